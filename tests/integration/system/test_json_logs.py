"""`log_format: json` end to end: a scheduler and an executor process (`python -m cli`) run one
run; every stderr line is a JSON object with the required fields, the lines about the run name its run,
tenant and fence, and a secret in the run's input (which travels in the tool request, the tool's answer,
the checkpoints and the run's result) is in no log line, at DEBUG level."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from executor_support import http_tool, mock_tool, scripted_agent, write_agent
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.embedded_pg import free_port
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[3]
SECRET = "tok-9f3b2c71e4-do-not-log"
TENANT = "tenant-logs"
REQUIRED = ("time", "level", "service", "logger", "message")
RFC3339_MS_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
DEADLINE_S = 60.0


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(AGENTRT_LOG_FORMAT="json", AGENTRT_LOG_LEVEL="DEBUG", AGENTRT_AUTH_MODE="none",
               AGENTRT_SHUTDOWN_GRACE_S="2", **extra)
    return env


async def spawn(name: str, env: dict[str, str], tmp_path: Path) -> tuple[asyncio.subprocess.Process, Path, Path]:
    out, err = tmp_path / f"{name}.stdout", tmp_path / f"{name}.stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:  # the child keeps its own descriptors
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "cli", name, cwd=REPO_ROOT,
                                                    env=env, stdout=stdout, stderr=stderr,
                                                    stdin=asyncio.subprocess.DEVNULL)
    return proc, out, err


async def stop(proc: asyncio.subprocess.Process, grace: float = 10.0) -> int:
    """SIGTERM to the process we started (by its pid), SIGKILL after the grace."""
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode


def tail(path: Path, chars: int = 2000) -> str:
    return path.read_text()[-chars:] if path.exists() else ""


async def wait_serving(addr: str, proc: asyncio.subprocess.Process, err: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            assert proc.returncode is None, f"scheduler exited: {tail(err)}"
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            assert time.monotonic() < deadline, f"scheduler not serving: {tail(err)}"
            await asyncio.sleep(0.1)


async def run_to_the_end(addr: str, agent: str) -> pb.Run:
    metadata = [("x-tenant-id", TENANT)]
    async with grpc.aio.insecure_channel(addr) as channel:
        runs = rs_grpc.RunServiceStub(channel)
        submitted = await runs.SubmitRun(rs.SubmitRunRequest(
            agent_name=agent, input_json=json.dumps({"card_token": SECRET}), client_request_id="logs-1"),
            metadata=metadata, timeout=10)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            run = await runs.GetRun(rs.GetRunRequest(run_id=submitted.run.run_id), metadata=metadata, timeout=10)
            if run.status in (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED, pb.RUN_STATUS_PAUSED_HUMAN,
                              pb.RUN_STATUS_PAUSED_INDOUBT):
                return run
            assert time.monotonic() < deadline, f"run still {pb.RunStatus.Name(run.status)}"
            await asyncio.sleep(0.1)


def json_lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for number, text in enumerate(path.read_text().splitlines(), 1):
        try:
            entry = json.loads(text)
        except ValueError:
            raise AssertionError(f"{path.name}:{number} is not JSON: {text[:300]}") from None
        assert isinstance(entry, dict), f"{path.name}:{number}: {text[:300]}"
        missing = [field for field in REQUIRED if field not in entry]
        assert not missing, f"{path.name}:{number} lacks {missing}: {text[:300]}"
        assert RFC3339_MS_UTC.match(entry["time"]), entry["time"]
        lines.append(entry)
    return lines


async def test_json_logs_of_a_scheduler_and_an_executor_name_the_run_and_never_its_input(db_url, tmp_path):
    agents = tmp_path / "agents"
    addr = f"127.0.0.1:{free_port()}"
    async with mock_tool(tmp_path) as mock:
        plan = [{"id": "charge", "tool": "pay.charge", "args": {"card": "${input.card_token}"}},
                {"id": "done", "finish": "charged ${input.card_token}"}]
        write_agent(agents, scripted_agent("payer", plan, [http_tool(mock.url, "pay.charge")]))
        scheduler, _, scheduler_err = await spawn("scheduler", child_env(
            AGENTRT_DATABASE_URL=db_url, AGENTRT_LISTEN_ADDR=addr, AGENTRT_CLAIM_POLL_INTERVAL_MS="100",
            AGENTRT_REQUIRE_REGISTERED_AGENTS="false"), tmp_path)
        executor = None
        try:
            await wait_serving(addr, scheduler, scheduler_err)
            executor, _, executor_err = await spawn("executor", child_env(
                AGENTRT_SCHEDULER_ADDR=addr, AGENTRT_AGENTS_PATH=str(agents), AGENTRT_HEALTH_ADDR="127.0.0.1:0",
                AGENTRT_CLAIM_WAIT_MS="300", AGENTRT_WORKER_ID="exec-logs"), tmp_path)
            run = await run_to_the_end(addr, "payer")
        finally:
            if executor is not None:
                await stop(executor)
            await stop(scheduler)
        sent = mock.rows("SELECT request_json, result_json FROM requests WHERE kind = 'call'")
    assert run.status == pb.RUN_STATUS_COMPLETED, (run.terminal_reason, tail(executor_err))
    assert SECRET in run.result_json and any(SECRET in str(row) for row in sent)  # it did travel

    scheduler_lines, executor_lines = json_lines(scheduler_err), json_lines(executor_err)
    assert {e["service"] for e in scheduler_lines} == {"agentrt-scheduler"}
    assert {e["service"] for e in executor_lines} == {"agentrt-executor"}
    assert any("scheduler listening" in e["message"] for e in scheduler_lines)

    about_the_run = [e for e in executor_lines if run.run_id in e["message"]]
    assert any("RUN_STATUS_COMPLETED" in e["message"] for e in about_the_run), about_the_run
    for entry in about_the_run:
        assert (entry.get("run_id"), entry.get("tenant"), entry.get("fencing_token")) == (
            run.run_id, TENANT, 1), entry
        assert re.fullmatch(r"[0-9a-f]{32}", entry.get("trace_id", "")), entry
    # The scheduler's DEBUG line per call names the run its handler annotated (fence 0 before the claim).
    claimed = [e for e in scheduler_lines if e["message"] == "ClaimWork answered" and "run_id" in e]
    assert [(e["run_id"], e["tenant"], e["fencing_token"]) for e in claimed] == [(run.run_id, TENANT, 1)], \
        [e for e in scheduler_lines if "answered" in e["message"]]
    for entries, fences in ((scheduler_lines, {0, 1}), (executor_lines, {1})):
        for entry in entries:
            if "run_id" in entry:
                assert (entry["run_id"], entry["tenant"]) == (run.run_id, TENANT), entry
                assert entry["fencing_token"] in fences, entry

    every_line = "\n".join(path.read_text() for path in sorted(tmp_path.glob("*.std*")))
    assert SECRET not in every_line, [line for line in every_line.splitlines() if SECRET in line][:5]
