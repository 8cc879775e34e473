"""Commit-unknown recovery (docs/design.md §commit-unknown) through the scheduler's gRPC API, on a real PostgreSQL.

A client that did not see its commit's answer retries with the SAME event id:
  (a) the write and its event both committed → success, replayed, nothing written twice;
  (b) neither committed → the write runs;
  (c) only one of the two is present → the run is frozen (PAUSED_INDOUBT) and counted, never guessed.
Case (c) cannot happen through the scheduler (each write is one statement); the tests
create it by deleting one half with SQL, which simulates the inconsistency.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import grpc
import pytest
from support import claim, eid, lease_ref, reason_of, rpc_error, scheduler_stack, snapshot, submit, tool_state
from support import commit_unknown_count as counter

from shared.errors import error_info
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration

STEP = "crm.ticket/attempt-1"
TOOL = "crm.open_ticket"
REQUEST = {"customer": 7, "topic": "refund"}


# ---------------------------------------------------------------------------- helpers





async def started(stack: Any, worker: str = "w1", agent: str = "demo") -> tuple[str, ws.LeaseRef]:
    run = await submit(stack, agent=agent)
    lease = await claim(stack, worker, agents=(agent,))
    assert lease is not None and lease.run.run_id == run.run_id
    return run.run_id, lease_ref(lease)


def save_req(ref: ws.LeaseRef, expected: int, state: dict[str, Any], event_id: str,
             step_key: str = "") -> ws.SaveCheckpointRequest:
    return ws.SaveCheckpointRequest(lease=ref, expected_version=expected, state_json=json.dumps(state),
                                    schema_version=1, step_key=step_key, event_id=event_id)


def begin_req(ref: ws.LeaseRef, expected: int, event_id: str, execution_id: str) -> ws.BeginToolCallRequest:
    return ws.BeginToolCallRequest(lease=ref, expected_version=expected, step_key=STEP, tool_name=TOOL,
                                   idempotency_key=f"idem-{execution_id}", request_json=json.dumps(REQUEST),
                                   execution_id=execution_id, event_id=event_id)


def complete_req(ref: ws.LeaseRef, expected: int, event_id: str) -> ws.CompleteToolCallRequest:
    return ws.CompleteToolCallRequest(
        lease=ref, expected_version=expected, step_key=STEP, outcome=ws.TOOL_OUTCOME_SUCCEEDED,
        response_json='{"ticket": "T-9"}', remote_resource_id="T-9", state_json='{"cursor": "ticket-open"}',
        schema_version=1, next_step_key="crm.notify/attempt-1", event_id=event_id)


def finish_req(ref: ws.LeaseRef, expected: int, outcome: int, event_id: str, **fields: Any) -> ws.FinishRunRequest:
    return ws.FinishRunRequest(lease=ref, expected_version=expected, outcome=outcome, event_id=event_id,
                               **fields)


async def waiting_on_tool(stack: Any) -> tuple[str, ws.LeaseRef]:
    """A run in WAITING_TOOL at version 1 with an open ledger row for STEP."""
    run_id, ref = await started(stack)
    await stack.work.SaveCheckpoint(save_req(ref, 0, tool_state(STEP, TOOL, REQUEST), eid(), step_key=STEP))
    began = await stack.work.BeginToolCall(begin_req(ref, 1, eid(), eid()))
    assert not began.existing
    return run_id, ref


async def assert_frozen(db: Any, run_id: str, error: grpc.aio.AioRpcError, event_id: str) -> None:
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, (error.code(), error.details())
    assert reason_of(error) == "COMMIT_STATE_INCONSISTENT"
    row = await db.fetchrow("SELECT * FROM agent_runs WHERE id = $1::uuid", run_id)
    assert row["status"] == "PAUSED_INDOUBT"
    assert row["pause_reason"] and event_id in row["pause_reason"]
    assert row["lease_owner"] is None and row["lease_expires_at"] is None
    assert await counter(db) == 1
    frozen = await db.fetch("SELECT * FROM outbox WHERE run_id = $1::uuid AND event_type = 'agent.run_frozen'",
                            run_id)
    assert len(frozen) == 1


# ---------------------------------------------------------------------------- SaveCheckpoint


async def test_save_checkpoint_committed_retry_is_replayed(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        event_id = eid()
        request = save_req(ref, 0, {"cursor": "a"}, event_id)
        first = await stack.work.SaveCheckpoint(request)
        assert (first.version, first.replayed) == (1, False)
        committed = await snapshot(db, run_id)
        for _ in range(2):  # the answer was lost; the client retries with the same event id
            again = await stack.work.SaveCheckpoint(request)
            assert (again.version, again.replayed) == (1, True)
        assert await snapshot(db, run_id) == committed
        assert len(committed["checkpoints"]) == 1
        assert [e["event_id"] for e in committed["events"] if e["event_type"] == "agent.checkpoint"] == [
            uuid.UUID(event_id)]
        # The run goes on from the replayed answer.
        nxt = await stack.work.SaveCheckpoint(save_req(ref, again.version, {"cursor": "b"}, eid()))
        assert (nxt.version, nxt.replayed) == (2, False)
        assert await counter(db) == 0


async def test_save_checkpoint_replay_answers_what_committed_even_after_a_takeover(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref_a = await started(stack, "worker-a")
        event_id = eid()
        request = save_req(ref_a, 0, {"cursor": "a"}, event_id)
        assert (await stack.work.SaveCheckpoint(request)).version == 1
        # Simulates time passing: A's lease lapses, and B takes the run over.
        await db.execute("UPDATE agent_runs SET lease_expires_at = clock_timestamp() - interval '1 second' "
                         "WHERE id = $1::uuid", run_id)
        b = await claim(stack, "worker-b")
        assert b is not None and b.run.fencing_token == 2
        taken = await snapshot(db, run_id)
        again = await stack.work.SaveCheckpoint(request)
        assert (again.version, again.replayed) == (1, True)  # it did commit, under A's fence
        assert await snapshot(db, run_id) == taken
        # A new write by A is refused as usual.
        error = await rpc_error(stack.work.SaveCheckpoint(save_req(ref_a, 1, {"cursor": "x"}, eid())))
        assert reason_of(error) == "LEASE_LOST"


async def test_save_checkpoint_nothing_committed_runs(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        # The first call with this event id never reached the database: it simply runs now.
        event_id = eid()
        assert await db.fetchval("SELECT count(*) FROM outbox WHERE event_id = $1::uuid", event_id) == 0
        reply = await stack.work.SaveCheckpoint(save_req(ref, 0, {"cursor": "a"}, event_id))
        assert (reply.version, reply.replayed) == (1, False)
        # An attempt that was refused wrote nothing, so the same id is still free to run.
        event_id = eid()
        error = await rpc_error(stack.work.SaveCheckpoint(save_req(ref, 0, {"cursor": "b"}, event_id)))
        assert error.code() == grpc.StatusCode.ABORTED
        reply = await stack.work.SaveCheckpoint(save_req(ref, 1, {"cursor": "b"}, event_id))
        assert (reply.version, reply.replayed) == (2, False)
        snap = await snapshot(db, run_id)
        assert [c["version"] for c in snap["checkpoints"]] == [1, 2]
        assert await counter(db) == 0


@pytest.mark.parametrize("missing", ["event", "checkpoint"])
async def test_save_checkpoint_half_committed_freezes_the_run(db_url, db, missing):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        event_id = eid()
        request = save_req(ref, 0, {"cursor": "a"}, event_id)
        assert (await stack.work.SaveCheckpoint(request)).version == 1
        # Simulates the inconsistency 6.1 guards against: only one half of the write is present.
        if missing == "event":
            deleted = await db.execute("DELETE FROM outbox WHERE event_id = $1::uuid", event_id)
        else:
            deleted = await db.execute("DELETE FROM agent_checkpoints WHERE event_id = $1::uuid", event_id)
        assert deleted == "DELETE 1"
        error = await rpc_error(stack.work.SaveCheckpoint(request))
        await assert_frozen(db, run_id, error, event_id)
        assert f"{missing}" in (await db.fetchval("SELECT pause_reason FROM agent_runs WHERE id = $1::uuid",
                                                  run_id))
        # Frozen means frozen: the former holder cannot write any more.
        error = await rpc_error(stack.work.SaveCheckpoint(save_req(ref, 1, {"cursor": "b"}, eid())))
        assert reason_of(error) == "LEASE_LOST"
        assert await claim(stack, "w2") is None


# ---------------------------------------------------------------------------- CompleteToolCall (Tx2)


async def test_complete_tool_call_committed_retry_is_replayed(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_tool(stack)
        event_id = eid()
        first = await stack.work.CompleteToolCall(complete_req(ref, 1, event_id))
        assert (first.version, first.replayed, first.status) == (2, False, pb.RUN_STATUS_RUNNING)
        committed = await snapshot(db, run_id)
        again = await stack.work.CompleteToolCall(complete_req(ref, 1, event_id))
        assert (again.version, again.replayed) == (2, True)
        assert await snapshot(db, run_id) == committed
        assert [row["status"] for row in committed["ledger"]] == ["SUCCEEDED"]
        assert [c["version"] for c in committed["checkpoints"]] == [1, 2]
        assert await counter(db) == 0


async def test_complete_tool_call_nothing_committed_runs(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_tool(stack)
        event_id = eid()
        error = await rpc_error(stack.work.CompleteToolCall(complete_req(ref, 0, event_id)))  # stale version
        assert error.code() == grpc.StatusCode.ABORTED
        reply = await stack.work.CompleteToolCall(complete_req(ref, 1, event_id))
        assert (reply.version, reply.replayed) == (2, False)
        assert (await snapshot(db, run_id))["ledger"][0]["status"] == "SUCCEEDED"


async def test_complete_tool_call_half_committed_freezes_the_run(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_tool(stack)
        event_id = eid()
        assert (await stack.work.CompleteToolCall(complete_req(ref, 1, event_id))).version == 2
        # Simulates the inconsistency: the checkpoint committed, its event is gone.
        assert await db.execute("DELETE FROM outbox WHERE event_id = $1::uuid", event_id) == "DELETE 1"
        error = await rpc_error(stack.work.CompleteToolCall(complete_req(ref, 1, event_id)))
        await assert_frozen(db, run_id, error, event_id)
        # The fact the tool succeeded is kept: freezing is not undoing.
        assert await db.fetchval("SELECT status FROM tool_executions WHERE run_id = $1::uuid", run_id) == "SUCCEEDED"


# ---------------------------------------------------------------------------- FinishRun


async def test_finish_run_committed_retry_is_replayed(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack, agent="done")
        event_id = eid()
        request = finish_req(ref, 0, ws.FINISH_OUTCOME_COMPLETED, event_id, result_json='{"ok": 1}')
        first = await stack.work.FinishRun(request)
        assert (first.status, first.replayed) == (pb.RUN_STATUS_COMPLETED, False)
        committed = await snapshot(db, run_id)
        again = await stack.work.FinishRun(request)
        assert (again.status, again.replayed) == (pb.RUN_STATUS_COMPLETED, True)
        assert await snapshot(db, run_id) == committed
        assert [e["event_type"] for e in committed["events"]].count("agent.run_completed") == 1

        # RETRY: the replay answers the same next attempt time.
        run_id, ref = await started(stack, agent="retry")
        event_id = eid()
        request = finish_req(ref, 0, ws.FINISH_OUTCOME_RETRY, event_id, reason="transient")
        first = await stack.work.FinishRun(request)
        assert first.status == pb.RUN_STATUS_QUEUED and first.HasField("next_attempt_at")
        committed = await snapshot(db, run_id)
        again = await stack.work.FinishRun(request)
        assert (again.status, again.replayed) == (pb.RUN_STATUS_QUEUED, True)
        assert again.next_attempt_at == first.next_attempt_at
        assert await snapshot(db, run_id) == committed
        assert await counter(db) == 0


async def test_finish_run_nothing_committed_runs(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        event_id = eid()
        error = await rpc_error(stack.work.FinishRun(finish_req(ref, 3, ws.FINISH_OUTCOME_COMPLETED, event_id)))
        assert error.code() == grpc.StatusCode.ABORTED
        reply = await stack.work.FinishRun(finish_req(ref, 0, ws.FINISH_OUTCOME_COMPLETED, event_id))
        assert (reply.status, reply.replayed) == (pb.RUN_STATUS_COMPLETED, False)
        assert (await snapshot(db, run_id))["run"]["status"] == "COMPLETED"


async def test_finish_run_half_committed_is_detected(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        event_id = eid()
        request = finish_req(ref, 0, ws.FINISH_OUTCOME_COMPLETED, event_id, result_json="{}")
        assert (await stack.work.FinishRun(request)).status == pb.RUN_STATUS_COMPLETED
        # Simulates the inconsistency: the run's transition committed, its event is gone.
        assert await db.execute("DELETE FROM outbox WHERE event_id = $1::uuid", event_id) == "DELETE 1"
        before = await snapshot(db, run_id)
        error = await rpc_error(stack.work.FinishRun(request))
        assert reason_of(error) == "COMMIT_STATE_INCONSISTENT", (reason_of(error), error.details())
        assert await counter(db) == 1
        after = await snapshot(db, run_id)
        assert after["run"] == before["run"]  # terminal runs never change


# ---------------------------------------------------------------------------- Tx1 and in-doubt


async def test_begin_tool_call_replay_and_half_commit(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        await stack.work.SaveCheckpoint(save_req(ref, 0, tool_state(STEP, TOOL, REQUEST), eid(), step_key=STEP))
        event_id, execution_id = eid(), eid()
        first = await stack.work.BeginToolCall(begin_req(ref, 1, event_id, execution_id))
        assert not first.existing and not first.replayed
        committed = await snapshot(db, run_id)
        again = await stack.work.BeginToolCall(begin_req(ref, 1, event_id, execution_id))
        assert again.replayed and again.execution.execution_id == execution_id
        assert await snapshot(db, run_id) == committed
        # Simulates the inconsistency: the ledger row committed, its event is gone.
        assert await db.execute("DELETE FROM outbox WHERE event_id = $1::uuid", event_id) == "DELETE 1"
        error = await rpc_error(stack.work.BeginToolCall(begin_req(ref, 1, event_id, execution_id)))
        await assert_frozen(db, run_id, error, event_id)
        assert await db.fetchval("SELECT status FROM tool_executions WHERE run_id = $1::uuid",
                                 run_id) == "OUTBOUND_INTENT"


async def test_mark_tool_in_doubt_committed_retry_is_replayed(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_tool(stack)
        request = ws.MarkToolInDoubtRequest(lease=ref, step_key=STEP, error_code="TIMEOUT", event_id=eid())
        first = await stack.work.MarkToolInDoubt(request)
        assert (first.status, first.replayed) == (pb.RUN_STATUS_PAUSED_INDOUBT, False)
        committed = await snapshot(db, run_id)
        again = await stack.work.MarkToolInDoubt(request)
        assert (again.status, again.replayed) == (pb.RUN_STATUS_PAUSED_INDOUBT, True)
        assert await snapshot(db, run_id) == committed


# ---------------------------------------------------------------------------- event id of another run


async def test_event_id_of_another_run_is_invalid_argument(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_1, ref_1 = await started(stack, agent="one")
        used = eid()
        await stack.work.SaveCheckpoint(save_req(ref_1, 0, {"cursor": "one"}, used))
        run_2, ref_2 = await waiting_on_tool(stack)
        before_1, before_2 = await snapshot(db, run_1), await snapshot(db, run_2)

        calls = {
            "SaveCheckpoint": lambda: stack.work.SaveCheckpoint(save_req(ref_2, 1, {"cursor": "two"}, used)),
            "CompleteToolCall": lambda: stack.work.CompleteToolCall(complete_req(ref_2, 1, used)),
            "MarkToolInDoubt": lambda: stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(
                lease=ref_2, step_key=STEP, error_code="TIMEOUT", event_id=used)),
        }
        for name, call in calls.items():
            error = await rpc_error(call())
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, error.code(), error.details())
            info = error_info(error)
            assert info is not None and info.metadata["field"] == "event_id", name
        assert await snapshot(db, run_1) == before_1
        assert await snapshot(db, run_2) == before_2

        # FinishRun on a third run with run 1's event id: refused, nothing written.
        run_3, ref_3 = await started(stack, agent="three")
        before_3 = await snapshot(db, run_3)
        error = await rpc_error(stack.work.FinishRun(finish_req(ref_3, 0, ws.FINISH_OUTCOME_COMPLETED, used)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert await snapshot(db, run_3) == before_3
        assert await counter(db) == 0
