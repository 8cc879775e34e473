"""The `http` tool adapter: POST JSON with Idempotency-Key and X-Fencing-Token; GET lookup by key.

Classification (executor.errors): 2xx → success; 429 → rate_limited; 409
stale_fence → stale_fence; 408 → timeout; other 4xx → refused; 5xx →
server_error; a timeout or a connection lost after sending → unknown outcome;
a connection that never opened → connect_failed (nothing was sent).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from executor.agents import HttpTool
from executor.tools.base import LookupOutcome, ToolCallContext, ToolOutcome

IDEMPOTENCY_HEADER = "Idempotency-Key"
FENCE_HEADER = "X-Fencing-Token"
RUN_HEADER = "X-Agentrt-Run-Id"
STEP_HEADER = "X-Agentrt-Step-Key"


def _headers(tool: HttpTool, ctx: ToolCallContext) -> dict[str, str]:
    return {**tool.headers, **ctx.headers, IDEMPOTENCY_HEADER: ctx.idempotency_key,
            FENCE_HEADER: str(ctx.fencing_token), RUN_HEADER: ctx.run_id, STEP_HEADER: ctx.step_key}


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


class HttpToolAdapter:
    def __init__(self, tool: HttpTool, session: aiohttp.ClientSession) -> None:
        self.tool = tool
        self.session = session

    async def call(self, request: dict[str, Any], ctx: ToolCallContext) -> ToolOutcome:
        timeout = aiohttp.ClientTimeout(total=self.tool.timeout_s)
        try:
            async with self.session.post(self.tool.url, json=request, headers=_headers(self.tool, ctx),
                                         timeout=timeout) as resp:
                status, text = resp.status, await resp.text()
                retry_after = resp.headers.get("Retry-After")
        except TimeoutError:
            return ToolOutcome.failure("timeout", f"no answer within {self.tool.timeout_s}s")
        except aiohttp.ClientConnectorError as exc:  # before the request was written
            return ToolOutcome.failure("connect_failed", str(exc))
        except (aiohttp.ClientError, OSError) as exc:
            return ToolOutcome.failure("connection_reset", f"{type(exc).__name__}: {exc}")
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
        timeout = aiohttp.ClientTimeout(total=self.tool.timeout_s)
        try:
            async with self.session.get(self.tool.lookup_url, params={"key": ctx.idempotency_key},
                                        headers=_headers(self.tool, ctx), timeout=timeout) as resp:
                status, text = resp.status, await resp.text()
        except (TimeoutError, aiohttp.ClientError, OSError, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            return LookupOutcome("unknown", evidence={"error": f"{type(exc).__name__}: {exc}"[:500]})
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
