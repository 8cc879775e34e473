"""Relay benchmark: outbox → Kafka events/s from one relay, and commit-to-consumer latency at 1,000 events/s.

Setup: a scratch database on AGENTRT_BENCH_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/postgres; created, migrated, dropped), a
Tansu broker (or AGENTRT_BENCH_KAFKA_BOOTSTRAP), and one `agentrt relay`
process with its default settings (batch 500, 16 shards).

Each phase starts from a vacuumed outbox (the bench runs VACUUM between phases,
as autovacuum would; the local server may have autovacuum off).

1. Throughput: with the relay idle, one statement commits a backlog of
   checkpoint-like events (1,000 runs, interleaved); the clock runs from that
   commit until the last row is marked published (polled every 50 ms).
   Two trials; the figure is their mean. Baseline: the 10,000 events/s target.
2. Latency: 1,000 events/s offered open-loop for 20 s (one event per
   transaction, 16 writer connections); each event's commit time is taken
   when its INSERT returns; a consumer in its own process (assigned
   partitions, fetch wait 10 ms) stamps arrival. Baseline: the 100 ms p99 target.

Ratios are value / baseline (≥ 1 meets the throughput target, ≤ 1 the latency one).
Prints, last, one JSON line per figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from devstack.kafka_testing import TansuBroker
from scheduler.store.migrate import migrate

BENCH = "relay"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
TARGET_EVENTS_PER_S = 10_000.0
TARGET_P99_MS = 100.0
BACKLOG_RUNS, BACKLOG_PER_RUN = 1_000, 50
OFFERED_RATE, OFFERED_SECONDS, WRITERS = 1_000, 20, 16

PREFILL = """
INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version, traceparent)
SELECT gen_random_uuid(), r.id, r.tenant_id, 'agent.checkpoint',
       jsonb_build_object('step_key', 'step-' || s, 'version', s, 'state_hash', md5(r.id::text || s),
                          'schema_version', 1, 'tokens', 512 + s),
       1, s, '00-' || md5(r.id::text) || '-' || substr(md5(s::text), 1, 16) || '-01'
FROM generate_series($1::int, $2::int) AS s
CROSS JOIN (SELECT id, tenant_id FROM agent_runs WHERE agent_name = 'bench-backlog') AS r
ORDER BY s, r.id
"""
INSERT_ONE = """
INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version)
VALUES ($1, $2, 'tenant-bench', 'agent.checkpoint',
        jsonb_build_object('step_key', 'live', 'version', $3::int, 'tokens', 512), 1, $3)
"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def with_database(url: str, database: str) -> str:
    return urlsplit(url)._replace(path=f"/{database}").geturl()


def figure(name: str, value: float, unit: str, baseline: float) -> dict[str, Any]:
    return {"bench": BENCH, "figure": name, "value": round(value, 3), "unit": unit, "baseline": baseline,
            "ratio": round(value / baseline, 3)}


async def admin(url: str, statement: str) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def wait_for(check: Any, within_s: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {within_s:g}s")
        await asyncio.sleep(interval)


async def vacuum_between_phases(db: asyncpg.Connection) -> None:
    # Each phase starts from a vacuumed outbox, as autovacuum (tuned for the outbox by
    # migration 0002) would leave it; the bench server may run with autovacuum off.
    await db.execute("VACUUM (ANALYZE) outbox")


async def throughput_trial(db: asyncpg.Connection, first: int, last: int) -> tuple[int, float]:
    await vacuum_between_phases(db)
    started = time.perf_counter()
    status = await db.execute(PREFILL, first, last)
    committed = time.perf_counter()
    count = int(status.split()[-1])
    log(f"  backlog of {count} events committed in {committed - started:.2f}s")

    async def drained() -> bool:
        return not await db.fetchval("SELECT EXISTS (SELECT 1 FROM outbox WHERE published_at IS NULL)")

    await wait_for(drained, 300, "backlog publish")
    return count, time.perf_counter() - committed


async def consume_to_file(bootstrap: str, topic: str, out_path: str) -> None:
    """Child process: stamps each event's arrival (ce_id, unix time) into a file until killed."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in await producer.partitions_for(topic)]
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10,
                                auto_offset_reset="latest")
    await consumer.start()
    consumer.assign(partitions)
    await consumer.seek_to_end(*partitions)
    for tp in partitions:
        await consumer.position(tp)
    print("ready", flush=True)
    with open(out_path, "w", buffering=1) as out:  # noqa: ASYNC230 (small appends, own process)
        while True:
            batches = await consumer.getmany(timeout_ms=50)
            now = time.time()
            for records in batches.values():
                for record in records:
                    out.write(f"{dict(record.headers)['ce_id'].decode()} {now:.6f}\n")


def read_arrivals(path: Path) -> dict[uuid.UUID, float]:
    arrived: dict[uuid.UUID, float] = {}
    with contextlib.suppress(FileNotFoundError), open(path) as lines:
        for line in lines:
            parts = line.split()
            if len(parts) == 2:
                arrived.setdefault(uuid.UUID(parts[0]), float(parts[1]))
    return arrived


async def latency_phase(db_url: str, db: asyncpg.Connection, bootstrap: str, topic: str,
                        work_dir: Path) -> list[float]:
    runs = [uuid.uuid4() for _ in range(400)]
    await db.executemany("INSERT INTO agent_runs (id, tenant_id, agent_name) VALUES ($1, 'tenant-bench', 'live')",
                         [(r,) for r in runs])
    arrivals_path = work_dir / "arrivals.txt"
    consumer = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.bench_relay", "--consume", bootstrap, topic, str(arrivals_path), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE)
    try:
        assert consumer.stdout is not None
        ready = await asyncio.wait_for(consumer.stdout.readline(), 60)
        if ready.strip() != b"ready":
            raise RuntimeError("the consumer process did not start")
        total = OFFERED_RATE * OFFERED_SECONDS
        committed_at: dict[uuid.UUID, float] = {}
        queue: asyncio.Queue[tuple[uuid.UUID, uuid.UUID, int] | None] = asyncio.Queue()

        async def writer() -> None:
            conn = await asyncpg.connect(db_url)
            try:
                while (item := await queue.get()) is not None:
                    event_id, run_id, version = item
                    await conn.execute(INSERT_ONE, event_id, run_id, version)
                    committed_at[event_id] = time.time()
            finally:
                await conn.close()

        writers = [asyncio.create_task(writer()) for _ in range(WRITERS)]
        start = time.perf_counter()
        behind = 0
        for i in range(total):
            target = start + i / OFFERED_RATE
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -0.05:
                behind += 1
            queue.put_nowait((uuid.uuid4(), runs[i % len(runs)], i))
        for _ in writers:
            queue.put_nowait(None)
        await asyncio.gather(*writers)
        offered_s = time.perf_counter() - start
        log(f"  offered {total} events in {offered_s:.1f}s ({total / offered_s:.0f}/s; "
            f"{behind} scheduled >50 ms late)")

        arrived: dict[uuid.UUID, float] = {}

        async def all_arrived() -> bool:
            arrived.update(read_arrivals(arrivals_path))
            return all(e in arrived for e in committed_at)

        with contextlib.suppress(TimeoutError):
            await wait_for(all_arrived, 60, "every event at the consumer", interval=0.2)
    finally:
        if consumer.returncode is None:
            consumer.terminate()
            await consumer.wait()
    latencies = [(arrived[e] - committed_at[e]) * 1000 for e in committed_at if e in arrived]
    marks = {r["event_id"]: r["published_at"].timestamp() for r in await db.fetch(
        "SELECT event_id, published_at FROM outbox WHERE event_id = ANY($1::uuid[])", list(committed_at))
        if r["published_at"] is not None}
    to_mark = [(marks[e] - committed_at[e]) * 1000 for e in committed_at if e in marks]
    after_mark = [(arrived[e] - marks[e]) * 1000 for e in committed_at if e in marks and e in arrived]
    if to_mark and after_mark:
        log(f"  commit to mark (relay: claim, publish, ack, mark) p50 {percentile(to_mark, 0.5):.1f} ms, "
            f"p99 {percentile(to_mark, 0.99):.1f} ms; mark to consumer p50 {percentile(after_mark, 0.5):.1f} ms, "
            f"p99 {percentile(after_mark, 0.99):.1f} ms (negative: the consumer got it before the mark)")
    if len(latencies) != total:
        missing = [e for e in committed_at if e not in arrived]
        rows = await db.fetch("SELECT id, published_at, created_at FROM outbox WHERE event_id = ANY($1::uuid[]) "
                              "ORDER BY id", missing)
        log(f"  missing {len(missing)}: first {rows[:2]}, last {rows[-2:]}")
        raise RuntimeError(f"only {len(latencies)} of {total} events arrived")
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main() -> int:
    server = os.environ.get("AGENTRT_BENCH_DATABASE_URL") or DEFAULT_URL
    name = f"agentrt_bench_relay_{secrets.token_hex(4)}"
    await admin(server, f'CREATE DATABASE "{name}"')
    db_url = with_database(server, name)
    broker: TansuBroker | None = None
    relay: subprocess.Popen[bytes] | None = None
    figures: list[dict[str, Any]] = []
    try:
        db = await asyncpg.connect(db_url)
        await migrate(db)
        log(f"database {name} on {urlsplit(server).netloc}: fsync {await db.fetchval('SHOW fsync')}, "
            f"synchronous_commit {await db.fetchval('SHOW synchronous_commit')}; "
            f"autovacuum {await db.fetchval('SHOW autovacuum')} (the bench vacuums the outbox between phases); "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (shared machine)")
        bootstrap = os.environ.get("AGENTRT_BENCH_KAFKA_BOOTSTRAP")
        if not bootstrap:
            broker = TansuBroker().start()
            bootstrap = broker.bootstrap
        topic = f"bench.relay.{secrets.token_hex(4)}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
        env.update(AGENTRT_DATABASE_URL=db_url, AGENTRT_KAFKA_BOOTSTRAP=bootstrap, AGENTRT_TOPIC=topic,
                   AGENTRT_HEALTH_ADDR="127.0.0.1:0", AGENTRT_LOG_LEVEL="WARNING",
                   AGENTRT_LAG_REPORT_INTERVAL_S="3600", AGENTRT_RETENTION_INTERVAL_S="3600")
        relay = subprocess.Popen([sys.executable, "-m", "cli", "relay"], cwd=ROOT, env=env)  # noqa: ASYNC220
        await wait_for(lambda: db.fetchval("SELECT count(*) > 0 FROM relay_shards WHERE owner IS NOT NULL"), 60,
                       "relay start")
        await db.execute("INSERT INTO agent_runs (id, tenant_id, agent_name) "
                         "SELECT gen_random_uuid(), 'tenant-' || (g % 10), 'bench-backlog' "
                         "FROM generate_series(1, $1) g", BACKLOG_RUNS)

        rates = []
        for trial in range(2):
            first = trial * BACKLOG_PER_RUN + 1
            log(f"throughput trial {trial + 1}: {BACKLOG_RUNS} runs x {BACKLOG_PER_RUN} events")
            count, elapsed = await throughput_trial(db, first, first + BACKLOG_PER_RUN - 1)
            rates.append(count / elapsed)
            log(f"  {count} events published in {elapsed:.2f}s = {count / elapsed:,.0f} events/s")
        rate = statistics.mean(rates)
        figures.append(figure("outbox_to_kafka_events_per_s", rate, "events/s", TARGET_EVENTS_PER_S))

        log(f"latency: {OFFERED_RATE} events/s offered for {OFFERED_SECONDS}s")
        await vacuum_between_phases(db)
        with tempfile.TemporaryDirectory(prefix="bench-relay-") as work_dir:
            latencies = await latency_phase(db_url, db, bootstrap, topic, Path(work_dir))
        p50, p99 = percentile(latencies, 0.50), percentile(latencies, 0.99)
        log(f"  commit-to-consumer p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(latencies):.1f} ms")
        figures.append(figure("commit_to_consumer_p50_ms_at_1000_per_s", p50, "ms", TARGET_P99_MS))
        figures.append(figure("commit_to_consumer_p99_ms_at_1000_per_s", p99, "ms", TARGET_P99_MS))
        await db.close()
    finally:
        if relay is not None:
            relay.terminate()
            try:
                relay.wait(30)
            except subprocess.TimeoutExpired:
                relay.kill()
                relay.wait(10)
        if broker is not None:
            broker.stop()
        with contextlib.suppress(Exception):
            await admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    for item in figures:
        print(json.dumps(item), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--consume"]:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(consume_to_file(*sys.argv[2:5]))
        sys.exit(0)
    sys.exit(asyncio.run(main()))
