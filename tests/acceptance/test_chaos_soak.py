"""A short chaos soak (`agentrt chaos`): every check must hold, and the figures must be printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(600)]

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_short_soak_keeps_every_invariant(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cli", "chaos", "--runs", "30", "--minutes", "1", "--kill-every-s", "3",
         "--settle-minutes", "3", "--seed", "20261130", "--artifacts", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=560)
    output = done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["pass_or_fail"] == "PASS" and all(check["ok"] for check in summary["checks"]), summary["checks"]
    observed = summary["observed"]
    assert observed["runs"] == 30 and observed["outbox_pending"] == 0
    assert {"executor", "relay", "scheduler"} <= set(observed["sigkills_by_soak"]), observed["sigkills_by_soak"]
    assert observed["postgres_restart_s"] is not None
    # One run in 33 is a long one (500 tool steps, its executor killed like the others): it completed,
    # each step once in the ledger and once in a gapless journal.
    long_runs = observed["long_runs"]
    assert len(long_runs) == 1 and long_runs[0]["status"] == "COMPLETED", long_runs
    assert long_runs[0]["steps"] == long_runs[0]["tool_entries"] == 500 and long_runs[0]["gapless"], long_runs
    assert "PASS:" in done.stdout and "runs 30:" in done.stdout
