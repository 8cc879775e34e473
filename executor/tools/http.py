"""The `http` tool adapter: POST JSON with Idempotency-Key and X-Fencing-Token; GET lookup by key.

Classification (executor.errors): 2xx → success; 429 → rate_limited; 409
stale_fence → stale_fence; 408 → timeout; other 4xx → refused; 5xx →
server_error; a timeout or a connection lost after sending → unknown outcome;
a connection that never opened → connect_failed (nothing was sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from executor.agents import HttpTool
from executor.tools.base import LookupOutcome, ToolCallContext, ToolOutcome
from shared.tracing import FENCING_TOKEN, RUN_ID, STEP_KEY, TENANT, TOOL, inject_metadata

IDEMPOTENCY_HEADER = "Idempotency-Key"
FENCE_HEADER = "X-Fencing-Token"
RUN_HEADER = "X-Agentrt-Run-Id"
STEP_HEADER = "X-Agentrt-Step-Key"


IDEMPOTENCY_KEY = "agentrt.idempotency_key"
_TRACER = trace.get_tracer("agentrt.tool.http")


def _headers(tool: HttpTool, ctx: ToolCallContext, trace_headers: dict[str, str] | None = None) -> dict[str, str]:
    return {**tool.headers, **ctx.headers, **(trace_headers or {}), IDEMPOTENCY_HEADER: ctx.idempotency_key,
            FENCE_HEADER: str(ctx.fencing_token), RUN_HEADER: ctx.run_id, STEP_HEADER: ctx.step_key}


@contextlib.contextmanager
def _client_span(tracer: Any, method: str, url: str, tool: HttpTool, ctx: ToolCallContext) -> Iterator[Any]:
    """A CLIENT span for the request, where the step's span is recorded; yields (span, its trace headers).

    It carries the fence and the idempotency key, and the request's traceparent names it, so the
    tool's own server span continues the step's trace.
    """
    if not trace.get_current_span().is_recording():
        yield None, None
        return
    parts = urlsplit(url)
    attributes: dict[str, Any] = {
        "http.request.method": method, "url.full": url, "server.address": parts.hostname or "",
        "server.port": parts.port or (443 if parts.scheme == "https" else 80), TOOL: tool.name,
        RUN_ID: ctx.run_id, TENANT: ctx.tenant_id, STEP_KEY: ctx.step_key, FENCING_TOKEN: ctx.fencing_token,
        IDEMPOTENCY_KEY: ctx.idempotency_key}
    with tracer.start_as_current_span(method, kind=SpanKind.CLIENT, attributes=attributes,
                                       record_exception=False, set_status_on_exception=False) as span:
        yield span, dict(inject_metadata())


def _answered(span: Any, status: int) -> None:
    if span is not None:
        span.set_attribute("http.response.status_code", status)
        if status >= 400:
            span.set_attribute("error.type", str(status))
            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))


def _failed(span: Any, exc: BaseException) -> None:
    if span is not None:
        span.set_attribute("error.type", type(exc).__name__)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:200]))


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


class HttpToolAdapter:
    def __init__(self, tool: HttpTool, session: aiohttp.ClientSession, tracer: Any = None) -> None:
        self.tool = tool
        self.session = session
        self.tracer = tracer or _TRACER

    async def call(self, request: dict[str, Any], ctx: ToolCallContext) -> ToolOutcome:
        with _client_span(self.tracer, "POST", self.tool.url, self.tool, ctx) as (span, trace_headers):
            return await self._post(request, ctx, span, trace_headers)

    async def _post(self, request: dict[str, Any], ctx: ToolCallContext, span: Any,
                    trace_headers: dict[str, str] | None) -> ToolOutcome:
        timeout = aiohttp.ClientTimeout(total=self.tool.timeout_s)
        try:
            async with self.session.post(self.tool.url, json=request, headers=_headers(self.tool, ctx, trace_headers),
                                         timeout=timeout) as resp:
                status, text = resp.status, await resp.text()
                retry_after = resp.headers.get("Retry-After")
        except TimeoutError as exc:
            _failed(span, exc)
            return ToolOutcome.failure("timeout", f"no answer within {self.tool.timeout_s}s")
        except aiohttp.ClientConnectorError as exc:  # before the request was written
            _failed(span, exc)
            return ToolOutcome.failure("connect_failed", str(exc))
        except (aiohttp.ClientError, OSError) as exc:
            _failed(span, exc)
            return ToolOutcome.failure("connection_reset", f"{type(exc).__name__}: {exc}")
        _answered(span, status)
        return self._classify(status, text, retry_after)

    def _classify(self, status: int, text: str, retry_after: str | None) -> ToolOutcome:
        body = _json_or_none(text)
        if 200 <= status < 300:
            if body is None and text:
                return ToolOutcome.failure("bad_response", f"HTTP {status} with a body that is not JSON")
            remote = body.get(self.tool.remote_id_field) if isinstance(body, dict) else None
            return ToolOutcome.success(body, str(remote) if remote is not None else None)
        detail = f"HTTP {status}: {text[:500]}"
        if status == 429:
            return ToolOutcome.failure("rate_limited", detail, http_status=status, retry_after=retry_after)
        if status == 409 and isinstance(body, dict) and body.get("error") == "stale_fence":
            return ToolOutcome.failure("stale_fence", detail, http_status=status)
        if status == 408:
            return ToolOutcome.failure("timeout", detail, http_status=status)
        if 400 <= status < 500:
            return ToolOutcome.failure("refused", detail, http_status=status)
        if status >= 500:
            return ToolOutcome.failure("server_error", detail, http_status=status)
        return ToolOutcome.failure("bad_response", detail, http_status=status)

    async def lookup(self, ctx: ToolCallContext) -> LookupOutcome:
        if self.tool.lookup_url is None:
            return LookupOutcome("unknown", evidence={"reason": "tool has no lookup contract"})
        with _client_span(self.tracer, "GET", self.tool.lookup_url, self.tool, ctx) as (span, trace_headers):
            return await self._get(ctx, span, trace_headers)

    async def _get(self, ctx: ToolCallContext, span: Any, trace_headers: dict[str, str] | None) -> LookupOutcome:
        assert self.tool.lookup_url is not None
        timeout = aiohttp.ClientTimeout(total=self.tool.timeout_s)
        try:
            async with self.session.get(self.tool.lookup_url, params={"key": ctx.idempotency_key},
                                        headers=_headers(self.tool, ctx, trace_headers), timeout=timeout) as resp:
                status, text = resp.status, await resp.text()
        except (TimeoutError, aiohttp.ClientError, OSError, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            _failed(span, exc)
            return LookupOutcome("unknown", evidence={"error": f"{type(exc).__name__}: {exc}"[:500]})
        _answered(span, status)
        body = _json_or_none(text)
        evidence = {"lookup_url": self.tool.lookup_url, "http_status": status, "body": body}
        if status == 200 and isinstance(body, dict) and body.get("found") is True:
            response = body.get("response")
            remote = response.get(self.tool.remote_id_field) if isinstance(response, dict) else None
            return LookupOutcome("found", response, str(remote) if remote is not None else None, evidence)
        if status == 404 and isinstance(body, dict) and body.get("found") is False:
            return LookupOutcome("not_found", evidence=evidence)
        return LookupOutcome("unknown", evidence=evidence)

    async def close(self) -> None:
        return None
