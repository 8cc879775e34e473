"""CompleteToolCall with `end`: the last Tx2 ends the run in the same transaction, on a real PostgreSQL.

The ledger row closes, the checkpoint that records the end is written, the run
ends COMPLETED or FAILED (lease cleared, result, reason, finished_at) and both
events commit together, or nothing does; a retry with the same event ids
answers from what committed; half of such a commit freezes the run.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import grpc
import pytest
from support import commit_unknown_count as counter
from support import eid, reason_of, rpc_error, scheduler_stack, snapshot, tool_state
from tool_call_support import REQ1, S1, TOOL, waiting_on_s1

from scheduler.store import CompleteCall, LeaseRef, RunEnd
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration


def last_tx2(ref: ws.LeaseRef, *, outcome: int = ws.FINISH_OUTCOME_COMPLETED, event_id: str | None = None,
             end_event_id: str | None = None, expected: int = 1, **end: Any) -> ws.CompleteToolCallRequest:
    state = tool_state(S1, TOOL, REQ1, tool_results={S1: {"status": "SUCCEEDED", "response": {"refund": "r-1"}}})
    state.pop("pending_tool", None)
    state["finished"] = {"outcome": "COMPLETED" if outcome == ws.FINISH_OUTCOME_COMPLETED else "FAILED"}
    return ws.CompleteToolCallRequest(
        lease=ref, expected_version=expected, step_key=S1, outcome=ws.TOOL_OUTCOME_SUCCEEDED,
        response_json='{"refund": "r-1"}', remote_resource_id="r-1", state_json=json.dumps(state),
        schema_version=1, next_step_key="done/attempt-1", event_id=event_id or eid(),
        end=ws.RunEnd(outcome=outcome, event_id=end_event_id or eid(), **end))


async def test_the_last_tx2_ends_the_run_in_the_same_write(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        event_id, end_event_id = eid(), eid()
        reply = await stack.work.CompleteToolCall(last_tx2(ref, event_id=event_id, end_event_id=end_event_id,
                                                           result_json='{"refund": "r-1"}', reason="all done"))
        assert (reply.version, reply.status, reply.replayed) == (2, pb.RUN_STATUS_COMPLETED, False)
        after = await snapshot(db, run_id)
        run = after["run"]
        assert (run["status"], run["version"], run["lease_owner"], run["lease_expires_at"]) == (
            "COMPLETED", 2, None, None)
        assert run["result"] == {"refund": "r-1"} and run["terminal_reason"] == "all done"
        assert run["finished_at"] is not None and run["current_step_key"] == "done/attempt-1"
        [row] = after["ledger"]
        assert (row["status"], row["response_json"]) == ("SUCCEEDED", {"refund": "r-1"})
        assert after["checkpoints"][-1]["version"] == 2
        assert after["checkpoints"][-1]["state_json"]["finished"]["outcome"] == "COMPLETED"
        events = {str(e["event_id"]): e for e in after["events"]}
        assert events[event_id]["event_type"] == "agent.tool_succeeded"
        assert events[end_event_id]["event_type"] == "agent.run_completed"
        assert events[end_event_id]["run_version"] == events[event_id]["run_version"] == 2

        # The same request again (its answer was lost): answered from what committed, nothing new.
        again = await stack.work.CompleteToolCall(last_tx2(ref, event_id=event_id, end_event_id=end_event_id,
                                                           result_json='{"refund": "r-1"}', reason="all done"))
        assert (again.version, again.status, again.replayed) == (2, pb.RUN_STATUS_COMPLETED, True)
        assert await snapshot(db, run_id) == after
        got = await stack.runs.GetRun(rs.GetRunRequest(run_id=run_id), metadata=stack.md())
        assert got.status == pb.RUN_STATUS_COMPLETED and json.loads(got.result_json) == {"refund": "r-1"}


async def test_a_failed_end_records_its_reason_and_class(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        reply = await stack.work.CompleteToolCall(last_tx2(ref, outcome=ws.FINISH_OUTCOME_FAILED,
                                                           reason="plan says stop", error_class="permanent:plan"))
        assert reply.status == pb.RUN_STATUS_FAILED
        after = await snapshot(db, run_id)
        assert (after["run"]["status"], after["run"]["terminal_reason"], after["run"]["result"]) == (
            "FAILED", "plan says stop", None)
        failed = next(e for e in after["events"] if e["event_type"] == "agent.run_failed")
        assert failed["payload"]["error_class"] == "permanent:plan"


async def test_refusals_write_nothing(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        stale = ws.LeaseRef(run_id=ref.run_id, worker_id=ref.worker_id, fencing_token=ref.fencing_token + 1)
        for request, code, reason in [
            (last_tx2(stale), grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST"),
            (last_tx2(ref, expected=0), grpc.StatusCode.ABORTED, "VERSION_CONFLICT"),
        ]:
            before = await snapshot(db, run_id)
            error = await rpc_error(stack.work.CompleteToolCall(request))
            assert (error.code(), reason_of(error)) == (code, reason), error.details()
            assert await snapshot(db, run_id) == before


async def test_half_of_a_commit_freezes_the_run(db_url, db):
    """The end's event exists but the checkpoint does not: never guessed, frozen and counted."""
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        end_event_id = eid()
        request = last_tx2(ref, end_event_id=end_event_id)
        # Half of this very write: its end event, bound to the write as the real statement binds it.
        binding = CompleteCall(
            expected_version=1, step_key=S1, succeeded=True, next_step_key=request.next_step_key,
            state=json.loads(request.state_json), schema_version=1, response=json.loads(request.response_json),
            remote_resource_id="r-1", error_code=None, evidence=None, event_id=uuid.UUID(request.event_id),
            end=RunEnd("COMPLETED", "", None, "", uuid.UUID(end_event_id)),
        ).binding(LeaseRef(uuid.UUID(ref.run_id), ref.worker_id, ref.fencing_token))
        await db.execute(
            "INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version, "
            "write_op, write_hash) "
            "SELECT $1::uuid, id, tenant_id, 'agent.run_completed', '{}'::jsonb, fencing_token, version, $3, $4 "
            "FROM agent_runs WHERE id = $2::uuid", end_event_id, run_id, binding.op, binding.digest)
        frozen_before = await counter(db)
        error = await rpc_error(stack.work.CompleteToolCall(request))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
        assert await counter(db) == frozen_before + 1
        assert (await snapshot(db, run_id))["run"]["status"] == "PAUSED_INDOUBT"
