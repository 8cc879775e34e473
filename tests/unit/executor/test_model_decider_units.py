"""The model deciders driven by the executor's own state transitions (executor/advance.py, executor/steps.py)
against loopback fake providers: parallel calls as steps, the context window and its running summary,
shrinking on context-too-long, the error table's outcomes, structured final answers, caching and prices."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from model_fakes import (
    FakeProvider,
    Raw,
    anthropic_error,
    anthropic_text,
    anthropic_tool_uses,
    chat_text,
    chat_tool_calls,
    openai_error,
    responses_calls,
)

from executor.advance import Advancer, DecideAgain, EndRun, ExecuteTool, Limits, Park
from executor.agents import DefinitionError, parse_definition
from executor.checkpoint import State
from executor.config import ModelPrice
from executor.deciders import DeciderRegistry
from executor.deciders.llm import ModelDecider, window
from executor.decisions import DeciderRateLimited, DeciderUnavailable, DecisionContext, Fail, Invalid, ToolCall
from executor.steps import RunIds, initial_state, tool_result

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def definition(decider: dict[str, Any], **extra: Any) -> Any:
    return parse_definition({
        "name": "counter", "version": "1", "decider": decider, "prompt": {"system": "Count things."},
        "tools": [{"name": "count.add", "kind": "python", "callable": "tests.nowhere:add", "input_schema": SCHEMA},
                  {"name": "count.read", "kind": "python", "callable": "tests.nowhere:read"}], **extra})


def build(agent: Any, prices: dict[str, ModelPrice] | None = None) -> ModelDecider:
    registry = DeciderRegistry([agent], None, "sk-openai-test", None,  # type: ignore[arg-type]
                               anthropic_api_key="sk-ant-test", prices=prices)
    decider = registry.get(agent)
    assert isinstance(decider, ModelDecider)
    return decider


class Loop:
    """The executor's decide → persist → act loop in memory: tools answer {"echo": args} at once."""

    def __init__(self, agent: Any, decider: ModelDecider, state: State | None = None) -> None:
        self.agent, self.decider = agent, decider
        self.advancer = Advancer(agent, decider, RunIds("tenant-a", "run-1"), {"task": "count"}, Limits(), 3,
                                 lambda: dt.datetime(2026, 12, 6, tzinfo=dt.UTC))
        self.state = state or initial_state(agent)

    async def step(self) -> Any:
        self.state, action = await self.advancer.advance(self.state)
        if isinstance(action, ExecuteTool):
            self.state = tool_result(self.state, action.decision, "SUCCEEDED",
                                     response={"echo": action.decision.request})
        elif isinstance(action, Park):
            self.state = self.state.model_copy(update={"waiting": None})
        return action

    async def run(self, limit: int = 500) -> Any:
        for _ in range(limit):
            action = await self.step()
            if isinstance(action, EndRun):
                return action
        raise AssertionError("the run did not end")


def ctx(agent: Any, state: State) -> DecisionContext:
    return DecisionContext(agent=agent, run_id="run-1", tenant_id="tenant-a", input={"task": "count"}, state=state)


async def test_parallel_tool_calls_are_steps_in_reply_order_and_are_replayed_as_one_turn():
    async with FakeProvider([
        anthropic_tool_uses(("count_add", {"n": 1}), ("count_read", {}), ("count_add", {"n": 2}), text="Three."),
        anthropic_tool_uses(("agentrt_finish", {"result": "done"}))]) as fake:
        agent = definition({"kind": "anthropic", "base_url": fake.url, "model": "claude-test"})
        loop = Loop(agent, build(agent))
        end = await loop.run()
    assert isinstance(end, EndRun) and end.finished.result == "done"
    assert len(fake.requests) == 2  # the queued calls needed no model call
    tools = [e for e in loop.state.history if e.kind == "tool"]
    assert [(e.tool, e.node, e.detail["args"]) for e in tools] == [
        ("count.add", "count.add@0.0", {"n": 1}), ("count.read", "count.read@0.1", {}),
        ("count.add", "count.add@0.2", {"n": 2})]
    # The second request shows the reply as one assistant turn, its results as one user turn, in order.
    messages = fake.requests[1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert [b["name"] for b in messages[1]["content"]] == ["count_add", "count_read", "count_add"]
    results = messages[2]["content"]
    assert [b["tool_use_id"] for b in results] == [b["id"] for b in messages[1]["content"]]
    assert json.loads(results[2]["content"])["response"] == {"echo": {"n": 2}}
    assert "queue" not in loop.state.agent_state


async def test_parallel_calls_off_takes_the_first_and_says_so_to_the_provider():
    async with FakeProvider([chat_tool_calls(("count_add", {"n": 1}), ("count_add", {"n": 2})),
                             chat_tool_calls(("agentrt_finish", {"result": 1}))]) as fake:
        agent = definition({"kind": "openai", "base_url": fake.openai_url, "model": "gpt-test",
                            "parallel_tool_calls": False})
        loop = Loop(agent, build(agent))
        await loop.run()
    assert fake.requests[0]["parallel_tool_calls"] is False
    assert [e.node for e in loop.state.history if e.kind == "tool"] == ["count.add@0"]


def summarising_fake(finish_after: int, calls: list[str]) -> FakeProvider:
    """Decision requests get one count_add call until `finish_after` tool steps exist; summarisation requests
    (no tools) get notes naming the steps they were shown."""
    def answer(body: dict[str, Any]) -> dict[str, Any]:
        if "tools" not in body:
            text = body["messages"][-1]["content"]
            calls.append("summarise")
            return chat_text("notes: " + ",".join(line.split(":")[0] for line in text.splitlines()
                                                  if line.startswith("step ")))
        calls.append("decide")
        step = len([c for c in calls if c == "decide"])
        if step > finish_after:
            return chat_tool_calls(("agentrt_finish", {"result": step}))
        return chat_tool_calls(("count_add", {"n": step}))
    return FakeProvider(default=answer)


async def test_the_window_stays_bounded_and_older_steps_are_summarised_once_per_chunk():
    calls: list[str] = []
    async with summarising_fake(20, calls) as fake:
        agent = definition({"kind": "openai", "base_url": fake.openai_url, "model": "gpt-test",
                            "context": {"last_turns": 4, "summarise": True, "summarise_every": 4}})
        loop = Loop(agent, build(agent))
        await loop.run()
    decisions = [r for r in fake.requests if "tools" in r]
    shown = [sum(1 for m in r["messages"] if m["role"] == "tool") for r in decisions]
    assert max(shown) <= 4 + 4 - 1  # the window, plus the steps waiting to make a whole chunk
    assert min(shown[8:]) >= 4
    # 20 tool steps: the window keeps 4, so steps 0-15 are summarised in chunks of 4: four calls.
    summaries = [r for r in fake.requests if "tools" not in r]
    assert len(summaries) == 4 and calls.count("summarise") == 4
    assert "step 0:" in summaries[0]["messages"][-1]["content"] and "step 4:" in summaries[1]["messages"][-1]["content"]
    # Each summary carries the previous one forward; the last covers steps 12-15.
    assert "notes: step 8,step 9,step 10,step 11" in summaries[3]["messages"][-1]["content"]
    assert loop.state.agent_state["summary_through"] == 15
    assert loop.state.agent_state["summary"] == "notes: step 12,step 13,step 14,step 15"
    assert "Notes on the earlier steps" in json.dumps(decisions[-1]["messages"])
    # Every call's tokens were charged to the run, the summarisation calls' included.
    assert loop.state.usage.tokens == sum(t + 12 for t in fake.prompt_tokens)


async def test_a_summary_made_is_reused_after_a_failed_call_and_after_a_takeover():
    calls: list[str] = []
    async with summarising_fake(30, calls) as fake:
        agent = definition({"kind": "openai", "base_url": fake.openai_url, "model": "gpt-test",
                            "context": {"last_turns": 2, "summarise": True, "summarise_every": 2}})
        loop = Loop(agent, build(agent))
        for _ in range(4):
            await loop.step()
        assert calls == ["decide"] * 4
        # The next decision needs a summary; the summary is made, then the decision call fails (503).
        decide = fake.default
        fake.script = [decide, openai_error(503, "busy", type_="server_error")]  # type: ignore[list-item]
        with pytest.raises(DeciderUnavailable):
            await loop.step()
        assert calls == ["decide"] * 4 + ["summarise"]
        tokens_before = loop.state.usage.tokens
        await loop.step()  # the retry: the summary is not made again, and is charged with this decision
        assert calls == ["decide"] * 4 + ["summarise", "decide"]
        summary_tokens = fake.prompt_tokens[4] + 12
        assert loop.state.usage.tokens - tokens_before == summary_tokens + fake.prompt_tokens[-1] + 12
        persisted = State.model_validate(loop.state.model_dump())
        # A takeover: a new executor (new decider objects) continues from the persisted state.
        successor = Loop(agent, build(agent), persisted)
        await successor.step()
        assert calls[-1] == "decide" and calls.count("summarise") == 1
        assert successor.state.agent_state["summary_through"] == persisted.agent_state["summary_through"]


async def test_without_summarising_older_steps_are_counted_not_shown():
    calls: list[str] = []
    async with summarising_fake(10, calls) as fake:
        agent = definition({"kind": "openai", "base_url": fake.openai_url, "model": "gpt-test",
                            "context": {"last_turns": 3, "max_tool_answer_chars": 100}})
        loop = Loop(agent, build(agent))
        await loop.run()
    last = fake.requests[-1]["messages"]
    assert sum(1 for m in last if m["role"] == "tool") == 3
    assert {"role": "user", "content": "(7 earlier steps of this run are not shown.)"} in last
    assert "summarise" not in calls


async def test_a_capped_tool_result_points_at_the_full_answer():
    async with FakeProvider([chat_tool_calls(("count_add", {"n": 1})), chat_text("ok")]) as fake:
        agent = definition({"kind": "openai", "base_url": fake.openai_url, "model": "m",
                            "context": {"max_tool_answer_chars": 100}})
        loop = Loop(agent, build(agent))
        loop.state, action = await loop.advancer.advance(loop.state)
        assert isinstance(action, ExecuteTool)
        loop.state = tool_result(loop.state, action.decision, "SUCCEEDED", response={"blob": "x" * 5000})
        await loop.step()
    content = fake.requests[1]["messages"][-1]["content"]
    assert len(content) < 300 and "the full answer is step count.add@0/attempt-1 of this run's ledger" in content


async def test_context_too_long_shrinks_the_window_then_fails_with_the_reason():
    too_long = openai_error(400, "This model's maximum context length is 8192 tokens", code="context_length_exceeded")
    script: list[Any] = [chat_tool_calls(("count_add", {"n": i})) for i in range(20)]
    async with FakeProvider([*script, too_long, chat_tool_calls(("count_read", {})), too_long, too_long,
                             too_long]) as fake:
        agent = definition({"kind": "openai", "base_url": fake.openai_url, "model": "gpt-test",
                            "context": {"last_turns": 16}})
        loop = Loop(agent, build(agent))
        for _ in range(20):
            await loop.step()
        await loop.step()  # too long once: the same decision with a quarter of the window
        shown = [sum(1 for m in r["messages"] if m["role"] == "tool") for r in fake.requests[20:22]]
        assert shown == [16, 4] and loop.state.history[-1].tool == "count.read"
        end = await loop.step()  # too long at every size: a definite failure with the provider's reason
    assert isinstance(end, EndRun) and end.finished.outcome == "FAILED"
    assert end.finished.reason.startswith("context too long for gpt-test even after shrinking it: HTTP 400 "
                                          "context_length_exceeded: ")
    assert [sum(1 for m in r["messages"] if m["role"] == "tool") for r in fake.requests[22:]] == [16, 4, 1]


async def test_the_error_table_decides_what_a_failed_call_does():
    async with FakeProvider() as fake:
        agent = definition({"kind": "anthropic", "base_url": fake.url, "model": "claude-test"})
        decider = build(agent)
        state = initial_state(agent)
        fake.script = [anthropic_error(429, "rate_limit_error", "slow down", headers={"retry-after": "3"})]
        with pytest.raises(DeciderRateLimited) as limited:
            await decider.decide(ctx(agent, state))
        assert limited.value.retry_after_s == 3.0
        fake.script = [anthropic_error(529, "overloaded_error", "Overloaded")]
        with pytest.raises(DeciderUnavailable) as overloaded:
            await decider.decide(ctx(agent, state))
        assert not isinstance(overloaded.value, DeciderRateLimited) and "529" in str(overloaded.value)
        fake.script = [anthropic_error(400, "invalid_request_error", "messages: roles must alternate")]
        invalid = (await decider.decide(ctx(agent, state))).decision
        assert isinstance(invalid, Invalid) and invalid.kind == "invalid_request" and "alternate" in invalid.detail
        fake.script = [anthropic_error(401, "authentication_error", "invalid x-api-key")]
        failed = (await decider.decide(ctx(agent, state))).decision
        assert isinstance(failed, Fail) and "HTTP 401" in failed.reason
        fake.script = [Raw("<html>bad gateway</html>", content_type="application/json")]
        garbled = (await decider.decide(ctx(agent, state))).decision
        assert isinstance(garbled, Invalid) and garbled.kind == "parse_failure"
        fake.script = [Raw("<html>bad gateway</html>")]  # text/html: the SDK hands back the text
        html = (await decider.decide(ctx(agent, state))).decision
        assert isinstance(html, Invalid) and html.kind == "parse_failure"
        fake.script = [anthropic_text("I can't help with that.", stop_reason="refusal")]
        refused = (await decider.decide(ctx(agent, state))).decision
        assert isinstance(refused, Invalid) and refused.kind == "refusal"
        await decider.close()
    async with FakeProvider([openai_error(429, "You exceeded your current quota", type_="insufficient_quota",
                                          code="insufficient_quota", headers={"retry-after": "1"})]) as fake:
        agent = definition({"kind": "openai", "base_url": fake.openai_url, "model": "gpt-test"})
        quota = (await build(agent).decide(ctx(agent, initial_state(agent)))).decision
    assert isinstance(quota, Fail) and "insufficient_quota" in quota.reason


async def test_the_final_answer_fits_the_result_schema_or_is_an_invalid_decision():
    result_schema = {"type": "object", "properties": {"refund": {"type": "number"}}, "required": ["refund"]}
    async with FakeProvider([responses_calls(("agentrt_finish", {"result": {"refund": "lots"}})),
                             responses_calls(text='{"refund": 12.5}')]) as fake:
        agent = definition({"kind": "openai", "api": "responses", "base_url": fake.openai_url, "model": "gpt-test",
                            "result_schema": result_schema})
        loop = Loop(agent, build(agent))
        assert isinstance(await loop.step(), DecideAgain)
        end = await loop.step()
    assert isinstance(end, EndRun) and end.finished.result == {"refund": 12.5}
    assert [e["kind"] for e in loop.state.exceptions] == ["invalid_arguments"]
    [finish] = [t for t in fake.requests[0]["tools"] if t["name"] == "agentrt_finish"]
    assert finish["parameters"]["properties"]["result"] == result_schema
    assert fake.paths == ["/v1/responses", "/v1/responses"] and fake.requests[0]["store"] is False
    # The invalid answer was told to the model, as a note after the input.
    assert "could not be used (invalid_arguments" in fake.requests[1]["input"][-1]["content"]


async def test_anthropic_caching_breakpoints_usage_and_prices(tmp_path: Path):
    key_file = tmp_path / "anthropic.key"
    key_file.write_text("sk-ant-from-file\n")
    price = ModelPrice(input=3, output=15, cached_input=0.3, cache_write=3.75)
    async with FakeProvider([anthropic_tool_uses(("count_add", {"n": 1})), anthropic_tool_uses(("count_add", {"n": 2})),
                             anthropic_tool_uses(("agentrt_finish", {"result": 2}))]) as fake:
        agent = definition({"kind": "anthropic", "base_url": fake.url, "model": "claude-test", "temperature": 0.2,
                            "api_key_file": str(key_file), "max_output_tokens": 512})
        loop = Loop(agent, build(agent, {"claude-test": price}))
        await loop.run()
    first, _, third = fake.requests
    assert fake.headers[0]["Authorization"] == "Bearer sk-ant-from-file"
    assert first["system"] == [{"type": "text", "text": "Count things.", "cache_control": {"type": "ephemeral"}}]
    assert first["temperature"] == 0.2 and first["max_tokens"] == 512
    assert first["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": False}
    assert first["messages"][0]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert third["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert sum(1 for m in third["messages"] for b in m["content"] if "cache_control" in b) == 2
    # The fake read the second and third prompts' prefixes from its cache: usage and cost say so.
    assert loop.state.usage.tokens == sum(fake.prompt_tokens) + 3 * 12
    assert loop.state.usage.cost_usd > 0
    assert "sk-ant-from-file" not in json.dumps(loop.state.model_dump())


async def test_cost_of_cached_tokens_uses_the_price_table():
    price = ModelPrice(input=3, output=15, cached_input=0.3, cache_write=3.75)
    reply = {**anthropic_tool_uses(("count_read", {})),
             "usage": {"input_tokens": 100, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 200,
                       "output_tokens": 50}}
    async with FakeProvider([reply]) as fake:
        agent = definition({"kind": "anthropic", "base_url": fake.url, "model": "claude-test"})
        proposal = await build(agent, {"claude-test": price}).decide(ctx(agent, initial_state(agent)))
    assert isinstance(proposal.decision, ToolCall)
    assert (proposal.input_tokens, proposal.output_tokens, proposal.tokens) == (1300, 50, 1350)
    assert proposal.extra["cached_input_tokens"] == 1000 and proposal.extra["cache_write_input_tokens"] == 200
    assert proposal.cost_usd == pytest.approx((100 * 3 + 1000 * 0.3 + 200 * 3.75 + 50 * 15) / 1e6)


def test_window_keeps_a_replys_calls_together():
    agent = definition({"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m",
                        "context": {"last_turns": 2}})
    state = initial_state(agent)
    history = []
    for index, node in enumerate(["count.add@0", "count.add@1.0", "count.read@1.1", "count.add@1.2"]):
        history.append({"index": index, "node": node, "step_key": f"{node}/attempt-1", "kind": "tool",
                        "tool": node.split("@")[0], "detail": {"args": {}}})
    state = State.model_validate({**state.model_dump(), "history": history, "step_index": 4})
    plan = window(state, agent.decider.context, {})
    assert [e.node for e in plan.kept] == ["count.add@1.0", "count.read@1.1", "count.add@1.2"] and plan.omitted == 1


def test_a_key_file_that_cannot_be_read_stops_the_executor_naming_the_field(tmp_path: Path):
    agent = definition({"kind": "anthropic", "model": "claude-test", "api_key_file": str(tmp_path / "missing")})
    with pytest.raises(DefinitionError) as refused:
        build(agent)
    assert refused.value.field == "decider.api_key_file" and "cannot read" in refused.value.problem


def test_a_summarising_window_must_fit_the_answers_in_memory():
    with pytest.raises(DefinitionError) as refused:
        definition({"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m",
                    "context": {"last_turns": 60, "summarise": True, "summarise_every": 8}})
    assert refused.value.field == "decider.context.summarise_every"


async def test_openai_cached_prompt_tokens_are_priced_as_cached_input():
    price = ModelPrice(input=2.0, output=8.0, cached_input=0.5)
    big = {"type": "object", "properties": {f"field_{i}": {"type": "string", "description": "x" * 200}
                                            for i in range(30)}}
    async with FakeProvider([chat_tool_calls(("count_read", {})), chat_tool_calls(("count_read", {})),
                             chat_tool_calls(("agentrt_finish", {"result": 1}))]) as fake:
        agent = parse_definition({
            "name": "reader", "version": "1", "decider": {"kind": "openai", "base_url": fake.openai_url,
                                                          "model": "gpt-test"},
            "tools": [{"name": "count.read", "kind": "python", "callable": "tests.nowhere:read", "input_schema": big}]})
        loop = Loop(agent, build(agent, {"gpt-test": price}))
        await loop.run()
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in fake.usages]
    assert cached[0] == 0 and cached[1] >= 1024 and cached[2] >= cached[1]  # the stable prefix comes first
    expected = sum((u["prompt_tokens"] - c) * 2.0 + c * 0.5 + u["completion_tokens"] * 8.0
                   for u, c in zip(fake.usages, cached, strict=True)) / 1e6
    assert loop.state.usage.cost_usd == pytest.approx(expected)


async def test_the_prompt_budget_shrinks_the_window_before_the_call():
    async with FakeProvider(default=chat_tool_calls(("count_add", {"n": 1}))) as fake:
        agent = definition({"kind": "openai", "base_url": fake.openai_url, "model": "gpt-test",
                            "context": {"last_turns": 32, "max_prompt_tokens": 1500}})
        loop = Loop(agent, build(agent))
        for _ in range(40):
            await loop.step()
    shown = [sum(1 for m in r["messages"] if m["role"] == "tool") for r in fake.requests]
    assert max(shown) < 32 and shown[-1] in (2, 8)  # a quarter or a sixteenth of the window
    assert all(t <= 1500 * 1.3 for t in fake.prompt_tokens)  # the estimate is close to the fake's own count
    assert len(fake.requests) == 40  # shrinking by the estimate costs no call


async def test_a_failed_summarisation_call_goes_through_the_same_table():
    calls: list[str] = []
    async with summarising_fake(30, calls) as fake:
        agent = definition({"kind": "openai", "base_url": fake.openai_url, "model": "gpt-test",
                            "context": {"last_turns": 2, "summarise": True, "summarise_every": 2}})
        loop = Loop(agent, build(agent))
        for _ in range(4):
            await loop.step()
        fake.script = [openai_error(503, "busy", type_="server_error")]  # the summarisation call
        with pytest.raises(DeciderUnavailable):
            await loop.step()
        fake.script = [openai_error(400, "summary request refused")]
        assert isinstance(await loop.step(), DecideAgain)
        assert loop.state.exceptions[-1]["kind"] == "invalid_request"
        await loop.step()  # then it works: summary made, decision taken
    # Steps 0-3 and the invalid decision (4): the window keeps 3 and 4, the rest is summarised.
    assert calls[-2:] == ["summarise", "decide"] and loop.state.agent_state["summary_through"] == 2


async def test_json_that_is_no_reply_of_the_api_is_a_parse_failure():
    wrong = {"id": "x", "object": "chat.completion", "created": 1, "model": "m",
             "choices": [{"index": 0, "finish_reason": "tool_calls",
                          "message": {"role": "assistant", "tool_calls": [{"id": 1, "function": 7}]}}]}
    async with FakeProvider([wrong, {"unexpected": True}, anthropic_text("x")]) as fake:
        agent = definition({"kind": "openai", "base_url": fake.openai_url, "model": "gpt-test"})
        decider = build(agent)
        for _ in range(2):
            invalid = (await decider.decide(ctx(agent, initial_state(agent)))).decision
            assert isinstance(invalid, Invalid) and invalid.kind == "parse_failure", invalid
