"""Trace context continues from the transaction that wrote the outbox row, through the relay's
publish span (the writer's child, linked to it), into the consumer's span; a relay that records no
spans hands the writer's context on unchanged."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind
from relay_support import TopicReader, pending_count, relay_settings, running_relay, wait_until
from support import scheduler_stack, submit
from test_relay_exactly_once import consumer_settings

from shared.client.consumer import EventConsumer

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


@pytest.mark.parametrize("relay_records", [True, False], ids=["relay-spans", "relay-without-spans"])
async def test_consumer_span_continues_the_writers_trace(db_url, db, kafka_bootstrap, relay_records):
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
    relay_provider = provider if relay_records else TracerProvider(sampler=ALWAYS_OFF)
    async with running_relay(settings, relay_provider):
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
    publishes = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.PRODUCER]
    if relay_records:
        [publish] = publishes
        assert publish.name == f"publish {settings.topic}"
        assert publish.context.trace_id == writer[0].context.trace_id
        assert publish.parent is not None and publish.parent.span_id == int(parent_hex, 16)
        assert [link.context.span_id for link in publish.links] == [int(parent_hex, 16)]
        assert publish.status.is_ok
        assert publish.attributes["messaging.operation"] == "publish"
        assert publish.attributes["messaging.kafka.message.key"] == run.run_id
        assert publish.attributes["agentrt.outbox_id"] == row["id"]
        assert publish.attributes["agentrt.fencing_token"] == row["fencing_token"]
        assert publish.attributes["agentrt.run_version"] == row["run_version"]
        assert span.parent is not None and span.parent.span_id == publish.context.span_id
    else:
        assert publishes == []
        assert span.parent is not None and span.parent.span_id == int(parent_hex, 16)
    assert span.attributes["messaging.operation"] == "process"
    assert span.attributes["messaging.kafka.message.key"] == run.run_id
    assert span.attributes["agentrt.run_id"] == run.run_id
    assert span.attributes["agentrt.tenant_id"] == "tenant-a"
    assert span.attributes["messaging.message.id"] == str(row["event_id"])
    assert seen_inside == [span.context], "the handler ran inside the consumer span"

    # The record carries the hop's context as `traceparent` and the writer's, unchanged, as the
    # CloudEvents distributed-tracing extension (`ce_traceparent`).
    reader = await TopicReader(kafka_bootstrap, [settings.topic]).start()
    try:
        await reader.read_until(lambda records: len(records) >= 1, 30, "the record")
    finally:
        await reader.stop()
    headers = {name: value.decode() for name, value in reader.records[0].headers}
    assert headers["ce_traceparent"] == row["traceparent"]
    hop_span = publishes[0].context.span_id if relay_records else int(parent_hex, 16)
    assert headers["traceparent"].split("-")[1:3] == [trace_hex, f"{hop_span:016x}"]


async def _drained(db) -> bool:
    return await pending_count(db) == 0
