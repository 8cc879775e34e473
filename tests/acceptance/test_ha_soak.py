"""The HA soak in its short form (`agentrt chaos --ha`, devstack/acceptance/soak_ha.py): three
minutes on etcd + two PostgreSQL 15 nodes under Patroni with one failover, retention on, random
SIGKILLs, the index upkeep every minute. The 60-minute soak and its flatness verdict are in
docs/benchmarks.md; here every invariant must hold and every per-minute figure must be sampled.
About 4-5 minutes; it needs Debian's `patroni` and `etcd-server` (.ci/run installs them) and root:
without them it fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.acceptance import ha_cluster, soak_report

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(900)]

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_short_ha_soak_keeps_every_invariant_and_samples_every_minute(tmp_path: Path) -> None:
    missing = ha_cluster.missing_binaries()
    assert not missing, f"the HA soak cannot run here: missing {missing} (apt-get install patroni etcd-server)"
    done = subprocess.run(
        [sys.executable, "-m", "cli", "chaos", "--ha", "--minutes", "3", "--failover-every-min", "2",
         "--calibration-runs", "60", "--kill-every-s", "8", "--keep-finished-s", "20", "--settle-minutes", "4",
         "--maintain-every-min", "1",
         "--seed", "20261206", "--artifacts", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=840)
    output = done.stdout[-6000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["pass_or_fail"] == "PASS", ([c for c in summary["checks"] if not c["ok"]], output)
    assert done.returncode == 0, output
    observed = summary["observed"]
    failover = observed["failovers"]
    assert len(failover) == 1 and failover[0]["rejoin"]["pg_rewind_used"], failover
    assert 0 < failover[0]["time_to_recover_s"] < 60, failover
    assert observed["statuses"]["deleted by retention"] > 0 and observed["runs_aged"] > 0, observed["statuses"]
    samples = [json.loads(line) for line in (tmp_path / "esoak-ha-r1" / "samples.jsonl").read_text().splitlines()]
    assert [s["minute"] for s in samples] == [1, 2, 3]
    for sample in samples[1:]:  # the first minute has no previous minute of submits to time
        missing_figures = [k for k in soak_report.UNITS if sample["figures"].get(k) is None]
        assert not missing_figures, (sample["minute"], missing_figures)
    assert samples[-1]["figures"]["RSS scheduler"] > 20 and samples[-1]["figures"]["size agent_runs"] > 0
    assert set(samples[-1]["index_mib"]) == set(soak_report.MAIN_TABLES), samples[-1]["index_mib"]
    # `agentrt maintain indexes` ran as the CronJob would, every minute here (one pass may be cut by
    # the failover: it is recorded as such, and the next pass drops what it left)
    passes = observed["index_maintenance"]
    assert [p for p in passes if "error" not in p], passes
    assert all(set(p) in ({"seconds", "rebuilt", "dropped"}, {"error"}) for p in passes), passes
    report = (tmp_path / "esoak-ha-r1" / "report.md").read_text()
    assert "| figure |" in report and "pg_rewind True" in report and "Index upkeep" in report
