"""OpenTelemetry setup and the W3C trace context that travels with every write.

Each RPC is a span (gRPC interceptor); handlers annotate it with run id,
tenant, fencing token and version. Outbox rows store the traceparent of the
transaction that wrote them, so the relay and consumers continue the trace.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared.config import TracingOptions
from shared.logs import bind_annotations
from shared.version import agentrt_version

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


def setup_tracing(options: TracingOptions, provider: TracerProvider | None = None) -> TracerProvider:
    """Installs a tracer provider (once per process) and returns it."""
    current = trace.get_tracer_provider()
    if provider is None and isinstance(current, TracerProvider):
        return current
    if provider is None:
        provider = _provider(options)
    trace.set_tracer_provider(provider)
    return provider


def _provider(options: TracingOptions) -> TracerProvider:
    exporter = options.exporter
    if exporter not in ("none", "console", "otlp"):
        raise ValueError(f"otel_exporter must be none, console or otlp, got {exporter!r}")
    # With no exporter, spans are not sampled: nothing records them (which costs a third of a
    # step's CPU at benchmark load), yet trace and span ids are still made and propagated, so
    # outbox rows, tool requests and Kafka events keep carrying one trace per run. With one,
    # the SDK's sampler: OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG, else parent-based always-on.
    sampler = ALWAYS_OFF if exporter == "none" else None
    provider = TracerProvider(resource=service_resource(options), sampler=sampler)
    if exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif exporter == "otlp":
        from shared.otlp import otlp_span_processor

        provider.add_span_processor(otlp_span_processor(options))
    return provider


def service_resource(options: TracingOptions) -> Resource:
    """OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME (read by the SDK), and agentrt's service name and version.

    An explicit agentrt `service_name` wins; the component's default name only where
    neither variable names the service. `service.version` is the package's (shared/version.py)
    unless OTEL_RESOURCE_ATTRIBUTES sets one.
    """
    resource = Resource.create({})
    if "service.version" not in resource.attributes:
        resource = resource.merge(Resource({"service.version": agentrt_version()}))
    named = not str(resource.attributes.get("service.name", "")).startswith("unknown_service")
    if options.service_name_set or not named:
        resource = resource.merge(Resource({"service.name": options.service_name}))
    return resource


def records_spans(provider: Any) -> bool:
    """Does this provider record spans? (No for otel_exporter none, or without an SDK provider.)

    Where it does not, servers skip making spans of their own and only carry the
    caller's context on (outbox rows then name the caller's span): a
    non-recording span still costs ids, a sampler call and its attributes.
    """
    return isinstance(provider, TracerProvider) and provider.sampler is not ALWAYS_OFF


_IDS = RandomIdGenerator()


@contextlib.contextmanager
def continued(carrier: dict[str, str] | None) -> Iterator[None]:
    """Makes the caller's W3C context current, without a span of our own.

    A call that brings none starts a trace of its own (unsampled ids, as the
    SDK would make), so what it writes still carries one trace id downstream.
    """
    if carrier:
        context = _PROPAGATOR.extract(carrier)
    else:
        root = SpanContext(trace_id=_IDS.generate_trace_id(), span_id=_IDS.generate_span_id(), is_remote=False,
                           trace_flags=TraceFlags(TraceFlags.DEFAULT))
        context = trace.set_span_in_context(NonRecordingSpan(root))
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


def current_trace() -> Trace:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return Trace(carrier.get("traceparent"), carrier.get("tracestate"))


def traceparent_of(span: Any) -> tuple[str | None, str | None]:
    """The W3C (traceparent, tracestate) naming `span` as the parent."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent"), carrier.get("tracestate")


def annotate(**attributes: Any) -> None:
    """Sets agentrt.* attributes on the current span (None values are skipped).

    The run, tenant and fencing token also go to this task's log records (shared/logs.py).
    """
    bind_annotations(attributes)
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


class ServerSpans:
    """A lean gRPC aio server interceptor: one SERVER span per unary call.

    It continues the caller's W3C context from the call metadata and names the
    span after the full method (`/agentrt.v1.WorkService/SaveCheckpoint`), as the
    OpenTelemetry gRPC instrumentation does, at a fraction of its cost per call
    (which matters at thousands of calls per second on a small machine).
    """

    def __init__(self, provider: Any, observe: Any = None) -> None:
        """`observe(method, code_name, seconds)` is called after every call (e.g. metrics)."""
        import grpc
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self._grpc = grpc
        self._tracer = provider.get_tracer("agentrt.grpc.server")
        self._server_kind = SpanKind.SERVER
        self._status, self._error = Status, StatusCode.ERROR
        self._observe = observe
        self._recording = records_spans(provider)

    def interceptor(self) -> Any:
        import grpc

        spans = self

        class _Interceptor(grpc.aio.ServerInterceptor):
            async def intercept_service(self, continuation: Any, details: Any) -> Any:
                handler = await continuation(details)
                if handler is None or handler.unary_unary is None:
                    return handler
                return spans._wrap(handler, details.method)

        return _Interceptor()

    def _wrap(self, handler: Any, method: str) -> Any:
        behavior = handler.unary_unary
        tracer, kind, grpc = self._tracer, self._server_kind, self._grpc
        service, _, name = method.lstrip("/").rpartition("/")

        observe = self._observe

        async def untraced(request: Any, context: Any) -> Any:
            started = time.perf_counter()
            carrier = {key: value for key, value in (context.invocation_metadata() or ())
                       if key in ("traceparent", "tracestate")}
            with continued(carrier):
                try:
                    return await behavior(request, context)
                finally:
                    if observe is not None:
                        code = context.code()
                        observe(name, code.name if code is not None else "OK", time.perf_counter() - started)

        async def traced(request: Any, context: Any) -> Any:
            started = time.perf_counter()
            carrier = {key: value for key, value in (context.invocation_metadata() or ())
                       if key in ("traceparent", "tracestate")}
            parent = _PROPAGATOR.extract(carrier) if carrier else None
            with tracer.start_as_current_span(
                method, context=parent, kind=kind,
                attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
                record_exception=False, set_status_on_exception=False,
            ) as span:
                try:
                    return await behavior(request, context)
                finally:
                    code = context.code()
                    span.set_attribute("rpc.grpc.status_code", code.value[0] if code is not None else 0)
                    if code is not None and code != grpc.StatusCode.OK:
                        span.set_status(self._status(self._error, str(code.name)))
                    if observe is not None:
                        observe(name, code.name if code is not None else "OK", time.perf_counter() - started)

        return grpc.unary_unary_rpc_method_handler(
            traced if self._recording else untraced, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
