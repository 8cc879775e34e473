"""Heartbeats keep a lease through long steps; a lost or cancelled lease stops the work at once."""

import pytest
from executor_support import SLOW, executor, history, scripted_agent, wait_for, wait_status, write_agent
from support import scheduler_stack, submit

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs

pytestmark = pytest.mark.integration
SLOW_TOOL = {"name": "slow", "kind": "python", "callable": "executor_support:slow_tool", "timeout_s": 60}


def slow_agent(seconds):
    plan = [{"id": "wait", "tool": "slow", "args": {"seconds": seconds}}, {"id": "done", "finish": "ok"}]
    return scripted_agent("slowpoke", plan, [SLOW_TOOL])


async def started(db):
    key = await db.fetchval("SELECT idempotency_key FROM tool_executions")
    return key if key and SLOW.get(key) == "started" else None


async def test_heartbeats_keep_the_lease_through_a_step_longer_than_the_lease(db_url, db, tmp_path):
    async with scheduler_stack(db_url, lease_duration_ms=1000) as stack:
        write_agent(tmp_path / "agents", slow_agent(2.5))
        run = await submit(stack, agent="slowpoke")
        async with executor(stack, tmp_path / "agents"):
            done = await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED)
        assert done.status == pb.RUN_STATUS_COMPLETED and done.fencing_token == 1  # never taken over


async def test_a_lost_lease_cancels_the_work_at_once_and_nothing_is_written(db_url, db, tmp_path):
    async with scheduler_stack(db_url, lease_duration_ms=1500) as stack:
        write_agent(tmp_path / "agents", slow_agent(30))
        await submit(stack, agent="slowpoke")
        async with executor(stack, tmp_path / "agents") as worker:
            key = await wait_for(lambda: started(db), 10, "the tool to start")
            # Another worker took the run over (a new fence): the next heartbeat is refused.
            await db.execute("UPDATE agent_runs SET fencing_token = fencing_token + 1, lease_owner = 'other'")
            await wait_for(lambda: _eq(SLOW.get(key), "cancelled"), 2.0, "the tool call to be cancelled")
            await wait_for(lambda: _eq(len(worker.active), 0), 2.0, "the slot to be freed")
        row = await db.fetchrow("SELECT status FROM tool_executions")
        assert row["status"] == "OUTBOUND_INTENT"  # the old holder wrote nothing after losing the lease
        assert await db.fetchval("SELECT version FROM agent_runs") == 1


async def test_cancel_run_reaches_the_holder_through_its_heartbeat(db_url, db, tmp_path):
    async with scheduler_stack(db_url, lease_duration_ms=1500) as stack:
        write_agent(tmp_path / "agents", slow_agent(30))
        run = await submit(stack, agent="slowpoke")
        async with executor(stack, tmp_path / "agents"):
            key = await wait_for(lambda: started(db), 10, "the tool to start")
            await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run.run_id, reason="customer withdrew"),
                                       metadata=stack.md())
            await wait_for(lambda: _eq(SLOW.get(key), "cancelled"), 2.0, "the tool call to be cancelled")
            done = await wait_status(stack, run.run_id, pb.RUN_STATUS_CANCELLED)
        assert done.terminal_reason == "cancelled: customer withdrew"
        hist = await history(stack, run.run_id)
        assert [e.event_type for e in hist.events][-1] == "agent.run_cancelled"


async def _eq(value, expected):
    return value == expected
