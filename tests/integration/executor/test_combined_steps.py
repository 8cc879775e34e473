"""The executor writes Tx2 of a step and Tx1 of the next in one call when the next decision is a tool call.

The decision is still persisted before its intent (invariant 6): the checkpoint
that records it and the intent row commit in the same transaction. A lost
answer is retried with the same event ids; a crash right after that commit is
taken over like any recorded intent (looked up, never resent blindly).
"""

import json

import grpc
import pytest
from executor_support import (
    executor,
    history,
    http_tool,
    mock_tool,
    scripted_agent,
    tap_writes,
    wait_for,
    wait_status,
    write_agent,
)
from support import scheduler_stack, submit

from executor.faults import Faults
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration
END = (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED, pb.RUN_STATUS_PAUSED_INDOUBT, pb.RUN_STATUS_PAUSED_HUMAN)
RPCS = ("SaveCheckpoint", "BeginToolCall", "CompleteToolCall", "CompleteAndBeginToolCall", "FinishRun")


def three_steps(url: str) -> dict:
    plan = [{"id": "a", "tool": "t.a", "args": {"n": 1}}, {"id": "b", "tool": "t.b", "args": {"n": 2}},
            {"id": "c", "tool": "t.a", "args": {"n": 3}}, {"id": "done", "finish": "ok"}]
    return scripted_agent("chain", plan, [http_tool(url, "t.a"), http_tool(url, "t.b")])


@pytest.mark.parametrize("batch_writes", [True, False], ids=["batched", "single-calls"])
async def test_each_tool_step_after_the_first_is_one_scheduler_call(db_url, db, tmp_path, batch_writes):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", three_steps(mock.url))
        run = await submit(stack, agent="chain")
        seen: dict[str, list] = {}
        async with executor(stack, tmp_path / "agents", batch_writes=batch_writes) as worker:
            tap_writes(worker.services.client, seen, RPCS)
            final = await wait_status(stack, run.run_id, *END)
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
        # decision a: SaveCheckpoint; a: Tx1; a→b and b→c: one call each; c: Tx2 with the finish, which
        # ends the run in the same transaction (no FinishRun).
        assert {name: len(calls) for name, calls in seen.items()} == {
            "SaveCheckpoint": 1, "BeginToolCall": 1, "CompleteAndBeginToolCall": 2, "CompleteToolCall": 1}
        assert [(r.step_key, r.next.step_key) for r in seen["CompleteAndBeginToolCall"]] == [
            ("a/attempt-1", "b/attempt-1"), ("b/attempt-1", "c/attempt-1")]
        [last] = seen["CompleteToolCall"]
        assert last.step_key == "c/attempt-1" and last.end.outcome == ws.FINISH_OUTCOME_COMPLETED
        assert json.loads(final.result_json) == "ok"

        hist = await history(stack, run.run_id)
        assert [(e.step_key, e.status) for e in hist.tool_executions] == [
            ("a/attempt-1", pb.TOOL_EXECUTION_STATUS_SUCCEEDED), ("b/attempt-1", pb.TOOL_EXECUTION_STATUS_SUCCEEDED),
            ("c/attempt-1", pb.TOOL_EXECUTION_STATUS_SUCCEEDED)]
        assert sorted(mock.calls_by_key().values()) == [1, 1, 1]
        assert [c.version for c in hist.checkpoints] == list(range(1, len(hist.checkpoints) + 1))
        # The last checkpoint records the end; its Tx2 event and the run's end share its version.
        assert json.loads(hist.checkpoints[-1].state_json)["finished"]["outcome"] == "COMPLETED"
        tail = [(e.event_type, e.run_version) for e in hist.events][-2:]
        assert tail == [("agent.tool_succeeded", hist.checkpoints[-1].version),
                        ("agent.run_completed", hist.checkpoints[-1].version)]
        assert final.version == hist.checkpoints[-1].version and not final.HasField("lease_expires_at")
        # Invariant 6: each intent was recorded at a version whose checkpoint holds that very decision.
        checkpoints = {c.version: c for c in hist.checkpoints}
        requested = [e for e in hist.events if e.event_type == "agent.tool_requested"]
        assert len(requested) == 3
        for event in requested:
            step = json.loads(event.payload_json)["step_key"]
            pending = json.loads(checkpoints[event.run_version].state_json)["pending_tool"]
            row = next(r for r in hist.tool_executions if r.step_key == step)
            assert (pending["step_key"], pending["request_hash"]) == (step, row.request_hash)


@pytest.mark.parametrize("batch_writes", [True, False], ids=["batched", "single-calls"])
async def test_a_lost_answer_is_retried_with_the_same_event_ids(db_url, db, tmp_path, batch_writes):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", three_steps(mock.url))
        run = await submit(stack, agent="chain")
        seen: dict[str, list] = {}
        async with executor(stack, tmp_path / "agents", batch_writes=batch_writes) as worker:
            # The first combined call commits, but its answer never arrives.
            tap_writes(worker.services.client, seen, ("CompleteAndBeginToolCall",),
                       lose=lambda name, n: grpc.StatusCode.UNAVAILABLE if n == 1 else None)
            final = await wait_status(stack, run.run_id, *END)
            assert worker.services.client.retries == 1
        sent = [(r.event_id, r.next.event_id, r.next.execution_id) for r in seen["CompleteAndBeginToolCall"]]
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
        assert len(sent) == 3 and sent[0] == sent[1]  # the retry reused all three ids
        hist = await history(stack, run.run_id)
        assert len({e.event_id for e in hist.events}) == len(hist.events)  # nothing written twice
        assert sorted(mock.calls_by_key().values()) == [1, 1, 1]


async def test_a_crash_after_the_combined_commit_is_taken_over_not_resent(db_url, db, tmp_path):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url, lease_duration_ms=1000) as stack:
        write_agent(tmp_path / "agents", three_steps(mock.url))
        run = await submit(stack, agent="chain")
        # The second intent is the first one recorded by CompleteAndBeginToolCall.
        faults = Faults(["after_outbound_intent_commit@occurrence=2"])
        async with executor(stack, tmp_path / "agents", faults=faults):
            await wait_for(lambda: _fired(faults), 10, "the fault")
        left = await db.fetchrow("SELECT status, current_step_key FROM agent_runs")
        assert (left["status"], left["current_step_key"]) == ("WAITING_TOOL", "b/attempt-1")
        async with executor(stack, tmp_path / "agents"):
            final = await wait_status(stack, run.run_id, *END)
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
        rows = [(e.step_key, e.status) for e in (await history(stack, run.run_id)).tool_executions]
        # The takeover looked b up: not found (never sent), so b ran again as its next attempt, once.
        assert ("b/attempt-1", pb.TOOL_EXECUTION_STATUS_NOT_EXECUTED) in rows
        assert ("b/attempt-2", pb.TOOL_EXECUTION_STATUS_SUCCEEDED) in rows
        assert set(mock.calls_by_key().values()) == {1}


async def _fired(faults: Faults) -> bool:
    return bool(faults.fired)
