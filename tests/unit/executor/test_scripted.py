from executor.agents import parse_definition
from executor.checkpoint import HistoryEntry
from executor.deciders.base import DecisionContext, Fail, Finish, Invalid, Sleep, ToolCall, WaitForInput
from executor.deciders.scripted import ScriptedDeciderImpl
from executor.steps import initial_state

PLAN = [
    {"id": "get", "tool": "t", "args": {"id": "${input.id}", "label": "order-${input.id}"}, "on_failure": "fallback"},
    {"id": "poll", "tool": "t", "args": {"seen": "${results.get.response.n}"}, "repeat": 2},
    {"id": "nap", "sleep_ms": 5},
    {"id": "ask", "wait_for_input": "address for ${input.id}?"},
    {"id": "done", "finish": {"address": "${inputs.ask.street}"}},
    {"id": "fallback", "fail": "could not read ${input.id}"},
]
AGENT = parse_definition({"name": "a", "version": "1", "decider": {"kind": "scripted", "plan": PLAN},
                          "tools": [{"name": "t", "kind": "python", "callable": "executor_support:noop_tool"}]})


def ctx(state):
    return DecisionContext(agent=AGENT, run_id="r", tenant_id="t", input={"id": 7}, state=state)


def step(state, node, kind, result=None, human=None, tool="t"):
    key = f"{node}/attempt-1"
    update = {"history": [*state.history, HistoryEntry(index=len(state.history), node=node, step_key=key,
                                                       kind=kind, tool=tool if kind == "tool" else None)]}
    if result is not None:
        update["tool_results"] = {**state.tool_results, key: result}
    if human is not None:
        update["inputs"] = {**state.inputs, key: human}
    return state.model_copy(update=update)


async def test_the_plan_walks_in_order_with_templates_repeats_and_waits():
    decider = ScriptedDeciderImpl(AGENT.decider)
    state = initial_state(AGENT)
    first = await decider.decide(ctx(state))
    assert first.node == "get" and first.decision == ToolCall("t", {"id": 7, "label": "order-7"})
    state = step(state, "get", "tool", {"status": "SUCCEEDED", "response": {"n": 3}})
    second = await decider.decide(ctx(state))
    assert second.node == "poll" and second.decision == ToolCall("t", {"seen": 3})
    state = step(state, "poll", "tool", {"status": "SUCCEEDED", "response": {}})
    again = await decider.decide(ctx(state))
    assert again.node == "poll@2"  # the logical iteration is part of the step key
    state = step(state, "poll@2", "tool", {"status": "SUCCEEDED", "response": {}})
    assert (await decider.decide(ctx(state))).decision == Sleep(5)
    state = step(state, "nap", "sleep")
    assert (await decider.decide(ctx(state))).decision == WaitForInput("address for 7?")
    state = step(state, "ask", "input", human={"street": "Main"})
    final = await decider.decide(ctx(state))
    assert final.decision == Finish({"address": "Main"})


async def test_failures_follow_on_failure_and_bad_templates_are_invalid():
    decider = ScriptedDeciderImpl(AGENT.decider)
    state = step(initial_state(AGENT), "get", "tool", {"status": "FAILED", "error_code": "refused"})
    assert (await decider.decide(ctx(state))).decision == Fail("could not read 7")
    broken = DecisionContext(agent=AGENT, run_id="r", tenant_id="t", input={}, state=initial_state(AGENT))
    proposal = await decider.decide(broken)
    assert isinstance(proposal.decision, Invalid) and "input.id" in proposal.decision.detail


BRANCHING = parse_definition({
    "name": "b", "version": "1", "tools": [{"name": "t", "kind": "python", "callable": "executor_support:noop_tool"}],
    "decider": {"kind": "scripted", "plan": [
        {"id": "check", "tool": "t", "args": {}},
        {"id": "approve", "when": {"value": "${input.amount}", "gt": 500},
         "wait_for_input": "approve ${input.amount}?"},
        {"id": "big", "when": {"value": "${results.check.response.tier}", "eq": "gold"}, "tool": "t", "args": {}},
        {"id": "done", "finish": "ok"}]}})


def branching_ctx(state, amount):
    return DecisionContext(agent=BRANCHING, run_id="r", tenant_id="t", input={"amount": amount}, state=state)


async def test_a_node_whose_when_does_not_hold_is_skipped_and_one_that_holds_is_entered():
    decider = ScriptedDeciderImpl(BRANCHING.decider)
    checked = step(initial_state(BRANCHING), "check", "tool", {"status": "SUCCEEDED", "response": {"tier": "gold"}})
    small = await decider.decide(branching_ctx(checked, 120))
    assert small.node == "big" and small.decision == ToolCall("t", {})
    large = await decider.decide(branching_ctx(checked, 750))
    assert large.node == "approve" and large.decision == WaitForInput("approve 750?")
    approved = step(checked, "approve", "input", human=None)
    assert (await decider.decide(branching_ctx(approved, 750))).node == "big"
    plain = step(initial_state(BRANCHING), "check", "tool", {"status": "SUCCEEDED", "response": {"tier": "std"}})
    assert (await decider.decide(branching_ctx(plain, 10))).decision == Finish("ok")


async def test_a_condition_on_a_value_that_is_not_a_number_fails_the_plan():
    decider = ScriptedDeciderImpl(BRANCHING.decider)
    checked = step(initial_state(BRANCHING), "check", "tool", {"status": "SUCCEEDED", "response": {"tier": "x"}})
    proposal = await decider.decide(branching_ctx(checked, "lots"))
    assert isinstance(proposal.decision, Fail) and "needs a number" in proposal.decision.reason
