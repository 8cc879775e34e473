"""A row Kafka will never take is parked and counted; its run waits behind it, other runs flow;
the operator's `agentrt outbox skip|retry` releases the run."""

from __future__ import annotations

import json

import pytest
from helpers import run_agentrt, without_settings
from relay_support import (
    TopicReader,
    insert_events,
    make_run,
    pending_count,
    relay_settings,
    running_relay,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

LIMIT = 4_096


async def cli(db_url: str, *args: str) -> tuple[int, str, str]:
    return await run_agentrt("outbox", *args, env=without_settings({"AGENTRT_DATABASE_URL": db_url}))


def poison_payload(n: int) -> dict:
    return {"n": n, "blob": "x" * (2 * LIMIT) if n == 1 else ""}


async def _pending_is(db, count: int) -> bool:
    return await pending_count(db) == count


async def _counter(db, name: str) -> int:
    return int(await db.fetchval("SELECT coalesce(max(value), 0) FROM runtime_counters WHERE name = $1", name))


def sequences_of(reader: TopicReader, run_id) -> list[int]:
    return [r.event.sequence for r in sorted(reader.records, key=lambda r: r.event.offset)
            if r.event.run_id == run_id]


async def test_poison_row_parks_its_run_until_the_operator_skips_it(db_url, db, kafka_bootstrap):
    poisoned = await make_run(db)
    others = [await make_run(db) for _ in range(2)]
    p_ids = await insert_events(db, poisoned, 4, payload=poison_payload)
    for run_id in others:
        await insert_events(db, run_id, 5)
    settings = relay_settings(db_url, kafka_bootstrap, max_message_bytes=LIMIT, max_batch_bytes=16_384)
    reader = await TopicReader(kafka_bootstrap, [settings.topic]).start()
    try:
        async with running_relay(settings) as relay:
            await wait_until(lambda: _pending_is(db, 3), 30, "everything but the poisoned run's tail published")
            parked = await db.fetchrow("SELECT * FROM outbox_parked")
            assert parked["outbox_id"] == p_ids[1] and parked["state"] == "PARKED"
            assert f"over max_message_bytes {LIMIT}" in parked["reason"]
            assert await _counter(db, "relay_outbox_parked") == 1

            # Other runs keep flowing while the poisoned run waits.
            more = await insert_events(db, others[0], 3, start_version=10)
            await reader.read_until(lambda rs: {r.event.sequence for r in rs} >= set(more), 30,
                                    "another run's new events")
            # A consumer can read an event before the relay has marked its row published (it marks after
            # the broker's ack): wait for the mark, then only the poisoned run's tail is left.
            await wait_until(lambda: _pending_is(db, 3), 30, "the new events marked published")
            assert sequences_of(reader, poisoned) == [p_ids[0]]

            code, out, err = await cli(db_url, "status")
            assert code == 0, err
            status = json.loads(out)
            assert (status["pending"], status["parked"], status["parked_total"]) == (3, 1, 1)
            assert set(status["shards"].values()) == {settings.relay_id}
            code, out, err = await cli(db_url, "parked")
            assert code == 0, err
            assert [row["outbox_id"] for row in json.loads(out)] == [p_ids[1]]
            code, out, err = await cli(db_url, "skip", str(p_ids[1]), "--operator", "alice",
                                       "--note", "payload too large for the topic")
            assert code == 0, err
            assert json.loads(out)["state"] == "SKIPPED"

            await wait_until(lambda: _pending_is(db, 0), 30, "the run's later events after the skip")
            await reader.read_until(lambda rs: len(rs) >= 1 + 2 * 5 + 3 + 2, 30, "every delivered event")
            assert relay.metrics.parked_total == 1
    finally:
        await reader.stop()

    assert sequences_of(reader, poisoned) == [p_ids[0], p_ids[2], p_ids[3]], "the skipped row never reached Kafka"
    row = await db.fetchrow("SELECT * FROM outbox_parked")
    assert (row["state"], row["resolved_by"], row["resolution_note"]) == (
        "SKIPPED", "alice", "payload too large for the topic")
    assert await _counter(db, "relay_outbox_parked") == 1, "parked once, not once per round"
    assert await _counter(db, "relay_outbox_skipped") == 1
    audit = await db.fetch("SELECT * FROM audit_log")  # the skip, in its own statement's transaction
    assert [(a["action"], a["principal"], a["principal_kind"], a["reason"], a["run_id"]) for a in audit] == [
        ("outbox.skip", "local:alice", "local", "payload too large for the topic", poisoned)]
    assert audit[0]["state_after"]["state"] == "SKIPPED" and audit[0]["evidence"]["event_type"]

    code, _, err = await cli(db_url, "skip", str(p_ids[1]), "--note", "again")
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentrt outbox: error: "), err
    assert lines[0].endswith(f"outbox row {p_ids[1]} is SKIPPED, not PARKED")


async def test_retry_reparks_while_refused_then_delivers_in_order(db_url, db, kafka_bootstrap):
    poisoned = await make_run(db)
    other = await make_run(db)
    p_ids = await insert_events(db, poisoned, 4, payload=poison_payload)
    strict = relay_settings(db_url, kafka_bootstrap, max_message_bytes=LIMIT, max_batch_bytes=16_384)
    reader = await TopicReader(kafka_bootstrap, [strict.topic]).start()
    try:
        async with running_relay(strict):
            await wait_until(lambda: _pending_is(db, 3), 30, "the poisoned row parked")
            code, out, err = await cli(db_url, "retry", str(p_ids[1]), "--operator", "bob")
            assert code == 0, err
            assert json.loads(out)["state"] == "RETRY"
            # Still too large for this relay: parked again, counted again.
            await wait_until(lambda: db.fetchval("SELECT park_count = 2 AND state = 'PARKED' FROM outbox_parked"),
                             30, "the retried row to be parked again")
            assert await _counter(db, "relay_outbox_parked") == 2

        # The operator raises the limit, then retries.
        lenient = relay_settings(db_url, kafka_bootstrap, topic=strict.topic)
        async with running_relay(lenient):
            await insert_events(db, other, 1)
            await wait_until(lambda: _pending_is(db, 3), 30, "the new relay to run while the row stays parked")
            code, _, err = await cli(db_url, "retry", str(p_ids[1]))
            assert code == 0, err
            await wait_until(lambda: _pending_is(db, 0), 30, "the retried row and its run's tail")
            await reader.read_until(lambda rs: len(sequences_of(reader, poisoned)) >= 4, 30, "the poisoned run")
    finally:
        await reader.stop()
    assert sequences_of(reader, poisoned) == p_ids, "the run's order held across park and retry"
    assert await db.fetchval("SELECT state FROM outbox_parked") == "DELIVERED"
    retries = await db.fetch("SELECT action, principal FROM audit_log ORDER BY id")
    assert [r["action"] for r in retries] == ["outbox.retry", "outbox.retry"] and retries[0]["principal"] == "local:bob"
