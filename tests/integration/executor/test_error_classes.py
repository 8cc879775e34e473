"""Each error class (docs/design.md §in-doubt) ends in its state, with the ledger row and reason right."""

import json

import pytest
from executor_support import (
    executor,
    history,
    http_tool,
    latest_state,
    mock_tool,
    scripted_agent,
    wait_status,
    write_agent,
)
from support import scheduler_stack, submit

from shared.gen.agentrt.v1 import common_pb2 as pb

pytestmark = pytest.mark.integration
END = (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED, pb.RUN_STATUS_PAUSED_INDOUBT, pb.RUN_STATUS_PAUSED_HUMAN)


def agent(mock_url, plan=None, **tool_options):
    plan = plan or [{"id": "charge", "tool": "pay.charge", "args": {"amount": "${input.amount}"}},
                    {"id": "done", "finish": {"charged": "${results.charge.response.id}"}}]
    schema = {"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer", "minimum": 1}}}
    return scripted_agent("pay", plan, [http_tool(mock_url, "pay.charge", schema=schema, timeout_s=1.0,
                                                  **tool_options)])


async def run_once(db_url, tmp_path, setup, amount=5, definition=None, within=20.0):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", definition(mock.url) if definition else agent(mock.url))
        setup(mock)
        run = await submit(stack, agent="pay", payload={"amount": amount})
        async with executor(stack, tmp_path / "agents"):
            final = await wait_status(stack, run.run_id, *END, within=within)
        return final, await history(stack, run.run_id), mock


async def test_definite_refusal_closes_the_row_failed_and_the_plan_ends_the_run(db_url, tmp_path):
    run, hist, mock = await run_once(db_url, tmp_path, lambda m: m.fault("pay.charge", "refuse"))
    assert run.status == pb.RUN_STATUS_FAILED
    assert "pay.charge failed at step charge/attempt-1: refused" in run.terminal_reason
    [row] = hist.tool_executions
    assert row.status == pb.TOOL_EXECUTION_STATUS_FAILED and row.error_code == "refused"
    result = latest_state(hist)["tool_results"]["charge/attempt-1"]
    assert result["error_class"] == "definite_no_effect" and result["status"] == "FAILED"
    assert mock.executions() == 0


async def test_local_validation_failure_never_reaches_the_ledger(db_url, tmp_path):
    run, hist, mock = await run_once(db_url, tmp_path, lambda m: None, amount=0)
    assert run.status == pb.RUN_STATUS_FAILED
    assert "invalid_arguments" in run.terminal_reason and "amount" in run.terminal_reason
    assert list(hist.tool_executions) == []
    state = latest_state(hist)
    assert state["exceptions"][0]["kind"] == "invalid_arguments" and "pending_tool" not in state
    assert mock.calls_by_key() == {}


async def test_rate_limit_is_retried_later_under_the_next_attempt(db_url, tmp_path):
    run, hist, mock = await run_once(db_url, tmp_path, lambda m: m.fault("pay.charge", "rate_limit"))
    assert run.status == pb.RUN_STATUS_COMPLETED, run.terminal_reason
    first, second = hist.tool_executions
    assert (first.step_key, first.status, first.error_code) == (
        "charge/attempt-1", pb.TOOL_EXECUTION_STATUS_FAILED, "rate_limited")
    assert (second.step_key, second.status) == ("charge/attempt-2", pb.TOOL_EXECUTION_STATUS_SUCCEEDED)
    assert first.idempotency_key != second.idempotency_key
    assert mock.calls_by_key() == {first.idempotency_key: 1, second.idempotency_key: 1}
    retry = [e for e in hist.events if e.event_type == "agent.run_retry_scheduled"]
    assert len(retry) == 1 and "retryable_transient:rate_limited" in retry[0].payload_json
    assert json.loads(run.result_json) == {"charged": json.loads(second.response_json)["id"]}


@pytest.mark.parametrize(("mode", "code"), [("timeout_after_execute", "timeout"), ("error_after", "server_error"),
                                            ("reset_after", "connection_reset")])
async def test_unknown_outcomes_freeze_in_doubt(db_url, tmp_path, mode, code):
    run, hist, mock = await run_once(db_url, tmp_path, lambda m: m.fault("pay.charge", mode, hold_ms=3000))
    assert run.status == pb.RUN_STATUS_PAUSED_INDOUBT
    assert run.pause_reason.startswith(f"tool outcome unknown: {code}") and run.lease_owner == ""
    [row] = hist.tool_executions
    assert row.status == pb.TOOL_EXECUTION_STATUS_IN_DOUBT and row.error_code == code
    assert mock.executions() == 1 and list(mock.calls_by_key().values()) == [1]


async def test_budget_exhaustion_fails_with_the_reason(db_url, tmp_path):
    plan = [{"id": "a", "tool": "pay.charge", "args": {"amount": 1}, "repeat": 5},
            {"id": "done", "finish": None}]

    def definition(url):
        return {**agent(url, plan), "budgets": {"max_steps": 3}}

    run, hist, mock = await run_once(db_url, tmp_path, lambda m: None, definition=definition)
    assert run.status == pb.RUN_STATUS_FAILED
    assert run.terminal_reason == "budget exhausted: max_steps 3 reached (3 steps taken)"
    assert len(hist.tool_executions) == 3 and mock.executions() == 3
    assert [e for e in hist.events if e.event_type == "agent.run_failed"]


async def test_budget_exhaustion_pauses_when_the_policy_says_so(db_url, tmp_path):
    plan = [{"id": "a", "tool": "pay.charge", "args": {"amount": 1}, "repeat": 5}]

    def definition(url):
        return {**agent(url, plan), "budgets": {"max_steps": 2}, "policy": {"on_budget_exhausted": "pause"}}

    run, hist, _ = await run_once(db_url, tmp_path, lambda m: None, definition=definition)
    assert run.status == pb.RUN_STATUS_PAUSED_HUMAN
    assert run.pause_reason == "budget exhausted: max_steps 2 reached (2 steps taken)"
    assert latest_state(hist)["waiting"]["kind"] == "resume"


async def test_an_executor_error_after_sending_freezes_the_step_instead_of_looping(db_url, tmp_path):
    plan = [{"id": "odd", "tool": "odd", "args": {}}, {"id": "done", "finish": None}]

    def definition(url):
        return scripted_agent("pay", plan, [{"name": "odd", "kind": "python",
                                             "callable": "executor_support:unserialisable_tool"}])

    run, hist, _ = await run_once(db_url, tmp_path, lambda m: None, definition=definition)
    assert run.status == pb.RUN_STATUS_PAUSED_INDOUBT
    # The reason says what went wrong, not only its class.
    assert run.pause_reason.startswith("tool outcome unknown: executor_error: executor error: "), run.pause_reason
    [row] = hist.tool_executions
    assert row.status == pb.TOOL_EXECUTION_STATUS_IN_DOUBT


async def test_the_agents_wall_clock_deadline_ends_the_run_by_the_database_clock(db_url, tmp_path):
    plan = [{"id": "a", "tool": "pay.charge", "args": {"amount": 1}}, {"id": "nap", "sleep_ms": 1200},
            {"id": "b", "tool": "pay.charge", "args": {"amount": 2}}, {"id": "done", "finish": None}]

    def definition(url):
        return {**agent(url, plan), "budgets": {"deadline_s": 1.0}}

    run, hist, mock = await run_once(db_url, tmp_path, lambda m: None, definition=definition)
    assert run.status == pb.RUN_STATUS_FAILED
    assert run.terminal_reason.startswith("budget exhausted: deadline ") and run.terminal_reason.endswith(" passed")
    assert [e.step_key for e in hist.tool_executions] == ["a/attempt-1"] and mock.executions() == 1
