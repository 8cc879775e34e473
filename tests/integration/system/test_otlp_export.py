"""OTLP export from real processes: a scheduler and an executor, configured by OTEL_* variables only,
send their spans of one run's step to a collector (an in-process receiver) as one trace; with the
collector gone, runs still complete and the spans not exported are counted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from executor_support import http_tool, mock_tool, scripted_agent, write_agent
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tests_paths import REPO

from devstack.embedded_pg import free_port
from devstack.otlp_receiver import OtlpReceiver, ReceivedSpan
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc

pytestmark = pytest.mark.integration
TENANT = "tenant-a"
SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER


def otel_env(endpoint: str, protocol: str) -> dict[str, str]:
    return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_BSP_SCHEDULE_DELAY": "100"}


class Processes:
    """A scheduler and an executor process (`python -m cli …`), stopped by their pids."""

    def __init__(self, db_url: str, agents: Path, logs: Path, otel: dict[str, str]) -> None:
        self.addr = f"127.0.0.1:{free_port()}"
        self.metrics = {"scheduler": free_port(), "executor": free_port()}
        self.db_url, self.agents, self.logs, self.otel = db_url, agents, logs, otel
        self.procs: dict[str, asyncio.subprocess.Process] = {}

    def _env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRT_", "OTEL_"))}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        return {**env, **self.otel, "AGENTRT_LOG_LEVEL": "WARNING", "AGENTRT_AUTH_MODE": "none", **extra}

    async def _spawn(self, name: str, env: dict[str, str]) -> None:
        with (self.logs / f"{name}.log").open("wb") as log:  # the child keeps its own descriptor
            self.procs[name] = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "cli", name, cwd=REPO, env=env, stdout=log, stderr=log)

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    async def start(self) -> None:
        await self._spawn("scheduler", self._env(
            AGENTRT_DATABASE_URL=self.db_url, AGENTRT_LISTEN_ADDR=self.addr,
            AGENTRT_REQUIRE_REGISTERED_AGENTS="false", AGENTRT_METRICS_ADDR=f"127.0.0.1:{self.metrics['scheduler']}"))
        await self.wait_serving()
        await self._spawn("executor", self._env(
            AGENTRT_SCHEDULER_ADDR=self.addr, AGENTRT_AGENTS_PATH=str(self.agents), AGENTRT_HEALTH_ADDR="127.0.0.1:0",
            AGENTRT_CLAIM_WAIT_MS="300", AGENTRT_SHUTDOWN_GRACE_S="2",
            AGENTRT_METRICS_ADDR=f"127.0.0.1:{self.metrics['executor']}"))

    async def wait_serving(self, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        async with grpc.aio.insecure_channel(self.addr) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                self.check_alive()
                with contextlib.suppress(grpc.aio.AioRpcError):
                    reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                assert time.monotonic() < deadline, f"scheduler not SERVING in {within}s: {self.log('scheduler')}"
                await asyncio.sleep(0.1)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            assert proc.returncode is None, f"{name} exited with {proc.returncode}: {self.log(name)}"

    async def stop(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for name in ("executor", "scheduler"):
            proc = self.procs.get(name)
            if proc is None:
                continue
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 15)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
            codes[name] = proc.returncode
        return codes

    async def counter(self, service: str, name: str, labels: str = "") -> float:
        """One sample of a service's /metrics (0 when absent)."""
        async with aiohttp.ClientSession() as session, \
                session.get(f"http://127.0.0.1:{self.metrics[service]}/metrics") as reply:
            text = await reply.text()
        match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
        return float(match.group(1)) if match else 0.0


@contextlib.asynccontextmanager
async def running(db_url: str, tmp_path: Path, otel: dict[str, str]) -> AsyncIterator[tuple[Processes, Any]]:
    async with mock_tool(tmp_path) as mock:
        agents = tmp_path / "agents"
        plan = [{"id": "note", "tool": "crm.note", "args": {"text": "${input.text}"}}, {"id": "done", "finish": "ok"}]
        write_agent(agents, scripted_agent("noter", plan, [http_tool(mock.url, "crm.note")]))
        procs = Processes(db_url, agents, tmp_path, otel)
        try:
            await procs.start()
            yield procs, mock
        finally:
            await procs.stop()


async def submit(addr: str, count: int) -> list[str]:
    async with grpc.aio.insecure_channel(addr) as channel:
        runs = rs_grpc.RunServiceStub(channel)
        ids = []
        for i in range(count):
            reply = await runs.SubmitRun(rs.SubmitRunRequest(agent_name="noter", input_json=json.dumps({"text": i})),
                                         metadata=[("x-tenant-id", TENANT)], timeout=10)
            ids.append(reply.run.run_id)
        return ids


async def until(probe: Callable[[], Awaitable[bool]], within: float, what: str, procs: Processes) -> None:
    deadline = time.monotonic() + within
    while not await probe():
        procs.check_alive()
        assert time.monotonic() < deadline, f"not within {within}s: {what}"
        await asyncio.sleep(0.1)


def all_completed(db: Any, run_ids: list[str]) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        done = await db.fetchval("SELECT count(*) FROM agent_runs WHERE id = ANY($1::uuid[]) "
                                 "AND status = 'COMPLETED'", run_ids)
        return bool(done == len(run_ids))
    return probe


def step_trace(spans: list[ReceivedSpan], run_id: str) -> tuple[ReceivedSpan, list[ReceivedSpan]] | None:
    """The executor's tool step span of the run, and the scheduler's server spans in its trace."""
    step = next((s for s in spans if s.service == "agentrt-executor" and s.name == "agent.step"
                 and s.attributes.get("agentrt.run_id") == run_id and s.attributes.get("agentrt.tool")), None)
    if step is None:
        return None
    server = [s for s in spans if s.service == "agentrt-scheduler" and s.trace_id == step.trace_id
              and s.kind == SERVER_KIND and s.parent_span_id == step.span_id]
    names = {s.name.rsplit("/", 1)[-1] for s in server}
    return (step, server) if {"BeginToolCall", "CompleteToolCall"} <= names else None


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
async def test_one_steps_spans_reach_the_collector_from_both_services_as_one_trace(db_url, db, tmp_path, protocol):
    async with OtlpReceiver() as receiver, \
            running(db_url, tmp_path, otel_env(receiver.endpoint(protocol), protocol)) as (procs, _mock):
        [run_id] = await submit(procs.addr, 1)
        await until(all_completed(db, [run_id]), 60, "the run to complete", procs)

        async def exported() -> bool:
            return step_trace(receiver.spans, run_id) is not None

        await until(exported, 30, f"the step's spans from both services ({len(receiver.spans)} spans so far)", procs)
        assert await procs.counter("executor", "agentrt_otel_spans_exported_total") > 0
    found = step_trace(receiver.spans, run_id)
    assert found is not None
    step, server = found
    assert step.attributes["agentrt.fencing_token"] == 1
    assert step.attributes["agentrt.tenant_id"] == TENANT
    for span in server:
        assert span.trace_id == step.trace_id, span.name
        assert span.attributes["agentrt.run_id"] == run_id, span.name
        assert span.attributes["agentrt.fencing_token"] == 1, span.name


async def test_a_dead_collector_neither_stops_runs_nor_goes_uncounted(db_url, db, tmp_path):
    """Nothing listens on the collector's port: runs complete; the spans are counted as not exported."""
    dead = f"http://127.0.0.1:{free_port()}"
    otel = {**otel_env(dead, "grpc"), "AGENTRT_OTEL_EXPORT_TIMEOUT_S": "0.5", "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    async with running(db_url, tmp_path, otel) as (procs, _mock):
        run_ids = await submit(procs.addr, 6)
        await until(all_completed(db, run_ids), 60, "every run to complete", procs)

        def failed_exports_counted(service: str) -> Callable[[], Awaitable[bool]]:
            async def probe() -> bool:
                return await procs.counter(service, "agentrt_otel_spans_dropped_total", '{reason="export_failed"}') > 0
            return probe

        def failed_metric_exports_counted(service: str) -> Callable[[], Awaitable[bool]]:
            async def probe() -> bool:
                return await procs.counter(service, "agentrt_otel_metric_exports_failed_total") > 0
            return probe

        for service in ("executor", "scheduler"):
            await until(failed_exports_counted(service), 30, f"{service}: failed exports counted", procs)
            assert await procs.counter(service, "agentrt_otel_spans_exported_total") == 0
            await until(failed_metric_exports_counted(service), 30, f"{service}: failed metric exports counted",
                        procs)
            assert await procs.counter(service, "agentrt_otel_metric_exports_total") == 0
        started = time.monotonic()
        codes = await procs.stop()
    # The exit flush gives up on a dead collector (shared/otlp.py EXIT_FLUSH_S) within the grace period.
    assert codes == {"executor": 0, "scheduler": 0}, (codes, procs.log("executor"), procs.log("scheduler"))
    assert time.monotonic() - started < 12


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
async def test_the_prometheus_metrics_also_reach_the_collector_as_otlp_metrics(db_url, db, tmp_path, protocol):
    """OTEL_METRICS_EXPORTER=otlp: each service's registry goes to the collector as OTLP metrics, next
    to the Prometheus endpoint, with the same figures."""
    async with OtlpReceiver() as receiver:
        otel = {**otel_env(receiver.endpoint(protocol), protocol), "OTEL_METRICS_EXPORTER": "otlp",
                "OTEL_METRIC_EXPORT_INTERVAL": "300"}
        async with running(db_url, tmp_path, otel) as (procs, _mock):
            [run_id] = await submit(procs.addr, 1)
            await until(all_completed(db, [run_id]), 60, "the run to complete", procs)

            def latest(service: str, name: str, **attributes: Any) -> Any:
                found = [p for p in receiver.points if p.service == service and p.name == name
                         and all(p.attributes.get(k) == v for k, v in attributes.items())]
                return found[-1] if found else None

            async def exported() -> bool:
                claimed = latest("agentrt-executor", "agentrt_executor_claimed")
                return claimed is not None and claimed.value >= 1 and latest(
                    "agentrt-scheduler", "agentrt_rpc_seconds", method="CompleteToolCall") is not None

            await until(exported, 30, f"metrics from both services ({len(receiver.points)} points so far)", procs)
            scraped_claims = await procs.counter("executor", "agentrt_executor_claimed_total")
            assert await procs.counter("scheduler", "agentrt_otel_metric_exports_total") > 0
            await until(lambda: _equal(lambda: latest("agentrt-executor", "agentrt_executor_claimed").value,
                                       scraped_claims), 10, "the OTLP figure to match the scrape", procs)
    submitted = latest("agentrt-scheduler", "agentrt_rpc", method="SubmitRun", code="OK")
    assert submitted.kind == "sum" and submitted.monotonic and submitted.value == 1
    histogram = latest("agentrt-scheduler", "agentrt_rpc_seconds", method="CompleteToolCall")
    assert histogram.kind == "histogram" and histogram.count >= 1
    assert sum(histogram.bucket_counts) == histogram.count
    assert len(histogram.bucket_counts) == len(histogram.explicit_bounds) + 1
    runs = [p for p in receiver.points if p.name == "agentrt_runs" and p.kind == "gauge"]
    assert runs and {p.attributes["status"] for p in runs} >= {"QUEUED", "COMPLETED"}


async def _equal(value: Callable[[], Any], expected: float) -> bool:
    return bool(value() == expected)
