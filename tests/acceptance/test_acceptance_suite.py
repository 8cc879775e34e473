"""The acceptance suite's short form: experiments 1-9 once each, on real processes (`agentrt acceptance`).

The suite runs as one child process (its own embedded PostgreSQL, brokers,
network namespaces); each test here reads one experiment's evidence record.
The full form is `agentrt acceptance --repeat 5`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(900)]

REPO_ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = [str(i) for i in range(1, 10)]
# Reference 13.3, as the records name them (Kubernetes fields recorded as not applicable).
EVIDENCE_FIELDS = ("experiment_id", "git_commit", "versions", "kubernetes_version", "worker_image_digest", "run_ids",
                   "tenant_id", "lease_duration_ms", "heartbeat_interval_ms", "fault_injection_point",
                   "commands_executed", "log_paths", "postgres_queries_and_results", "mock_tool_request_log",
                   "broker_messages", "expected_invariant", "observed_result", "pass_or_fail")


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    artifacts = tmp_path_factory.mktemp("acceptance")
    done = subprocess.run([sys.executable, "-m", "devstack.acceptance.runner", "--repeat", "1", "--artifacts",
                           str(artifacts)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=840)
    records = {path.parent.name: json.loads(path.read_text()) for path in artifacts.glob("e*-r*/evidence.json")}
    return {"records": records, "artifacts": artifacts, "output": done.stdout[-4000:] + done.stderr[-4000:],
            "returncode": done.returncode}


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_passes_with_evidence(suite: dict[str, Any], experiment: str) -> None:
    record = suite["records"].get(f"e{experiment}-r1")
    assert record is not None, f"no evidence for experiment {experiment}; output:\n{suite['output']}"
    failed = [check for check in record["checks"] if not check["ok"]]
    assert record["pass_or_fail"] == "PASS", (record["error"], failed, str(suite["artifacts"]))
    missing = [name for name in EVIDENCE_FIELDS if name not in record]
    assert not missing, missing
    assert record["run_ids"] and record["commands_executed"] and record["postgres_queries_and_results"]
    assert record["git_commit"]["commit"] and record["versions"]["postgres"].startswith("postgres")
    for path in record["log_paths"].values():
        assert Path(path).exists(), path


def test_the_suite_exits_zero_and_writes_the_summary(suite: dict[str, Any]) -> None:
    assert suite["returncode"] == 0, suite["output"]
    summary = json.loads((suite["artifacts"] / "summary.json").read_text())
    assert summary["failed"] == 0 and summary["passed"] == len(EXPERIMENTS)
    assert "exp  title" in suite["output"]  # the table


def test_the_partition_used_a_network_namespace_when_it_could(suite: dict[str, Any]) -> None:
    record = suite["records"].get("e9-r1")
    assert record is not None
    kind = record["method"]["kind"]
    assert kind.startswith(("netns", "sigstop")), kind
    if kind.startswith("netns"):
        assert any("ip link set" in c and "down" in c for c in record["commands_executed"])
