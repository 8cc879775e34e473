"""A marked secret through the whole stack: scheduler, executor and relay as processes, a consumer
process, Kafka (Tansu), OTLP export of spans and metrics, and a real loopback HTTP tool with its own
store. The tool receives the plain value; no log file, exported span, metric point, Prometheus
scrape, Kafka record or database table holds its bytes."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from executor_support import scripted_agent, write_agent
from relay_support import TopicReader
from sealing_support import raw_tables
from test_trace_whole_stack import consumer_process
from tests_paths import REPO

from devstack.embedded_pg import free_port
from devstack.kafka_testing import kafka_for_tests
from devstack.otlp_receiver import OtlpReceiver
from devstack.services import Service

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

SECRET = "pan-5500-WHOLE-STACK-secret-e41d"
TOPIC = "agentrt.events"


class CardTool:
    """POST /charge records the body it received (its own store) and answers with a charge id."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.runner: web.AppRunner | None = None
        self.port = free_port()

    async def start(self) -> str:
        app = web.Application()

        async def charge(request: web.Request) -> web.Response:
            body = await request.json()
            self.received.append(body)
            return web.json_response({"id": f"ch-{len(self.received)}", "last4": body["card"][-4:]})

        app.router.add_post("/charge", charge)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def env_for(db_url: str, bootstrap: str, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRT_", "OTEL_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return {**env, "AGENTRT_DATABASE_URL": db_url, "AGENTRT_KAFKA_BOOTSTRAP": bootstrap,
            "OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_METRIC_EXPORT_INTERVAL": "500", "AGENTRT_LOG_LEVEL": "DEBUG", "AGENTRT_AUTH_MODE": "none",
            "AGENTRT_SHUTDOWN_GRACE_S": "2", "AGENTRT_CLAIM_WAIT_MS": "500"}


async def scrape(addr: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"http://{addr}/metrics") as resp:
        return await resp.text()


async def stop_and_collect(services: list[Service], receiver: OtlpReceiver) -> tuple[list, list]:
    """Stops the services (last started first) and waits for the scheduler's and the relay's metrics
    to reach the OTLP receiver; returns the spans and the metric points it got."""
    for service in reversed(services):
        await service.stop()
    deadline = time.monotonic() + 20
    while {p.service for p in receiver.points} < {"agentrt-scheduler", "agentrt-relay"}:
        assert time.monotonic() < deadline, "no metrics exported"
        await asyncio.sleep(0.2)
    return list(receiver.spans), list(receiver.points)


async def test_a_marked_secret_reaches_the_tool_and_nothing_else(db_url, db, tmp_path: Path):
    from shared.gen.agentrt.v1 import common_pb2 as pb
    from shared.gen.agentrt.v1 import run_service_pb2 as rs
    from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc

    tool = CardTool()
    url = await tool.start()
    agents = tmp_path / "agents"
    schema = {"type": "object", "required": ["card"],
              "properties": {"card": {"type": "string", "x-agentrt-sensitive": True}, "amount": {"type": "integer"}}}
    write_agent(agents, scripted_agent(
        "card-payer", [{"id": "charge", "tool": "cards.charge", "args": {"card": "${input.card}",
                                                                        "amount": "${input.amount}"}},
                       {"id": "done", "finish": {"charged": "${results.charge.response.id}"}}],
        [{"name": "cards.charge", "kind": "http", "url": f"{url}/charge", "timeout_s": 5,
          "input_schema": {"type": "object", "properties": {
              "card": {"type": "string", "x-agentrt-sensitive": True}}}}],
        input_schema=schema))
    logs = tmp_path / "logs"
    logs.mkdir()
    keys = json.dumps({"current": "k1", "keys": {"k1": base64.b64encode(os.urandom(32)).decode()}})
    listen = f"127.0.0.1:{free_port()}"
    metrics = {name: f"127.0.0.1:{free_port()}" for name in ("scheduler", "executor", "relay")}
    services: list[Service] = []
    try:
        with kafka_for_tests(tmp_path / "tansu.log") as (bootstrap, _broker):
            async with OtlpReceiver() as receiver:
                env = env_for(db_url, bootstrap, receiver.grpc_endpoint)
                scheduler = Service("scheduler", ["scheduler"], {
                    **env, "AGENTRT_LISTEN_ADDR": listen, "AGENTRT_ENCRYPTION_KEYS": keys,
                    "AGENTRT_METRICS_ADDR": metrics["scheduler"], "AGENTRT_REQUIRE_REGISTERED_AGENTS": "true"},
                    logs, health_addr=listen)
                relay_health = f"127.0.0.1:{free_port()}"
                relay = Service("relay", ["relay"], {**env, "AGENTRT_HEALTH_ADDR": relay_health,
                                                     "AGENTRT_METRICS_ADDR": metrics["relay"]},
                                logs, health_addr=relay_health)
                exec_health = f"127.0.0.1:{free_port()}"
                executor = Service("executor", ["executor"], {
                    **env, "AGENTRT_SCHEDULER_ADDR": listen, "AGENTRT_AGENTS_PATH": str(agents),
                    "AGENTRT_HEALTH_ADDR": exec_health, "AGENTRT_METRICS_ADDR": metrics["executor"]},
                    logs, health_addr=exec_health)
                scheduler.start()
                services.append(scheduler)
                await scheduler.wait_healthy(60)
                for service in (relay, executor):
                    service.start()
                    services.append(service)
                await asyncio.gather(relay.wait_healthy(60), executor.wait_healthy(60))
                async with consumer_process(env, bootstrap, logs / "consumer.log"):
                    import grpc

                    async with grpc.aio.insecure_channel(listen) as channel:
                        runs = rs_grpc.RunServiceStub(channel)
                        md = [("x-tenant-id", "acme")]
                        deadline = time.monotonic() + 30
                        while True:  # the executor registers its agent at start
                            try:
                                submitted = await runs.SubmitRun(rs.SubmitRunRequest(
                                    agent_name="card-payer", input_json=json.dumps({"card": SECRET, "amount": 7})),
                                    metadata=md)
                                break
                            except grpc.aio.AioRpcError as error:
                                assert time.monotonic() < deadline, error.details()
                                await asyncio.sleep(0.2)
                        run_id = submitted.run.run_id
                        deadline = time.monotonic() + 60
                        while True:
                            run = await runs.GetRun(rs.GetRunRequest(run_id=run_id), metadata=md)
                            if run.status in (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED):
                                break
                            assert time.monotonic() < deadline, pb.RunStatus.Name(run.status)
                            await asyncio.sleep(0.2)
                        assert run.status == pb.RUN_STATUS_COMPLETED, run.terminal_reason
                        assert json.loads(run.input_json)["card"] == "[redacted]"
                        history = await runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=run_id), metadata=md)
                        assert SECRET not in str(history)
                    assert tool.received == [{"card": SECRET, "amount": 7}]  # the tool got the plain value
                    reader = await TopicReader(bootstrap, [TOPIC]).start()
                    try:
                        await reader.read_until(lambda rs_: any(r.event.type == "agent.run_completed"
                                                                and str(r.event.run_id) == run_id for r in rs_),
                                                60, "the run's completion on Kafka")
                    finally:
                        await reader.stop()
                    scraped = [await scrape(addr) for addr in metrics.values()]
                    # The consumer processed the events (its log says nothing of them at WARNING).
                spans, points = await stop_and_collect(services, receiver)
    finally:
        for service in services:
            await service.stop()
        await tool.stop()

    needle = SECRET.encode()
    assert spans and points and reader.records
    assert {s.service for s in spans} >= {"agentrt-scheduler", "agentrt-executor", "agentrt-relay"}
    for span in spans:
        assert SECRET not in repr(span.attributes) and SECRET not in span.name, span.name
    for point in points:
        assert SECRET not in repr(point), point
    for record in reader.records:
        assert needle not in (record.value or b"") and needle not in (record.key or b""), record.event.type
        assert all(needle not in (value or b"") for _, value in record.headers)
    for text in scraped:
        assert text and SECRET not in text
    log_files = [*sorted(logs.glob("*.log")), tmp_path / "tansu.log"]
    assert len(log_files) >= 5
    for path in log_files:
        if path.exists():
            assert needle not in path.read_bytes(), path.name
    everything = await raw_tables(db)
    assert SECRET not in everything and "$sealed" in everything
    # Sealed in the ledger and the checkpoints as well as in the run's input.
    assert await db.fetchval("SELECT count(*) FROM tool_executions WHERE request_json::text LIKE '%$sealed%'") == 1
    assert await db.fetchval("SELECT count(*) FROM agent_checkpoints WHERE state_json::text LIKE '%$sealed%'") >= 1
