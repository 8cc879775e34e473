"""CompleteAndBeginToolCall: Tx2 of one step and Tx1 of the next in one transaction, on a real PostgreSQL.

Each half keeps every check it has on its own (fence, owner, live lease,
version CAS, WAITING_TOOL on the completed step with an open ledger row, the
next decision recorded in the new checkpoint, no ledger row yet for the next
step); a refusal writes nothing at all; a retry with the same event ids answers
from what committed, and half of a commit freezes the run.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable
from typing import Any

import grpc
import pytest
from support import claim, eid, lease_ref, reason_of, rpc_error, scheduler_stack, snapshot
from support import commit_unknown_count as counter
from tool_call_support import REQ2, S1, S2, TOOL2, combined, next_state, waiting_on_s1

from shared.canonical import request_hash
from shared.errors import error_info
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration

async def assert_refused_and_unchanged(db: Any, run_id: str, call: Awaitable[Any], code: grpc.StatusCode,
                                       reason: str) -> grpc.aio.AioRpcError:
    before = await snapshot(db, run_id)
    error = await rpc_error(call)
    assert (error.code(), reason_of(error)) == (code, reason), error.details()
    assert await snapshot(db, run_id) == before, "a refused call changed something"
    return error


# ---------------------------------------------------------------------------- success


async def test_completes_one_step_and_records_the_next_intent_in_one_write(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        before = await snapshot(db, run_id)
        event_id, next_event_id, execution_id = eid(), eid(), eid()
        reply = await stack.work.CompleteAndBeginToolCall(combined(
            ref, event_id=event_id, next_event_id=next_event_id, execution_id=execution_id))
        assert (reply.version, reply.status, reply.replayed) == (2, pb.RUN_STATUS_WAITING_TOOL, False)
        execution = reply.execution
        assert (execution.execution_id, execution.step_key, execution.tool_name, execution.status) == (
            execution_id, S2, TOOL2, pb.TOOL_EXECUTION_STATUS_OUTBOUND_INTENT)
        assert execution.request_hash == request_hash(TOOL2, REQ2).hex()
        assert execution.fencing_token == ref.fencing_token

        after = await snapshot(db, run_id)
        run = after["run"]
        assert (run["status"], run["version"], run["current_step_key"]) == ("WAITING_TOOL", 2, S2)
        # The lease is untouched: the holder goes on to send the next request.
        assert (run["lease_owner"], run["fencing_token"], run["lease_expires_at"]) == (
            before["run"]["lease_owner"], before["run"]["fencing_token"], before["run"]["lease_expires_at"])
        first, second = after["ledger"]  # ordered by step key: create, notify
        assert (first["step_key"], first["status"], first["response_json"], first["remote_resource_id"]) == (
            S1, "SUCCEEDED", {"refund": "r-1"}, "r-1")
        assert first["completed_at"] is not None
        assert (second["step_key"], second["status"], second["intent_event_id"], second["request_json"]) == (
            S2, "OUTBOUND_INTENT", uuid.UUID(next_event_id), REQ2)
        assert bytes(second["request_hash"]) == request_hash(TOOL2, REQ2)
        checkpoint = after["checkpoints"][-1]
        assert (checkpoint["version"], checkpoint["event_id"], checkpoint["state_json"]) == (
            2, uuid.UUID(event_id), next_state())
        new_events = after["events"][len(before["events"]):]
        assert [(e["event_type"], e["event_id"], e["run_version"]) for e in new_events] == [
            ("agent.tool_succeeded", uuid.UUID(event_id), 2),
            ("agent.tool_requested", uuid.UUID(next_event_id), 2)]
        assert new_events[1]["payload"]["execution_id"] == execution_id

        # The next step closes with an ordinary Tx2.
        done = await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
            lease=ref, expected_version=2, step_key=S2, outcome=ws.TOOL_OUTCOME_SUCCEEDED, response_json="{}",
            state_json='{"cursor": "done"}', schema_version=1, event_id=eid()))
        assert (done.version, done.status) == (3, pb.RUN_STATUS_RUNNING)
        assert await counter(db) == 0


async def test_a_definite_failure_closes_the_step_failed_and_begins_the_next(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        reply = await stack.work.CompleteAndBeginToolCall(combined(
            ref, outcome=ws.TOOL_OUTCOME_FAILED, error_code="http_400"))
        assert (reply.version, reply.status) == (2, pb.RUN_STATUS_WAITING_TOOL)
        after = await snapshot(db, run_id)
        assert [(r["step_key"], r["status"], r["error_code"]) for r in after["ledger"]] == [
            (S1, "FAILED", "http_400"), (S2, "OUTBOUND_INTENT", None)]
        assert [e["event_type"] for e in after["events"]][-2:] == ["agent.tool_failed", "agent.tool_requested"]


# ---------------------------------------------------------------------------- refusals write nothing


async def test_stale_fence_is_lease_lost_and_writes_nothing(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref_a = await waiting_on_s1(stack, "worker-a")
        # Lapsed by database time, not yet taken over: still LEASE_LOST.
        await db.execute("UPDATE agent_runs SET lease_expires_at = clock_timestamp() - interval '1 second' "
                         "WHERE id = $1::uuid", run_id)
        await assert_refused_and_unchanged(db, run_id, stack.work.CompleteAndBeginToolCall(combined(ref_a)),
                                           grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
        # Taken over by B (fence 2): A's write is refused, B's goes through.
        lease_b = await claim(stack, "worker-b")
        assert lease_b is not None and lease_b.run.fencing_token == 2
        assert lease_b.run.status == pb.RUN_STATUS_WAITING_TOOL
        await assert_refused_and_unchanged(db, run_id, stack.work.CompleteAndBeginToolCall(combined(ref_a)),
                                           grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
        reply = await stack.work.CompleteAndBeginToolCall(combined(lease_ref(lease_b)))
        assert reply.version == 2 and reply.execution.fencing_token == 2


async def test_version_conflict_is_aborted_and_writes_nothing(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        for stale in (0, 2):
            await assert_refused_and_unchanged(
                db, run_id, stack.work.CompleteAndBeginToolCall(combined(ref, stale)), grpc.StatusCode.ABORTED,
                "VERSION_CONFLICT")


@pytest.mark.parametrize("mismatch", ["request", "tool", "step_key", "no pending_tool"])
async def test_next_decision_not_in_the_new_checkpoint_is_refused(db_url, db, mismatch):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        state = {
            "request": next_state(request={**REQ2, "to": "someone else"}),
            "tool": next_state(tool="mail.send_bulk"),
            "step_key": next_state(step_key="refund.notify/attempt-2"),
            "no pending_tool": {"cursor": S2, "tool_results": {S1: {"status": "SUCCEEDED"}}},
        }[mismatch]
        error = await assert_refused_and_unchanged(
            db, run_id, stack.work.CompleteAndBeginToolCall(combined(ref, state=state)),
            grpc.StatusCode.FAILED_PRECONDITION, "DECISION_NOT_CHECKPOINTED")
        assert "nothing was written" in error.details()
        # The same call with the decision recorded goes through.
        assert (await stack.work.CompleteAndBeginToolCall(combined(ref))).version == 2


async def test_a_ledger_row_for_the_next_step_is_never_overwritten(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        # Another run already recorded this idempotency key: nothing is written.
        other_id, other = await waiting_on_s1(stack, "w2", agent="other")
        await stack.work.CompleteAndBeginToolCall(combined(other, key="shared-key"))
        error = await assert_refused_and_unchanged(
            db, run_id, stack.work.CompleteAndBeginToolCall(combined(ref, key="shared-key")),
            grpc.StatusCode.ALREADY_EXISTS, "ALREADY_EXISTS")
        assert error_info(error).metadata["field"] == "next.idempotency_key"
        # A row for the next step itself (simulated: it cannot be made through the API while on S1).
        await db.execute(
            "INSERT INTO tool_executions (id, run_id, step_key, tool_name, idempotency_key, request_json, "
            "request_hash, status, fencing_token, intent_event_id) "
            "VALUES ($1, $2::uuid, $3, $4, 'k-planted', '{}', $5, 'OUTBOUND_INTENT', 1, $6)",
            uuid.uuid4(), run_id, S2, TOOL2, request_hash(TOOL2, {}), uuid.uuid4())
        error = await assert_refused_and_unchanged(db, run_id, stack.work.CompleteAndBeginToolCall(combined(ref)),
                                                   grpc.StatusCode.ALREADY_EXISTS, "ALREADY_EXISTS")
        assert error_info(error).metadata["field"] == "next.step_key"
        assert (await snapshot(db, other_id))["run"]["current_step_key"] == S2


async def test_not_waiting_on_the_step_or_not_waiting_at_all(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        request = combined(ref)
        request.step_key = "refund.other/attempt-1"
        await assert_refused_and_unchanged(db, run_id, stack.work.CompleteAndBeginToolCall(request),
                                           grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
        # Back to RUNNING after an ordinary Tx2: the combined call is not a Tx1 from RUNNING.
        await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, outcome=ws.TOOL_OUTCOME_SUCCEEDED,
            state_json=json.dumps(next_state()), schema_version=1, next_step_key=S2, event_id=eid()))
        await assert_refused_and_unchanged(db, run_id, stack.work.CompleteAndBeginToolCall(combined(ref, 2)),
                                           grpc.StatusCode.FAILED_PRECONDITION, "INVALID_TRANSITION")


async def test_a_requested_cancel_ends_the_run_and_keeps_the_outcome(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run_id, reason="stop"), metadata=stack.md())
        error = await rpc_error(stack.work.CompleteAndBeginToolCall(combined(ref)))
        assert (error.code(), reason_of(error)) == (grpc.StatusCode.FAILED_PRECONDITION, "RUN_CANCELLED")
        after = await snapshot(db, run_id)
        assert after["run"]["status"] == "CANCELLED" and after["run"]["lease_owner"] is None
        # The tool's outcome is a fact and is kept; the next step's intent was never recorded.
        assert [(r["step_key"], r["status"]) for r in after["ledger"]] == [(S1, "SUCCEEDED")]
        assert [c["version"] for c in after["checkpoints"]] == [1]


# ---------------------------------------------------------------------------- commit-unknown recovery


async def test_retry_with_the_same_event_ids_is_replayed(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        request = combined(ref)
        first = await stack.work.CompleteAndBeginToolCall(request)
        committed = await snapshot(db, run_id)
        for _ in range(2):  # the answer was lost; the client sends the very same request again
            again = await stack.work.CompleteAndBeginToolCall(request)
            assert (again.version, again.status, again.replayed) == (2, pb.RUN_STATUS_WAITING_TOOL, True)
            assert again.execution.execution_id == first.execution.execution_id
            assert again.execution.status == pb.TOOL_EXECUTION_STATUS_OUTBOUND_INTENT
        assert await snapshot(db, run_id) == committed
        # The same ids after the run moved on still answer what committed.
        await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
            lease=ref, expected_version=2, step_key=S2, outcome=ws.TOOL_OUTCOME_SUCCEEDED,
            state_json='{"cursor": "done"}', schema_version=1, event_id=eid()))
        late = await stack.work.CompleteAndBeginToolCall(request)
        assert (late.version, late.replayed) == (2, True)
        assert late.execution.status == pb.TOOL_EXECUTION_STATUS_SUCCEEDED  # as it is now
        assert await counter(db) == 0


async def test_nothing_committed_runs_with_the_same_ids(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        event_id, next_event_id = eid(), eid()
        await assert_refused_and_unchanged(
            db, run_id, stack.work.CompleteAndBeginToolCall(
                combined(ref, 0, event_id=event_id, next_event_id=next_event_id)),
            grpc.StatusCode.ABORTED, "VERSION_CONFLICT")
        reply = await stack.work.CompleteAndBeginToolCall(
            combined(ref, 1, event_id=event_id, next_event_id=next_event_id))
        assert (reply.version, reply.replayed) == (2, False)


# part -> (statement deleting it, whose event id it is keyed by: Tx2's or Tx1's)
HALVES = {
    "result event": ("DELETE FROM outbox WHERE event_id = $1::uuid", "result"),
    "checkpoint": ("DELETE FROM agent_checkpoints WHERE event_id = $1::uuid", "result"),
    "intent event": ("DELETE FROM outbox WHERE event_id = $1::uuid", "intent"),
    "intent row": ("DELETE FROM tool_executions WHERE intent_event_id = $1::uuid", "intent"),
}


@pytest.mark.parametrize("missing", list(HALVES))
async def test_half_a_commit_freezes_the_run(db_url, db, missing):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        event_id, next_event_id = eid(), eid()
        request = combined(ref, event_id=event_id, next_event_id=next_event_id)
        assert (await stack.work.CompleteAndBeginToolCall(request)).version == 2
        # Simulates the inconsistency 6.1 guards against: one part of the write is gone.
        statement, keyed_by = HALVES[missing]
        key = event_id if keyed_by == "result" else next_event_id
        assert await db.execute(statement, uuid.UUID(key)) == "DELETE 1"
        error = await rpc_error(stack.work.CompleteAndBeginToolCall(request))
        assert (error.code(), reason_of(error)) == (grpc.StatusCode.FAILED_PRECONDITION,
                                                    "COMMIT_STATE_INCONSISTENT"), error.details()
        run = await db.fetchrow("SELECT * FROM agent_runs WHERE id = $1::uuid", run_id)
        assert run["status"] == "PAUSED_INDOUBT"
        assert event_id in run["pause_reason"] and next_event_id in run["pause_reason"]
        assert run["lease_owner"] is None and run["lease_expires_at"] is None
        assert await counter(db) == 1
        frozen = await db.fetch("SELECT * FROM outbox WHERE run_id = $1::uuid AND event_type = 'agent.run_frozen'",
                                run_id)
        assert len(frozen) == 1
        # Frozen means frozen: the former holder cannot write any more.
        error = await rpc_error(stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(
            lease=ref, step_key=S2, error_code="timeout", event_id=eid())))
        assert reason_of(error) == "LEASE_LOST"


@pytest.mark.parametrize("field", ["event_id", "next.event_id"])
async def test_an_event_id_of_another_run_is_invalid_argument(db_url, db, field):
    async with scheduler_stack(db_url) as stack:
        other_id, other = await waiting_on_s1(stack, "w2", agent="other")
        used, used_next = eid(), eid()
        await stack.work.CompleteAndBeginToolCall(combined(other, event_id=used, next_event_id=used_next))
        run_id, ref = await waiting_on_s1(stack)
        request = combined(ref, event_id=used) if field == "event_id" else combined(ref, next_event_id=used_next)
        error = await assert_refused_and_unchanged(db, run_id, stack.work.CompleteAndBeginToolCall(request),
                                                   grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
        assert error_info(error).metadata["field"] == field
        assert (await snapshot(db, other_id))["run"]["status"] == "WAITING_TOOL"
        assert await counter(db) == 0
