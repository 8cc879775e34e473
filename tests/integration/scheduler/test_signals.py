"""Signals through the scheduler's API (issue 19): SignalRun queues, a claim delivers, a checkpoint
consumes exactly once, a signal wait parks the run and a signal of its name wakes it at once.

The executor's side (a scripted plan waiting for a signal, a crash between delivery and the
consuming checkpoint) is in tests/integration/executor/test_signal_runs.py.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from executor_support import wait_for
from support import Stack, claim, eid, lease_ref, reason_of, rpc_error, scheduler_stack, submit

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration


async def signal(stack: Stack, run_id: str, name: str, payload: Any = None, request_id: str = "",
                 tenant: str = "tenant-a") -> rs.SignalRunResponse:
    return await stack.runs.SignalRun(rs.SignalRunRequest(
        run_id=run_id, name=name, payload_json=json.dumps(payload) if payload is not None else "",
        request_id=request_id), metadata=stack.md(tenant))


async def signal_rows(db: Any, run_id: str) -> list[dict[str, Any]]:
    return [dict(r) for r in await db.fetch("SELECT * FROM run_signals WHERE run_id = $1::uuid ORDER BY id", run_id)]


async def save(stack: Stack, lease: ws.Lease, version: int, consume: list[int], state: dict | None = None) -> int:
    reply = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=lease_ref(lease), expected_version=version, state_json=json.dumps(state or {"n": version}),
        schema_version=1, event_id=eid(), consume_signal_seqs=consume))
    return int(reply.version)


async def park_for(stack: Stack, lease: ws.Lease, version: int, name: str, timeout_ms: int = 60_000,
                   seen: int | None = None) -> ws.FinishRunResponse:
    return await stack.work.FinishRun(ws.FinishRunRequest(
        lease=lease_ref(lease), expected_version=version, outcome=ws.FINISH_OUTCOME_SLEEP, sleep_ms=timeout_ms,
        wait_signal=name, signals_seen=lease.last_signal_seq if seen is None else seen, event_id=eid()))


async def test_signal_run_is_idempotent_by_request_id(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack)
        first = await signal(stack, run.run_id, "customer.reply", {"text": "yes"}, request_id="msg-1")
        assert first.created and first.signal.name == "customer.reply" and first.signal.seq > 0
        assert json.loads(first.signal.payload_json) == {"text": "yes"} and first.run.status == pb.RUN_STATUS_QUEUED
        again = await signal(stack, run.run_id, "customer.reply", {"text": "yes"}, request_id="msg-1")
        assert not again.created and again.signal == first.signal
        before = (await signal_rows(db, run.run_id), await db.fetchval("SELECT count(*) FROM outbox"))
        for name, payload in (("customer.reply", {"text": "no"}), ("other", {"text": "yes"})):
            error = await rpc_error(signal(stack, run.run_id, name, payload, request_id="msg-1"))
            assert error.code() == grpc.StatusCode.ALREADY_EXISTS
        assert (await signal_rows(db, run.run_id), await db.fetchval("SELECT count(*) FROM outbox")) == before
        # Without a request id every call is a new signal; the same id on another run is another signal.
        other = await submit(stack)
        assert (await signal(stack, other.run_id, "customer.reply", request_id="msg-1")).created
        assert (await signal(stack, run.run_id, "customer.reply")).created
        assert len(await signal_rows(db, run.run_id)) == 2
        events = [r["event_type"] for r in await db.fetch(
            "SELECT event_type FROM outbox WHERE run_id = $1::uuid ORDER BY id", run.run_id)]
        assert events == ["agent.run_submitted", "agent.signal_received", "agent.signal_received"]


async def test_signal_to_an_ended_run_is_refused_and_another_tenants_run_is_not_found(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack)
        queued = await signal(stack, run.run_id, "late", request_id="r-1")
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run.run_id), metadata=stack.md())
        error = await rpc_error(signal(stack, run.run_id, "late", request_id="r-2"))
        assert (error.code(), reason_of(error)) == (grpc.StatusCode.FAILED_PRECONDITION, "RUN_ENDED")
        # A retry of a signal queued before the end still gets its answer.
        assert (await signal(stack, run.run_id, "late", request_id="r-1")).signal == queued.signal
        error = await rpc_error(signal(stack, run.run_id, "late", tenant="tenant-b"))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert len(await signal_rows(db, run.run_id)) == 1


async def test_a_claim_delivers_pending_signals_and_a_checkpoint_consumes_each_once(db_url, db):
    async with scheduler_stack(db_url, lease_duration_ms=60_000) as stack:
        run = await submit(stack)
        sent = [await signal(stack, run.run_id, f"s{i}", {"i": i}) for i in range(3)]
        lease = await claim(stack)
        assert lease is not None
        assert [(s.seq, s.name, json.loads(s.payload_json)) for s in lease.signals] == [
            (s.signal.seq, f"s{i}", {"i": i}) for i, s in enumerate(sent)]
        assert lease.last_signal_seq == sent[-1].signal.seq
        version = await save(stack, lease, 0, [lease.signals[0].seq, lease.signals[1].seq])
        rows = await signal_rows(db, run.run_id)
        assert [(r["consumed_version"], r["consumed_fencing_token"]) for r in rows] == [
            (1, lease.run.fencing_token), (1, lease.run.fencing_token), (None, None)]
        # Consuming one again refuses the whole write: no checkpoint, nothing consumed.
        checkpoints = await db.fetchval("SELECT count(*) FROM agent_checkpoints")
        error = await rpc_error(save(stack, lease, version, [lease.signals[0].seq, lease.signals[2].seq]))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "consume_signal_seqs" in error.details()
        assert await db.fetchval("SELECT count(*) FROM agent_checkpoints") == checkpoints
        assert [r["consumed_at"] is None for r in await signal_rows(db, run.run_id)] == [False, False, True]
        consumed = await db.fetch("SELECT payload FROM outbox WHERE event_type = 'agent.signal_consumed' "
                                  "AND run_id = $1::uuid ORDER BY id", run.run_id)
        assert sorted(r["payload"]["name"] for r in consumed) == ["s0", "s1"]
        # The next claim delivers only the one left.
        await stack.work.FinishRun(ws.FinishRunRequest(lease=lease_ref(lease), expected_version=version,
                                                       outcome=ws.FINISH_OUTCOME_SLEEP, sleep_ms=1, event_id=eid()))
        async def claimed() -> ws.Lease | None:
            return await claim(stack, worker="w2")

        again = await wait_for(claimed, 10, "the run to be claimable again")
        assert [s.name for s in again.signals] == ["s2"]


async def test_a_signal_wait_parks_the_run_and_its_signal_wakes_it_at_once(db_url, db):
    async with scheduler_stack(db_url, lease_duration_ms=60_000) as stack:
        run = await submit(stack)
        lease = await claim(stack)
        assert lease is not None and lease.last_signal_seq == 0
        version = await save(stack, lease, 0, [])
        parked = await park_for(stack, lease, version, "approval.granted", timeout_ms=3_600_000)
        assert parked.status == pb.RUN_STATUS_QUEUED
        row = await db.fetchrow("SELECT *, next_attempt_at > clock_timestamp() + interval '50 minutes' AS far "
                                "FROM agent_runs WHERE id = $1::uuid", run.run_id)
        assert row["awaiting_signal"] == "approval.granted" and row["far"]
        # Another name does not wake it; its own name does.
        await signal(stack, run.run_id, "unrelated")
        assert await claim(stack, worker="w2") is None
        woken = await signal(stack, run.run_id, "approval.granted", {"by": "alice"})
        row = await db.fetchrow("SELECT awaiting_signal, next_attempt_at <= clock_timestamp() AS due "
                                "FROM agent_runs WHERE id = $1::uuid", run.run_id)
        assert row["due"] and row["awaiting_signal"] is None and woken.run.status == pb.RUN_STATUS_QUEUED
        again = await claim(stack, worker="w2")
        assert again is not None and [s.name for s in again.signals] == ["unrelated", "approval.granted"]
        received = await db.fetch("SELECT payload FROM outbox WHERE event_type = 'agent.signal_received' "
                                  "AND run_id = $1::uuid ORDER BY id", run.run_id)
        wakes = [e["payload"]["woke"] for e in received]
        assert wakes == [False, True]


async def test_a_signal_that_arrives_before_the_park_makes_the_park_due_at_once(db_url, db):
    """The race: the holder decided to wait, a signal comes before its FinishRun. The park
    compares the run row's last signal with what the holder saw at claim: due at once."""
    async with scheduler_stack(db_url, lease_duration_ms=60_000) as stack:
        run = await submit(stack)
        lease = await claim(stack)
        assert lease is not None
        version = await save(stack, lease, 0, [])
        await signal(stack, run.run_id, "go")
        parked = await park_for(stack, lease, version, "go", timeout_ms=3_600_000)
        assert parked.status == pb.RUN_STATUS_QUEUED
        row = await db.fetchrow("SELECT awaiting_signal, next_attempt_at <= clock_timestamp() AS due "
                                "FROM agent_runs WHERE id = $1::uuid", run.run_id)
        assert row["due"] and row["awaiting_signal"] is None
        again = await claim(stack, worker="w2")
        assert again is not None and [s.name for s in again.signals] == ["go"]


async def test_only_a_signal_of_the_awaited_name_makes_the_park_due(db_url, db):
    """Another name arriving before the park leaves the run parked; an awaited signal the claim did not
    deliver (beyond its first 100 pending) makes the park due at once."""
    async with scheduler_stack(db_url, lease_duration_ms=60_000) as stack:
        run = await submit(stack)
        lease = await claim(stack)
        assert lease is not None
        version = await save(stack, lease, 0, [])
        await signal(stack, run.run_id, "unrelated")
        await park_for(stack, lease, version, "go", timeout_ms=3_600_000)
        row = await db.fetchrow("SELECT awaiting_signal, next_attempt_at <= clock_timestamp() AS due "
                                "FROM agent_runs WHERE id = $1::uuid", run.run_id)
        assert not row["due"] and row["awaiting_signal"] == "go"

        other = await submit(stack)
        for n in range(101):
            await signal(stack, other.run_id, "noise", {"n": n}, request_id=f"noise-{n}")
        await signal(stack, other.run_id, "go", request_id="the-one")
        lease = await claim(stack, worker="w2")
        assert lease is not None and lease.run.run_id == other.run_id
        assert "go" not in {s.name for s in lease.signals}  # past the claim's first 100
        version = await save(stack, lease, 0, [])
        await park_for(stack, lease, version, "go", timeout_ms=3_600_000)
        row = await db.fetchrow("SELECT awaiting_signal, next_attempt_at <= clock_timestamp() AS due "
                                "FROM agent_runs WHERE id = $1::uuid", other.run_id)
        assert row["due"] and row["awaiting_signal"] is None
