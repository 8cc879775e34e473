"""OpenTelemetry setup and the W3C trace context that travels with every write.

Each RPC is a span (gRPC interceptor); handlers annotate it with run id,
tenant, fencing token and version. Outbox rows store the traceparent of the
transaction that wrote them, so the relay and consumers continue the trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()

# Span attribute names used across services (one spelling everywhere).
RUN_ID = "agentrt.run_id"
TENANT = "agentrt.tenant_id"
FENCING_TOKEN = "agentrt.fencing_token"
RUN_VERSION = "agentrt.run_version"
STEP_KEY = "agentrt.step_key"
AGENT = "agentrt.agent"
TOOL = "agentrt.tool"
WORKER = "agentrt.worker_id"


@dataclass(frozen=True)
class Trace:
    """W3C trace context of the calling span, as stored on outbox rows."""

    traceparent: str | None = None
    tracestate: str | None = None


NO_TRACE = Trace()


def setup_tracing(service_name: str, exporter: str = "none",
                  provider: TracerProvider | None = None) -> TracerProvider:
    """Installs a tracer provider (once per process) and returns it."""
    current = trace.get_tracer_provider()
    if provider is None and isinstance(current, TracerProvider):
        return current
    if provider is None:
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        if exporter == "console":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        elif exporter != "none":
            raise ValueError(f"otel_exporter must be none or console, got {exporter!r}")
    trace.set_tracer_provider(provider)
    return provider


def current_trace() -> Trace:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return Trace(carrier.get("traceparent"), carrier.get("tracestate"))


def annotate(**attributes: Any) -> None:
    """Sets agentrt.* attributes on the current span (None values are skipped)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(f"agentrt.{key}", value if isinstance(value, bool | int | float | str) else str(value))


def inject_metadata(metadata: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """Adds the current trace context to gRPC/HTTP metadata."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return [*(metadata or []), *carrier.items()]


def extract_context(carrier: dict[str, str]) -> Any:
    return _PROPAGATOR.extract(carrier)
