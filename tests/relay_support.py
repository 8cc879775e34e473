"""Helpers for the relay tests: settings, runs and outbox rows, reading topics, relay processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from helpers import wait_until
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from relay.config import RelaySettings
from relay.main import RelayServer
from shared.cloudevents import AgentEvent

REPO_ROOT = Path(__file__).resolve().parents[1]


def unique_topic(prefix: str = "t") -> str:
    return f"{prefix}.{uuid.uuid4().hex[:10]}"


def relay_settings(db_url: str, bootstrap: str, **overrides: Any) -> RelaySettings:
    values: dict[str, Any] = dict(
        database_url=db_url, kafka_bootstrap=bootstrap, topic=unique_topic(), health_addr="127.0.0.1:0",
        shard_count=8, shard_lease_ms=3_000, busy_poll_ms=5, idle_poll_ms=200, retention_interval_s=3_600,
        lag_report_interval_s=1, shutdown_grace_s=5, startup_timeout_s=10, kafka_request_timeout_ms=3_000,
        retry_backoff_base_ms=50, retry_backoff_cap_ms=1_000, relay_id=f"relay-{uuid.uuid4().hex[:6]}")
    values.update(overrides)
    return RelaySettings(**values)


@asynccontextmanager
async def running_relay(settings: RelaySettings, tracer_provider: Any = None) -> AsyncIterator[RelayServer]:
    """The relay in-process; without a tracer provider it records no spans (whatever this process set up)."""
    server = RelayServer(settings, tracer_provider or TracerProvider(sampler=ALWAYS_OFF))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def make_run(db: asyncpg.Connection, tenant: str = "tenant-a") -> uuid.UUID:
    run_id = uuid.uuid4()
    await db.execute("INSERT INTO agent_runs (id, tenant_id, agent_name) VALUES ($1, $2, 'demo')", run_id, tenant)
    return run_id


async def insert_events(db: asyncpg.Connection, run_id: uuid.UUID, count: int, *, tenant: str = "tenant-a",
                        event_type: str = "agent.test", payload: Callable[[int], Any] | None = None,
                        start_version: int = 1) -> list[int]:
    """Inserts `count` outbox rows for one run, one statement each; returns their ids."""
    ids = []
    for i in range(count):
        body = payload(i) if payload else {"n": i}
        ids.append(await db.fetchval(
            "INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
            uuid.uuid4(), run_id, tenant, event_type, body, 1, start_version + i))
    return ids


async def pending_count(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL"))


@dataclass
class Received:
    event: AgentEvent
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    timestamp: int


class TopicReader:
    """Reads whole topics from the beginning (no consumer group) and keeps everything it saw."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.records: list[Received] = []
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> TopicReader:
        # Assigned partitions, no group: a group join on Tansu takes half the session timeout.
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, enable_idempotence=False)
        await producer.start()
        try:
            partitions = [TopicPartition(topic, p) for topic in self.topics
                          for p in await producer.partitions_for(topic)]  # creates the topic on Tansu
        finally:
            await producer.stop()
        self._consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                          auto_offset_reset="earliest", fetch_max_wait_ms=50)
        await self._consumer.start()
        self._consumer.assign(partitions)
        await self._consumer.seek_to_beginning(*partitions)
        return self

    async def poll(self) -> int:
        assert self._consumer is not None
        batches = await self._consumer.getmany(timeout_ms=100)
        added = 0
        for records in batches.values():
            for r in records:
                self.records.append(Received(AgentEvent.from_record(r), r.key, r.value, list(r.headers),
                                             r.timestamp))
                added += 1
        return added

    async def read_until(self, done: Callable[[list[Received]], bool], within_s: float, what: str) -> None:
        async def check() -> bool:
            await self.poll()
            return done(self.records)

        await wait_until(check, within_s, what, interval=0)

    def event_ids(self) -> set[uuid.UUID]:
        return {r.event.id for r in self.records}

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None


def first_occurrence_order_ok(records: list[Received]) -> dict[uuid.UUID, list[int]]:
    """Per run, the outbox ids in the order they were first seen in Kafka (partition order)."""
    by_partition: dict[tuple[str, int], list[Received]] = {}
    for r in records:
        by_partition.setdefault((r.event.topic, r.event.partition), []).append(r)
    seen: set[uuid.UUID] = set()
    per_run: dict[uuid.UUID, list[int]] = {}
    for items in by_partition.values():
        for r in sorted(items, key=lambda x: x.event.offset):
            if r.event.id in seen:
                continue
            seen.add(r.event.id)
            per_run.setdefault(r.event.run_id, []).append(r.event.sequence)
    return per_run


def relay_env(db_url: str, bootstrap: str, topic: str, **extra: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
    env.update({
        "AGENTRT_DATABASE_URL": db_url, "AGENTRT_KAFKA_BOOTSTRAP": bootstrap, "AGENTRT_TOPIC": topic,
        "AGENTRT_HEALTH_ADDR": "127.0.0.1:0", "AGENTRT_SHARD_COUNT": "8", "AGENTRT_SHARD_LEASE_MS": "2000",
        "AGENTRT_IDLE_POLL_MS": "200", "AGENTRT_KAFKA_REQUEST_TIMEOUT_MS": "3000",
        "AGENTRT_LAG_REPORT_INTERVAL_S": "1", "AGENTRT_STARTUP_TIMEOUT_S": "10",
        "AGENTRT_RETRY_BACKOFF_BASE_MS": "50", "AGENTRT_RETRY_BACKOFF_CAP_MS": "1000",
    })
    env.update({f"AGENTRT_{k.upper()}": str(v) for k, v in extra.items()})
    return env


def start_relay_process(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "cli", "relay"], env=env, cwd=REPO_ROOT,
                                stdout=log, stderr=subprocess.STDOUT)


def stop_process(process: subprocess.Popen[bytes], timeout: float = 15) -> int:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
    return int(process.returncode)


def payload_of(received: Received) -> Any:
    return json.loads(received.value)
