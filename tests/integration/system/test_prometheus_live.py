"""A real Prometheus (Debian's `prometheus` binary) scrapes a live scheduler, executor, relay and
consumer, loads the chart's alert rules, and evaluates every rule and every dashboard query without
error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import helm_python as helm
import pytest
import yaml
from executor_support import executor, scripted_agent, wait_for, write_agent
from support import scheduler_stack, submit

from devstack.embedded_pg import free_port
from devstack.kafka_testing import kafka_for_tests
from relay.config import RelaySettings
from relay.main import RelayServer
from shared.client.consumer import ConsumerSettings, EventConsumer
from shared.client.consumer_metrics import ConsumerCollector
from shared.metrics import Metrics

pytestmark = [pytest.mark.integration, pytest.mark.kafka]
CHART = Path(__file__).resolve().parents[3] / "helm" / "agentrt"
PROMETHEUS = shutil.which("prometheus")


def chart_rules() -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render({"prometheusRule": {"enabled": True}}, name="demo", namespace="agents",
                                 is_install=True)
    docs = [d for path, text in manifests.items() if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def dashboard_queries() -> list[str]:
    boards = [json.loads(path.read_text()) for path in sorted((CHART / "dashboards").glob("*.json"))]
    return [t["expr"] for board in boards for panel in board["panels"] for t in panel.get("targets", [])]


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus; .ci/run does)")
async def test_a_real_prometheus_evaluates_every_rule_and_dashboard_query(db_url, tmp_path):
    groups = chart_rules()
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{**g, "interval": "1s"} for g in groups]}))
    agents = tmp_path / "agents"
    write_agent(agents, scripted_agent("prom-agent", [{"id": "done", "finish": {"ok": True}}], []))
    async with scheduler_stack(db_url, metrics_addr="127.0.0.1:0") as stack, \
            relay_and_consumer(db_url, tmp_path) as (relay, consumer_port):
        await submit(stack, agent="prom-agent")
        async with executor(stack, agents, metrics_addr="127.0.0.1:0") as worker:
            targets = [f"127.0.0.1:{port}" for port in (stack.server.metrics_port, worker.metrics_port,
                                                         relay.metrics_port, consumer_port)]
            port = free_port()
            (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(tmp_path / "rules.yaml")],
                "scrape_configs": [{"job_name": "agentrt", "static_configs": [{"targets": targets}]}]}))
            proc = await asyncio.create_subprocess_exec(
                str(PROMETHEUS), f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                stdout=asyncio.subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("wb"))
            try:
                await check_prometheus(f"http://127.0.0.1:{port}", groups)
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 20)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


@contextlib.asynccontextmanager
async def relay_and_consumer(db_url: str, tmp_path: Path) -> AsyncIterator[tuple[RelayServer, int]]:
    """A relay and a consumer (the library, its collector on a registry of its own) on a test broker."""
    with kafka_for_tests(tmp_path / "tansu.log") as (bootstrap, _broker):
        topic = f"prom-{uuid.uuid4().hex[:8]}"
        relay = RelayServer(RelaySettings(
            database_url=db_url, kafka_bootstrap=bootstrap, topic=topic, health_addr="127.0.0.1:0",
            metrics_addr="127.0.0.1:0", shard_count=2, busy_poll_ms=5, idle_poll_ms=100, lag_report_interval_s=1,
            shutdown_grace_s=5, startup_timeout_s=10))
        consumer = EventConsumer(ConsumerSettings(
            database_url=db_url, kafka_bootstrap=bootstrap, topics=[topic], group_id=f"prom-{topic}",
            dead_letter_topic=f"{topic}.dlq", fetch_max_wait_ms=50, session_timeout_ms=2_000,
            heartbeat_interval_ms=500), _ignore)
        exported = Metrics("consumer")
        exported.registry.register(ConsumerCollector(consumer))
        await relay.start()
        stop = asyncio.Event()
        task = None
        try:
            await consumer.start()
            task = asyncio.create_task(consumer.run(stop))
            port = exported.serve("127.0.0.1:0")
            assert port is not None
            yield relay, port
        finally:
            stop.set()
            if task is not None:
                await task
            await consumer.stop()
            exported.stop()
            await relay.stop()


async def _ignore(event: Any, conn: Any) -> None:
    return None


async def check_prometheus(base: str, groups: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        async def get(path: str, **params: str) -> Any:
            try:
                async with http.get(f"{base}{path}", params=params) as reply:
                    return await reply.json() if reply.status == 200 else None
            except (aiohttp.ClientError, TimeoutError):
                return None

        async def scraped() -> bool:
            answer = await get("/api/v1/targets")
            active = (answer or {}).get("data", {}).get("activeTargets", [])
            return len(active) == 4 and all(t["health"] == "up" for t in active)

        await wait_for(scraped, within=60, what="Prometheus to scrape the scheduler, executor, relay and consumer",
                       interval=0.5)
        names = set((await get("/api/v1/label/__name__/values"))["data"])
        assert {"agentrt_runs", "agentrt_rpc_total", "agentrt_work_refusals_total"} & names, sorted(names)[:20]

        async def delivered() -> bool:
            # The run's events went outbox → relay → Kafka → consumer, as Prometheus saw it.
            published = await get("/api/v1/query", query="sum(agentrt_relay_published_total)")
            applied = await get("/api/v1/query", query="sum(agentrt_consumer_applied_total)")
            values = [float(r["data"]["result"][0]["value"][1]) if r and r["data"]["result"] else 0.0
                      for r in (published, applied)]
            return all(v >= 1 for v in values)

        await wait_for(delivered, within=60, what="the relay's and the consumer's counts scraped", interval=0.5)

        async def rules_evaluated() -> bool:
            answer = await get("/api/v1/rules")
            rules = [r for g in (answer or {}).get("data", {}).get("groups", []) for r in g["rules"]]
            return len(rules) == sum(len(g["rules"]) for g in groups) and all(
                r.get("lastEvaluation", "").startswith("2") and not r["lastEvaluation"].startswith("0001")
                for r in rules)

        await wait_for(rules_evaluated, within=30, what="every rule evaluated once", interval=0.5)
        answer = await get("/api/v1/rules")
        rules = [r for g in answer["data"]["groups"] for r in g["rules"]]
        assert all(r["health"] == "ok" and not r.get("lastError") for r in rules), \
            [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        failures = []
        for expr in [r["expr"] for g in groups for r in g["rules"]] + dashboard_queries():
            result = await get("/api/v1/query", query=expr)
            if result is None or result.get("status") != "success":
                failures.append(expr)
        assert not failures, failures
