"""requires_approval, wait_for_input and durable sleep: checkpoint, park without a lease, resume."""

import json

import pytest
from executor_support import (
    executor,
    get_run,
    history,
    http_tool,
    latest_state,
    mock_tool,
    scripted_agent,
    wait_for,
    wait_status,
    write_agent,
)
from support import scheduler_stack, submit

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs

pytestmark = pytest.mark.integration
END = (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED)


def refund_agent(url, **policy):
    plan = [{"id": "refund", "tool": "pay.refund", "args": {"amount": "${input.amount}"}, "on_failure": "continue"},
            {"id": "done", "finish": {"refund": "${results.refund.status}"}}]
    definition = scripted_agent("refunds", plan, [http_tool(url, "pay.refund", requires_approval=True)])
    if policy:
        definition["policy"] = policy
    return definition


async def resume(stack, run_id, decision, operator="alice", comment="", payload=None):
    await stack.runs.ResumeRun(rs.ResumeRunRequest(
        run_id=run_id, decision=decision, operator=operator, comment=comment,
        input_json=json.dumps(payload) if payload is not None else ""), metadata=stack.md())


async def test_approval_pauses_before_tx1_then_approve_runs_on(db_url, db, tmp_path):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", refund_agent(mock.url))
        run = await submit(stack, agent="refunds", payload={"amount": 30})
        async with executor(stack, tmp_path / "agents"):
            paused = await wait_status(stack, run.run_id, pb.RUN_STATUS_PAUSED_HUMAN)
            assert paused.pause_reason == "approval required: approve pay.refund at step refund/attempt-1"
            assert paused.lease_owner == "" and mock.calls_by_key() == {}
            assert await db.fetchval("SELECT count(*) FROM tool_executions") == 0  # nothing before approval
            await resume(stack, run.run_id, rs.RESUME_DECISION_APPROVE, comment="ok",
                         payload={"args": {"amount": 25}})  # an operator edit, validated and recorded
            done = await wait_status(stack, run.run_id, *END)
        assert done.status == pb.RUN_STATUS_COMPLETED and json.loads(done.result_json) == {"refund": "SUCCEEDED"}
        hist = await history(stack, run.run_id)
        [row] = hist.tool_executions
        assert json.loads(row.request_json) == {"amount": 25}
        assert [json.loads(r[0]) for r in mock.rows("SELECT request_json FROM requests")] == [{"amount": 25}]
        kinds = [e["kind"] for e in latest_state(hist)["exceptions"]]
        assert kinds == ["operator_response", "operator_edit"]


@pytest.mark.parametrize("policy", ["fail", "continue"])
async def test_rejected_approval_ends_as_the_policy_says(db_url, tmp_path, policy):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", refund_agent(mock.url, on_approval_rejected=policy))
        run = await submit(stack, agent="refunds", payload={"amount": 30})
        async with executor(stack, tmp_path / "agents"):
            await wait_status(stack, run.run_id, pb.RUN_STATUS_PAUSED_HUMAN)
            await resume(stack, run.run_id, rs.RESUME_DECISION_REJECT, operator="bob", comment="too much")
            done = await wait_status(stack, run.run_id, *END)
        hist = await history(stack, run.run_id)
        assert list(hist.tool_executions) == [] and mock.calls_by_key() == {}
        if policy == "fail":
            assert done.status == pb.RUN_STATUS_FAILED
            assert done.terminal_reason == "approval rejected by bob: too much"
        else:
            assert done.status == pb.RUN_STATUS_COMPLETED
            assert json.loads(done.result_json) == {"refund": "REJECTED"}


async def test_wait_for_input_pauses_and_resumes_with_the_input(db_url, tmp_path):
    plan = [{"id": "ask", "wait_for_input": "which address for order ${input.order}?"},
            {"id": "ship", "tool": "ship.create", "args": {"street": "${inputs.ask.street}"}},
            {"id": "done", "finish": "${results.ship.response.request}"}]
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", scripted_agent("ship", plan, [http_tool(mock.url, "ship.create")]))
        run = await submit(stack, agent="ship", payload={"order": 9})
        async with executor(stack, tmp_path / "agents"):
            paused = await wait_status(stack, run.run_id, pb.RUN_STATUS_PAUSED_HUMAN)
            assert paused.pause_reason == "waiting for input at ask/attempt-1: which address for order 9?"
            await resume(stack, run.run_id, rs.RESUME_DECISION_INPUT, payload={"street": "Main St"})
            done = await wait_status(stack, run.run_id, *END)
        assert done.status == pb.RUN_STATUS_COMPLETED and json.loads(done.result_json) == {"street": "Main St"}
        assert latest_state(await history(stack, run.run_id))["inputs"] == {"ask/attempt-1": {"street": "Main St"}}


async def test_durable_sleep_holds_no_lease_and_wakes_by_the_database_clock(db_url, db, tmp_path):
    plan = [{"id": "before", "tool": "t.a", "args": {}}, {"id": "nap", "sleep_ms": 1500},
            {"id": "after", "tool": "t.b", "args": {}}, {"id": "done", "finish": "ok"}]
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", scripted_agent("sleepy", plan, [http_tool(mock.url, "t.a"),
                                                                         http_tool(mock.url, "t.b")]))
        run = await submit(stack, agent="sleepy")
        async with executor(stack, tmp_path / "agents"):
            async def sleeping():
                row = await db.fetchrow("SELECT status, lease_owner, next_attempt_at, updated_at, "
                                        "clock_timestamp() AS now FROM agent_runs")
                return row if row["status"] == "QUEUED" and row["next_attempt_at"] > row["now"] else None

            row = await wait_for(sleeping, 10, "the run to sleep")
            assert row["lease_owner"] is None  # no lease held while it waits
            wake_at = row["next_attempt_at"]
            assert (wake_at - row["updated_at"]).total_seconds() == pytest.approx(1.5, abs=0.05)
            assert (await get_run(stack, run.run_id)).status == pb.RUN_STATUS_QUEUED
            done = await wait_status(stack, run.run_id, *END)
        assert done.status == pb.RUN_STATUS_COMPLETED
        after = await db.fetchval("SELECT outbound_intent_at FROM tool_executions WHERE tool_name = 't.b'")
        assert after >= wake_at  # resumed after its time, by the database clock
        events = [e.event_type for e in (await history(stack, run.run_id)).events]
        assert events.count("agent.run_sleeping") == 1
        assert sum(mock.calls_by_key().values()) == 2
