"""A crash between the broker's ack and the outbox mark publishes duplicates; the consumer applies once.

Also: a failing handler is retried, then dead-lettered with its reason, and the
partition moves on; offsets are committed after the database commit. Consecutive
events of a partition share one transaction (apply_batch_max), a failing one
undoing only its own writes, with the same attempts as one at a time.
"""

from __future__ import annotations

import asyncio
import collections
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from relay_support import (
    TopicReader,
    insert_events,
    make_run,
    pending_count,
    relay_env,
    relay_settings,
    running_relay,
    start_relay_process,
    stop_process,
    unique_topic,
    wait_until,
)

from shared.client.consumer import DLQ_ATTEMPTS, DLQ_CONSUMER, DLQ_REASON, ConsumerSettings, EventConsumer

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

EFFECTS_DDL = """CREATE TABLE applied_effects (
  event_id uuid NOT NULL, run_id uuid NOT NULL, sequence bigint NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"""


def consumer_settings(db_url: str, bootstrap: str, topic: str, **overrides) -> ConsumerSettings:
    values = dict(database_url=db_url, kafka_bootstrap=bootstrap, topics=[topic],
                  group_id=f"g-{uuid.uuid4().hex[:8]}", dead_letter_topic=f"{topic}.dlq", fetch_max_wait_ms=50,
                  retry_backoff_base_ms=20, retry_backoff_cap_ms=100, max_attempts=3,
                  # Tansu holds a group join for half the session timeout.
                  session_timeout_ms=2_000, heartbeat_interval_ms=500)
    values.update(overrides)
    return ConsumerSettings(**values)


async def record_effect(event, conn) -> None:
    # No unique key on purpose: a second application would show up as a second row.
    await conn.execute("INSERT INTO applied_effects (event_id, run_id, sequence) VALUES ($1, $2, $3)",
                       event.id, event.run_id, event.sequence)


async def test_crash_after_ack_before_mark_duplicates_are_applied_once(db_url, db, kafka_bootstrap, tmp_path):
    await db.execute(EFFECTS_DDL)
    runs = [await make_run(db) for _ in range(5)]
    for run_id in runs:
        await insert_events(db, run_id, 10)
    topic = unique_topic()

    # Relay A publishes its first round, gets every ack, and SIGKILLs itself before marking.
    crashing = start_relay_process(relay_env(db_url, kafka_bootstrap, topic, batch_size=100,
                                             fault_point="after_broker_ack_before_outbox_mark", fault_round=1,
                                             relay_id="relay-a"), tmp_path / "relay-a.log")
    try:
        await wait_until(lambda: asyncio.sleep(0, crashing.poll() is not None), 30, "relay A to kill itself")
    finally:
        stop_process(crashing)
    assert crashing.returncode == -9, (tmp_path / "relay-a.log").read_text()
    assert await pending_count(db) == 50, "nothing may be marked: the crash came before the mark"

    reader = await TopicReader(kafka_bootstrap, [topic]).start()
    try:
        await reader.read_until(lambda rs: len(rs) >= 50, 30, "relay A's acknowledged events")
        # Relay B takes the shards over once A's leases expire and publishes everything again.
        survivor = start_relay_process(relay_env(db_url, kafka_bootstrap, topic, relay_id="relay-b"),
                                       tmp_path / "relay-b.log")
        try:
            await wait_until(lambda: _no_pending(db), 30, "relay B to publish and mark everything")
        finally:
            assert stop_process(survivor) == 0, (tmp_path / "relay-b.log").read_text()
        # SIGTERM is an orderly stop: shards handed back, membership left (relay A's row just expires).
        assert await db.fetchval("SELECT count(*) FROM relay_shards WHERE owner IS NOT NULL") == 0
        assert [r["relay_id"] for r in await db.fetch("SELECT relay_id FROM relay_members")] == ["relay-a"]
        await reader.read_until(lambda rs: len(rs) >= 100, 30, "the duplicates")
    finally:
        await reader.stop()
    copies = collections.Counter(r.event.id for r in reader.records)
    assert len(copies) == 50 and set(copies.values()) == {2}, "every event exactly twice in Kafka"

    consumer = EventConsumer(consumer_settings(db_url, kafka_bootstrap, topic), record_effect)
    await consumer.start()
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await wait_until(lambda: asyncio.sleep(0, consumer.stats.applied + consumer.stats.duplicates >= 100),
                         30, "the consumer to see all 100 records")
    finally:
        stop.set()
        await task
        await consumer.stop()
    assert (consumer.stats.applied, consumer.stats.duplicates) == (50, 50)
    effects = await db.fetch("SELECT * FROM applied_effects ORDER BY applied_at")
    assert len(effects) == 50 and len({e["event_id"] for e in effects}) == 50
    per_run = collections.defaultdict(list)
    for effect in effects:
        per_run[effect["run_id"]].append(effect["sequence"])
    assert all(seq == sorted(seq) for seq in per_run.values()), "each run applied in order"
    assert await db.fetchval("SELECT count(*) FROM consumed_events") == 50


async def _no_pending(db) -> bool:
    return await pending_count(db) == 0


@pytest.mark.parametrize("batch_max", [1, 100], ids=["one-per-transaction", "batched"])
async def test_failing_handler_is_retried_then_dead_lettered_and_the_partition_moves_on(
        db_url, db, kafka_bootstrap, batch_max):
    await db.execute(EFFECTS_DDL)
    run_id = await make_run(db)
    ids = await insert_events(db, run_id, 6, payload=lambda n: {"n": n, "poison": n == 2, "flaky": n == 4})
    settings = relay_settings(db_url, kafka_bootstrap)
    async with running_relay(settings):
        await wait_until(lambda: _no_pending(db), 30, "the relay to publish")
    # A record that is not an agentrt CloudEvent at all.
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        await producer.send_and_wait(settings.topic, key=str(run_id).encode(), value=b"{}")
    finally:
        await producer.stop()

    flaky_attempts = collections.Counter()
    calls = collections.Counter()

    async def handler(event, conn) -> None:
        calls[event.sequence] += 1
        await record_effect(event, conn)  # rolled back whenever the handler raises
        if event.payload["poison"]:
            raise RuntimeError("boom")
        if event.payload["flaky"] and flaky_attempts[event.id] < 1:
            flaky_attempts[event.id] += 1
            # An OSError from the handler's own network call is the handler's failure, not the database's.
            raise ConnectionResetError("downstream hiccup")

    csettings = consumer_settings(db_url, kafka_bootstrap, settings.topic, apply_batch_max=batch_max)
    consumer = EventConsumer(csettings, handler)
    await consumer.start()
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await wait_until(lambda: asyncio.sleep(0, consumer.stats.applied == 5 and consumer.stats.dead_lettered == 2),
                         30, "5 applied and 2 dead-lettered")
    finally:
        stop.set()
        await task
        await consumer.stop()

    effects = await db.fetch("SELECT sequence FROM applied_effects ORDER BY applied_at")
    assert [e["sequence"] for e in effects] == [ids[i] for i in (0, 1, 3, 4, 5)]
    assert consumer.stats.handler_failures == 3 + 1
    # A failure inside a batch is the event's first attempt: no extra call, batched or not.
    assert calls == {ids[0]: 1, ids[1]: 1, ids[2]: 3, ids[3]: 1, ids[4]: 2, ids[5]: 1}, calls

    dlq = await TopicReaderRaw.read(kafka_bootstrap, csettings.dead_letter_topic, 2)
    reasons = sorted(dict(r.headers)[DLQ_REASON].decode() for r in dlq)
    assert reasons == ["RuntimeError: boom", "malformed event: missing header ce_specversion"]
    by_reason = {dict(r.headers)[DLQ_REASON].decode(): dict(r.headers) for r in dlq}
    assert by_reason["RuntimeError: boom"][DLQ_ATTEMPTS] == b"3"
    assert by_reason["RuntimeError: boom"][DLQ_CONSUMER] == csettings.group_id.encode()
    assert by_reason["RuntimeError: boom"]["ce_sequence"].decode().lstrip("0") == str(ids[2])

    # Offsets were committed after the database commits: the group is at the end of every partition.
    check = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=csettings.group_id,
                             enable_auto_commit=False, session_timeout_ms=2_000, heartbeat_interval_ms=500)
    await check.start()
    try:
        partitions = [TopicPartition(settings.topic, p) for p in check.partitions_for_topic(settings.topic)]
        ends = await check.end_offsets(partitions)
        for tp in partitions:
            assert (await check.committed(tp) or 0) == ends[tp], tp
    finally:
        await check.stop()


async def test_consecutive_events_of_a_partition_commit_together_and_in_order(db_url, db, kafka_bootstrap):
    """apply_batch_max: a partition's events in hand share one transaction (one commit, one synchronous
    replication round trip), each still applied once and in order; at 1, every event has its own."""
    await db.execute(EFFECTS_DDL)
    await db.execute("ALTER TABLE applied_effects ADD COLUMN xid bigint NOT NULL DEFAULT txid_current()")
    run_id = await make_run(db)
    ids = await insert_events(db, run_id, 60)
    settings = relay_settings(db_url, kafka_bootstrap)
    async with running_relay(settings):
        await wait_until(lambda: _no_pending(db), 30, "the relay to publish")
    transactions = {}
    for batch_max in (100, 1):
        await db.execute("TRUNCATE applied_effects, consumed_events")
        consumer = EventConsumer(consumer_settings(db_url, kafka_bootstrap, settings.topic, apply_batch_max=batch_max),
                                 record_effect)
        await consumer.start()
        stop = asyncio.Event()
        task = asyncio.create_task(consumer.run(stop))
        try:
            await wait_until(lambda c=consumer: asyncio.sleep(0, c.stats.applied == 60), 30, "60 applied")
        finally:
            stop.set()
            await task
            await consumer.stop()
        effects = await db.fetch("SELECT sequence, xid FROM applied_effects ORDER BY applied_at")
        assert [e["sequence"] for e in effects] == ids, "each event once, in order"
        transactions[batch_max] = len({e["xid"] for e in effects})
    assert transactions[1] == 60
    # The broker hands the consumer what it has in one or a few fetches: a handful of transactions.
    assert transactions[100] <= 6, transactions


class TopicReaderRaw:
    @staticmethod
    async def read(bootstrap: str, topic: str, count: int) -> list:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"raw-{uuid.uuid4().hex[:8]}",
                                    auto_offset_reset="earliest", enable_auto_commit=False, fetch_max_wait_ms=50,
                                    session_timeout_ms=2_000, heartbeat_interval_ms=500)
        await consumer.start()
        records: list = []
        try:
            async def enough() -> bool:
                for batch in (await consumer.getmany(timeout_ms=100)).values():
                    records.extend(batch)
                return len(records) >= count

            await wait_until(enough, 30, f"{count} records on {topic}", interval=0)
        finally:
            await consumer.stop()
        return records
