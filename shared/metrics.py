"""Prometheus metrics: one registry per process, served on `metrics_addr` (off when empty).

Names are agentrt_*; the Helm chart's ServiceMonitor scrapes the `metrics` port. Every
registry carries the process's span export counts (agentrt_otel_spans_*, see shared/otlp.py).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from shared.otlp import SpanExportCollector


def trace_exemplar() -> dict[str, str] | None:
    """The current span's trace and span ids as a histogram exemplar, when the trace is sampled
    (exported, so there is something to follow); None otherwise. Prometheus shows exemplars in
    the OpenMetrics exposition (`Accept: application/openmetrics-text`)."""
    context = trace.get_current_span().get_span_context()
    if not context.trace_flags.sampled:
        return None
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


class Metrics:
    def __init__(self, component: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(SpanExportCollector())
        self.component = component
        self._server: Any = None
        self._export: Any = None  # the OTLP metrics export, when on

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, labels, registry=self.registry)

    def histogram(self, name: str, doc: str, labels: tuple[str, ...] = (),
                  buckets: tuple[float, ...] = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30),
                  ) -> Histogram:
        return Histogram(name, doc, labels, registry=self.registry, buckets=buckets)

    def start_export(self, settings: Any) -> None:
        """With otel_metrics_exporter otlp (or OTEL_METRICS_EXPORTER=otlp): this registry goes to the
        OTLP collector too, every OTEL_METRIC_EXPORT_INTERVAL ms (shared/otlp_metrics.py)."""
        if settings.otel_metrics_exporter != "otlp" or self._export is not None:
            return
        from shared.otlp_metrics import MetricExportStats, RegistryExporter, export_interval_s, otlp_metric_exporter
        from shared.tracing import service_resource

        stats = MetricExportStats()
        self.registry.register(stats)
        self._export = RegistryExporter(
            self.registry, otlp_metric_exporter(settings.metrics_protocol(), settings.otel_endpoint or None),
            service_resource(settings.tracing()), export_interval_s(), stats)
        self._export.start()

    def serve(self, addr: str) -> int | None:
        """Starts the /metrics HTTP endpoint on host:port; returns the bound port (None when addr is empty)."""
        if not addr:
            return None
        host, _, port = addr.rpartition(":")
        server, _thread = start_http_server(int(port), addr=host or "0.0.0.0", registry=self.registry)
        self._server = server
        return int(server.server_address[1])

    def stop(self) -> None:
        if self._export is not None:
            self._export.stop()
            self._export = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
