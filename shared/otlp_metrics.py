"""Optional OTLP export of the Prometheus metrics, next to the scrape endpoint.

The metrics stay one prometheus_client registry per process (shared/metrics.py).
With `otel_metrics_exporter: otlp` (or OTEL_METRICS_EXPORTER=otlp) a thread
reads that registry every OTEL_METRIC_EXPORT_INTERVAL milliseconds (60 s by
default), the way a scrape would, and sends it to the collector as OTLP
metrics, cumulative: counters as monotonic sums (named without `_total`),
gauges as gauges, histograms as explicit-bucket histograms. The exporter reads
OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT, headers, certificates and timeout itself;
the protocol is the one the traces use. A collector that is down costs a failed
export on that thread, counted in `agentrt_otel_metric_exports_failed_total`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

log = logging.getLogger(__name__)
DEFAULT_INTERVAL_MS = 60_000
EXIT_FLUSH_S = 3.0
_SCOPE = InstrumentationScope("agentrt.prometheus")
_CUMULATIVE = AggregationTemporality.CUMULATIVE


def export_interval_s() -> float:
    raw = os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
    try:
        milliseconds = float(raw) if raw else DEFAULT_INTERVAL_MS
    except ValueError:
        raise ValueError(f"OTEL_METRIC_EXPORT_INTERVAL={raw!r}: a number of milliseconds") from None
    if milliseconds <= 0:
        raise ValueError(f"OTEL_METRIC_EXPORT_INTERVAL={raw!r}: must be positive")
    return milliseconds / 1000


def metrics_data(registry: CollectorRegistry, resource: Resource, started_ns: int) -> MetricsData:
    """The registry as one OTLP export, read now."""
    now = time.time_ns()
    metrics = [m for family in registry.collect() for m in _metric(family, started_ns, now)]
    return MetricsData([ResourceMetrics(resource, [ScopeMetrics(_SCOPE, metrics, "")], "")])


def _metric(family: Any, start: int, now: int) -> Iterator[Metric]:
    if family.type == "counter":
        points = [NumberDataPoint(dict(s.labels), start, now, s.value) for s in family.samples
                  if s.name.endswith("_total")]
        if points:
            yield Metric(family.name, family.documentation, family.unit or None, Sum(points, _CUMULATIVE, True))
    elif family.type == "gauge":
        points = [NumberDataPoint(dict(s.labels), start, now, s.value) for s in family.samples]
        if points:
            yield Metric(family.name, family.documentation, family.unit or None, Gauge(points))
    elif family.type == "histogram":
        histogram_points = list(_histogram_points(family, start, now))
        if histogram_points:
            yield Metric(family.name, family.documentation, family.unit or None,
                         Histogram(histogram_points, _CUMULATIVE))


def _histogram_points(family: Any, start: int, now: int) -> Iterator[HistogramDataPoint]:
    """One point per label set: Prometheus' cumulative `le` buckets as OTLP's per-bucket counts."""
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for sample in family.samples:
        labels = {k: v for k, v in sample.labels.items() if k != "le"}
        entry = series.setdefault(tuple(sorted(labels.items())), {"labels": labels, "buckets": [], "sum": 0.0,
                                                                   "count": 0})
        if sample.name.endswith("_bucket"):
            entry["buckets"].append((float(sample.labels["le"]), sample.value))
        elif sample.name.endswith("_sum"):
            entry["sum"] = sample.value
        elif sample.name.endswith("_count"):
            entry["count"] = int(sample.value)
    for entry in series.values():
        buckets = sorted(entry["buckets"])
        bounds = [le for le, _ in buckets if not math.isinf(le)]
        counts, below = [], 0.0
        for _, cumulative in buckets:
            counts.append(int(cumulative - below))
            below = cumulative
        yield HistogramDataPoint(entry["labels"], start, now, entry["count"], entry["sum"], counts, bounds,
                                 min=None, max=None)  # type: ignore[arg-type]  # unknown: optional in OTLP


class MetricExportStats(Collector):
    """The bridge's own counts, on the same registry."""

    def __init__(self) -> None:
        self.exported = 0
        self.failed = 0

    def collect(self) -> Iterator[Any]:
        yield CounterMetricFamily("agentrt_otel_metric_exports", "OTLP metric exports the collector accepted",
                                  value=self.exported)
        yield CounterMetricFamily("agentrt_otel_metric_exports_failed", "OTLP metric exports that failed "
                                  "(the collector down or refusing)", value=self.failed)


class RegistryExporter:
    """Sends a registry to an OTLP collector on a thread of its own, every `interval_s`."""

    def __init__(self, registry: CollectorRegistry, exporter: MetricExporter, resource: Resource,
                 interval_s: float, stats: MetricExportStats) -> None:
        self._registry, self._exporter, self._resource = registry, exporter, resource
        self._interval_s, self._stats = interval_s, stats
        self._started_ns = time.time_ns()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="otlp-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def export_once(self) -> bool:
        try:
            result = self._exporter.export(metrics_data(self._registry, self._resource, self._started_ns),
                                           timeout_millis=min(self._interval_s, 10.0) * 1000)
        except Exception as exc:  # a metrics export never takes the service down
            log.debug("OTLP metrics export failed: %r", exc)
            result = MetricExportResult.FAILURE
        ok = result is MetricExportResult.SUCCESS
        if ok:
            self._stats.exported += 1
        else:
            self._stats.failed += 1
        return ok

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.export_once()
        self.export_once()  # the last figures, on stop

    def stop(self) -> None:
        """The last export, waited for at most EXIT_FLUSH_S (a dead collector does not hold a stop)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=EXIT_FLUSH_S)
        if self._thread.is_alive():
            log.warning("OTLP metrics: the last export did not finish within %.0fs; giving up", EXIT_FLUSH_S)
        self._exporter.shutdown(timeout_millis=500)


def otlp_metric_exporter(protocol: str, endpoint: str | None) -> MetricExporter:
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

        if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/metrics"):
            endpoint = endpoint.rstrip("/") + "/v1/metrics"
        return HttpExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

    return GrpcExporter(endpoint=endpoint)
