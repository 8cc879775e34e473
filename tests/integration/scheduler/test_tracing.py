import contextlib
import json

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support import claim, eid, lease_ref, scheduler_stack

from scheduler.store.queries import Q
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.tracing import inject_metadata

pytestmark = pytest.mark.integration


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_rpc_spans_continue_the_caller_trace_and_reach_the_outbox(db_url, db, spans):
    provider, exporter = spans
    tracer = provider.get_tracer("test-client")
    async with scheduler_stack(db_url, tracer_provider=provider) as stack:
        with tracer.start_as_current_span("client.submit") as parent:
            reply = await stack.runs.SubmitRun(
                rs.SubmitRunRequest(agent_name="demo", input_json="{}"),
                metadata=inject_metadata(stack.md()))
        lease = await claim(stack)
        with tracer.start_as_current_span("client.step") as step:
            await stack.work.SaveCheckpoint(
                ws.SaveCheckpointRequest(lease=lease_ref(lease), expected_version=0, state_json=json.dumps({}),
                                         schema_version=1, event_id=eid()),
                metadata=inject_metadata())

    server_spans = {s.name: s for s in exporter.get_finished_spans() if s.kind.name == "SERVER"}
    submit_span = server_spans["/agentrt.v1.RunService/SubmitRun"]
    assert submit_span.context.trace_id == parent.get_span_context().trace_id
    assert submit_span.parent.span_id == parent.get_span_context().span_id
    assert submit_span.attributes["agentrt.run_id"] == reply.run.run_id
    assert submit_span.attributes["agentrt.tenant_id"] == "tenant-a"

    save_span = server_spans["/agentrt.v1.WorkService/SaveCheckpoint"]
    assert save_span.parent.span_id == step.get_span_context().span_id
    assert save_span.attributes["agentrt.fencing_token"] == lease.run.fencing_token == 1
    assert save_span.attributes["agentrt.run_version"] == 1

    claim_span = server_spans["/agentrt.v1.WorkService/ClaimWork"]
    assert claim_span.attributes["agentrt.fencing_token"] == 1

    rows = {r["event_type"]: r["traceparent"] for r in await db.fetch("SELECT * FROM outbox")}
    trace_hex = f"{parent.get_span_context().trace_id:032x}"
    # The outbox row carries the W3C context of the span whose transaction wrote it.
    assert rows["agent.run_submitted"].split("-")[1] == trace_hex
    assert rows["agent.run_submitted"].split("-")[2] == f"{submit_span.context.span_id:016x}"
    assert rows["agent.checkpoint"].split("-")[2] == f"{save_span.context.span_id:016x}"


async def test_a_refused_call_is_an_error_span_with_its_status_code(db_url, spans):
    import grpc

    provider, exporter = spans
    async with scheduler_stack(db_url, tracer_provider=provider) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stack.runs.GetRun(rs.GetRunRequest(run_id="00000000-0000-0000-0000-000000000001"),
                                    metadata=stack.md())
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    span = next(s for s in exporter.get_finished_spans() if s.name == "/agentrt.v1.RunService/GetRun")
    assert span.status.status_code.name == "ERROR"
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert span.attributes["agentrt.error_reason"] == "NOT_FOUND"


async def test_work_service_spans_carry_the_runs_tenant(db_url, spans):
    provider, exporter = spans
    async with scheduler_stack(db_url, tracer_provider=provider) as stack:
        await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json="{}"), metadata=stack.md("acme"))
        lease = await claim(stack)
        ref = lease_ref(lease)
        await stack.work.Heartbeat(ws.HeartbeatRequest(lease=ref))
        await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(lease=ref, expected_version=0, state_json="{}",
                                                                 schema_version=1, event_id=eid()))
        await stack.work.FinishRun(ws.FinishRunRequest(lease=ref, expected_version=1,
                                                       outcome=ws.FINISH_OUTCOME_COMPLETED, event_id=eid()))
    for name in ("ClaimWork", "Heartbeat", "SaveCheckpoint", "FinishRun"):
        span = next(s for s in exporter.get_finished_spans() if s.name == f"/agentrt.v1.WorkService/{name}")
        assert span.attributes["agentrt.tenant_id"] == "acme", name
        assert span.attributes["agentrt.run_id"] == lease.run.run_id, name
        assert span.attributes["agentrt.fencing_token"] == 1, name


async def test_batched_writes_are_spans_of_their_own_callers(db_url, db, spans):
    """Each WriteBatch item is a server span whose parent is the span that made that write."""
    provider, exporter = spans
    tracer = provider.get_tracer("test-client")
    async with scheduler_stack(db_url, tracer_provider=provider) as stack:
        await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json="{}"), metadata=stack.md())
        lease = await claim(stack)
        ref = lease_ref(lease)
        items, callers = [], []
        for name in ("beat", "save"):
            with tracer.start_as_current_span(f"client.{name}") as caller:
                carrier = dict(inject_metadata())
                callers.append(caller)
            item = ws.WriteBatchItem(traceparent=carrier["traceparent"])
            if name == "beat":
                item.heartbeat.CopyFrom(ws.HeartbeatRequest(lease=ref))
            else:
                item.save_checkpoint.CopyFrom(ws.SaveCheckpointRequest(
                    lease=ref, expected_version=0, state_json="{}", schema_version=1, event_id=eid()))
            items.append(item)
        reply = await stack.work.WriteBatch(ws.WriteBatchRequest(items=items))
    assert [r.WhichOneof("result") for r in reply.results] == ["heartbeat", "save_checkpoint"]
    finished = exporter.get_finished_spans()
    for name, caller in zip(("Heartbeat", "SaveCheckpoint"), callers, strict=True):
        span = next(s for s in finished if s.name == f"/agentrt.v1.WorkService/{name}")
        assert span.parent.span_id == caller.get_span_context().span_id, name
        assert span.context.trace_id == caller.get_span_context().trace_id, name
        assert span.attributes["agentrt.fencing_token"] == 1, name
    row = await db.fetchrow("SELECT traceparent FROM outbox WHERE event_type = 'agent.checkpoint'")
    save = next(s for s in finished if s.name == "/agentrt.v1.WorkService/SaveCheckpoint")
    assert row["traceparent"].split("-")[1:3] == [f"{save.context.trace_id:032x}", f"{save.context.span_id:016x}"]


@pytest.mark.parametrize("batched", [False, True], ids=["single-call", "batched"])
async def test_without_an_exporter_the_callers_context_still_reaches_the_outbox(db_url, db, batched):
    """otel_exporter none: nothing is recorded, yet the outbox row names the caller's trace and span."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    provider = TracerProvider(sampler=ALWAYS_OFF)
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with scheduler_stack(db_url, tracer_provider=provider) as stack:
        await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json="{}"), metadata=stack.md())
        lease = await claim(stack)
        request = ws.SaveCheckpointRequest(lease=lease_ref(lease), expected_version=0, state_json="{}",
                                           schema_version=1, event_id=eid())
        if batched:
            reply = await stack.work.WriteBatch(ws.WriteBatchRequest(
                items=[ws.WriteBatchItem(save_checkpoint=request, traceparent=caller)]))
            assert reply.results[0].WhichOneof("result") == "save_checkpoint"
        else:
            await stack.work.SaveCheckpoint(request, metadata=[("traceparent", caller)])
    row = await db.fetchrow("SELECT traceparent FROM outbox WHERE event_type = 'agent.checkpoint'")
    assert row["traceparent"] == caller


async def test_without_an_exporter_a_call_without_context_starts_a_trace_of_its_own(db_url, db):
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    async with scheduler_stack(db_url, tracer_provider=TracerProvider(sampler=ALWAYS_OFF)) as stack:
        for _ in range(2):
            await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json="{}"), metadata=stack.md())
    rows = await db.fetch("SELECT traceparent FROM outbox ORDER BY id")
    assert len(rows) == 2
    parts = [row["traceparent"].split("-") for row in rows]
    assert all(len(p) == 4 and len(p[1]) == 32 and p[1] != "0" * 32 and p[3] == "00" for p in parts), parts
    assert parts[0][1] != parts[1][1], "each call without context is a trace of its own"


async def test_get_run_names_the_trace_of_the_runs_last_step(db_url, db):
    """`agentrt runs get` shows the trace id of the latest write, to look the step up in a tracing backend."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    submit_trace, step_trace = "0af7651916cd43dd8448eb211c80319c", "4bf92f3577b34da6a3ce929d0e0e4736"
    async with scheduler_stack(db_url, tracer_provider=TracerProvider(sampler=ALWAYS_OFF)) as stack:
        caller = ("traceparent", f"00-{submit_trace}-b7ad6b7169203331-01")
        reply = await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json="{}"),
                                           metadata=[*stack.md(), caller])
        run = await stack.runs.GetRun(rs.GetRunRequest(run_id=reply.run.run_id), metadata=stack.md())
        assert run.last_trace_id == submit_trace
        lease = await claim(stack)
        await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=lease_ref(lease), expected_version=0, state_json="{}", schema_version=1, event_id=eid()),
            metadata=[("traceparent", f"00-{step_trace}-00f067aa0ba902b7-01")])
        run = await stack.runs.GetRun(rs.GetRunRequest(run_id=reply.run.run_id), metadata=stack.md())
        assert run.last_trace_id == step_trace
        await db.execute("UPDATE outbox SET traceparent = NULL")
        run = await stack.runs.GetRun(rs.GetRunRequest(run_id=reply.run.run_id), metadata=stack.md())
        assert run.last_trace_id == ""


async def test_rpc_spans_follow_the_rpc_conventions_and_sql_spans_name_their_query(db_url, spans):
    """RPC attributes on every call (status code 0 when OK); with trace_sql, each named statement is a
    CLIENT span of the call with the database conventions and no parameter values."""
    provider, exporter = spans
    async with scheduler_stack(db_url, tracer_provider=provider, trace_sql=True) as stack:
        with exporter_cleared(exporter):
            reply = await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json='{"secret": 41}'),
                                               metadata=stack.md())
    finished = exporter.get_finished_spans()
    [submit] = [s for s in finished if s.name == "/agentrt.v1.RunService/SubmitRun"]
    assert (submit.attributes["rpc.system"], submit.attributes["rpc.service"], submit.attributes["rpc.method"],
            submit.attributes["rpc.grpc.status_code"]) == ("grpc", "agentrt.v1.RunService", "SubmitRun", 0)
    # The scheduler's background tasks (schedule firer, retention, database health) trace their own
    # statements in traces of their own: only the call's trace is looked at here.
    sql = [s for s in finished if s.attributes.get("db.system") == "postgresql"
           and s.context.trace_id == submit.context.trace_id]
    assert sql and all(s.parent is not None and s.parent.span_id == submit.context.span_id for s in sql)
    assert all(s.kind.name == "CLIENT" and s.attributes["db.system.name"] == "postgresql" for s in sql)
    for span in sql:
        operation, query = span.attributes["db.operation.name"], span.attributes["agentrt.query"]
        assert operation in ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH") and query
        assert span.name == span.attributes["db.query.summary"] == f"{operation} {query}"
        text = span.attributes["db.query.text"]
        assert "41" not in text and ("$1" in text or not getattr(Q, query).params), text  # placeholders only
    assert any(s.attributes["db.operation.name"] in ("INSERT", "WITH") for s in sql), [s.name for s in sql]
    assert reply.run.run_id

    # Off by default: no statement spans.
    exporter.clear()
    async with scheduler_stack(db_url, tracer_provider=provider) as stack:
        await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json="{}"), metadata=stack.md())
    assert not [s for s in exporter.get_finished_spans() if s.attributes.get("db.system") == "postgresql"]


@contextlib.contextmanager
def exporter_cleared(exporter):
    exporter.clear()
    yield
