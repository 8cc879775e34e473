"""Acceptance experiment 10, the database primary lost, once (`agentrt acceptance --only 10`).

Real processes: etcd and two PostgreSQL 15 nodes under Patroni (synchronous mode) on loopback,
the scheduler, two executors, the relay, a broker and a consumer under load; a switchover, a
SIGKILL of the leader's Patroni and postmaster, the old leader back through pg_rewind
(devstack/acceptance/experiments_ha.py, docs/ha.md). About 1-2.5 minutes. It needs Debian's
`patroni` and `etcd-server` (.ci/run installs them) and root: without them it fails, never skips.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devstack.acceptance import ha_cluster
from devstack.acceptance.experiments import DEFAULT_IDS, EXPERIMENTS
from devstack.acceptance.lab import _with_database

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(600)]

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    missing = ha_cluster.missing_binaries()
    assert not missing, f"experiment 10 cannot run here: missing {missing} (apt-get install patroni etcd-server)"
    artifacts = tmp_path_factory.mktemp("acceptance-e10")
    done = subprocess.run([sys.executable, "-m", "devstack.acceptance.runner", "--only", "10", "--repeat", "1",
                           "--artifacts", str(artifacts)], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=560)
    path = artifacts / "e10-r1" / "evidence.json"
    output = done.stdout[-4000:] + done.stderr[-4000:]
    assert path.exists(), f"no evidence for experiment 10; output:\n{output}"
    return {"record": json.loads(path.read_text()), "returncode": done.returncode, "output": output,
            "artifacts": artifacts}


def test_the_primary_lost_under_load_loses_nothing(record: dict[str, Any]) -> None:
    ev = record["record"]
    failed = [check for check in ev["checks"] if not check["ok"]]
    assert ev["pass_or_fail"] == "PASS", (ev["error"], failed, str(record["artifacts"]))
    assert record["returncode"] == 0, record["output"]
    names = {check["name"] for check in ev["checks"]}
    for expected in ("no acknowledged commit lost (probe rows)",
                     "no committed checkpoint, ledger row, journal entry or outbox row lost (failover)",
                     "fencing tokens never went back across the failover", "every run COMPLETED",
                     "no event applied twice", "the old leader came back as a synchronous standby (pg_rewind)"):
        assert expected in names, expected


def test_the_evidence_shows_each_fault_and_the_time_to_recover(record: dict[str, Any]) -> None:
    ev = record["record"]
    phases = ev["method"]["phases"]
    assert phases["switchover"]["exit"] == 0 and phases["switchover"]["seconds_until_new_leader"] > 0
    failover = phases["failover"]
    assert failover["killed"]["patroni_pid"] and failover["killed"]["postmaster_pid"]
    assert failover["new_leader"] != failover["killed"]["node"]
    assert 0 < failover["time_to_recover_s"] < 60, failover
    assert phases["rejoin"]["pg_rewind_used"], phases["rejoin"]
    commands = "\n".join(ev["commands_executed"])
    assert "patronictl" in commands and "switchover" in commands
    assert f"kill -KILL {failover['killed']['postmaster_pid']}" in commands
    assert ev["observed_result"]["ha_versions"]["patroni"].startswith("patroni")
    assert "target_session_attrs=read-write" in ev["method"]["dsn"]
    for path in ev["log_paths"].values():
        assert Path(path).exists(), path


def test_experiment_10_is_registered_outside_the_default_list() -> None:
    assert EXPERIMENTS["10"].title == "primary lost"
    assert DEFAULT_IDS == [str(i) for i in range(1, 10)]
    # The lab's databases keep a multi-host DSN's query (target_session_attrs).
    dsn = "postgresql://postgres@127.0.0.1:5001,127.0.0.1:5002/postgres?target_session_attrs=read-write"
    assert _with_database(dsn, "acc_x") == \
        "postgresql://postgres@127.0.0.1:5001,127.0.0.1:5002/acc_x?target_session_attrs=read-write"
    assert _with_database("postgresql://u@h:1/postgres", "d") == "postgresql://u@h:1/d"
