"""A pydantic-ai Agent on agentrt (executor.pydanticai): every model request and tool call is a journaled,
fenced step; an executor killed at any step boundary is succeeded by one that repeats neither a model
call nor a side effect. Tested with pydantic-ai's own FunctionModel and TestModel."""

import json

import pydantic_agents as pa
import pytest
from executor_support import executor, history, latest_state, wait_for, wait_status
from support import scheduler_stack, submit

from executor.faults import Faults
from shared.gen.agentrt.v1 import common_pb2 as pb

pytestmark = pytest.mark.integration
END = (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED, pb.RUN_STATUS_PAUSED_INDOUBT, pb.RUN_STATUS_PAUSED_HUMAN)


@pytest.fixture(autouse=True)
def fresh_counts():
    pa.MODEL_CALLS.clear()
    pa.ORDERS.clear()
    pa.FENCES.clear()


async def _fired(faults):
    return bool(faults.fired)


async def test_a_pydantic_ai_agent_runs_with_each_step_journaled(db_url):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack, agent="pai-shop", payload={"prompt": "two pens please"})
        quiz = await submit(stack, agent="pai-quiz", payload={"prompt": "add something"})
        async with executor(stack, "pydantic_agents"):
            final = await wait_status(stack, run.run_id, *END)
            answered = await wait_status(stack, quiz.run_id, *END)
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
        assert json.loads(final.result_json) == {"order_id": "order-1", "qty": 2, "note": "3 messages"}
        rows = (await history(stack, run.run_id)).tool_executions
        assert [(r.tool_name, r.step_key.split("@")[0]) for r in rows] == [
            ("pydantic_ai.model", "model-0"), ("place_order", "tool-0-0"), ("pydantic_ai.model", "model-1")]
        assert all(r.status == pb.TOOL_EXECUTION_STATUS_SUCCEEDED for r in rows)
        journaled = json.loads(rows[0].response_json)["response"]
        assert journaled["parts"][0]["tool_name"] == "place_order"  # the model's own response, kept
        # The model's own token counts are charged to the run's budget.
        used = [json.loads(r.response_json)["response"]["usage"] for r in rows if r.tool_name == "pydantic_ai.model"]
        tokens = sum(u["input_tokens"] + u["output_tokens"] for u in used)
        assert tokens > 0 and latest_state(await history(stack, run.run_id))["usage"]["tokens"] == tokens
        assert pa.MODEL_CALLS == [1, 3] and len(pa.ORDERS) == 1
        assert answered.status == pb.RUN_STATUS_COMPLETED, answered.terminal_reason or answered.pause_reason
        quiz_rows = (await history(stack, quiz.run_id)).tool_executions
        # Two tool calls in one response: each its own step, the second after the first was journaled.
        assert [(r.tool_name, r.step_key.split("@")[0]) for r in quiz_rows] == [
            ("pydantic_ai.model", "model-0"), ("add", "tool-0-0"), ("shout", "tool-0-1"),
            ("pydantic_ai.model", "model-1")]
        answer = json.loads(answered.result_json)
        assert "add" in answer and "shout" in answer  # TestModel's answer quotes what the tools returned


BOUNDARIES = [(point, occurrence) for point in ("after_checkpoint_commit", "after_outbound_intent_commit",
                                                 "before_tool_send", "after_tool_response_before_tx2_commit")
              for occurrence in (1, 2, 3)]


@pytest.mark.parametrize(("point", "occurrence"), BOUNDARIES)
async def test_killed_at_a_step_boundary_the_successor_repeats_no_model_call_and_no_side_effect(
        db_url, point, occurrence):
    async with scheduler_stack(db_url, lease_duration_ms=1000) as stack:
        run = await submit(stack, agent="pai-shop", payload={"prompt": "two pens please"})
        faults = Faults([f"{point}@occurrence={occurrence}"])
        async with executor(stack, "pydantic_agents", faults=faults):
            await wait_for(lambda: _fired(faults), 30, f"the fault {point} #{occurrence}")
        async with executor(stack, "pydantic_agents"):
            final = await wait_status(stack, run.run_id, *END)
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
        assert json.loads(final.result_json) == {"order_id": "order-1", "qty": 2, "note": "3 messages"}
        assert pa.MODEL_CALLS == [1, 3]  # each model request made once, whatever the boundary
        assert len(pa.ORDERS) == 1  # one order; a resend after a takeover found it by key or was refused
        rows = (await history(stack, run.run_id)).tool_executions
        done = [r for r in rows if r.status == pb.TOOL_EXECUTION_STATUS_SUCCEEDED]
        assert [r.step_key.split("@")[0] for r in done] == ["model-0", "tool-0-0", "model-1"]
        assert done[-1].fencing_token > 1  # finished by a successor, under a newer lease


async def test_a_tool_without_a_lookup_killed_after_it_acted_leaves_the_run_in_doubt(db_url):
    async with scheduler_stack(db_url, lease_duration_ms=1000) as stack:
        run = await submit(stack, agent="pai-quiz", payload={"prompt": "add something"})
        faults = Faults(["after_tool_response_before_tx2_commit@occurrence=2"])  # the first tool step
        async with executor(stack, "pydantic_agents", faults=faults):
            await wait_for(lambda: _fired(faults), 30, "the fault after add answered")
        async with executor(stack, "pydantic_agents"):
            final = await wait_status(stack, run.run_id, *END)
        assert final.status == pb.RUN_STATUS_PAUSED_INDOUBT
        [row] = [r for r in (await history(stack, run.run_id)).tool_executions if r.tool_name != "pydantic_ai.model"]
        assert row.status == pb.TOOL_EXECUTION_STATUS_IN_DOUBT and row.error_code == "takeover_no_lookup"


async def test_a_tool_taking_a_run_context_gets_the_runs_dependencies(db_url):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack, agent="pai-greeter", payload={"prompt": "greet Ada"})
        async with executor(stack, "pydantic_agents"):
            final = await wait_status(stack, run.run_id, *END)
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
        assert json.loads(final.result_json) == "done: Hello, Ada (greet)"
