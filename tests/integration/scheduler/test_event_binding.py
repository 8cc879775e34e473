"""Event ids are bound to the write they were first used for, on a real PostgreSQL (issue 11).

A retry with the same event id replays only the very write it first named
(same operation, same lease, same payload). Reusing an id for another
operation, another payload, or under a stale or forged lease is refused and
changes nothing: the live holder's run is never frozen or altered by anyone
else's retry. A run that ends while its tool call is in flight never keeps an
open intent.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from support import claim, eid, lease_ref, reason_of, rpc_error, scheduler_stack, snapshot, submit, tool_state
from support import commit_unknown_count as counter
from tool_call_support import REQ1, S1, TOOL, waiting_on_s1

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration


async def lapse(db: Any, run_id: str) -> None:
    """The holder's lease lapses by database time (its process is gone)."""
    await db.execute("UPDATE agent_runs SET lease_expires_at = clock_timestamp() - interval '1 second' "
                     "WHERE id = $1::uuid", run_id)


def checkpoint(ref: ws.LeaseRef, version: int, event_id: str, state: dict[str, Any] | None = None,
               **fields: Any) -> ws.SaveCheckpointRequest:
    return ws.SaveCheckpointRequest(lease=ref, expected_version=version,
                                    state_json=json.dumps(state or {"cursor": "a"}), schema_version=1,
                                    event_id=event_id, **fields)


async def taken_over(stack: Any, db: Any) -> tuple[str, ws.LeaseRef, ws.LeaseRef, str]:
    """A (fence 1) began a tool call, lapsed; B (fence 2) holds the run. Returns run, A, B, A's Tx1 event id."""
    run = await submit(stack)
    a = lease_ref(await claim(stack, "w-a"))
    await stack.work.SaveCheckpoint(checkpoint(a, 0, eid(), tool_state(S1, TOOL, REQ1), step_key=S1))
    begin_event = eid()
    await stack.work.BeginToolCall(ws.BeginToolCallRequest(
        lease=a, expected_version=1, step_key=S1, tool_name=TOOL, idempotency_key=f"k-{run.run_id}",
        request_json=json.dumps(REQ1), execution_id=eid(), event_id=begin_event))
    await lapse(db, run.run_id)
    lease_b = await claim(stack, "w-b")
    assert lease_b is not None and lease_b.run.fencing_token == a.fencing_token + 1
    return run.run_id, a, lease_ref(lease_b), begin_event


async def test_a_stale_holder_reusing_its_own_event_id_changes_nothing(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, a, b, begin_event = await taken_over(stack, db)
        before = await snapshot(db, run_id)
        frozen = await counter(db)
        error = await rpc_error(stack.work.SaveCheckpoint(checkpoint(a, 1, begin_event)))
        assert reason_of(error) == "LEASE_LOST", error.details()
        after = await snapshot(db, run_id)
        assert after == before and await counter(db) == frozen
        assert (after["run"]["status"], after["run"]["lease_owner"]) == ("WAITING_TOOL", "w-b")
        # B's lease still works.
        await stack.work.Heartbeat(ws.HeartbeatRequest(lease=b))


async def test_a_forged_lease_with_the_submitted_event_id_changes_nothing(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack)
        holder = lease_ref(await claim(stack, "w-1"))
        history = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=run.run_id), metadata=stack.md())
        submitted = next(e.event_id for e in history.events if e.event_type == "agent.run_submitted")
        before = await snapshot(db, run.run_id)
        frozen = await counter(db)
        for forged in (ws.LeaseRef(run_id=run.run_id, worker_id="mallory", fencing_token=holder.fencing_token),
                       ws.LeaseRef(run_id=run.run_id, worker_id="mallory", fencing_token=99)):
            for call in (stack.work.SaveCheckpoint(checkpoint(forged, 0, submitted)),
                         stack.work.FinishRun(ws.FinishRunRequest(
                             lease=forged, expected_version=0, outcome=ws.FINISH_OUTCOME_FAILED,
                             event_id=submitted)),
                         stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(
                             lease=forged, step_key=S1, error_code="x", event_id=submitted))):
                error = await rpc_error(call)
                assert reason_of(error) == "LEASE_LOST", error.details()
        assert await snapshot(db, run.run_id) == before and await counter(db) == frozen
        await stack.work.Heartbeat(ws.HeartbeatRequest(lease=holder))


@pytest.mark.parametrize("stale", [False, True])
async def test_finish_run_reusing_another_writes_event_id_is_refused_cleanly(db_url, db, stale):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack)
        ref = lease_ref(await claim(stack, "w-1"))
        used = eid()
        await stack.work.SaveCheckpoint(checkpoint(ref, 0, used))
        if stale:
            await lapse(db, run.run_id)
            assert await claim(stack, "w-2") is not None
        before = await snapshot(db, run.run_id)
        error = await rpc_error(stack.work.FinishRun(ws.FinishRunRequest(
            lease=ref, expected_version=1, outcome=ws.FINISH_OUTCOME_COMPLETED, result_json="{}", event_id=used)))
        assert error.code() != grpc.StatusCode.INTERNAL
        expected = ("LEASE_LOST", grpc.StatusCode.FAILED_PRECONDITION) if stale else (
            "ALREADY_EXISTS", grpc.StatusCode.ALREADY_EXISTS)
        assert (reason_of(error) or error.code().name, error.code()) == expected, error.details()
        assert await snapshot(db, run.run_id) == before


async def test_mark_in_doubt_reusing_a_checkpoint_event_id_is_not_a_false_success(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        used = (await db.fetchrow("SELECT event_id FROM agent_checkpoints WHERE run_id = $1::uuid AND version = 1",
                                  run_id))["event_id"]
        before = await snapshot(db, run_id)
        error = await rpc_error(stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(
            lease=ref, step_key=S1, error_code="timeout", event_id=str(used))))
        assert error.code() == grpc.StatusCode.ALREADY_EXISTS, error.details()
        assert await snapshot(db, run_id) == before
        # With its own event id the same call does what it says.
        reply = await stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(
            lease=ref, step_key=S1, error_code="timeout", event_id=eid()))
        assert (reply.status, reply.replayed) == (pb.RUN_STATUS_PAUSED_INDOUBT, False)


async def test_same_event_id_with_another_payload_is_already_exists(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack)
        ref = lease_ref(await claim(stack, "w-1"))
        event_id = eid()
        first = await stack.work.SaveCheckpoint(checkpoint(ref, 0, event_id, {"cursor": "a"}))
        again = await stack.work.SaveCheckpoint(checkpoint(ref, 0, event_id, {"cursor": "a"}))
        assert (first.version, first.replayed, again.version, again.replayed) == (1, False, 1, True)
        before = await snapshot(db, run.run_id)
        error = await rpc_error(stack.work.SaveCheckpoint(checkpoint(ref, 0, event_id, {"cursor": "b"})))
        assert error.code() == grpc.StatusCode.ALREADY_EXISTS, error.details()
        assert "another payload" in error.details()
        assert await snapshot(db, run.run_id) == before
        # A finished run's retry with another result is refused too, not answered "replayed".
        finish = eid()
        await stack.work.FinishRun(ws.FinishRunRequest(lease=ref, expected_version=1,
                                                       outcome=ws.FINISH_OUTCOME_COMPLETED,
                                                       result_json='{"a": 1}', event_id=finish))
        replay = await stack.work.FinishRun(ws.FinishRunRequest(lease=ref, expected_version=1,
                                                                outcome=ws.FINISH_OUTCOME_COMPLETED,
                                                                result_json='{"a": 1}', event_id=finish))
        assert replay.replayed and replay.status == pb.RUN_STATUS_COMPLETED
        error = await rpc_error(stack.work.FinishRun(ws.FinishRunRequest(
            lease=ref, expected_version=1, outcome=ws.FINISH_OUTCOME_COMPLETED, result_json='{"a": 2}',
            event_id=finish)))
        assert error.code() == grpc.StatusCode.ALREADY_EXISTS, error.details()
        got = await stack.runs.GetRun(rs.GetRunRequest(run_id=run.run_id), metadata=stack.md())
        assert json.loads(got.result_json) == {"a": 1}


async def test_resolution_retry_with_another_payload_is_already_exists(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        await stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(lease=ref, step_key=S1, error_code="t",
                                                                   event_id=eid()))
        event_id = eid()

        def resolve(evidence: str) -> rs.ResolveToolExecutionRequest:
            return rs.ResolveToolExecutionRequest(
                run_id=run_id, step_key=S1, outcome=rs.RESOLUTION_OUTCOME_NOT_EXECUTED,
                evidence_json=json.dumps({"lookup": evidence}), resolved_by="op", event_id=event_id)

        await stack.runs.ResolveToolExecution(resolve("absent"), metadata=stack.md())
        await stack.runs.ResolveToolExecution(resolve("absent"), metadata=stack.md())  # a replay
        before = await snapshot(db, run_id)
        error = await rpc_error(stack.runs.ResolveToolExecution(resolve("other"), metadata=stack.md()))
        assert error.code() == grpc.StatusCode.ALREADY_EXISTS, error.details()
        assert await snapshot(db, run_id) == before


async def open_intents_of_terminal_runs(db: Any) -> int:
    return await db.fetchval(
        "SELECT count(*) FROM tool_executions te JOIN agent_runs r ON r.id = te.run_id "
        "WHERE te.status = 'OUTBOUND_INTENT' AND r.status IN ('COMPLETED', 'FAILED', 'CANCELLED')")


async def test_cancel_of_a_waiting_run_whose_holder_died_leaves_no_open_intent(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, _ = await waiting_on_s1(stack)
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run_id, reason="stop"), metadata=stack.md())
        await lapse(db, run_id)
        assert await claim(stack, "w-2") is None  # the claim applies the cancel and finds no other work
        after = await snapshot(db, run_id)
        assert after["run"]["status"] == "CANCELLED"
        [row] = after["ledger"]
        assert (row["status"], row["error_code"]) == ("IN_DOUBT", "run_ended_with_open_intent")
        cancelled = next(e for e in after["events"] if e["event_type"] == "agent.run_cancelled")
        assert cancelled["payload"]["intents_in_doubt"] == 1
        assert await open_intents_of_terminal_runs(db) == 0


async def test_deadline_of_a_waiting_run_whose_holder_died_leaves_no_open_intent(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, _ = await waiting_on_s1(stack)
        await db.execute("UPDATE agent_runs SET deadline_at = clock_timestamp() WHERE id = $1::uuid", run_id)
        await lapse(db, run_id)
        assert await claim(stack, "w-2") is None
        after = await snapshot(db, run_id)
        assert (after["run"]["status"], after["run"]["terminal_reason"]) == (
            "FAILED", "budget exhausted: deadline passed")
        assert [r["status"] for r in after["ledger"]] == ["IN_DOUBT"]
        assert await open_intents_of_terminal_runs(db) == 0
