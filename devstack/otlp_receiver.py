"""An OTLP receiver on loopback, for tests and `python -m bench otlp` (test infrastructure).

It speaks both OTLP transports an OpenTelemetry collector does: gRPC
(`opentelemetry.proto.collector.trace.v1.TraceService/Export`,
`...metrics.v1.MetricsService/Export`) and HTTP (`POST /v1/traces`,
`POST /v1/metrics`, protobuf). It keeps every span and metric point it is
sent, flattened, and can be stopped mid-run to play a collector that went away.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

_PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: int
    trace_id: str  # 32 hex digits, as in a W3C traceparent
    span_id: str
    parent_span_id: str  # "" for a root span
    attributes: dict[str, Any] = field(default_factory=dict)
    links: tuple[tuple[str, str], ...] = ()  # (trace id, span id) of each linked span


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else None


@dataclass(frozen=True)
class ReceivedPoint:
    """One data point of a metric: `value` for sums and gauges; count, sum and buckets for histograms."""

    service: str
    name: str
    kind: str  # sum | gauge | histogram
    attributes: dict[str, Any]
    value: float = 0.0
    count: int = 0
    total: float = 0.0
    bucket_counts: tuple[int, ...] = ()
    explicit_bounds: tuple[float, ...] = ()
    monotonic: bool = False


def flatten_metrics(request: metrics_service_pb2.ExportMetricsServiceRequest) -> list[ReceivedPoint]:
    points = []
    for resource_metrics in request.resource_metrics:
        resource = {a.key: _value(a.value) for a in resource_metrics.resource.attributes}
        service = str(resource.get("service.name", ""))
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = str(metric.WhichOneof("data"))
                data = getattr(metric, kind)
                for p in data.data_points:
                    attributes = {a.key: _value(a.value) for a in p.attributes}
                    if kind == "histogram":
                        points.append(ReceivedPoint(service, metric.name, kind, attributes, count=p.count,
                                                    total=p.sum, bucket_counts=tuple(p.bucket_counts),
                                                    explicit_bounds=tuple(p.explicit_bounds)))
                    else:
                        value = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
                        points.append(ReceivedPoint(service, metric.name, kind, attributes, value=value,
                                                    monotonic=kind == "sum" and data.is_monotonic))
    return points


def flatten(request: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(ReceivedSpan(
                    service=service, name=span.name, kind=span.kind, trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(), parent_span_id=span.parent_span_id.hex(),
                    attributes={a.key: _value(a.value) for a in span.attributes},
                    links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links)))
    return spans


class OtlpReceiver:
    """Start with `await start()`; `grpc_endpoint` / `http_endpoint` are the OTEL_EXPORTER_OTLP_ENDPOINT values."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.points: list[ReceivedPoint] = []
        self.exports = 0
        self.metric_exports = 0
        self.grpc_port: int | None = None
        self.http_port: int | None = None
        self._grpc: grpc.aio.Server | None = None
        self._http: web.AppRunner | None = None

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def endpoint(self, protocol: str) -> str:
        return self.http_endpoint if protocol == "http/protobuf" else self.grpc_endpoint

    def _keep(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        self.exports += 1
        self.spans.extend(flatten(request))

    async def start(self) -> None:
        """Listens on fresh ports; after stop(), on the same ports again (a collector that came back)."""
        receiver = self

        class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
            async def Export(self, request: Any, context: Any) -> Any:
                receiver._keep(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
            async def Export(self, request: Any, context: Any) -> Any:
                receiver._keep_metrics(request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(), server)  # type: ignore[no-untyped-call]
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _MetricsService(), server)
        self.grpc_port = server.add_insecure_port(f"127.0.0.1:{self.grpc_port or 0}")
        await server.start()
        self._grpc = server

        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/traces", self._post_traces)
        app.router.add_post("/v1/metrics", self._post_metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.http_port or 0)
        await site.start()
        self.http_port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        self._http = runner

    def _keep_metrics(self, request: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        self.metric_exports += 1
        self.points.extend(flatten_metrics(request))

    @staticmethod
    async def _body(request: web.Request) -> bytes:
        body = await request.read()
        encoding = request.headers.get("Content-Encoding", "")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        return body

    async def _post_traces(self, request: web.Request) -> web.Response:
        if request.content_type != _PROTOBUF:
            return web.Response(status=415, text=f"send {_PROTOBUF}")
        message = trace_service_pb2.ExportTraceServiceRequest()
        message.ParseFromString(await self._body(request))
        self._keep(message)
        return web.Response(body=trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                            content_type=_PROTOBUF)

    async def _post_metrics(self, request: web.Request) -> web.Response:
        if request.content_type != _PROTOBUF:
            return web.Response(status=415, text=f"send {_PROTOBUF}")
        message = metrics_service_pb2.ExportMetricsServiceRequest()
        message.ParseFromString(await self._body(request))
        self._keep_metrics(message)
        return web.Response(body=metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString(),
                            content_type=_PROTOBUF)

    async def stop(self) -> None:
        """Closes both ports (a collector gone away); safe to call twice."""
        if self._grpc is not None:
            await self._grpc.stop(0)
            self._grpc = None
        if self._http is not None:
            await self._http.cleanup()
            self._http = None

    async def __aenter__(self) -> OtlpReceiver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
