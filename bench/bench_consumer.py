"""Consumer benchmark: events/s the exactly-once consumer applies, a transaction per batch against one per event.

Setup: a scratch database on AGENTRT_BENCH_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/postgres; created, dropped) for the consumer's dedupe table
and a business table, and a Tansu broker (or AGENTRT_BENCH_KAFKA_BOOTSTRAP). EVENTS agent events
of RUNS runs (keyed by run, so spread over the topic's partitions) are produced to a topic once.

Each round is a fresh consumer group reading the whole topic from the start with
`shared.client.consumer.EventConsumer` and a handler that inserts one row per event; the clock runs
from the first applied event (after the group join) until every event is applied. Rounds
alternate between `apply_batch_max=1` (a transaction per event: the behaviour before batching)
and the default (100), twice each; the figures are the means. Baseline: the one-per-event rate
measured in the same run, so the ratio is the speed-up of batching on this machine and server
(its commits flush WAL: synchronous_commit on).

Prints, last, one JSON line per figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import time
import uuid

import asyncpg
from aiokafka import AIOKafkaProducer

from bench._pg import emit, figure, log, scratch_database
from devstack.kafka_testing import TansuBroker
from shared.client.consumer import SQL_CREATE_CONSUMED_EVENTS, ConsumerSettings, EventConsumer
from shared.cloudevents import encode_headers, format_time

EVENTS = int(os.environ.get("AGENTRT_BENCH_CONSUMER_EVENTS", "20000"))
RUNS = 200
EFFECTS_DDL = "CREATE TABLE bench_effects (event_id uuid NOT NULL, run_id uuid NOT NULL, sequence bigint NOT NULL)"


async def _produce(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=5)
    await producer.start()
    try:
        runs = [uuid.uuid4() for _ in range(RUNS)]
        now = format_time(dt.datetime.now(dt.UTC))
        sends = []
        for n in range(1, EVENTS + 1):
            run_id = runs[n % RUNS]
            headers = encode_headers(event_id=uuid.uuid4(), event_type="agent.checkpoint", source="bench",
                                     run_id=run_id, time=now, tenant_id="bench", fencing_token=1, run_version=n,
                                     outbox_id=n, traceparent=None, tracestate=None)
            sends.append(await producer.send(topic, key=str(run_id).encode(), value=json.dumps({"n": n}).encode(),
                                             headers=headers))
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def _round(db_url: str, bootstrap: str, topic: str, batch_max: int) -> float:
    async def handler(event, conn) -> None:  # type: ignore[no-untyped-def]
        await conn.execute("INSERT INTO bench_effects (event_id, run_id, sequence) VALUES ($1, $2, $3)",
                           event.id, event.run_id, event.sequence)

    settings = ConsumerSettings(database_url=db_url, kafka_bootstrap=bootstrap, topics=[topic],
                                group_id=f"bench-{uuid.uuid4().hex[:8]}", apply_batch_max=batch_max,
                                fetch_max_wait_ms=50, session_timeout_ms=2_000, heartbeat_interval_ms=500)
    consumer = EventConsumer(settings, handler)
    await consumer.start()
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        deadline = time.perf_counter() + 600
        first: tuple[float, int] | None = None  # the clock starts at the first applied event (after the group join)
        while consumer.stats.applied < EVENTS:
            if time.perf_counter() > deadline or task.done():
                raise RuntimeError(f"applied {consumer.stats.applied} of {EVENTS} (batch {batch_max})")
            if first is None and consumer.stats.applied:
                first = (time.perf_counter(), consumer.stats.applied)
            await asyncio.sleep(0.005)
        assert first is not None
        elapsed = time.perf_counter() - first[0]
    finally:
        stop.set()
        await task
        await consumer.stop()
    return (EVENTS - first[1]) / elapsed


async def main() -> None:
    external = os.environ.get("AGENTRT_BENCH_KAFKA_BOOTSTRAP")
    with contextlib.ExitStack() as stack:
        bootstrap = external or stack.enter_context(TansuBroker()).bootstrap
        topic = f"bench.consumer.{uuid.uuid4().hex[:8]}"
        async with scratch_database("agentrt_bench_consumer") as db_url:
            conn = await asyncpg.connect(db_url)
            try:
                await conn.execute(EFFECTS_DDL)
                await conn.execute(SQL_CREATE_CONSUMED_EVENTS)
            finally:
                await conn.close()
            await _produce(bootstrap, topic)
            log(f"produced {EVENTS} events of {RUNS} runs to {topic}")
            rates: dict[int, list[float]] = {1: [], 100: []}
            for batch_max in (1, 100, 1, 100):
                conn = await asyncpg.connect(db_url)
                try:
                    await conn.execute("TRUNCATE bench_effects, consumed_events")
                finally:
                    await conn.close()
                rate = await _round(db_url, bootstrap, topic, batch_max)
                rates[batch_max].append(rate)
                log(f"apply_batch_max={batch_max}: {rate:.0f} events/s")
    one, batched = (sum(rates[k]) / len(rates[k]) for k in (1, 100))
    emit([figure("consumer", "events applied per second, one transaction per event", one, "events/s"),
          figure("consumer", "events applied per second, a transaction per batch (apply_batch_max=100)", batched,
                 "events/s", baseline=one, ratio=batched / one)])


if __name__ == "__main__":
    asyncio.run(main())
