"""OTLP export of spans: off the request path, bounded, and counted.

A finished span is put on a BatchSpanProcessor's queue; its worker thread
serialises and sends batches. A span that finishes while `max_queue_size`
spans are waiting (or being sent) is dropped and counted, never waited for, so
a slow or dead collector costs a run nothing. Spans of a failed export (the
collector down or refusing) are counted too. The counts are the Prometheus
counter `agentrt_otel_spans_dropped_total{reason}` on every component's registry.

The exporters read the other OTEL_EXPORTER_OTLP_* variables themselves
(endpoint, headers, timeout, certificates, compression).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from shared.config import TracingOptions

log = logging.getLogger(__name__)

# At exit the queue is flushed for at most this long; then the export is abandoned (a dead
# collector must not hold a stopping process past its grace period).
EXIT_FLUSH_S = 3.0
# After a failed export, batches are not sent for a pause: the first, and the longest (seconds).
PAUSE_S = (1.0, 30.0)
_now = time.monotonic  # the pause's clock (process time: no run depends on it)
_HTTP_TRACES_PATH = "/v1/traces"


class SpanExportStats:
    """This process's export counts (one tracer provider per process, so one set of counts)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending = 0  # handed to the batch processor, not yet exported or failed
        self.exported = 0
        self.dropped_queue_full = 0
        self.export_failed = 0

    def admit(self, limit: int) -> bool:
        with self._lock:
            if self.pending >= limit:
                self.dropped_queue_full += 1
                return False
            self.pending += 1
            return True

    def settled(self, count: int, ok: bool) -> None:
        with self._lock:
            self.pending -= count
            if ok:
                self.exported += count
            else:
                self.export_failed += count


SPAN_EXPORT = SpanExportStats()


class CountingExporter(SpanExporter):
    """Counts what an exporter sent or failed to send; once abandoned, fails at once without sending.

    After a failed export it pauses: batches ending within the pause fail at once, unsent
    (counted as export_failed). The OTLP exporters encode a batch again for every retry, so a
    collector that is down would otherwise cost several encodings of every batch; the pause
    doubles from PAUSE_S[0] up to PAUSE_S[1] while exports keep failing, and ends at the first
    success.
    """

    def __init__(self, exporter: SpanExporter, stats: SpanExportStats = SPAN_EXPORT) -> None:
        self._exporter = exporter
        self._stats = stats
        self._abandoned = threading.Event()
        self._pause_s = 0.0
        self._paused_until = 0.0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._abandoned.is_set() or _now() < self._paused_until:
            self._stats.settled(len(spans), ok=False)
            return SpanExportResult.FAILURE
        result = SpanExportResult.FAILURE
        try:
            result = self._send(spans)
            return result
        finally:
            if result is SpanExportResult.SUCCESS:
                self._pause_s = 0.0
            else:
                self._pause_s = min(PAUSE_S[1], max(PAUSE_S[0], self._pause_s * 2))
                self._paused_until = _now() + self._pause_s

    def _send(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        ok = False
        try:
            result = self._exporter.export(spans)
            ok = result is SpanExportResult.SUCCESS
            return result
        except Exception:
            if self._abandoned.is_set():  # the exit flush gave up and closed the channel under this export
                return SpanExportResult.FAILURE
            raise
        finally:
            self._stats.settled(len(spans), ok)

    def abandon(self) -> None:
        """Stops sending: an export waiting between retries ends now (the exporter's shutdown)."""
        self._abandoned.set()
        self._exporter.shutdown()

    def shutdown(self) -> None:
        if not self._abandoned.is_set():
            self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._exporter.force_flush(timeout_millis)


class BoundedSpanProcessor(SpanProcessor):
    """A BatchSpanProcessor that drops (and counts) rather than queue past `max_queue_size`.

    The batch processor would also drop at its own bound, silently; admitting here first
    makes each drop counted, and bounds the spans in flight to the collector as well.
    """

    def __init__(self, exporter: SpanExporter, max_queue_size: int, stats: SpanExportStats = SPAN_EXPORT) -> None:
        self._exporter = CountingExporter(exporter, stats)
        self._stats = stats
        self._max_queue_size = max_queue_size
        # The batch size must not exceed the queue (the SDK refuses it); None = OTEL_BSP_* or 512.
        batch = min(512, max_queue_size) if max_queue_size < 512 else None
        self._batch = BatchSpanProcessor(self._exporter, max_queue_size=max_queue_size, max_export_batch_size=batch)

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None or not span.context.trace_flags.sampled:
            return
        if self._stats.admit(self._max_queue_size):
            self._batch.on_end(span)

    def shutdown(self) -> None:
        """Flushes what is queued, for at most EXIT_FLUSH_S; then gives the rest up."""
        done = threading.Event()

        def flush_and_stop() -> None:
            self._batch.shutdown()
            done.set()

        threading.Thread(target=flush_and_stop, name="otlp-shutdown", daemon=True).start()
        if not done.wait(EXIT_FLUSH_S):
            log.warning("OTLP export: the collector did not take the last spans within %.0fs; giving up",
                        EXIT_FLUSH_S)
            self._exporter.abandon()
            done.wait(1.0)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._batch.force_flush(timeout_millis)


def otlp_exporter(options: TracingOptions) -> SpanExporter:
    """The OTLP span exporter for `options.protocol`; unset values are the exporter's own OTEL_* reading."""
    if options.protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        endpoint = options.endpoint
        # agentrt's otel_endpoint is a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is; the exporter
        # takes a full URL when given one in code.
        if endpoint is not None and not endpoint.rstrip("/").endswith(_HTTP_TRACES_PATH):
            endpoint = endpoint.rstrip("/") + _HTTP_TRACES_PATH
        return HttpExporter(endpoint=endpoint, timeout=options.export_timeout_s)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

    return GrpcExporter(endpoint=options.endpoint, timeout=options.export_timeout_s)


def otlp_span_processor(options: TracingOptions) -> BoundedSpanProcessor:
    return BoundedSpanProcessor(otlp_exporter(options), options.max_queue_size)


class SpanExportCollector(Collector):
    """The export counts on a component's Prometheus registry (zeros while nothing is exported)."""

    def __init__(self, stats: SpanExportStats = SPAN_EXPORT) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        s = self._stats
        yield CounterMetricFamily("agentrt_otel_spans_exported", "Spans the OTLP collector accepted",
                                  value=s.exported)
        dropped = CounterMetricFamily("agentrt_otel_spans_dropped",
                                      "Spans not exported: the export queue was full, or the export failed",
                                      labels=("reason",))
        dropped.add_metric(("queue_full",), s.dropped_queue_full)
        dropped.add_metric(("export_failed",), s.export_failed)
        yield dropped
