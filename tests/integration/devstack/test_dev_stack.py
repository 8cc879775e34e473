"""`agentrt dev` end to end: real processes on embedded PostgreSQL and Tansu.

--runs 20 --exit-when-done completes (every run COMPLETED or waiting for its
approval, every event consumed); --chaos (executors and the relay SIGKILLed and
restarted) still completes with at most one request per idempotency key for
the non-idempotent tool; the CLI against a live stack (`events tail --json`
parsed, resume an approval, status); error exits are one line; nothing is left
running afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from helpers import run_agentrt
from tests_paths import REPO

from devstack.embedded_pg import free_port, pid_alive
from devstack.kafka_testing import kafka_for_tests

pytestmark = [pytest.mark.integration, pytest.mark.kafka]
NON_IDEMPOTENT = "labels.create"


def dev_env() -> dict[str, str]:
    # The embedded database and broker, whatever the calling shell points at.
    return {k: v for k, v in os.environ.items()
            if k not in ("AGENTRT_DATABASE_URL", "AGENTRT_KAFKA_BOOTSTRAP", "AGENTRT_TENANT", "AGENTRT_ADDR")}


def dev_args(data_dir: Path, addr: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "cli", "dev", "--data-dir", str(data_dir), "--listen", addr, "--plain",
            "--tool-latency-ms", "20", *extra]


def run_dev(data_dir: Path, *extra: str, within_s: float) -> tuple[int, str, dict[str, Any]]:
    addr = f"127.0.0.1:{free_port()}"
    summary_path = data_dir.parent / f"{data_dir.name}-summary.json"
    # dev gives up by itself first (and stops everything it started); the test's own timeout is the backstop.
    proc = subprocess.run([*dev_args(data_dir, addr, "--exit-when-done", "--timeout", str(within_s),
                                     "--summary-json", str(summary_path)), *extra],
                          cwd=REPO, env=dev_env(), capture_output=True, text=True, timeout=within_s + 90)
    output = proc.stdout + proc.stderr
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return proc.returncode, output, summary


def assert_nothing_left(data_dir: Path) -> None:
    state = json.loads((data_dir / "stack.json").read_text())
    assert state["stopped"] is True
    pids = [*state["pids"].values(), state["broker_pid"], state["postgres_pid"]]
    assert all(pids) and len(pids) == 8  # scheduler, mocktool, 2 executors, relay, console, broker, PostgreSQL
    alive = [pid for pid in pids if pid_alive(pid)]
    assert not alive, f"still running: {alive}"


def test_twenty_demo_runs_complete_or_wait_for_approval_and_every_event_is_consumed(tmp_path):
    started = time.monotonic()
    code, output, summary = run_dev(tmp_path / "dev", "--runs", "20", within_s=100)
    assert code == 0, output[-4000:]
    runs = summary["runs"]
    assert runs["submitted"] == 20 and runs["completed"] == 16 and runs["awaiting_approval"] == 4, runs
    assert runs["by_status"] == {"COMPLETED": 16, "PAUSED_HUMAN": 4} and not runs["not_done"]
    labels = summary["tool_requests"][NON_IDEMPOTENT]
    assert labels == {"idempotent": False, "keys": 16, "requests": 16, "max_per_key": 1,
                      "keys_with_more_than_one": []}
    events = summary["events"]
    # run_submitted, 3 tool steps (checkpoint, requested, succeeded) … per run: well over 10 each.
    assert events["published"] > 200 and events["consumed"] == events["published"]
    assert events["pending"] == 0 and events["missing"] == 0
    assert summary["ok"] is True and summary["problems"] == []
    assert "all runs done, every event consumed" in output
    assert_nothing_left(tmp_path / "dev")
    assert time.monotonic() - started < 120


def test_chaos_kills_executors_and_the_relay_yet_every_run_completes_and_no_label_is_requested_twice(tmp_path):
    code, output, summary = run_dev(tmp_path / "dev", "--runs", "20", "--chaos", "--chaos-interval", "1",
                                    "--auto-approve", "--tool-latency-ms", "150", within_s=150)
    assert code == 0, output[-4000:]
    chaos = summary["chaos"]
    assert chaos["executor_kills"] >= 3 and chaos["relay_kills"] >= 1, chaos
    runs = summary["runs"]
    assert runs["by_status"] == {"COMPLETED": 20} and runs["approved_by_dev"] == 4, runs
    for tool, figures in summary["tool_requests"].items():
        assert figures["keys"] == 20, (tool, figures)
    labels = summary["tool_requests"][NON_IDEMPOTENT]
    assert labels["max_per_key"] == 1 and labels["requests"] == labels["keys"] == 20
    # Every freeze was settled (by the reconciler's lookup), none is left.
    assert all(d["resolution"] != "unresolved" for d in summary["in_doubt"]), summary["in_doubt"]
    events = summary["events"]
    assert events["consumed"] == events["published"] > 0 and events["missing"] == 0
    assert "SIGKILL exec-" in output and "SIGKILL relay" in output
    assert_nothing_left(tmp_path / "dev")


async def test_an_external_postgresql_and_kafka_are_used_and_left_running(db_url, db, tmp_path):
    with kafka_for_tests(tmp_path / "tansu.log") as (bootstrap, broker):
        data_dir = tmp_path / "dev"
        summary_path = tmp_path / "summary.json"
        env = {**dev_env(), "AGENTRT_DATABASE_URL": db_url}  # the variable, and the flag for Kafka
        proc = await asyncio.create_subprocess_exec(
            *dev_args(data_dir, f"127.0.0.1:{free_port()}", "--runs", "5", "--exit-when-done", "--timeout", "90",
                      "--kafka-bootstrap", bootstrap, "--summary-json", str(summary_path)),
            cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 180)
        output = out.decode()
        assert proc.returncode == 0, output[-4000:]
        assert "embedded" not in output  # neither an embedded PostgreSQL nor an embedded broker
        summary = json.loads(summary_path.read_text())
        assert summary["ok"] and summary["runs"]["submitted"] == 5
        assert await db.fetchval("SELECT count(*) FROM agent_runs WHERE tenant_id = 'demo'") == 5
        state = json.loads((data_dir / "stack.json").read_text())
        assert state["broker_pid"] is None and state["postgres_pid"] is None
        assert not any(pid_alive(pid) for pid in state["pids"].values())
        assert broker is None or broker.running  # dev stopped only what it started
        assert await db.fetchval("SELECT 1") == 1


# ---------------------------------------------------------------------- the CLI against a live stack


async def agentrt(*args: str, within_s: float = 60) -> tuple[int, str, str]:
    return await run_agentrt(*args, env=dev_env(), within_s=within_s)


def one_error_line(err: str) -> bool:
    lines = err.strip().splitlines()
    return len(lines) == 1 and "Traceback" not in err


async def read_until(stream: asyncio.StreamReader, needle: str, within_s: float, seen: list[str]) -> None:
    async with asyncio.timeout(within_s):
        while True:
            line = (await stream.readline()).decode()
            if not line:
                raise AssertionError(f"dev exited before printing {needle!r}:\n{''.join(seen)[-3000:]}")
            seen.append(line)
            if needle in line:
                return


async def wait_for_line(seen: list[str], needle: str, within_s: float, reader: asyncio.Task[None]) -> None:
    deadline = time.monotonic() + within_s
    while not any(needle in line for line in seen):
        if reader.done() or time.monotonic() > deadline:
            raise AssertionError(f"{needle!r} not printed within {within_s:g}s:\n{''.join(seen)[-3000:]}")
        await asyncio.sleep(0.1)


async def test_every_cli_command_against_a_live_stack_then_error_exits_once_it_is_stopped(tmp_path):
    data_dir = tmp_path / "dev"
    addr = f"127.0.0.1:{free_port()}"
    proc = await asyncio.create_subprocess_exec(*dev_args(data_dir, addr, "--runs", "5"), cwd=REPO, env=dev_env(),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    seen: list[str] = []
    assert proc.stdout is not None
    drain = asyncio.create_task(read_until(proc.stdout, "(never printed: read everything)", 600, seen))
    try:
        await wait_for_line(seen, "every demo run is completed or waiting for approval", 120, drain)
        state = json.loads((data_dir / "stack.json").read_text())
        bootstrap, runs = state["kafka_bootstrap"], state["runs"]
        # dev authenticates by default: its session's admin key (every tenant) is in <data-dir>/api_key.
        assert state["auth_mode"] == "api_key" and state["api_key_file"] == str(data_dir / "api_key")
        key = ["--api-key", (data_dir / "api_key").read_text().strip()]
        assert any("export AGENTRT_API_KEY=$(cat" in line for line in seen)
        # The operator console runs beside the stack, and dev says where.
        console_url = state["console_url"]
        assert console_url.startswith("http://localhost:") and any(f"console on {console_url}" in line
                                                                    for line in seen)
        async with aiohttp.ClientSession() as http, http.get(f"{console_url}/signin") as reply:
            assert reply.status == 200 and "Sign in to the agentrt console" in await reply.text()
        code, _, err = await agentrt("runs", "list", "--addr", addr, "--tenant", "demo")
        assert code == 1 and one_error_line(err) and "needs a credential" in err, err
        scope = ["--addr", addr, "--tenant", "demo", *key]

        # events tail --json: one CloudEvent per line, for the runs just made (the session key's
        # agent.audit.key.create event is every tenant's, "*": --tenant leaves it out).
        code, out, err = await agentrt("events", "tail", "--bootstrap", bootstrap, "--from-beginning", "--json",
                                       "--max", "20", "--timeout", "30", "--tenant", "demo")
        assert code == 0, err
        events = [json.loads(line) for line in out.splitlines()]
        assert len(events) == 20
        assert {e["specversion"] for e in events} == {"1.0"} and {e["tenantid"] for e in events} == {"demo"}
        assert {e["subject"] for e in events} <= set(runs)
        assert all(e["type"].startswith("agent.") and e["kafka"]["topic"] == "agentrt.events" for e in events)
        code, out, _ = await agentrt("events", "tail", "--bootstrap", bootstrap, "--from-beginning",
                                     "--type", "agent.run_completed", "--max", "4", "--timeout", "30")
        assert code == 0 and len(out.splitlines()) == 4 and all("agent.run_completed" in line for line in
                                                                 out.splitlines())

        # The run above the refund threshold waits; approve it, watch it finish, see its event arrive.
        code, out, err = await agentrt("runs", "list", "--status", "PAUSED_HUMAN", "--json", *scope)
        assert code == 0, err
        [paused] = [r for r in json.loads(out)["runs"] if r["run_id"] in runs]
        assert paused["current_step_key"].startswith("approve_refund")
        code, out, err = await agentrt("runs", "resume", paused["run_id"], "--approve", "--operator", "alice",
                                       "--json", *scope)
        assert code == 0 and json.loads(out)["status"] == "QUEUED", err
        code, out, _ = await agentrt("runs", "watch", paused["run_id"], "--json", *scope)
        assert code == 0 and json.loads(out.splitlines()[-1])["status"] == "COMPLETED"
        code, out, _ = await agentrt("runs", "history", paused["run_id"], "--json", *scope)
        tools = [t["tool_name"] for t in json.loads(out)["tool_executions"]]
        assert tools[-3:] == ["labels.create", "tickets.register", "notify.send"]
        code, out, err = await agentrt("events", "tail", "--bootstrap", bootstrap, "--from-beginning", "--json",
                                       "--run", paused["run_id"], "--type", "agent.run_completed", "--max", "1",
                                       "--timeout", "30")
        assert code == 0 and json.loads(out)["subject"] == paused["run_id"], err

        # An operator settles an in-doubt label call: the label service creates it, then answers 500.
        # (Tenant "ops": the executors' reconciler sweeps only "demo", so the person decides.)
        ops = ["--addr", addr, "--tenant", "ops", *key]
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{state['mock_url']}/_faults",
                                    json={"tool": "labels.create", "mode": "error_after", "count": 1}) as resp:
                assert resp.status == 200
            order = {"order_id": 7, "customer_id": "cust-7", "refund_amount": 80, "currency": "EUR",
                     "reason": "wrong size"}
            code, out, err = await agentrt("runs", "submit", "after_sales_return", "--input", json.dumps(order),
                                           "--request-id", "ops-7", "--json", *ops)
            assert code == 0 and json.loads(out)["created"] is True, err
            ops_run = json.loads(out)["run_id"]
            code, out, _ = await agentrt("runs", "watch", ops_run, "--until", "PAUSED_INDOUBT", "--json", *ops)
            assert json.loads(out.splitlines()[-1])["status"] == "PAUSED_INDOUBT"
            code, out, _ = await agentrt("runs", "get", ops_run, "--json", *ops)
            assert code == 0 and json.loads(out)["current_step_key"] == "create_label/attempt-1"
            code, out, _ = await agentrt("runs", "history", ops_run, "--json", *ops)
            [row] = [t for t in json.loads(out)["tool_executions"] if t["tool_name"] == "labels.create"]
            async with session.get(f"{state['mock_url']}/lookup/labels.create",
                                   params={"key": row["idempotency_key"]}) as resp:
                found = await resp.json()
        assert found["found"] is True
        code, out, err = await agentrt("tools", "resolve", ops_run, "create_label/attempt-1", "--succeeded",
                                       "--result", json.dumps(found["response"]), "--evidence",
                                       json.dumps({"lookup": "found", "by": "test"}), "--json", *ops)
        assert code == 0 and json.loads(out)["run"]["status"] == "QUEUED", err
        code, out, _ = await agentrt("runs", "watch", ops_run, "--json", *ops)
        finished = json.loads(out.splitlines()[-1])
        assert finished["status"] == "COMPLETED" and finished["result"]["label_id"] == found["response"]["id"]
        # Cancel: a large refund waiting for approval ends CANCELLED.
        code, out, _ = await agentrt("runs", "submit", "after_sales_return", "--input",
                                     json.dumps({**order, "order_id": 8, "refund_amount": 900}), "--json", *ops)
        big = json.loads(out)["run_id"]
        code, out, _ = await agentrt("runs", "watch", big, "--until", "PAUSED_HUMAN", "--json", *ops)
        assert json.loads(out.splitlines()[-1])["status"] == "PAUSED_HUMAN"
        code, out, _ = await agentrt("runs", "cancel", big, "--reason", "customer withdrew", "--json", *ops)
        assert code == 0 and json.loads(out)["status"] == "CANCELLED"

        # The code-first example (devstack/examples/refund_triage.py) runs through the same trio: the
        # executors registered it, its typed tools call the mock tool server, its events reach Kafka.
        code, out, err = await agentrt("agents", "list", "--json", *scope)
        served = {(a["name"], a["version"]): a for a in json.loads(out)["agents"]}
        assert code == 0 and {("after_sales_return", "1"), ("refund_triage", "1")} <= set(served), err
        assert sorted(served[("refund_triage", "1")]["executors"]) == ["exec-1.1", "exec-2.1"]
        code, out, err = await agentrt("runs", "submit", "refund_triage", "--input", '{"order_id": "x"}', *scope)
        assert code == 1 and "input_json: $.order_id: 'x' is not of type 'integer'" in err, err
        code, out, err = await agentrt("runs", "submit", "refund_triage", "--input",
                                       '{"order_id": 12, "refund_amount": 40}', "--json", *scope)
        assert code == 0, err
        triage = json.loads(out)["run_id"]
        code, out, _ = await agentrt("runs", "watch", triage, "--json", *scope)
        summary = json.loads(out.splitlines()[-1])
        assert summary["status"] == "COMPLETED" and summary["result"]["order_id"] == 12, summary
        assert summary["result"]["label_id"].startswith("labels.create-")
        code, out, err = await agentrt("events", "tail", "--bootstrap", bootstrap, "--from-beginning", "--json",
                                       "--run", triage, "--type", "agent.run_completed", "--max", "1",
                                       "--timeout", "30")
        assert code == 0 and json.loads(out)["subject"] == triage, err

        # status: every service healthy, the demo tenant's counts.
        services = [f"{name}={target}" for name, target in state["health"].items() if not target.startswith("http")]
        code, out, err = await agentrt("status", "--json", *scope, *(x for s in services for x in ("--service", s)))
        assert code == 0, err
        status = json.loads(out)
        assert {name for name, s in status["services"].items() if s["health"] == "SERVING"} == {
            "scheduler", "relay", "exec-1", "exec-2"}
        assert status["runs_by_status"].get("COMPLETED", 0) >= 5

        # Bad arguments: one line, non-zero.
        for bad in (["events", "tail", "--max", "0"], ["events", "tail", "--bootstrap", "nohost"],
                    ["events", "tail", "--frobnicate"], ["dev", "--runs", "-1"], ["dev", "--exit-when-done",
                                                                                  "--runs", "0"]):
            code, _, err = await agentrt(*bad)
            assert code != 0 and one_error_line(err), (bad, err)
        code, _, err = await agentrt("events", "tail", "--bootstrap", bootstrap, "--type", "no.such.event",
                                     "--max", "1", "--timeout", "1")
        assert code == 1 and one_error_line(err) and "0 of 1 events" in err
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 60)
        with contextlib.suppress(AssertionError):
            await drain
        assert code == 0, "".join(seen)[-3000:]
    assert_nothing_left(data_dir)

    # A stopped service: one line, non-zero.
    code, _, err = await agentrt("runs", "list", "--addr", addr, "--tenant", "demo", "--timeout", "0.5")
    assert code == 1 and one_error_line(err) and "UNAVAILABLE" in err
    code, _, err = await agentrt("events", "tail", "--bootstrap", bootstrap, "--timeout", "5")
    assert code == 1 and one_error_line(err) and "UNAVAILABLE" in err
