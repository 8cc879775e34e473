"""The `anthropic` and `openai` deciders in real runs (a real scheduler and executor on PostgreSQL, the
mock tool server on loopback) against loopback fake providers speaking each API's wire format."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from executor_support import executor, history, http_tool, latest_state, mock_tool, wait_for, wait_status, write_agent
from model_fakes import (
    FakeProvider,
    anthropic_error,
    anthropic_tool_uses,
    chat_tool_calls,
    openai_error,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support import scheduler_stack, submit

from executor.faults import Faults
from shared.gen.agentrt.v1 import common_pb2 as pb

pytestmark = pytest.mark.integration
END = (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED, pb.RUN_STATUS_PAUSED_HUMAN)
SCHEMA = {"type": "object", "required": ["order_id"], "additionalProperties": False,
          "properties": {"order_id": {"type": "integer"}}}
RESULT = {"type": "object", "required": ["shipped"], "properties": {"shipped": {"type": "array"}}}
PRICE = {"input": 3.0, "output": 15.0, "cached_input": 0.3, "cache_write": 3.75}
KEY = "sk-ant-very-secret-0123456789"


def agent(decider: dict[str, Any], mock_url: str, **extra: Any) -> dict[str, Any]:
    return {"name": "support", "version": "1", "decider": decider, "prompt": {"system": "You handle returns."},
            "policy": {"max_decision_retries": 2}, "tools": [http_tool(mock_url, "orders.get", schema=SCHEMA)],
            **extra}


async def test_an_anthropic_run_with_parallel_calls_a_structured_answer_caching_and_prices(db_url, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)  # every record of every logger, the providers' SDKs and httpx among them
    key_file = tmp_path / "anthropic.key"
    key_file.write_text(KEY + "\n")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    fake = FakeProvider([
        anthropic_tool_uses(("orders_get", {"order_id": 1}), ("orders_get", {"order_id": 2})),
        anthropic_tool_uses(("agentrt_finish", {"result": {"shipped": "both"}})),  # not the schema
        anthropic_tool_uses(("agentrt_finish", {"result": {"shipped": [1, 2]}}))])
    async with fake, mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", agent({"kind": "anthropic", "base_url": fake.url, "model": "claude-test",
                                                "api_key_file": str(key_file), "result_schema": RESULT}, mock.url))
        run = await submit(stack, agent="support", payload={"ask": "where are orders 1 and 2?"})
        async with executor(stack, tmp_path / "agents", tracer_provider=provider,
                            model_prices={"claude-test": PRICE}):
            final = await wait_status(stack, run.run_id, *END)
        hist = await history(stack, run.run_id)
    assert final.status == pb.RUN_STATUS_COMPLETED and json.loads(final.result_json) == {"shipped": [1, 2]}
    # One reply, two calls: two ledgered steps in the reply's order, each sent once.
    rows = sorted(hist.tool_executions, key=lambda r: r.step_key)
    assert [(r.step_key, json.loads(r.request_json)) for r in rows] == [
        ("orders.get@0.0/attempt-1", {"order_id": 1}), ("orders.get@0.1/attempt-1", {"order_id": 2})]
    assert sorted(mock.calls_by_key().values()) == [1, 1]
    second = fake.requests[1]["messages"]
    assert [b["input"] for b in second[1]["content"]] == [{"order_id": 1}, {"order_id": 2}]
    assert [json.loads(b["content"])["status"] for b in second[2]["content"]] == ["SUCCEEDED", "SUCCEEDED"]
    # The answer that missed the result schema was recorded and told to the model.
    state = latest_state(hist)
    assert [e["kind"] for e in state["exceptions"]] == ["invalid_arguments"]
    assert "could not be used (invalid_arguments" in fake.requests[2]["messages"][-1]["content"][-1]["text"]
    # Usage from the provider's counts, cache reads and writes priced by the executor's table.
    assert all(h["Authorization"] == f"Bearer {KEY}" for h in fake.headers)
    usages = fake.usages
    assert usages[1]["cache_read_input_tokens"] > 0 and usages[2]["cache_read_input_tokens"] > 0
    expected_cost = sum(u["input_tokens"] * 3 + u["cache_read_input_tokens"] * 0.3
                        + u["cache_creation_input_tokens"] * 3.75 + u["output_tokens"] * 15 for u in usages) / 1e6
    assert state["usage"]["tokens"] == sum(fake.prompt_tokens) + sum(u["output_tokens"] for u in usages)
    assert state["usage"]["cost_usd"] == pytest.approx(expected_cost)
    # GenAI spans, with the cache counts; no key and no prompt text anywhere.
    chats = [s for s in exporter.get_finished_spans() if s.name == "chat claude-test"]
    assert len(chats) == 3
    attributes = chats[1].attributes
    assert (attributes["gen_ai.system"], attributes["gen_ai.request.model"], attributes["gen_ai.response.model"]) == (
        "anthropic", "claude-test", "fake-claude")
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == usages[1]["cache_read_input_tokens"]
    assert attributes["gen_ai.usage.input_tokens"] == fake.prompt_tokens[1]
    for span in exporter.get_finished_spans():
        assert KEY not in json.dumps(dict(span.attributes or {}), default=str)
    assert KEY not in str(hist)  # checkpoints, journal, events, ledger
    assert caplog.records and KEY not in caplog.text  # nor in any log record, at any level


async def test_a_rate_limit_sleeps_until_retry_after_without_an_attempt_and_overload_backs_off(db_url, tmp_path):
    fake = FakeProvider([
        anthropic_error(429, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit",
                        headers={"retry-after": "1"}),
        anthropic_error(529, "overloaded_error", "Overloaded"),
        anthropic_tool_uses(("agentrt_finish", {"result": "ok"}))])
    async with fake, mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", agent({"kind": "anthropic", "base_url": fake.url, "model": "claude-test"},
                                               mock.url))
        run = await submit(stack, agent="support", payload={"ask": "hello"})
        async with executor(stack, tmp_path / "agents", anthropic_api_key=KEY):
            final = await wait_status(stack, run.run_id, *END)
        hist = await history(stack, run.run_id)
    assert final.status == pb.RUN_STATUS_COMPLETED and len(fake.requests) == 3
    assert fake.times[1] - fake.times[0] >= 0.95  # came back no earlier than the provider said
    kinds = [e.event_type for e in hist.events]
    [sleeping] = [e for e in hist.events if e.event_type == "agent.run_sleeping"]
    assert "model rate limited" in sleeping.payload_json
    [retry] = [e for e in hist.events if e.event_type == "agent.run_retry_scheduled"]
    assert "model_unavailable" in retry.payload_json and "529" in retry.payload_json
    assert kinds.index("agent.run_sleeping") < kinds.index("agent.run_retry_scheduled")


async def test_openai_definite_failures_end_the_run_with_the_reason(db_url, tmp_path):
    too_long = openai_error(400, "Your input exceeds the context window of this model.", code="context_length_exceeded")
    quota = openai_error(429, "You exceeded your current quota, please check your plan and billing details.",
                         type_="insufficient_quota", code="insufficient_quota", headers={"retry-after": "1"})

    def answer(body: dict[str, Any]) -> Any:
        asked = json.dumps(body["input"][0])
        return quota if "quota" in asked else too_long

    async with FakeProvider(default=answer) as fake, mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", agent({"kind": "openai", "api": "responses", "base_url": fake.openai_url,
                                                "model": "gpt-test", "api_key_env": "NO_SUCH_VARIABLE_X"}, mock.url))
        quota_run = await submit(stack, agent="support", payload={"ask": "quota"})
        long_run = await submit(stack, agent="support", payload={"ask": "long"})
        async with executor(stack, tmp_path / "agents", openai_api_key="sk-openai-test"):
            quota_final = await wait_status(stack, quota_run.run_id, *END)
            long_final = await wait_status(stack, long_run.run_id, *END)
        quota_hist = await history(stack, quota_run.run_id)
    assert quota_final.status == pb.RUN_STATUS_FAILED
    assert quota_final.terminal_reason.startswith("model call refused for good: HTTP 429 insufficient_quota")
    assert not [e for e in quota_hist.events if e.event_type in ("agent.run_retry_scheduled", "agent.run_sleeping")]
    assert long_final.status == pb.RUN_STATUS_FAILED
    assert long_final.terminal_reason.startswith("context too long for gpt-test even after shrinking it")
    assert fake.headers[0]["Authorization"] == "Bearer sk-openai-test"  # the executor's key, the env var unset
    assert {p for p in fake.paths} == {"/v1/responses"} and len(fake.requests) == 1 + 3


async def test_a_summarising_run_makes_each_summary_once_across_a_takeover(db_url, tmp_path):
    calls: list[str] = []

    def answer(body: dict[str, Any]) -> Any:
        if "tools" not in body:
            calls.append("summarise")
            return {"id": "c", "object": "chat.completion", "created": 1, "model": "fake-gpt",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": f"notes {len(calls)}"}}]}
        calls.append("decide")
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        decided = calls.count("decide")
        if decided > 12:
            return chat_tool_calls(("agentrt_finish", {"result": {"decisions": decided, "shown": done}}))
        return chat_tool_calls(("orders_get", {"order_id": decided}))

    async with FakeProvider(default=answer) as fake, mock_tool(tmp_path) as mock, \
            scheduler_stack(db_url, lease_duration_ms=1000) as stack:
        write_agent(tmp_path / "agents", agent(
            {"kind": "openai", "base_url": fake.openai_url, "model": "gpt-test",
             "context": {"last_turns": 2, "summarise": True, "summarise_every": 2}}, mock.url))
        run = await submit(stack, agent="support", payload={"ask": "walk the orders"})
        # Executor A dies right after the checkpoint that carries the first summary; B takes over.
        faults = Faults(["after_checkpoint_commit@occurrence=5"])
        async with executor(stack, tmp_path / "agents", faults=faults, openai_api_key="k"):
            await wait_for(lambda: _true(faults.fired), 20, "the fault")
        assert calls.count("summarise") == 1
        async with executor(stack, tmp_path / "agents", openai_api_key="k"):
            final = await wait_status(stack, run.run_id, *END, within=60)
        hist = await history(stack, run.run_id)
    assert final.status == pb.RUN_STATUS_COMPLETED
    state = latest_state(hist)
    # 12 tool steps, a window of 2: steps 0-9 summarised two at a time, each chunk once.
    assert calls.count("summarise") == 5 and state["agent_state"]["summary_through"] == 9
    assert json.loads(final.result_json)["shown"] <= 3
    # Each summary is in the journal too, with the decision it was made for: five, in order.
    summaries = [json.loads(j.detail_json)["detail"]["summary"] for j in hist.journal
                 if "summary" in json.loads(j.detail_json or "{}").get("detail", {})]
    assert [s["through"] for s in summaries] == [1, 3, 5, 7, 9]
    assert summaries[-1]["text"] == state["agent_state"]["summary"]
    assert len(hist.tool_executions) == 12 and sorted(set(mock.calls_by_key().values())) == [1]


async def _true(value: Any) -> bool:
    return bool(value)
