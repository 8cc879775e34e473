"""OTLP export settings (agentrt's against OTEL_*), the bounded queue's counts, and the bounded exit flush."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from prometheus_client import generate_latest

from executor.config import ExecutorSettings
from scheduler.config import SchedulerSettings
from shared import otlp
from shared.config import TracingOptions
from shared.metrics import Metrics
from shared.tracing import _provider, records_spans, service_resource

OTEL_VARS = ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
             "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER", "AGENTRT_OTEL_EXPORTER",
             "AGENTRT_SERVICE_NAME", "AGENTRT_OTEL_PROTOCOL")


@pytest.fixture(autouse=True)
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)


def test_otel_traces_exporter_turns_otlp_on_unless_agentrt_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    assert SchedulerSettings().otel_exporter == "none"  # the cheap default
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    assert SchedulerSettings().otel_exporter == "otlp"
    assert ExecutorSettings().otel_exporter == "otlp"
    assert SchedulerSettings(otel_exporter="none").otel_exporter == "none"
    monkeypatch.setenv("AGENTRT_OTEL_EXPORTER", "console")
    assert SchedulerSettings().otel_exporter == "console"
    monkeypatch.delenv("AGENTRT_OTEL_EXPORTER")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(ValueError, match="zipkin"):
        SchedulerSettings()


def test_the_protocol_is_agentrts_setting_else_otel_exporter_otlp_protocol_else_grpc(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert SchedulerSettings().tracing().protocol == "grpc"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    assert SchedulerSettings().tracing().protocol == "http/protobuf"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    assert SchedulerSettings().tracing().protocol == "grpc"
    assert SchedulerSettings(otel_protocol="http/protobuf").tracing().protocol == "http/protobuf"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match="http/json"):
        SchedulerSettings().tracing()


def test_otel_service_name_renames_the_default_but_not_an_explicit_name(monkeypatch: pytest.MonkeyPatch) -> None:
    def name(settings: SchedulerSettings) -> object:
        return service_resource(settings.tracing()).attributes["service.name"]

    assert name(SchedulerSettings()) == "agentrt-scheduler"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging")
    assert service_resource(SchedulerSettings().tracing()).attributes["deployment.environment"] == "staging"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "checkout-agents")
    assert name(SchedulerSettings()) == "checkout-agents"
    assert name(SchedulerSettings(service_name="sched-eu")) == "sched-eu"


def test_with_an_exporter_sampling_is_parent_based_unless_otel_traces_sampler_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    none = _provider(TracingOptions("s"))
    assert none.sampler is ALWAYS_OFF and not records_spans(none)
    console = _provider(TracingOptions("s", exporter="console"))
    assert isinstance(console.sampler, ParentBased) and records_spans(console)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    assert not records_spans(_provider(TracingOptions("s", exporter="console")))


def test_the_http_endpoint_is_a_base_url_as_otel_exporter_otlp_endpoint_is() -> None:
    exporter = otlp.otlp_exporter(TracingOptions("s", exporter="otlp", protocol="http/protobuf",
                                                 endpoint="http://collector:4318"))
    assert exporter._endpoint == "http://collector:4318/v1/traces"  # type: ignore[attr-defined]


class _Exporter(SpanExporter):
    def __init__(self, result: SpanExportResult = SpanExportResult.SUCCESS, hold: threading.Event | None = None):
        self.result, self.hold, self.sent = result, hold, 0
        self.entered = threading.Event()

    def export(self, spans):  # type: ignore[no-untyped-def]
        self.entered.set()
        if self.hold is not None:
            self.hold.wait(10)
        self.sent += len(spans)
        return self.result

    def shutdown(self) -> None:
        if self.hold is not None:
            self.hold.set()  # as the OTLP exporters do: shutdown ends a wait between retries


def _spans(processor: otlp.BoundedSpanProcessor, count: int) -> None:
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    for i in range(count):
        with tracer.start_as_current_span(f"s{i}"):
            pass


def _wait(condition, within: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_stuck_collector_fills_the_queue_and_every_span_past_it_is_counted_not_waited_for() -> None:
    stats, hold = otlp.SpanExportStats(), threading.Event()
    processor = otlp.BoundedSpanProcessor(_Exporter(hold=hold), max_queue_size=4, stats=stats)
    started = time.perf_counter()
    _spans(processor, 20)
    assert time.perf_counter() - started < 1.0  # ending spans never waits for the exporter
    assert stats.dropped_queue_full == 16 and stats.pending == 4
    hold.set()
    processor.force_flush()
    _wait(lambda: stats.exported == 4)
    assert stats.pending == 0
    processor.shutdown()


def test_failed_exports_are_counted_by_their_spans_and_on_every_registry() -> None:
    stats = otlp.SpanExportStats()
    processor = otlp.BoundedSpanProcessor(_Exporter(SpanExportResult.FAILURE), max_queue_size=64, stats=stats)
    _spans(processor, 5)
    processor.force_flush()
    _wait(lambda: stats.export_failed == 5)
    processor.shutdown()
    otlp.SPAN_EXPORT.settled(0, ok=False)  # the process's counts are what every registry shows
    text = generate_latest(Metrics("any").registry).decode()
    assert 'agentrt_otel_spans_dropped_total{reason="export_failed"}' in text
    assert 'agentrt_otel_spans_dropped_total{reason="queue_full"}' in text
    assert "agentrt_otel_spans_exported_total" in text


def test_the_exit_flush_gives_a_dead_collector_up_after_a_bounded_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otlp, "EXIT_FLUSH_S", 0.3)
    stats, hold = otlp.SpanExportStats(), threading.Event()
    exporter = _Exporter(hold=hold)
    processor = otlp.BoundedSpanProcessor(exporter, max_queue_size=1024, stats=stats)
    _spans(processor, 600)  # two batches: one stuck in export, one behind it
    assert exporter.entered.wait(10)
    started = time.monotonic()
    processor.shutdown()
    assert time.monotonic() - started < 2.0
    assert stats.exported + stats.export_failed == 600



def test_after_a_failed_export_batches_are_not_sent_for_a_growing_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead collector costs one attempt per pause, not an encoding (and retries) of every batch."""
    clock = [100.0]
    monkeypatch.setattr(otlp, "_now", lambda: clock[0])
    monkeypatch.setattr(otlp, "PAUSE_S", (1.0, 4.0))
    stats, inner = otlp.SpanExportStats(), _Exporter(SpanExportResult.FAILURE)
    exporter = otlp.CountingExporter(inner, stats)
    batch: Any = [object()] * 10

    def attempt(after_s: float) -> SpanExportResult:
        clock[0] += after_s
        stats.pending += 10
        return exporter.export(batch)

    assert attempt(0) is SpanExportResult.FAILURE and inner.sent == 10
    assert attempt(0.9) is SpanExportResult.FAILURE and inner.sent == 10  # paused 1 s: not sent, counted
    assert attempt(0.2) is SpanExportResult.FAILURE and inner.sent == 20  # tried again; now paused 2 s
    assert attempt(1.9) is SpanExportResult.FAILURE and inner.sent == 20
    attempt(0.2)
    assert inner.sent == 30  # paused 4 s (the longest) from here
    attempt(4.1)
    assert inner.sent == 40
    assert stats.export_failed == 60 and stats.pending == 0
    inner.result = SpanExportResult.SUCCESS
    assert attempt(4.1) is SpanExportResult.SUCCESS
    assert attempt(0) is SpanExportResult.SUCCESS  # no pause after a success
    assert inner.sent == 60 and stats.exported == 20
