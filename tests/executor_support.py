"""Executor test helpers: the mock tool server, agent files, an in-process executor, condition waits."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc
import yaml
from helpers import wait_until
from support import Stack

from devstack.mocktool import MockToolServer
from executor import journal
from executor.agents import AgentCatalog
from executor.client import WorkClient
from executor.config import ExecutorSettings
from executor.faults import Faults
from executor.tools.base import LookupOutcome, ToolCallContext, ToolRefused
from executor.worker import Worker
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.writes import WRITE_OPS

T = TypeVar("T")
STATUS = pb.RunStatus.Name


async def wait_for(probe: Callable[[], Awaitable[T | None]], within: float = 60.0, what: str = "condition",
                   interval: float = 0.05) -> T:
    """helpers.wait_until with this module's defaults (a minute, "condition")."""
    return await wait_until(probe, within, what, interval)


async def get_run(stack: Stack, run_id: str, tenant: str = "tenant-a") -> pb.Run:
    return await stack.runs.GetRun(rs.GetRunRequest(run_id=run_id), metadata=stack.md(tenant))


async def wait_status(stack: Stack, run_id: str, *statuses: int, within: float = 60.0,
                      tenant: str = "tenant-a") -> pb.Run:
    seen: list[str] = []

    async def probe() -> pb.Run | None:
        run = await get_run(stack, run_id, tenant)
        seen.append(f"{STATUS(run.status)} {run.terminal_reason or run.pause_reason}".strip())
        return run if run.status in statuses else None

    try:
        return await wait_for(probe, within, f"run {run_id} in {[STATUS(s) for s in statuses]}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {seen[-1] if seen else None}") from None


async def history(stack: Stack, run_id: str, tenant: str = "tenant-a") -> rs.RunHistory:
    """The whole history, every page of it merged."""
    merged = rs.RunHistory()
    token = ""
    for _ in range(10_000):
        page = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=run_id, page_size=500, page_token=token),
                                              metadata=stack.md(tenant))
        merged.run.CopyFrom(page.run)
        merged.checkpoints.extend(page.checkpoints)
        merged.tool_executions.extend(page.tool_executions)
        merged.events.extend(page.events)
        merged.journal.extend(page.journal)
        token = page.next_page_token
        if not token:
            return merged
    raise AssertionError("history did not end within 10,000 pages")


def latest_state(hist: rs.RunHistory) -> dict[str, Any]:
    """The run's state as its executor sees it: the latest checkpoint (schema 2 holds only what is
    current) with the history, tool results, inputs and exceptions rebuilt from the run's journal and
    the answers from its ledger rows."""
    if not hist.checkpoints:
        return {}
    state = json.loads(hist.checkpoints[-1].state_json)
    if hist.checkpoints[-1].schema_version != 2:  # schema 1 kept it inline; others are not ours to read
        return state
    rebuilt = journal.Rebuilt()
    for entry in hist.journal:
        rebuilt.add(entry)
    rebuilt.set_answers(hist.tool_executions)
    return {**state, "history": [e.model_dump(mode="json", exclude_none=True) for e in rebuilt.history],
            "tool_results": rebuilt.tool_results, "inputs": rebuilt.inputs, "exceptions": rebuilt.exceptions}


def write_agent(directory: Path, definition: dict[str, Any], filename: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (filename or f"{definition['name'].replace('/', '_')}-{definition['version']}.yaml")
    path.write_text(yaml.safe_dump(definition, sort_keys=False))
    return path


def http_tool(mock_url: str, name: str, *, lookup: bool = True, fenced: bool = True, idempotent: bool = True,
              requires_approval: bool = False, schema: dict[str, Any] | None = None,
              timeout_s: float = 5.0) -> dict[str, Any]:
    tool: dict[str, Any] = {
        "name": name, "kind": "http", "url": f"{mock_url}/tools/{name}", "timeout_s": timeout_s,
        "contract": {"idempotent": idempotent, "lookup": lookup, "fenced": fenced,
                     "requires_approval": requires_approval},
        "input_schema": schema or {"type": "object"},
    }
    if lookup:
        tool["lookup_url"] = f"{mock_url}/lookup/{name}"
    return tool


def scripted_agent(name: str, plan: list[dict[str, Any]], tools: list[dict[str, Any]], **extra: Any,
                   ) -> dict[str, Any]:
    return {"name": name, "version": "1", "decider": {"kind": "scripted", "plan": plan}, "tools": tools, **extra}


class MockTool:
    """The mock tool server in this process (real HTTP on loopback, its own SQLite file)."""

    def __init__(self, server: MockToolServer, db_path: Path) -> None:
        self.server = server
        self.url = server.url
        self.db = sqlite3.connect(str(db_path), isolation_level=None)  # readable after the server stops

    def fault(self, tool: str, mode: str, count: int = 1, **params: int) -> None:
        self.db.execute(
            "INSERT INTO faults (tool, mode, remaining, latency_ms, hold_ms) VALUES (?,?,?,?,?)",
            (tool, mode, count, params.get("latency_ms", 0), params.get("hold_ms", 30_000)))

    def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return self.db.execute(sql, args).fetchall()

    def calls_by_key(self, tool: str | None = None) -> dict[str, int]:
        rows = self.rows("SELECT idempotency_key, count(*) FROM requests WHERE kind = 'call' "
                         "AND (? IS NULL OR tool = ?) GROUP BY idempotency_key", tool, tool)
        return {key: count for key, count in rows}

    def executions(self, tool: str | None = None) -> int:
        return int(self.rows("SELECT count(*) FROM executions WHERE (? IS NULL OR tool = ?)", tool, tool)[0][0])


@asynccontextmanager
async def mock_tool(tmp_path: Path, latency_ms: int = 0) -> AsyncIterator[MockTool]:
    path = tmp_path / "mocktool.sqlite"
    server = MockToolServer(path, latency_ms=latency_ms)
    await server.start()
    try:
        yield MockTool(server, path)
    finally:
        await server.stop()


def executor_settings(stack: Stack, agents_path: Path | str, **overrides: Any) -> ExecutorSettings:
    values: dict[str, Any] = {"scheduler_addr": stack.addr, "agents_path": str(agents_path), "health_addr": "",
                              "claim_wait_ms": 300, "slots": 4, "shutdown_grace_s": 2.0, "rpc_timeout_s": 5.0}
    values.update(overrides)
    return ExecutorSettings(**values)


@asynccontextmanager
async def executor(stack: Stack, agents_path: Path | str, faults: Faults | None = None,
                   tracer_provider: Any = None, **overrides: Any) -> AsyncIterator[Worker]:
    settings = executor_settings(stack, agents_path, **overrides)
    worker = Worker(settings, AgentCatalog.load(settings.agents_path), faults=faults,
                    tracer_provider=tracer_provider)
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop()


def tap_writes(client: WorkClient, seen: dict[str, list[Any]], names: tuple[str, ...] = tuple(WRITE_OPS.values()),
               lose: Callable[[str, int], grpc.StatusCode | None] | None = None) -> None:
    """Records every write the client sends under its single call's name (`SaveCheckpoint`, ...),
    whether it leaves as that call or as a WriteBatch item. `lose(name, n)` (n = writes of that name
    so far) may name a status: the write still reaches the scheduler and commits, but its answer is
    lost (the whole WriteBatch answer, when batched) and the caller gets that status instead."""
    stub = client.stub

    def record(name: str, request: Any) -> grpc.StatusCode | None:
        if name not in names:
            return None
        seen.setdefault(name, []).append(request)
        return lose(name, len(seen[name])) if lose else None

    def lost(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="answer lost in the test")

    for name in WRITE_OPS.values():
        real = getattr(stub, name)

        async def call(request: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            code = record(_name, request)
            reply = await _real(request, **kwargs)
            if code is not None:
                raise lost(code)
            return reply

        setattr(stub, name, call)
    real_batch = stub.WriteBatch

    async def batch(request: Any, **kwargs: Any) -> Any:
        codes = [record(WRITE_OPS[op], getattr(item, op)) for item in request.items
                 for op in (item.WhichOneof("op"),) if op]
        reply = await real_batch(request, **kwargs)
        code = next((c for c in codes if c is not None), None)
        if code is not None:
            raise lost(code)
        return reply

    stub.WriteBatch = batch


# ---------------------------------------------------------------- python tools used by agent files

CALLS: dict[str, list[dict[str, Any]]] = {}


def record_tool(request: dict[str, Any], ctx: ToolCallContext) -> dict[str, Any]:
    """A python tool that remembers each call by idempotency key (and dedupes like a good downstream)."""
    seen = CALLS.setdefault(ctx.idempotency_key, [])
    seen.append({"request": request, "fence": ctx.fencing_token, "step_key": ctx.step_key,
                 "traceparent": ctx.headers.get("traceparent")})
    return {"id": f"py-{ctx.idempotency_key[-8:]}", "echo": request, "calls": len(seen)}


def record_lookup(key: str, ctx: ToolCallContext) -> LookupOutcome:
    if key in CALLS:
        return LookupOutcome("found", {"id": f"py-{key[-8:]}", "echo": CALLS[key][0]["request"]})
    return LookupOutcome("not_found", evidence={"checked": key})


def refusing_tool(request: dict[str, Any], ctx: ToolCallContext) -> dict[str, Any]:
    raise ToolRefused(f"refused {request}")


def noop_tool(request: dict[str, Any], ctx: ToolCallContext) -> dict[str, Any]:
    return {"ok": True}


SLOW: dict[str, str] = {}  # idempotency key -> started | finished | cancelled


async def slow_tool(request: dict[str, Any], ctx: ToolCallContext) -> dict[str, Any]:
    """Sleeps request["seconds"]; remembers whether it finished or was cancelled."""
    SLOW[ctx.idempotency_key] = "started"
    try:
        await asyncio.sleep(float(request.get("seconds", 30)))
    except asyncio.CancelledError:
        SLOW[ctx.idempotency_key] = "cancelled"
        raise
    SLOW[ctx.idempotency_key] = "finished"
    return {"slept": request.get("seconds")}


def unserialisable_tool(request: dict[str, Any], ctx: ToolCallContext) -> dict[str, Any]:
    """Returns something JSON cannot carry: an executor-side failure after the tool ran."""
    return {"ids": {1, 2}}
