"""The openai decider against a local server speaking the chat-completions protocol (no network)."""

import json

import pytest
from executor_support import executor, history, http_tool, latest_state, mock_tool, wait_status, write_agent
from openai_stub import OpenAIStub, completion, tool_call
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from support import scheduler_stack, submit

from executor.metrics import executor_metrics
from shared.gen.agentrt.v1 import common_pb2 as pb

pytestmark = pytest.mark.integration
END = (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED, pb.RUN_STATUS_PAUSED_HUMAN)
SCHEMA = {"type": "object", "required": ["order_id"], "additionalProperties": False,
          "properties": {"order_id": {"type": "integer"}}}


def openai_agent(stub_url, mock_url, **extra):
    return {"name": "support", "version": "3",
            "decider": {"kind": "openai", "base_url": stub_url, "model": "gpt-test", "api_key_env": "TEST_LLM_KEY",
                        "usd_per_1k_input_tokens": 0.5, "usd_per_1k_output_tokens": 1.5},
            "model": {"provider": "stub", "name": "gpt-test", "version": "2026-01"},
            "prompt": {"version": "p4", "system": "You handle returns."},
            "policy": {"version": "pol-9", "max_decision_retries": 2},
            "tools": [http_tool(mock_url, "orders.get", schema=SCHEMA)], **extra}


async def run_agent(db_url, tmp_path, replies, monkeypatch, *, status_codes=(), within=20.0, **extra):
    monkeypatch.setenv("TEST_LLM_KEY", "sk-local-test")
    stub = OpenAIStub(replies)
    stub.status_codes = list(status_codes)
    async with stub, mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", openai_agent(stub.url, mock.url, **extra))
        run = await submit(stack, agent="support", payload={"ask": "where is order 42?"})
        async with executor(stack, tmp_path / "agents"):
            final = await wait_status(stack, run.run_id, *END, within=within)
        return final, await history(stack, run.run_id), stub, mock


async def test_tool_calling_run_completes_with_usage_cost_and_versions(db_url, tmp_path, monkeypatch):
    final, hist, stub, mock = await run_agent(db_url, tmp_path, [
        tool_call("orders_get", {"order_id": 42}), tool_call("agentrt_finish", {"result": {"status": "shipped"}})],
        monkeypatch)
    assert final.status == pb.RUN_STATUS_COMPLETED and json.loads(final.result_json) == {"status": "shipped"}
    first, second = stub.requests
    assert stub.headers[0]["Authorization"] == "Bearer sk-local-test"
    assert first["model"] == "gpt-test" and first["messages"][0] == {"role": "system", "content": "You handle returns."}
    [tool] = [t for t in first["tools"] if t["function"]["name"] == "orders_get"]
    assert tool["function"]["parameters"] == SCHEMA
    # The second request replays the decided call and its result, rebuilt from the checkpoint.
    assistant, result = second["messages"][-2:]
    assert assistant["tool_calls"][0]["function"] == {"name": "orders_get", "arguments": '{"order_id": 42}'}
    assert result["role"] == "tool" and json.loads(result["content"])["status"] == "SUCCEEDED"
    state = latest_state(hist)
    assert state["usage"] == {"steps": 2, "tokens": 60, "cost_usd": pytest.approx(0.05)}
    assert state["versions"] == {"agent": "support", "agent_version": "3", "decider": "openai",
                                 "model": "stub:gpt-test:2026-01", "prompt": "p4", "policy": "pol-9",
                                 "tool_schemas": state["versions"]["tool_schemas"]}
    [row] = hist.tool_executions
    assert row.step_key == "orders.get@0/attempt-1" and json.loads(row.request_json) == {"order_id": 42}
    assert list(mock.calls_by_key().values()) == [1]


async def test_malformed_tool_arguments_are_recorded_and_retried_never_guessed(db_url, tmp_path, monkeypatch):
    final, hist, stub, mock = await run_agent(db_url, tmp_path, [
        tool_call("orders_get", '{"order_id": 42', raw=True),  # not JSON
        tool_call("orders_get", {"order_id": "forty-two"}),  # JSON, but not the schema
        tool_call("orders_get", {"order_id": 42}),
        tool_call("agentrt_finish", {"result": "ok"})], monkeypatch)
    assert final.status == pb.RUN_STATUS_COMPLETED
    state = latest_state(hist)
    assert [e["kind"] for e in state["exceptions"]] == ["parse_failure", "invalid_arguments"]
    assert state["exceptions"][0]["raw"]["tool_calls"][0]["function"]["arguments"] == '{"order_id": 42'
    assert "forty-two" in state["exceptions"][1]["detail"] or "integer" in state["exceptions"][1]["detail"]
    # The model was told, and nothing invalid reached the ledger or the tool.
    assert "could not be used (parse_failure" in stub.requests[1]["messages"][-1]["content"]
    assert "could not be used (invalid_arguments" in stub.requests[2]["messages"][-1]["content"]
    [row] = hist.tool_executions
    assert json.loads(row.request_json) == {"order_id": 42} and list(mock.calls_by_key().values()) == [1]
    assert state["usage"]["steps"] == 4 and state["usage"]["tokens"] == 120


async def test_refusals_and_filters_past_the_retry_budget_end_the_run(db_url, tmp_path, monkeypatch):
    refusal = completion({"role": "assistant", "content": None, "refusal": "I cannot help with that."})
    filtered = completion({"role": "assistant", "content": ""}, finish_reason="content_filter")
    final, hist, _, mock = await run_agent(db_url, tmp_path, [refusal, filtered, refusal], monkeypatch)
    assert final.status == pb.RUN_STATUS_FAILED
    assert final.terminal_reason == ("no valid decision after 3 attempt(s); last: refusal: "
                                     "I cannot help with that.")
    assert [e["kind"] for e in latest_state(hist)["exceptions"]] == ["refusal", "content_filter", "refusal"]
    assert list(hist.tool_executions) == [] and mock.calls_by_key() == {}


async def test_token_budget_stops_the_run_with_the_reason(db_url, tmp_path, monkeypatch):
    final, hist, stub, _ = await run_agent(db_url, tmp_path, [
        tool_call("orders_get", {"order_id": 1}), tool_call("orders_get", {"order_id": 2}),
        tool_call("orders_get", {"order_id": 3})], monkeypatch, budgets={"max_tokens": 50})
    assert final.status == pb.RUN_STATUS_FAILED
    assert final.terminal_reason == "budget exhausted: max_tokens 50 reached (60 used)"
    assert len(stub.requests) == 2 and len(hist.tool_executions) == 2


async def test_an_unavailable_model_endpoint_retries_the_run_later(db_url, tmp_path, monkeypatch):
    final, hist, stub, _ = await run_agent(db_url, tmp_path, [tool_call("agentrt_finish", {"result": 1})],
                                           monkeypatch, status_codes=[503])
    assert final.status == pb.RUN_STATUS_COMPLETED and len(stub.requests) == 2
    [retry] = [e for e in hist.events if e.event_type == "agent.run_retry_scheduled"]
    assert "model_unavailable" in retry.payload_json


async def test_the_model_call_is_a_genai_span_and_its_usage_is_counted_per_tenant_and_agent(db_url, tmp_path,
                                                                                             monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", "sk-local-test")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    stub = OpenAIStub([tool_call("orders_get", {"order_id": 42}), tool_call("agentrt_finish", {"result": "ok"})])
    async with stub, mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", openai_agent(stub.url, mock.url))
        run = await submit(stack, agent="support", payload={"ask": "where is order 42?"})
        async with executor(stack, tmp_path / "agents", tracer_provider=provider) as worker:
            final = await wait_status(stack, run.run_id, *END)
            registry = executor_metrics(worker).registry
    assert final.status == pb.RUN_STATUS_COMPLETED

    chats = [s for s in exporter.get_finished_spans() if s.name == "chat gpt-test"]
    assert len(chats) == 2
    steps = {s.context.span_id: s for s in exporter.get_finished_spans() if s.name == "agent.step"}
    for span in chats:
        assert span.kind == SpanKind.CLIENT and span.parent is not None and span.parent.span_id in steps
        a = span.attributes
        assert (a["gen_ai.system"], a["gen_ai.operation.name"], a["gen_ai.request.model"]) == (
            "openai", "chat", "gpt-test")
        assert a["gen_ai.response.model"] == "stub-model-1" and a["gen_ai.response.id"] == "chatcmpl-1"
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (20, 10)
        assert a["agentrt.cost_usd"] == pytest.approx((20 * 0.5 + 10 * 1.5) / 1000)
        assert a["gen_ai.response.finish_reasons"] == ("tool_calls",)
        assert not any("content" in key or "prompt" in key for key in a), "no prompt or answer text in traces"
    # The tool call's HTTP span is the step's child as well, with the fence and the idempotency key.
    [http] = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CLIENT and s.name == "POST"]
    assert http.attributes["agentrt.fencing_token"] == 1
    assert http.attributes["agentrt.idempotency_key"] == next(iter(mock.calls_by_key()))
    assert http.attributes["http.response.status_code"] == 200

    def sample(name, **labels):
        return registry.get_sample_value(name, {"tenant": "tenant-a", "agent": "support", **labels})

    assert sample("agentrt_model_tokens_total", type="input") == 40
    assert sample("agentrt_model_tokens_total", type="output") == 20
    assert sample("agentrt_model_tokens_total", type="other") == 0
    assert sample("agentrt_model_cost_usd_total") == pytest.approx(0.05)
