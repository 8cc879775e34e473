import asyncio
import re
import urllib.request
import uuid

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from support import claim, eid, lease_ref, scheduler_stack, submit

from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.tracing import inject_metadata

pytestmark = pytest.mark.integration


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


async def test_scheduler_serves_prometheus_metrics(db_url):
    async with scheduler_stack(db_url, metrics_addr="127.0.0.1:0") as stack:
        for _ in range(3):
            await submit(stack)
        port = stack.server.metrics_port
        assert port
        stack.server.metrics.apply(await stack.server.store.runs.global_stats())
        text = await asyncio.to_thread(scrape, port)
    assert 'agentrt_rpc_total{code="OK",method="SubmitRun"} 3.0' in text
    assert 'agentrt_runs{status="QUEUED"} 3.0' in text
    assert "agentrt_outbox_pending 3.0" in text
    assert "agentrt_rpc_seconds_bucket" in text


async def test_scheduler_serves_database_capacity_and_pool_gauges(db_url):
    async with scheduler_stack(db_url, metrics_addr="127.0.0.1:0") as stack:
        port = stack.server.metrics_port
        assert port
        stack.server.metrics.apply(await stack.server.store.runs.global_stats())
        text = await asyncio.to_thread(scrape, port)
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    assert samples["agentrt_db_size_bytes"] > 0
    assert samples["agentrt_db_max_connections"] >= samples["agentrt_db_client_connections"] >= 1
    assert samples["agentrt_db_pool_max_connections"] >= 1
    assert 'agentrt_db_pool_connections{state="idle"}' in samples


def scrape_openmetrics(port: int) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                     headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
        return reply.read().decode()


EXEMPLAR = re.compile(r'^agentrt_rpc_seconds_bucket\{le="[^"]+",method="(\w+)"\} \S+ '
                      r'# \{span_id="([0-9a-f]{16})",trace_id="([0-9a-f]{32})"\} \S+', re.M)


@pytest.mark.parametrize("batched", [False, True], ids=["call", "write-batch-item"])
async def test_checkpoint_commit_and_claim_latency_carry_trace_exemplars(db_url, batched):
    """The OpenMetrics scrape shows an exemplar on the latency histogram naming the traced call's trace."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test-executor")
    async with scheduler_stack(db_url, tracer_provider=provider, metrics_addr="127.0.0.1:0") as stack:
        await submit(stack)
        with tracer.start_as_current_span("claim") as claiming:
            reply = await stack.work.ClaimWork(ws.ClaimWorkRequest(worker_id="w1", agents=["demo"], wait_ms=0),
                                               metadata=inject_metadata(), timeout=10)
        lease = reply.lease
        with tracer.start_as_current_span("step") as step:
            save = ws.SaveCheckpointRequest(lease=lease_ref(lease), expected_version=0, state_json="{}",
                                            schema_version=1, event_id=eid())
            if batched:
                carrier = dict(inject_metadata())
                await stack.work.WriteBatch(ws.WriteBatchRequest(items=[ws.WriteBatchItem(
                    save_checkpoint=save, traceparent=carrier["traceparent"])]), timeout=10)
            else:
                await stack.work.SaveCheckpoint(save, metadata=inject_metadata(), timeout=10)
        # Plain Prometheus text has no exemplars; OpenMetrics has them.
        plain = await asyncio.to_thread(scrape, stack.server.metrics_port)
        text = await asyncio.to_thread(scrape_openmetrics, stack.server.metrics_port)
    assert "trace_id" not in plain
    exemplars = {method: (span_id, trace_id) for method, span_id, trace_id in EXEMPLAR.findall(text)}
    assert exemplars["ClaimWork"][1] == f"{claiming.get_span_context().trace_id:032x}"
    assert exemplars["SaveCheckpoint"][1] == f"{step.get_span_context().trace_id:032x}"
    # The exemplar's span is the scheduler's span of that call (or of that batch item).
    [server] = [s for s in exporter.get_finished_spans() if s.name == "/agentrt.v1.WorkService/SaveCheckpoint"]
    assert exemplars["SaveCheckpoint"][0] == f"{server.context.span_id:016x}"


async def test_no_exemplar_without_a_sampled_trace(db_url):
    """otel_exporter none: nothing is sampled (shared/tracing.py), so no exemplar points nowhere."""
    unsampled = TracerProvider(sampler=ALWAYS_OFF)
    async with scheduler_stack(db_url, tracer_provider=unsampled, metrics_addr="127.0.0.1:0") as stack:
        await submit(stack)
        text = await asyncio.to_thread(scrape_openmetrics, stack.server.metrics_port)
    assert 'method="SubmitRun"' in text and "trace_id" not in text


async def test_claim_wait_by_tenant_has_bounded_labels_and_counts_from_when_the_run_was_due(db_url, db):
    """agentrt_claim_wait_seconds: queued → claimed by tenant, by database time; past
    claim_wait_tenant_labels tenants the rest share `_other`; a lease taken over is not a queue wait."""
    async with scheduler_stack(db_url, metrics_addr="127.0.0.1:0", claim_wait_tenant_labels=1) as stack:
        first = await submit(stack, tenant="tenant-a")
        await db.execute("UPDATE agent_runs SET next_attempt_at = clock_timestamp() - interval '40 seconds' "
                         "WHERE id = $1", uuid.UUID(first.run_id))
        lease = await claim(stack, "w-a")
        assert lease is not None and lease.run.run_id == first.run_id
        for tenant in ("tenant-b", "tenant-c"):
            await submit(stack, tenant=tenant)
            assert await claim(stack, f"w-{tenant}") is not None
        # A lapsed lease taken over: claimed again, not from the queue.
        await db.execute("UPDATE agent_runs SET lease_expires_at = clock_timestamp() - interval '1 second' "
                         "WHERE id = $1", uuid.UUID(first.run_id))
        again = await claim(stack, "w-takeover")
        assert again is not None and again.run.run_id == first.run_id
        text = await asyncio.to_thread(scrape, stack.server.metrics_port)
    assert 'agentrt_claim_wait_seconds_count{tenant="tenant-a"} 1.0' in text
    assert 'agentrt_claim_wait_seconds_bucket{le="30.0",tenant="tenant-a"} 0.0' in text
    assert 'agentrt_claim_wait_seconds_bucket{le="60.0",tenant="tenant-a"} 1.0' in text
    assert 'agentrt_claim_wait_seconds_count{tenant="_other"} 2.0' in text
    assert 'agentrt_claim_wait_seconds_bucket{le="30.0",tenant="_other"} 2.0' in text
    assert 'tenant="tenant-b"' not in text and 'tenant="tenant-c"' not in text
