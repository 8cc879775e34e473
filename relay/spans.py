"""The relay's publish spans: one PRODUCER span per outbox row sent to Kafka.

A row carries the W3C context of the transaction that wrote it. Its publish
span is a child of that writer's span (so one trace runs from the executor to
the consumer) and also links to it, as OpenTelemetry's messaging conventions
ask of a span that sends a message made elsewhere. The Kafka record's
`traceparent` header names the publish span, so a consumer's span continues
from it.

Only where the tracer provider records spans (an exporter is configured); with
none the relay forwards the writer's context unchanged and makes no spans.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from relay.store import OutboxRow
from shared.tracing import (
    FENCING_TOKEN,
    RUN_ID,
    RUN_VERSION,
    TENANT,
    extract_context,
    records_spans,
    traceparent_of,
)


class PublishSpans:
    """The publish spans of one round, keyed by outbox id; every one is ended by `settle`."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        self._open: dict[int, Any] = {}

    def start(self, row: OutboxRow, topic: str, partition: int) -> tuple[str | None, str | None]:
        """Starts the row's span; returns the (traceparent, tracestate) its Kafka record carries.

        A row written outside any trace gets no span (there is no trace to continue).
        """
        if not row.traceparent:
            return row.traceparent, row.tracestate
        parent = extract_context({"traceparent": row.traceparent, "tracestate": row.tracestate or ""})
        writer = trace.get_current_span(parent).get_span_context()
        links = [Link(writer, {"agentrt.link": "outbox_writer"})] if writer.is_valid else None
        span = self._tracer.start_span(
            f"publish {topic}", context=parent, kind=SpanKind.PRODUCER, links=links, attributes={
                "messaging.system": "kafka", "messaging.operation": "publish",
                "messaging.operation.type": "publish", "messaging.operation.name": "publish",
                "messaging.destination.name": topic, "messaging.destination.partition.id": str(partition),
                "messaging.kafka.destination.partition": partition, "messaging.kafka.message.key": row.run_id,
                "messaging.message.id": row.event_id, "cloudevents.event_type": row.event_type,
                "cloudevents.event_id": row.event_id, "agentrt.outbox_id": row.id, RUN_ID: row.run_id,
                TENANT: row.tenant_id, FENCING_TOKEN: row.fencing_token, RUN_VERSION: row.run_version})
        self._open[row.id] = span
        traceparent, tracestate = traceparent_of(span)
        return traceparent or row.traceparent, tracestate if traceparent else row.tracestate

    def fail(self, row: OutboxRow, reason: str) -> None:
        """The row's record did not go out this round (refused, or its batch was full)."""
        span = self._open.pop(row.id, None)
        if span is not None:
            span.set_status(Status(StatusCode.ERROR, reason))
            span.end()

    def settle(self, delivered: list[OutboxRow], error: BaseException | None) -> None:
        """Ends every span of the round: delivered rows OK, the others with the round's error."""
        for row in delivered:
            span = self._open.pop(row.id, None)
            if span is not None:
                span.set_status(Status(StatusCode.OK))
                span.end()
        reason = f"{type(error).__name__}: {error}" if error is not None else "held back for a later round"
        for span in self._open.values():
            span.set_status(Status(StatusCode.ERROR, reason))
            span.end()
        self._open.clear()


def publish_tracer(provider: Any = None) -> Any:
    """The relay's tracer, or None where spans are not recorded (then no publish spans are made)."""
    provider = provider or trace.get_tracer_provider()
    return provider.get_tracer("agentrt.relay") if records_spans(provider) else None
