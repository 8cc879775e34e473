"""Trace context continues from the transaction that wrote the outbox row into the consumer's span."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from relay_support import pending_count, relay_settings, running_relay, wait_until
from support import scheduler_stack, submit
from test_relay_exactly_once import consumer_settings

from shared.client.consumer import EventConsumer

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


async def test_consumer_span_continues_the_writers_trace(db_url, db, kafka_bootstrap):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async with scheduler_stack(db_url, tracer_provider=provider) as stack:
        run = await submit(stack, payload={"traced": True})
    row = await db.fetchrow("SELECT * FROM outbox WHERE run_id = $1", uuid.UUID(run.run_id))
    assert row["traceparent"], "the scheduler records the writing span's context"
    _, trace_hex, parent_hex, _ = row["traceparent"].split("-")
    writer = [s for s in exporter.get_finished_spans() if s.context.span_id == int(parent_hex, 16)]
    assert len(writer) == 1 and "SubmitRun" in writer[0].name, [s.name for s in exporter.get_finished_spans()]

    settings = relay_settings(db_url, kafka_bootstrap)
    async with running_relay(settings):
        await wait_until(lambda: _drained(db), 30, "the relay to publish")

    seen_inside: list[trace.SpanContext] = []

    async def handler(event, conn) -> None:
        seen_inside.append(trace.get_current_span().get_span_context())

    consumer = EventConsumer(consumer_settings(db_url, kafka_bootstrap, settings.topic), handler,
                             tracer_provider=provider)
    await consumer.start()
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await wait_until(lambda: asyncio.sleep(0, consumer.stats.applied >= 1), 30, "the event to be consumed")
    finally:
        stop.set()
        await task
        await consumer.stop()

    spans = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    assert len(spans) == 1
    span = spans[0]
    assert span.name == "process agent.run_submitted"
    assert span.context.trace_id == int(trace_hex, 16) == writer[0].context.trace_id
    assert span.parent is not None and span.parent.span_id == int(parent_hex, 16)
    assert span.attributes["agentrt.run_id"] == run.run_id
    assert span.attributes["agentrt.tenant_id"] == "tenant-a"
    assert span.attributes["messaging.message.id"] == str(row["event_id"])
    assert seen_inside == [span.context], "the handler ran inside the consumer span"


async def _drained(db) -> bool:
    return await pending_count(db) == 0
