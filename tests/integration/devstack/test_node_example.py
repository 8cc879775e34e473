"""The Node.js example in docs/examples/node, run as written against the real stack: scheduler,
executor and relay as processes, a Kafka-protocol broker, PostgreSQL. It submits (and retries the
submit), waits for the approval, approves (and retries the approval), waits for the end, and consumes
the run's events with its own dedupe table; a second consumer pass from the beginning applies nothing.

Needs `node` and `npm` (the example's dependencies install from its package-lock.json)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from aiohttp import web
from executor_support import scripted_agent, write_agent
from tests_paths import REPO

from devstack.embedded_pg import free_port
from devstack.kafka_testing import kafka_for_tests
from devstack.services import Service

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

EXAMPLE = REPO / "docs" / "examples" / "node"


@pytest.fixture(scope="module")
def node_example() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed")
    if not (EXAMPLE / "node_modules" / "kafkajs").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=EXAMPLE, check=True,
                       capture_output=True, timeout=600)
    return EXAMPLE


class RefundTool:
    """POST /refund keeps the refunds it made (its own store) and answers with a refund id."""

    def __init__(self) -> None:
        self.refunds: list[dict] = []
        self.port = free_port()
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()

        async def refund(request: web.Request) -> web.Response:
            key = request.headers.get("Idempotency-Key")
            body = await request.json()
            for done in self.refunds:
                if done["key"] == key:
                    return web.json_response({"id": done["id"]})
            self.refunds.append({"key": key, "id": f"rf-{len(self.refunds) + 1}", **body})
            return web.json_response({"id": self.refunds[-1]["id"]})

        app.router.add_post("/refund", refund)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def run_node(args: list[str], env: dict[str, str], within: float = 120) -> list[dict]:
    proc = await asyncio.create_subprocess_exec("node", str(EXAMPLE / "refund.mjs"), *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), within)
    assert proc.returncode == 0, (out.decode(), err.decode())
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


async def test_the_node_example_submits_approves_and_consumes_exactly_once(db_url, db, tmp_path: Path,
                                                                          node_example: Path):
    tool = RefundTool()
    url = await tool.start()
    agents = tmp_path / "agents"
    write_agent(agents, scripted_agent(
        "refunds", [{"id": "refund", "tool": "shop.refund", "args": {"order_id": "${input.order_id}",
                                                                  "amount": "${input.amount}"}},
                    {"id": "done", "finish": {"refund_id": "${results.refund.response.id}"}}],
        [{"name": "shop.refund", "kind": "http", "url": f"{url}/refund", "timeout_s": 5,
          "contract": {"requires_approval": True, "idempotent": True}}]))
    logs = tmp_path / "logs"
    logs.mkdir()
    listen = f"127.0.0.1:{free_port()}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRT_", "OTEL_"))}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH")]))
    services: list[Service] = []
    try:
        with kafka_for_tests(tmp_path / "tansu.log") as (bootstrap, _broker):
            env = {**base, "AGENTRT_DATABASE_URL": db_url, "AGENTRT_KAFKA_BOOTSTRAP": bootstrap,
                   "AGENTRT_AUTH_MODE": "none", "AGENTRT_SHUTDOWN_GRACE_S": "2", "AGENTRT_CLAIM_WAIT_MS": "500"}
            scheduler = Service("scheduler", ["scheduler"], {**env, "AGENTRT_LISTEN_ADDR": listen}, logs,
                                health_addr=listen)
            scheduler.start()
            services.append(scheduler)
            await scheduler.wait_healthy(60)
            relay_health, exec_health = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
            relay = Service("relay", ["relay"], {**env, "AGENTRT_HEALTH_ADDR": relay_health}, logs,
                            health_addr=relay_health)
            executor = Service("executor", ["executor"], {
                **env, "AGENTRT_SCHEDULER_ADDR": listen, "AGENTRT_AGENTS_PATH": str(agents),
                "AGENTRT_HEALTH_ADDR": exec_health}, logs, health_addr=exec_health)
            for service in (relay, executor):
                service.start()
                services.append(service)
            await asyncio.gather(relay.wait_healthy(60), executor.wait_healthy(60))

            node_env = {"PATH": os.environ["PATH"], "AGENTRT_ADDR": listen, "AGENTRT_TENANT": "acme",
                        "KAFKA_BOOTSTRAP": bootstrap, "DATABASE_URL": db_url, "CONSUMER_NAME": "shop-refunds"}
            steps = {line["step"]: line for line in await run_node([], node_env)}
            run_id = steps["submitted"]["run_id"]
            assert steps["submitted"]["created"] is True and steps["submitted"]["retry_created"] is False
            assert steps["submitted"]["same_run"] is True
            assert steps["conflict"] == {"step": "conflict", "code": "ALREADY_EXISTS", "reason": "ALREADY_EXISTS"}
            assert steps["paused"]["status"] == "RUN_STATUS_PAUSED_HUMAN"
            assert steps["approved"]["status_after_retry"] != "RUN_STATUS_PAUSED_HUMAN"
            assert steps["finished"]["status"] == "RUN_STATUS_COMPLETED"
            assert steps["finished"]["result"] == {"refund_id": "rf-1"}
            assert len(tool.refunds) == 1  # one refund, for all the retries

            events = await db.fetchval(
                "SELECT count(*) FROM outbox WHERE run_id = $1::uuid", run_id)
            first = steps["consumed"]
            assert first["applied"] >= 5 and first["applied"] + first["skipped"] >= events
            effects = await db.fetch("SELECT event_type FROM refund_effects WHERE run_id = $1::uuid", run_id)
            assert len(effects) == first["applied"]
            assert {"agent.run_submitted", "agent.run_paused", "agent.run_resumed", "agent.tool_succeeded",
                    "agent.run_completed"} <= {e["event_type"] for e in effects}

            # A second pass from the beginning (a new group: every record redelivered) applies nothing.
            again = {line["step"]: line for line in await run_node(["--consume-only", run_id], node_env)}
            assert again["consumed"]["applied"] == 0 and again["consumed"]["skipped"] >= first["applied"]
            assert await db.fetchval("SELECT count(*) FROM refund_effects WHERE run_id = $1::uuid",
                                     run_id) == len(effects)
    finally:
        for service in reversed(services):
            await service.stop()
        await tool.stop()
