"""Fencing, leases and backoff against a real PostgreSQL, through the scheduler's gRPC API.

Reference design sections 3-8, 10 and 13.2: a lapsed lease cannot be revived,
a stale fence never writes, Tx1 needs the decision checkpointed first, every
transition out of RUNNING/WAITING_TOOL clears the lease, and retries back off
by database time. All waits are on database-clock conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from typing import Any

import grpc
import pytest
from support import claim, eid, lease_ref, reason_of, rpc_error, scheduler_stack, snapshot, submit, tool_state

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration

# Short enough to lapse quickly, long enough that a loaded 2-core machine
# finishes the set-up writes well inside it.
SHORT_LEASE_MS = 2000
STEP = "return_label.create/attempt-1"
TOOL = "labels.create"
REQUEST = {"order": 42, "carrier": "ups"}
# The stack's backoff settings (tests/support.py): base 100 ms, cap 1000 ms, jitter 10 ms.
BASE_MS, CAP_MS, JITTER_MS = 100, 1000, 10


# ---------------------------------------------------------------------------- helpers


async def wait_until(db: Any, sql: str, *args: Any, within: float = 20.0) -> None:
    """Polls a boolean SQL condition (on the database clock) until it holds, or fails at the deadline."""
    deadline = time.monotonic() + within
    while not await db.fetchval(sql, *args):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s: {sql} {args}")
        await asyncio.sleep(0.05)


async def wait_lapsed(db: Any, run_id: str) -> None:
    await wait_until(db, "SELECT lease_expires_at < clock_timestamp() FROM agent_runs WHERE id = $1::uuid",
                     run_id)



async def expect_refused(call: Awaitable[Any], code: grpc.StatusCode, reason: str) -> grpc.aio.AioRpcError:
    error = await rpc_error(call)
    assert error.code() == code, (error.code(), error.details())
    assert reason_of(error) == reason, (reason_of(error), error.details())
    return error



async def run_row(db: Any, run_id: str) -> Any:
    return await db.fetchrow("SELECT * FROM agent_runs WHERE id = $1::uuid", run_id)


def save_req(ref: ws.LeaseRef, expected: int, state: dict[str, Any], step_key: str = "",
             event_id: str | None = None) -> ws.SaveCheckpointRequest:
    return ws.SaveCheckpointRequest(lease=ref, expected_version=expected, state_json=json.dumps(state),
                                    schema_version=1, step_key=step_key, event_id=event_id or eid())


def begin_req(ref: ws.LeaseRef, expected: int, step_key: str = STEP, tool: str = TOOL,
              request: Any = None, key: str | None = None,
              execution_id: str | None = None) -> ws.BeginToolCallRequest:
    return ws.BeginToolCallRequest(
        lease=ref, expected_version=expected, step_key=step_key, tool_name=tool,
        idempotency_key=key or f"idem:{step_key}:{eid()}", request_json=json.dumps(REQUEST if request is None
                                                                                   else request),
        execution_id=execution_id or eid(), event_id=eid())


def complete_req(ref: ws.LeaseRef, expected: int, step_key: str = STEP,
                 outcome: int = ws.TOOL_OUTCOME_SUCCEEDED) -> ws.CompleteToolCallRequest:
    return ws.CompleteToolCallRequest(
        lease=ref, expected_version=expected, step_key=step_key, outcome=outcome,
        response_json='{"label": "L-1"}', state_json=json.dumps({"cursor": "after-label"}), schema_version=1,
        event_id=eid())


def finish_req(ref: ws.LeaseRef, expected: int, outcome: int, **fields: Any) -> ws.FinishRunRequest:
    return ws.FinishRunRequest(lease=ref, expected_version=expected, outcome=outcome, event_id=eid(), **fields)


async def claim_run(stack: Any, worker: str, agent: str = "demo") -> ws.Lease:
    lease = await claim(stack, worker, agents=(agent,))
    assert lease is not None, f"{worker} found nothing to claim for {agent}"
    return lease


async def claim_with_decision(stack: Any, worker: str, agent: str = "demo") -> tuple[ws.Lease, ws.LeaseRef]:
    """Claims and checkpoints the tool decision (version 1), ready for Tx1."""
    lease = await claim_run(stack, worker, agent)
    ref = lease_ref(lease)
    saved = await stack.work.SaveCheckpoint(save_req(ref, lease.run.version, tool_state(STEP, TOOL, REQUEST),
                                                     step_key=STEP))
    assert saved.version == lease.run.version + 1 and not saved.replayed
    return lease, ref


# ---------------------------------------------------------------------------- stale fence (13.2)


async def test_stale_fence_reference_example(db_url, db):
    """A holds fence N and stops heartbeating; the lease lapses by database time; B claims N+1;
    every write A makes is LEASE_LOST and changes nothing; B's writes succeed."""
    async with scheduler_stack(db_url, lease_duration_ms=SHORT_LEASE_MS) as stack:
        run = await submit(stack)
        a_lease, ref_a = await claim_with_decision(stack, "worker-a")
        fence_n = a_lease.run.fencing_token
        assert a_lease.run.run_id == run.run_id and fence_n == 1

        # A stops heartbeating. Wait until the database clock passes its lease expiry.
        await wait_lapsed(db, run.run_id)
        lapsed = await snapshot(db, run.run_id)
        assert lapsed["run"]["lease_owner"] == "worker-a"  # nobody claimed yet

        # No self-revival: the heartbeat fails even though nobody else holds the run.
        await expect_refused(stack.work.Heartbeat(ws.HeartbeatRequest(lease=ref_a)),
                             grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
        assert await snapshot(db, run.run_id) == lapsed

        b_lease = await claim_run(stack, "worker-b")
        ref_b = lease_ref(b_lease)
        assert b_lease.run.run_id == run.run_id
        assert b_lease.run.fencing_token == fence_n + 1
        assert b_lease.run.status == pb.RUN_STATUS_RUNNING and b_lease.run.version == 1
        assert b_lease.checkpoint.version == 1  # B resumes from the committed checkpoint
        taken = await snapshot(db, run.run_id)
        assert taken["run"]["lease_owner"] == "worker-b" and taken["run"]["fencing_token"] == fence_n + 1

        # A's checkpoint CAS, Tx1 and Tx2 (and the rest) all affect nothing.
        await expect_refused(
            stack.work.SaveCheckpoint(save_req(ref_a, 1, {"cursor": "stale"})),
            grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
        await expect_refused(stack.work.BeginToolCall(begin_req(ref_a, 1)),
                             grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
        await expect_refused(stack.work.CompleteToolCall(complete_req(ref_a, 1)),
                             grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
        await expect_refused(stack.work.Heartbeat(ws.HeartbeatRequest(lease=ref_a)),
                             grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
        await expect_refused(stack.work.FinishRun(finish_req(ref_a, 1, ws.FINISH_OUTCOME_COMPLETED)),
                             grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
        await expect_refused(
            stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(lease=ref_a, step_key=STEP,
                                                                 error_code="TIMEOUT", event_id=eid())),
            grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
        after = await snapshot(db, run.run_id)
        assert after == taken
        assert after["run"]["version"] == 1 and len(after["checkpoints"]) == 1 and after["ledger"] == []

        # B's writes go through under fence N+1.
        began = await stack.work.BeginToolCall(begin_req(ref_b, 1))
        assert not began.existing and began.execution.fencing_token == fence_n + 1
        done = await stack.work.CompleteToolCall(complete_req(ref_b, 1))
        assert done.version == 2 and done.status == pb.RUN_STATUS_RUNNING
        fin = await stack.work.FinishRun(finish_req(ref_b, 2, ws.FINISH_OUTCOME_COMPLETED, result_json="{}"))
        assert fin.status == pb.RUN_STATUS_COMPLETED
        final = await run_row(db, run.run_id)
        assert final["status"] == "COMPLETED" and final["version"] == 2 and final["fencing_token"] == fence_n + 1
        assert await db.fetchval("SELECT count(*) FROM agent_checkpoints WHERE run_id = $1::uuid",
                                 run.run_id) == 2
        assert {r["fencing_token"] for r in await db.fetch(
            "SELECT fencing_token FROM agent_checkpoints WHERE run_id = $1::uuid AND version > 1",
            run.run_id)} == {fence_n + 1}


async def test_waiting_tool_run_is_reclaimed_as_waiting_tool(db_url, db):
    """A lapsed WAITING_TOOL run is taken over as WAITING_TOOL with its open ledger row; the new holder
    gets fence+1 and the same attempt_count; the old holder can neither re-begin nor complete the call."""
    async with scheduler_stack(db_url, lease_duration_ms=SHORT_LEASE_MS) as stack:
        run = await submit(stack)
        a_lease, ref_a = await claim_with_decision(stack, "worker-a")
        assert a_lease.run.attempt_count == 1  # claimed from QUEUED: the attempt counts
        execution_id = eid()
        began = await stack.work.BeginToolCall(begin_req(ref_a, 1, key="idem-1", execution_id=execution_id))
        assert began.execution.status == pb.TOOL_EXECUTION_STATUS_OUTBOUND_INTENT
        assert (await run_row(db, run.run_id))["status"] == "WAITING_TOOL"

        await wait_lapsed(db, run.run_id)
        b_lease = await claim_run(stack, "worker-b")
        assert b_lease.run.run_id == run.run_id
        assert b_lease.run.status == pb.RUN_STATUS_WAITING_TOOL  # not RUNNING: no resend
        assert b_lease.run.fencing_token == a_lease.run.fencing_token + 1
        assert b_lease.run.attempt_count == 1  # a takeover is not a new attempt
        assert b_lease.HasField("pending_tool")
        pending = b_lease.pending_tool
        assert pending.execution_id == execution_id and pending.step_key == STEP
        assert pending.status == pb.TOOL_EXECUTION_STATUS_OUTBOUND_INTENT
        assert pending.idempotency_key == "idem-1" and json.loads(pending.request_json) == REQUEST
        assert pending.fencing_token == a_lease.run.fencing_token  # written under A's fence
        ref_b = lease_ref(b_lease)
        taken = await snapshot(db, run.run_id)

        # The old holder: a repeated Tx1 for the step is no answer for it, nor is Tx2 or a freeze.
        await expect_refused(stack.work.BeginToolCall(begin_req(ref_a, 1, key="idem-1")),
                             grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
        await expect_refused(stack.work.CompleteToolCall(complete_req(ref_a, 1)),
                             grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
        await expect_refused(
            stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(lease=ref_a, step_key=STEP,
                                                                 error_code="TIMEOUT", event_id=eid())),
            grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
        assert await snapshot(db, run.run_id) == taken

        # The new holder's lookup found the result: Tx2 under its fence.
        done = await stack.work.CompleteToolCall(complete_req(ref_b, 1))
        assert done.version == 2
        row = await run_row(db, run.run_id)
        assert row["status"] == "RUNNING" and row["attempt_count"] == 1
        ledger = await db.fetchrow("SELECT * FROM tool_executions WHERE run_id = $1::uuid", run.run_id)
        assert ledger["status"] == "SUCCEEDED" and ledger["id"].hex == execution_id.replace("-", "")


async def test_claim_from_queued_counts_an_attempt(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack, max_attempts=5)
        first = await claim_run(stack, "w1")
        assert first.run.attempt_count == 1 and first.run.fencing_token == 1
        fin = await stack.work.FinishRun(finish_req(lease_ref(first), 0, ws.FINISH_OUTCOME_RETRY,
                                                    reason="flaky"))
        assert fin.status == pb.RUN_STATUS_QUEUED
        assert (await run_row(db, run.run_id))["attempt_count"] == 1  # counted at claim, not at retry
        await wait_until(db, "SELECT next_attempt_at <= clock_timestamp() FROM agent_runs WHERE id = $1::uuid",
                         run.run_id)
        second = await claim_run(stack, "w2")
        assert second.run.attempt_count == 2 and second.run.fencing_token == 2


# ---------------------------------------------------------------------------- Tx1 precondition


async def test_begin_tool_call_requires_the_checkpointed_decision(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack)
        _, ref = await claim_with_decision(stack, "w1")
        before = await snapshot(db, run.run_id)

        refusals = {
            "different request args": begin_req(ref, 1, request={"order": 43, "carrier": "ups"}),
            "different tool": begin_req(ref, 1, tool="labels.void"),
            "different step": begin_req(ref, 1, step_key="return_label.create/attempt-2"),
        }
        for what, request in refusals.items():
            error = await expect_refused(stack.work.BeginToolCall(request),
                                         grpc.StatusCode.FAILED_PRECONDITION, "DECISION_NOT_CHECKPOINTED")
            assert error.details(), what
            assert await snapshot(db, run.run_id) == before, what

        # A checkpoint without any pending_tool: no decision at all.
        saved = await stack.work.SaveCheckpoint(save_req(ref, 1, {"cursor": "thinking"}))
        assert saved.version == 2
        no_decision = await snapshot(db, run.run_id)
        await expect_refused(stack.work.BeginToolCall(begin_req(ref, 2)),
                             grpc.StatusCode.FAILED_PRECONDITION, "DECISION_NOT_CHECKPOINTED")
        assert await snapshot(db, run.run_id) == no_decision

        # Checkpoint the decision again, then Tx1 goes through.
        await stack.work.SaveCheckpoint(save_req(ref, 2, tool_state(STEP, TOOL, REQUEST), step_key=STEP))
        execution_id = eid()
        began = await stack.work.BeginToolCall(begin_req(ref, 3, key="idem-1", execution_id=execution_id))
        assert not began.existing and not began.replayed
        assert began.execution.execution_id == execution_id
        assert began.execution.request_hash == tool_state(STEP, TOOL, REQUEST)["pending_tool"]["request_hash"]
        first = await snapshot(db, run.run_id)
        assert first["run"]["status"] == "WAITING_TOOL" and first["run"]["current_step_key"] == STEP

        # Tx1 again for the same step (new ids): the existing row answers; nothing new is created.
        again = await stack.work.BeginToolCall(begin_req(ref, 3, key="idem-1", execution_id=eid()))
        assert again.existing and not again.replayed
        assert again.execution.execution_id == execution_id
        assert again.execution.status == pb.TOOL_EXECUTION_STATUS_OUTBOUND_INTENT
        assert await snapshot(db, run.run_id) == first
        assert await db.fetchval("SELECT count(*) FROM tool_executions") == 1


async def test_version_conflict_writes_nothing(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack)
        lease = await claim_run(stack, "w1")
        ref = lease_ref(lease)
        assert (await stack.work.SaveCheckpoint(save_req(ref, 0, {"n": 1}))).version == 1
        assert (await stack.work.SaveCheckpoint(save_req(ref, 1, {"n": 2}))).version == 2
        before = await snapshot(db, run.run_id)
        for stale in (0, 1, 5):
            await expect_refused(stack.work.SaveCheckpoint(save_req(ref, stale, {"n": "stale"})),
                                 grpc.StatusCode.ABORTED, "VERSION_CONFLICT")
        await expect_refused(stack.work.FinishRun(finish_req(ref, 1, ws.FINISH_OUTCOME_COMPLETED)),
                             grpc.StatusCode.ABORTED, "VERSION_CONFLICT")
        assert await snapshot(db, run.run_id) == before
        # The current version still works: the refusal did not disturb the lease.
        assert (await stack.work.SaveCheckpoint(save_req(ref, 2, {"n": 3}))).version == 3


# ---------------------------------------------------------------------------- leases cleared


async def assert_unleased(db: Any, run_id: str, status: str) -> Any:
    row = await run_row(db, run_id)
    assert row["status"] == status, (row["status"], status)
    assert row["lease_owner"] is None and row["lease_expires_at"] is None
    return row


async def test_every_transition_out_of_a_lease_clears_it(db_url, db):
    async with scheduler_stack(db_url) as stack:
        # Each case has its own agent so that claims cannot pick another case's run.
        for outcome, status in ((ws.FINISH_OUTCOME_COMPLETED, "COMPLETED"), (ws.FINISH_OUTCOME_FAILED, "FAILED"),
                                (ws.FINISH_OUTCOME_PAUSED_HUMAN, "PAUSED_HUMAN"),
                                (ws.FINISH_OUTCOME_RETRY, "QUEUED"), (ws.FINISH_OUTCOME_SLEEP, "QUEUED")):
            agent = f"finish-{status.lower()}-{outcome}"
            run = await submit(stack, agent=agent)
            lease = await claim_run(stack, "w1", agent)
            extra = {"sleep_ms": 60_000} if outcome == ws.FINISH_OUTCOME_SLEEP else {}
            fin = await stack.work.FinishRun(finish_req(lease_ref(lease), 0, outcome, reason="done", **extra))
            assert fin.status == convert_status(status)
            await assert_unleased(db, run.run_id, status)

        # RETRY at max_attempts ends the run, unleased.
        run = await submit(stack, agent="exhausted", max_attempts=1)
        lease = await claim_run(stack, "w1", "exhausted")
        await stack.work.FinishRun(finish_req(lease_ref(lease), 0, ws.FINISH_OUTCOME_RETRY, reason="boom"))
        await assert_unleased(db, run.run_id, "FAILED")

        # Tool outcome unknown: PAUSED_INDOUBT, unleased.
        run = await submit(stack, agent="indoubt")
        _, ref = await claim_with_decision(stack, "w1", "indoubt")
        await stack.work.BeginToolCall(begin_req(ref, 1))
        reply = await stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(
            lease=ref, step_key=STEP, error_code="TIMEOUT", detail="read timed out", event_id=eid()))
        assert reply.status == pb.RUN_STATUS_PAUSED_INDOUBT
        row = await assert_unleased(db, run.run_id, "PAUSED_INDOUBT")
        assert "TIMEOUT" in row["pause_reason"]

        # Takeover lookup proved the call never happened: QUEUED, unleased, ledger row kept.
        run = await submit(stack, agent="notexec")
        _, ref = await claim_with_decision(stack, "w1", "notexec")
        await stack.work.BeginToolCall(begin_req(ref, 1))
        reply = await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
            lease=ref, expected_version=1, step_key=STEP, outcome=ws.TOOL_OUTCOME_NOT_EXECUTED,
            evidence_json='{"lookup": "no such request"}', event_id=eid()))
        assert reply.status == pb.RUN_STATUS_QUEUED
        await assert_unleased(db, run.run_id, "QUEUED")
        assert await db.fetchval("SELECT status FROM tool_executions WHERE run_id = $1::uuid",
                                 run.run_id) == "NOT_EXECUTED"

        # Cancel of a leased run: flagged; the holder's next write ends it (CANCELLED, unleased).
        for agent, waiting in (("cancel-running", False), ("cancel-waiting", True)):
            run = await submit(stack, agent=agent)
            _, ref = await claim_with_decision(stack, "w1", agent)
            if waiting:
                await stack.work.BeginToolCall(begin_req(ref, 1))
            flagged = await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run.run_id, reason="user asked"),
                                                 metadata=stack.md())
            assert flagged.cancel_requested and flagged.status in (pb.RUN_STATUS_RUNNING,
                                                                   pb.RUN_STATUS_WAITING_TOOL)
            assert (await run_row(db, run.run_id))["lease_owner"] == "w1"
            write = (stack.work.CompleteToolCall(complete_req(ref, 1)) if waiting
                     else stack.work.SaveCheckpoint(save_req(ref, 1, {"n": 1})))
            await expect_refused(write, grpc.StatusCode.FAILED_PRECONDITION, "RUN_CANCELLED")
            row = await assert_unleased(db, run.run_id, "CANCELLED")
            assert row["terminal_reason"].startswith("cancelled") and row["version"] == 1
            if waiting:  # the holder's definite outcome is kept in the ledger even though the run ended
                assert await db.fetchval("SELECT status FROM tool_executions WHERE run_id = $1::uuid",
                                         run.run_id) == "SUCCEEDED"

        # Heartbeat is a write too: a flagged run ends at the holder's heartbeat.
        run = await submit(stack, agent="cancel-heartbeat")
        lease = await claim_run(stack, "w1", "cancel-heartbeat")
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run.run_id), metadata=stack.md())
        await expect_refused(stack.work.Heartbeat(ws.HeartbeatRequest(lease=lease_ref(lease))),
                             grpc.StatusCode.FAILED_PRECONDITION, "RUN_CANCELLED")
        await assert_unleased(db, run.run_id, "CANCELLED")

        # The table-wide invariant, for good measure.
        assert await db.fetchval("""
            SELECT count(*) FROM agent_runs
            WHERE (status IN ('RUNNING', 'WAITING_TOOL')) <> (lease_owner IS NOT NULL)
               OR (lease_owner IS NULL) <> (lease_expires_at IS NULL)""") == 0


def convert_status(name: str) -> int:
    return getattr(pb, f"RUN_STATUS_{name}")


# ---------------------------------------------------------------------------- backoff and sleep


async def test_retry_backoff_is_exponential_capped_and_jittered_by_db_time(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack, max_attempts=6)
        for attempt in range(1, 6):
            lease = await claim_run(stack, f"w{attempt}")
            assert lease.run.attempt_count == attempt
            t0 = await db.fetchval("SELECT clock_timestamp()")
            fin = await stack.work.FinishRun(finish_req(lease_ref(lease), 0, ws.FINISH_OUTCOME_RETRY,
                                                        reason=f"try {attempt}", error_class="TRANSIENT"))
            t1 = await db.fetchval("SELECT clock_timestamp()")
            row = await assert_unleased(db, run.run_id, "QUEUED")
            assert row["attempt_count"] == attempt
            delay_ms = min(BASE_MS * 2 ** (attempt - 1), CAP_MS)
            next_at = row["next_attempt_at"]
            assert fin.next_attempt_at.ToDatetime(tzinfo=next_at.tzinfo) == next_at
            # db time at the write + min(base * 2^(attempt-1), cap) + jitter in [0, jitter]
            low = await db.fetchval("SELECT $1::timestamptz + make_interval(secs => $2::double precision / 1000)",
                                    t0, delay_ms)
            high = await db.fetchval("SELECT $1::timestamptz + make_interval(secs => $2::double precision / 1000)",
                                     t1, delay_ms + JITTER_MS)
            assert low <= next_at <= high, (attempt, low, next_at, high)
            # The jitter is the database's deterministic function of (run, attempt).
            expected_ms = await db.fetchval("SELECT agentrt_backoff_ms($1::uuid, $2, $3, $4, $5)",
                                            run.run_id, attempt, BASE_MS, CAP_MS, JITTER_MS)
            assert delay_ms <= expected_ms <= delay_ms + JITTER_MS
            written_ms = (next_at - row["updated_at"]).total_seconds() * 1000
            assert abs(written_ms - expected_ms) < 5, (written_ms, expected_ms)
            await wait_until(db, "SELECT next_attempt_at <= clock_timestamp() FROM agent_runs WHERE id = $1::uuid",
                             run.run_id)
        # The sixth attempt is the last one: RETRY now ends the run.
        lease = await claim_run(stack, "w6")
        assert lease.run.attempt_count == 6
        fin = await stack.work.FinishRun(finish_req(lease_ref(lease), 0, ws.FINISH_OUTCOME_RETRY, reason="again"))
        assert fin.status == pb.RUN_STATUS_FAILED and not fin.HasField("next_attempt_at")


async def test_retry_at_max_attempts_fails(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack, max_attempts=2)
        lease = await claim_run(stack, "w1")
        fin = await stack.work.FinishRun(finish_req(lease_ref(lease), 0, ws.FINISH_OUTCOME_RETRY, reason="e1"))
        assert fin.status == pb.RUN_STATUS_QUEUED
        await wait_until(db, "SELECT next_attempt_at <= clock_timestamp() FROM agent_runs WHERE id = $1::uuid",
                         run.run_id)
        lease = await claim_run(stack, "w2")
        assert lease.run.attempt_count == 2
        fin = await stack.work.FinishRun(finish_req(lease_ref(lease), 0, ws.FINISH_OUTCOME_RETRY, reason="e2"))
        assert fin.status == pb.RUN_STATUS_FAILED
        row = await assert_unleased(db, run.run_id, "FAILED")
        assert row["terminal_reason"].startswith("attempts exhausted") and "e2" in row["terminal_reason"]
        assert row["finished_at"] is not None
        assert await claim(stack, "w3") is None


async def test_retry_at_max_attempts_pauses_for_a_human_when_asked(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack, max_attempts=2)
        for attempt in (1, 2):
            await wait_until(db, "SELECT next_attempt_at <= clock_timestamp() FROM agent_runs WHERE id = $1::uuid",
                             run.run_id)
            lease = await claim_run(stack, f"w{attempt}")
            fin = await stack.work.FinishRun(finish_req(lease_ref(lease), 0, ws.FINISH_OUTCOME_RETRY,
                                                        reason=f"e{attempt}", pause_when_exhausted=True))
        assert fin.status == pb.RUN_STATUS_PAUSED_HUMAN
        row = await assert_unleased(db, run.run_id, "PAUSED_HUMAN")
        assert row["pause_reason"].startswith("attempts exhausted") and row["finished_at"] is None
        assert await claim(stack, "w3") is None  # paused runs are not claimable


async def test_sleep_holds_no_lease_and_wakes_by_db_time(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack)
        lease = await claim_run(stack, "w1")
        ref = lease_ref(lease)
        await stack.work.SaveCheckpoint(save_req(ref, 0, {"cursor": "before-sleep"}))
        t0 = await db.fetchval("SELECT clock_timestamp()")
        fin = await stack.work.FinishRun(finish_req(ref, 1, ws.FINISH_OUTCOME_SLEEP, sleep_ms=800))
        t1 = await db.fetchval("SELECT clock_timestamp()")
        assert fin.status == pb.RUN_STATUS_QUEUED
        row = await assert_unleased(db, run.run_id, "QUEUED")
        next_at = row["next_attempt_at"]
        assert (next_at - t0).total_seconds() >= 0.8 and (next_at - t1).total_seconds() <= 0.8

        # Not claimable while the database clock is before next_attempt_at.
        refused = 0
        deadline = time.monotonic() + 20
        while True:
            db_before = await db.fetchval("SELECT clock_timestamp()")
            got = await claim(stack, "w2")
            if got is not None:
                break
            refused += 1
            assert time.monotonic() < deadline, "run never became claimable"
            await asyncio.sleep(0.05)
        assert refused >= 1 or db_before >= next_at
        claimed_at = await db.fetchval("SELECT updated_at FROM agent_runs WHERE id = $1::uuid", run.run_id)
        assert claimed_at >= next_at
        assert got.run.run_id == run.run_id and got.run.fencing_token == 2
        assert got.run.version == 1 and got.checkpoint.version == 1
        assert got.run.attempt_count == 1  # a sleep resets the attempt count; the claim counts one


async def test_not_executed_at_max_attempts_ends_the_run(db_url, db):
    """A proven-not-executed tool call re-queues the run, but never past max_attempts."""
    async with scheduler_stack(db_url) as stack:
        for max_attempts, expected in ((2, pb.RUN_STATUS_QUEUED), (1, pb.RUN_STATUS_FAILED)):
            run = await submit(stack, agent=f"limit{max_attempts}", max_attempts=max_attempts)
            lease = await claim(stack, agents=(f"limit{max_attempts}",))
            ref = lease_ref(lease)
            await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
                lease=ref, expected_version=0, state_json=json.dumps(tool_state("s/attempt-1", "t", {})),
                schema_version=1, event_id=eid()))
            await stack.work.BeginToolCall(ws.BeginToolCallRequest(
                lease=ref, expected_version=1, step_key="s/attempt-1", tool_name="t",
                idempotency_key=f"k{max_attempts}", request_json="{}", execution_id=eid(), event_id=eid()))
            reply = await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
                lease=ref, expected_version=1, step_key="s/attempt-1", outcome=ws.TOOL_OUTCOME_NOT_EXECUTED,
                evidence_json='{"http_status": 429}', error_code="rate_limited", event_id=eid()))
            assert reply.status == expected
            row = await db.fetchrow("SELECT * FROM agent_runs WHERE id = $1::uuid", run.run_id)
            assert row["lease_owner"] is None
            if expected == pb.RUN_STATUS_FAILED:
                assert "attempts exhausted" in row["terminal_reason"] and row["finished_at"] is not None
            ledger = await db.fetchval("SELECT status FROM tool_executions WHERE run_id = $1::uuid", run.run_id)
            assert ledger == "NOT_EXECUTED"
