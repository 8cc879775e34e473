"""The `mcp` tool adapter: a Model Context Protocol server's tools, served with the ledger's guarantees.

At start the executor lists each server's tools (list_mcp_tools) and serves
them with their JSON Schemas. Annotations give the contract: readOnlyHint or
idempotentHint make a tool idempotent (an unknown outcome is then retried
with backoff); any other tool's unknown outcome freezes the run IN_DOUBT. An
agent may override per tool and name a lookup tool of the same server.

Every call opens its own session (streamable HTTP, or a fresh stdio process),
so a restarted server is simply reached by the next call. The request's
`_meta` carries the ledger's keys (META_* below) for servers that honour them.

Classification (executor.errors): a result → success; a result with isError
→ tool_error (the tool answered that it failed), or the code the server puts
in the result's `_meta["agentrt/error"]` (stale_fence, retry_later,
unknown_outcome); a JSON-RPC error answering the call → refused when the
request was malformed or named no tool, otherwise server_error; a session
that never opened → connect_failed (nothing was sent); a connection lost or
a server that died after the call was sent → connection_reset; no answer in
time → timeout. An idempotent tool's unknown outcome is retried_unknown
instead (retried with backoff).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from executor.agents import (
    AgentCatalog,
    AgentDefinition,
    DefinitionError,
    McpServerAddress,
    McpServerTools,
    McpTool,
    ToolContract,
)
from executor.errors import ErrorClass, classify
from executor.tools.base import LookupOutcome, ToolCallContext, ToolOutcome

log = logging.getLogger(__name__)
if logging.getLogger("httpx2").level == logging.NOTSET:  # the SDK's HTTP client logs every request at INFO
    logging.getLogger("httpx2").setLevel(logging.WARNING)

# The keys of a tools/call request's `_meta` that agentrt sets. A server picks them out by name (the
# protocol adds its own io.modelcontextprotocol/* keys beside them).
META_IDEMPOTENCY_KEY = "agentrt/idempotency-key"  # the same on every resend of one step
META_FENCING_TOKEN = "agentrt/fencing-token"  # an integer; a fenced server refuses one lower than it has seen
META_RUN_ID = "agentrt/run-id"
META_STEP_KEY = "agentrt/step-key"
# The key of a result's `_meta` by which a server names its own error class (with isError).
META_ERROR = "agentrt/error"
SERVER_ERRORS = {"stale_fence": "stale_fence", "retry_later": "tool_busy", "unknown_outcome": "server_error",
                 "refused": "tool_error"}
# JSON-RPC errors that prove the request never reached a tool: parse error, invalid request, no such
# method, invalid params (an unknown tool or arguments the server refused before calling it).
_NOT_RUN = {-32700, -32600, -32601, -32602}
_CONNECTION_CLOSED = -32000  # mcp_types.CONNECTION_CLOSED: a stdio server that exited mid-call
_REQUEST_TIMEOUT = -32001  # mcp_types.REQUEST_TIMEOUT: the SDK gave up waiting (and sent notifications/cancelled)


class McpSessionNotOpened(Exception):
    """The session could not be opened (connect, spawn, handshake): no tools/call was sent."""


def _meta(ctx: ToolCallContext) -> dict[str, Any]:
    return {META_IDEMPOTENCY_KEY: ctx.idempotency_key, META_FENCING_TOKEN: ctx.fencing_token,
            META_RUN_ID: ctx.run_id, META_STEP_KEY: ctx.step_key}


@contextlib.asynccontextmanager
async def open_session(address: McpServerAddress, connect_timeout_s: float) -> AsyncIterator[Any]:
    """An mcp.Client on `address`, its handshake done within `connect_timeout_s` (else McpSessionNotOpened)."""
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

    async with contextlib.AsyncExitStack() as owned:
        server: Any
        if address.url is not None:
            http_client = None
            if address.headers:  # the SDK leaves a client it was given open: ours is closed with the session
                import httpx2

                http_client = await owned.enter_async_context(httpx2.AsyncClient(
                    headers=address.headers, timeout=httpx2.Timeout(30.0, read=300.0)))
            server = streamable_http_client(address.url, http_client=http_client)
        else:
            command = address.command or []
            server = StdioServerParameters(command=command[0], args=command[1:], env=address.env or None,
                                           cwd=address.cwd)
        client = Client(server, cache=None)
        try:
            async with asyncio.timeout(connect_timeout_s):
                await client.__aenter__()
        except Exception as exc:
            raise McpSessionNotOpened(f"{type(exc).__name__}: {exc}"[:500]) from None
        except BaseExceptionGroup as group:
            raise McpSessionNotOpened(_first_error(group)) from None
        failed: BaseException | None = None
        try:
            yield client
        except BaseException as exc:
            failed = exc
            raise
        finally:
            # Leaving a session whose server died raises (an ExceptionGroup): what the call saw is what counts.
            try:
                await client.__aexit__(type(failed) if failed else None, failed, None)
            except (Exception, BaseExceptionGroup) as exc:
                log.debug("mcp session to %s closed with %s", address.describe(), _first_error(exc))


def _first_error(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:500]


def _result_json(result: Any) -> Any:
    """A CallToolResult as JSON: its structured content, else {"content": [...]} of its blocks."""
    if result.structured_content is not None:
        return result.structured_content
    return {"content": [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]}


def _result_text(result: Any) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content).strip()


async def _exchange(address: McpServerAddress, connect_timeout_s: float, name: str, arguments: dict[str, Any],
                    meta: dict[str, Any], timeout_s: float, sent: list[bool]) -> Any:
    async with open_session(address, connect_timeout_s) as client:
        sent.append(True)
        return await client.call_tool(name, arguments, read_timeout_seconds=timeout_s, meta=meta)


class McpToolAdapter:
    def __init__(self, tool: McpTool) -> None:
        self.tool = tool

    async def _send(self, name: str, arguments: dict[str, Any], ctx: ToolCallContext) -> tuple[str, Any]:
        """("ok", result) | ("not_sent", why) | ("error", MCPError) | ("lost", why) | ("timeout", why).

        The exchange runs in a task of its own: a server dying mid-call cancels that task from inside the
        SDK (asyncio.CancelledError), which is an unknown outcome, never this task's own cancellation.
        """
        from mcp.shared.exceptions import MCPError

        sent: list[bool] = []
        exchange = asyncio.ensure_future(_exchange(self.tool.server, self.tool.connect_timeout_s, name, arguments,
                                                   _meta(ctx), self.tool.timeout_s, sent))
        try:
            await asyncio.wait({exchange}, timeout=self.tool.connect_timeout_s + self.tool.timeout_s + 5)
        except asyncio.CancelledError:  # ours: the executor is stopping or the lease is gone
            exchange.cancel()
            await asyncio.gather(exchange, return_exceptions=True)
            raise
        if not exchange.done():
            exchange.cancel()
            await asyncio.gather(exchange, return_exceptions=True)
            return ("timeout" if sent else "not_sent"), f"no answer within {self.tool.timeout_s}s"
        if exchange.cancelled():
            return "lost", "the session was cancelled under the call (the server went away)"
        exc = exchange.exception()
        if exc is None:
            return "ok", exchange.result()
        if isinstance(exc, McpSessionNotOpened):
            return "not_sent", str(exc)
        if isinstance(exc, MCPError):
            if exc.code == _REQUEST_TIMEOUT:
                return "timeout", exc.message
            if exc.code == _CONNECTION_CLOSED:
                return "lost", f"MCPError {exc.code}: {exc.message}"
            return "error", exc
        if isinstance(exc, TimeoutError):
            return "timeout", f"no answer within {self.tool.timeout_s}s"
        return "lost", _first_error(exc)

    async def call(self, request: dict[str, Any], ctx: ToolCallContext) -> ToolOutcome:
        kind, value = await self._send(self.tool.remote_name, request, ctx)
        if kind == "ok":
            return self._classify(value)
        if kind == "not_sent":
            return ToolOutcome.failure("connect_failed", value)
        if kind == "error":
            code = "refused" if value.code in _NOT_RUN else "server_error"
            return self._unknown_if_idempotent(ToolOutcome.failure(code, f"MCPError {value.code}: {value.message}",
                                                                   mcp_error=value.code))
        code = "timeout" if kind == "timeout" else "connection_reset"
        return self._unknown_if_idempotent(ToolOutcome.failure(code, value))

    def _unknown_if_idempotent(self, outcome: ToolOutcome) -> ToolOutcome:
        """An idempotent tool's unknown outcome is safe to send again: retried, not frozen."""
        if self.tool.contract.idempotent and classify(outcome.error_code) is ErrorClass.UNKNOWN_OUTCOME:
            return ToolOutcome.failure("retried_unknown", f"{outcome.error_code}: {outcome.detail}",
                                       **outcome.evidence)
        return outcome

    def _classify(self, result: Any) -> ToolOutcome:
        body = _result_json(result)
        if not result.is_error:
            remote = body.get("id") if isinstance(body, dict) else None
            return ToolOutcome.success(body, str(remote) if remote is not None else None)
        named = (result.meta or {}).get(META_ERROR)
        code = SERVER_ERRORS.get(named, "tool_error") if isinstance(named, str) else "tool_error"
        return self._unknown_if_idempotent(ToolOutcome.failure(code, _result_text(result) or "isError", mcp=body))

    async def lookup(self, ctx: ToolCallContext) -> LookupOutcome:
        if self.tool.lookup_tool is None:
            return LookupOutcome("unknown", evidence={"reason": "tool has no lookup contract"})
        kind, value = await self._send(self.tool.lookup_tool, {"idempotency_key": ctx.idempotency_key}, ctx)
        evidence: dict[str, Any] = {"lookup_tool": self.tool.lookup_tool}
        if kind != "ok":
            return LookupOutcome("unknown", evidence={**evidence, "error": str(value)[:500]})
        body = _result_json(value)
        evidence["body"] = body
        if not value.is_error and isinstance(body, dict) and body.get("found") is True:
            response = body.get("response")
            remote = response.get("id") if isinstance(response, dict) else None
            return LookupOutcome("found", response, str(remote) if remote is not None else None, evidence)
        if not value.is_error and isinstance(body, dict) and body.get("found") is False:
            return LookupOutcome("not_found", evidence=evidence)
        return LookupOutcome("unknown", evidence=evidence)

    async def close(self) -> None:
        return None


def _contract(entry: McpServerTools, name: str, annotations: dict[str, Any]) -> tuple[ToolContract, Any]:
    override = entry.tools.get(name)
    hinted = bool(annotations.get("readOnlyHint") or annotations.get("idempotentHint"))
    idempotent = override.idempotent if override and override.idempotent is not None else hinted
    contract = ToolContract(idempotent=idempotent, lookup=bool(override and override.lookup_tool),
                            fenced=bool(override and override.fenced),
                            requires_approval=bool(override and override.requires_approval))
    return contract, override


async def _listed(entry: McpServerTools) -> list[Any]:
    tools: list[Any] = []
    async with open_session(entry.server, entry.connect_timeout_s) as client:
        cursor: str | None = None
        for _ in range(100):  # a server that pages forever cannot hang the start
            async with asyncio.timeout(entry.timeout_s):
                page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
    return tools


async def server_tools(agent: AgentDefinition, index: int, entry: McpServerTools) -> list[McpTool]:
    """The tools one `kind: mcp` entry serves, as listed by its server now."""
    where = f"tools.mcp.{index}"
    try:
        listed = await _listed(entry)
    except (Exception, BaseExceptionGroup) as exc:
        raise DefinitionError(agent.source, f"{where}.server",
                              f"cannot list the tools of {entry.server.describe()}: {_first_error(exc)}") from None
    by_name = {t.name: t for t in listed}
    for name in [*entry.tools, *(entry.include or ())]:
        if name not in by_name:
            raise DefinitionError(agent.source, f"{where}.tools.{name}", "the server lists no such tool")
    served: list[McpTool] = []
    for remote in listed:
        if entry.include is not None and remote.name not in entry.include:
            continue
        annotations = remote.annotations.model_dump(by_alias=True, exclude_none=True) if remote.annotations else {}
        contract, override = _contract(entry, remote.name, annotations)
        lookup_tool = override.lookup_tool if override else None
        if lookup_tool is not None and lookup_tool not in by_name:
            raise DefinitionError(agent.source, f"{where}.tools.{remote.name}.lookup_tool",
                                  f"the server lists no tool {lookup_tool!r}")
        try:
            served.append(McpTool(
                kind="mcp", name=f"{entry.prefix}{remote.name}", description=remote.description or "",
                input_schema=remote.input_schema or {"type": "object"}, output_schema=remote.output_schema,
                contract=contract, timeout_s=(override.timeout_s if override and override.timeout_s else
                                              entry.timeout_s),
                server=entry.server, remote_name=remote.name, lookup_tool=lookup_tool, annotations=annotations,
                connect_timeout_s=entry.connect_timeout_s))
        except ValueError as exc:
            raise DefinitionError(agent.source, f"{where}.tools.{remote.name}",
                                  str(exc).splitlines()[-1].strip()[:300]) from None
    return served


async def list_mcp_tools(catalog: AgentCatalog) -> None:
    """Lists every MCP server's tools and adds them to their agents' definitions (in place, once).

    A server that cannot be listed, or whose tools clash with the agent's own, stops the executor with
    one line naming the file and the field (DefinitionError), as an invalid definition does.
    """
    for agent in catalog.all():
        if not agent.mcp_servers or any(isinstance(t, McpTool) for t in agent.tools):
            continue
        added: list[McpTool] = []
        for index, entry in enumerate(agent.mcp_servers):
            added.extend(await server_tools(agent, index, entry))
        expanded = agent.model_copy(update={"tools": [*agent.tools, *added]})
        expanded.check_plan_tools()
        catalog.replace(expanded)
        log.info("agent %s %s: %d tools from %d MCP servers", agent.name, agent.version, len(added),
                 len(agent.mcp_servers))
