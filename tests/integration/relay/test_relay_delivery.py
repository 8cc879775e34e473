"""Every outbox row reaches Kafka, with the right key, payload and CloudEvents headers."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest
from relay_support import (
    TopicReader,
    first_occurrence_order_ok,
    insert_events,
    make_run,
    pending_count,
    relay_settings,
    running_relay,
    wait_until,
)
from support import claim, eid, lease_ref, scheduler_stack, submit

from relay.retention import purge_once
from relay.store import RelayStore
from shared.cloudevents import format_sequence, format_time
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = [pytest.mark.integration, pytest.mark.kafka]
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


async def test_every_row_reaches_kafka_with_headers_and_payload(db_url, db, kafka_bootstrap):
    # Realistic rows from the scheduler (with trace context) plus a bulk of direct ones.
    async with scheduler_stack(db_url) as stack:
        runs = [await submit(stack, payload={"i": i}) for i in range(3)]
        lease = await claim(stack)
        assert lease is not None
        await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=lease_ref(lease), expected_version=0, state_json='{"cursor": 1}', schema_version=1,
            step_key="s1", event_id=eid()))
    bulk_runs = [await make_run(db, tenant=f"tenant-{i % 3}") for i in range(10)]
    for i, run_id in enumerate(bulk_runs):
        await insert_events(db, run_id, 20, tenant=f"tenant-{i % 3}",
                            payload=lambda n, i=i: {"run": i, "n": n, "text": "ü ✓", "nested": {"a": [1, 2.5]}})
    rows = {r["event_id"]: r for r in await db.fetch("SELECT * FROM outbox")}
    assert len(rows) >= 3 + 1 + 200  # submits, the checkpoint, the bulk

    settings = relay_settings(db_url, kafka_bootstrap, batch_size=64)
    reader = await TopicReader(kafka_bootstrap, [settings.topic]).start()
    try:
        async with running_relay(settings) as relay:
            await wait_until(lambda: _zero(db), 30, "every row marked published")
            await reader.read_until(lambda rs: {r.event.id for r in rs} >= set(rows), 30, "every event in Kafka")
            assert relay.metrics.published_total == len(rows)
    finally:
        await reader.stop()

    assert len(reader.records) == len(rows), "no duplicates without failures"
    for received in reader.records:
        row = rows[received.event.id]
        headers = dict(received.headers)
        assert received.key == str(row["run_id"]).encode()
        assert json.loads(received.value) == row["payload"]
        assert headers["ce_specversion"] == b"1.0"
        assert headers["ce_id"] == str(row["event_id"]).encode()
        assert headers["ce_type"] == row["event_type"].encode()
        assert headers["ce_source"] == b"/agentrt"
        assert headers["ce_subject"] == str(row["run_id"]).encode()
        assert headers["ce_time"] == format_time(row["created_at"]).encode()
        assert headers["content-type"] == b"application/json"
        assert headers["ce_tenantid"] == row["tenant_id"].encode()
        assert headers["ce_fencingtoken"] == str(row["fencing_token"]).encode()
        assert headers["ce_runversion"] == str(row["run_version"]).encode()
        assert headers["ce_sequence"] == format_sequence(row["id"]).encode()
        if row["traceparent"]:
            assert headers["traceparent"] == row["traceparent"].encode()
        else:
            assert "traceparent" not in headers
        assert received.timestamp == (row["created_at"] - EPOCH) // dt.timedelta(milliseconds=1)
        event = received.event
        assert (event.run_id, event.tenant_id, event.fencing_token, event.run_version) == (
            row["run_id"], row["tenant_id"], row["fencing_token"], row["run_version"])
        assert event.time == row["created_at"].astimezone(dt.UTC)
    assert any(r["traceparent"] for r in rows.values()), "scheduler rows carry trace context"
    assert {r.event.type for r in reader.records} >= {"agent.run_submitted", "agent.checkpoint", "agent.test"}

    per_run = first_occurrence_order_ok(reader.records)
    for run_id, sequences in per_run.items():
        assert sequences == sorted(sequences), f"run {run_id} out of order"
    assert {uuid.UUID(r.run_id) for r in runs} <= set(per_run)


async def _zero(db) -> bool:
    return await pending_count(db) == 0


async def test_per_event_type_topics(db_url, db, kafka_bootstrap):
    run_id = await make_run(db)
    await insert_events(db, run_id, 3, event_type="agent.alpha")
    await insert_events(db, run_id, 2, event_type="agent.beta")
    settings = relay_settings(db_url, kafka_bootstrap, topic_policy="per_event_type")
    alpha, beta = settings.topic_for("agent.alpha"), settings.topic_for("agent.beta")
    assert alpha == f"{settings.topic}.agent.alpha"
    reader = await TopicReader(kafka_bootstrap, [alpha, beta]).start()
    try:
        async with running_relay(settings):
            await reader.read_until(lambda rs: len(rs) >= 5, 30, "five events on two topics")
    finally:
        await reader.stop()
    topics = sorted((r.event.topic, r.event.type) for r in reader.records)
    assert topics == [(alpha, "agent.alpha")] * 3 + [(beta, "agent.beta")] * 2


async def test_idle_relay_wakes_on_notify(db_url, db, kafka_bootstrap):
    # Idle poll is 30 s: only the NOTIFY (sent because the relay asked for wake-ups) can be this fast.
    settings = relay_settings(db_url, kafka_bootstrap, idle_poll_ms=30_000, busy_window_ms=0)
    run_id = await make_run(db)
    async with running_relay(settings):
        await wait_until(lambda: db.fetchval("SELECT bool_or(wants_wakeup) FROM relay_members"), 10,
                         "the idle relay to ask for wake-ups")
        await insert_events(db, run_id, 1)
        await wait_until(lambda: _zero(db), 5, "the notified relay to publish")


async def test_retention_deletes_only_old_published_rows_in_batches(db_url, db):
    run_id = await make_run(db)
    ids = await insert_events(db, run_id, 60)
    # A gap in the ids (rows deleted before) that the walk must jump over.
    await db.execute("DELETE FROM outbox WHERE id = ANY($1)", ids[10:30])
    old_published = ids[:10] + ids[30:45]
    published_recently, never_published, new_rows = ids[45:48], ids[48:52], ids[52:]
    await db.execute("UPDATE outbox SET created_at = now() - interval '3 days' WHERE id < $1", ids[52])
    await db.execute("UPDATE outbox SET published_at = now() - interval '2 days' WHERE id = ANY($1)", old_published)
    await db.execute("UPDATE outbox SET published_at = now() WHERE id = ANY($1) OR id = ANY($2)",
                     published_recently, new_rows)
    await db.execute("INSERT INTO consumed_events (consumer_name, event_id, consumed_at) "
                     "SELECT 'c', gen_random_uuid(), now() - interval '40 days' FROM generate_series(1, 12)")
    await db.execute("INSERT INTO consumed_events (consumer_name, event_id) VALUES ('c', gen_random_uuid())")
    settings = relay_settings(db_url, "127.0.0.1:9", published_retention_s=86_400,
                              consumed_retention_s=30 * 86_400, retention_batch_size=4)
    from relay.store import connect_pool

    pool = await connect_pool(db_url, min_size=1, max_size=2, command_timeout=10)
    try:
        deleted = await purge_once(RelayStore(pool), settings)
        again = await purge_once(RelayStore(pool), settings)
    finally:
        await pool.close()
    assert deleted == (25, 12) and again == (0, 0)
    left = [r["id"] for r in await db.fetch("SELECT id FROM outbox ORDER BY id")]
    assert left == published_recently + never_published + new_rows
    assert await db.fetchval("SELECT count(*) FROM consumed_events") == 1
