"""One trace follows a step: the executor's step span is the parent of the scheduler's RPC spans,
with the same fencing token, and its context reaches the tool and the outbox rows."""

import pytest
from executor_support import CALLS, executor, scripted_agent, wait_status, write_agent
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support import scheduler_stack, submit

from shared.gen.agentrt.v1 import common_pb2 as pb

pytestmark = pytest.mark.integration


async def test_the_step_span_parents_the_scheduler_spans_with_the_same_fence(db_url, db, tmp_path):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    plan = [{"id": "note", "tool": "crm.note", "args": {"text": "hello"}}, {"id": "done", "finish": "ok"}]
    write_agent(tmp_path / "agents", scripted_agent(
        "tracer", plan, [{"name": "crm.note", "kind": "python", "callable": "executor_support:record_tool"}]))
    async with scheduler_stack(db_url, tracer_provider=provider) as stack:
        run = await submit(stack, agent="tracer")
        async with executor(stack, tmp_path / "agents", tracer_provider=provider):
            await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED)

    spans = exporter.get_finished_spans()
    steps = [s for s in spans if s.name == "agent.step"]
    tool_step = next(s for s in steps if s.attributes.get("agentrt.tool") == "crm.note")
    assert tool_step.attributes["agentrt.run_id"] == run.run_id
    assert tool_step.attributes["agentrt.tenant_id"] == "tenant-a"
    assert tool_step.attributes["agentrt.agent"] == "tracer"
    assert tool_step.attributes["agentrt.step_key"] == "note/attempt-1"
    assert len(tool_step.attributes["agentrt.decision_hash"]) == 64
    fence = tool_step.attributes["agentrt.fencing_token"]
    assert fence == 1

    server = {s.name.rsplit("/", 1)[-1]: s for s in spans
              if s.kind.name == "SERVER" and s.parent is not None and s.parent.span_id == tool_step.context.span_id}
    assert {"SaveCheckpoint", "BeginToolCall", "CompleteToolCall"} <= set(server)
    for rpc in ("SaveCheckpoint", "BeginToolCall", "CompleteToolCall"):
        span = server[rpc]
        assert span.context.trace_id == tool_step.context.trace_id
        assert span.attributes["agentrt.fencing_token"] == fence, rpc

    # The tool call carried the step's W3C context, and so did the outbox rows its transactions wrote.
    key = await db.fetchval("SELECT idempotency_key FROM tool_executions")
    traceparent = CALLS[key][0]["traceparent"]
    assert traceparent.split("-")[1] == f"{tool_step.context.trace_id:032x}"
    assert traceparent.split("-")[2] == f"{tool_step.context.span_id:016x}"
    row = await db.fetchrow("SELECT traceparent FROM outbox WHERE event_type = 'agent.tool_requested'")
    assert row["traceparent"].split("-")[1] == f"{tool_step.context.trace_id:032x}"
    assert row["traceparent"].split("-")[2] == f"{server['BeginToolCall'].context.span_id:016x}"
