"""Test helpers: an in-process scheduler on a free loopback port, and a fenced-work client."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from scheduler.config import SchedulerSettings
from scheduler.server import SchedulerServer
from shared.canonical import request_hash
from shared.errors import error_info
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.gen.agentrt.v1 import work_service_pb2_grpc as ws_grpc

TENANT = "tenant-a"


@dataclass
class Stack:
    server: SchedulerServer
    channel: grpc.aio.Channel
    runs: rs_grpc.RunServiceStub
    work: ws_grpc.WorkServiceStub
    addr: str

    def md(self, tenant: str = TENANT) -> list[tuple[str, str]]:
        return [("x-tenant-id", tenant)]


@asynccontextmanager
async def scheduler_stack(db_url: str, tracer_provider: Any = None, **overrides: Any) -> AsyncIterator[Stack]:
    values: dict[str, Any] = {"database_url": db_url, "listen_addr": "127.0.0.1:0", "claim_poll_interval_ms": 50,
                              "backoff_base_ms": 100, "backoff_cap_ms": 1000, "backoff_jitter_ms": 10,
                              "shutdown_grace_s": 1,
                              # Most tests submit runs no executor serves (they act as the executor):
                              # tests/integration/scheduler/test_agent_registry.py turns the check on.
                              "require_registered_agents": False,
                              # Not about authentication: tests/integration/test_auth*.py turn it on.
                              "auth_mode": "none"}
    settings = SchedulerSettings(**{**values, **overrides})
    server = SchedulerServer(settings, tracer_provider=tracer_provider)
    port = await server.start()
    addr = f"127.0.0.1:{port}"
    channel = grpc.aio.insecure_channel(addr)
    try:
        yield Stack(server, channel, rs_grpc.RunServiceStub(channel), ws_grpc.WorkServiceStub(channel), addr)
    finally:
        await channel.close()
        await server.stop(0.5)


def eid() -> str:
    return str(uuid.uuid4())


def reason_of(error: grpc.aio.AioRpcError) -> str | None:
    info = error_info(error)
    return info.reason if info else None


async def submit(stack: Stack, agent: str = "demo", payload: dict[str, Any] | None = None,
                 tenant: str = "tenant-a", **fields: Any) -> pb.Run:
    reply = await stack.runs.SubmitRun(
        rs.SubmitRunRequest(agent_name=agent, input_json=json.dumps(payload or {}), **fields),
        metadata=stack.md(tenant))
    return reply.run


async def claim(stack: Stack, worker: str = "w1", agents: tuple[str, ...] = ("demo",),
                wait_ms: int = 0) -> ws.Lease | None:
    reply = await stack.work.ClaimWork(ws.ClaimWorkRequest(worker_id=worker, agents=list(agents),
                                                           wait_ms=wait_ms), timeout=30)
    return reply.lease if reply.HasField("lease") else None


def lease_ref(lease: ws.Lease, worker: str | None = None) -> ws.LeaseRef:
    return ws.LeaseRef(run_id=lease.run.run_id, worker_id=worker or lease.run.lease_owner,
                       fencing_token=lease.run.fencing_token)


def tool_state(step_key: str, tool: str, request: Any, **extra: Any) -> dict[str, Any]:
    """A checkpoint state recording a tool decision (the scheduler's Tx1 precondition)."""
    return {"cursor": step_key, **extra,
            "pending_tool": {"step_key": step_key, "tool_name": tool,
                             "request_hash": request_hash(tool, request).hex()}}


async def rpc_error(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    """The error a call fails with (the test fails if it succeeds)."""
    try:
        reply = await call
    except grpc.aio.AioRpcError as error:
        return error
    raise AssertionError(f"call succeeded but was expected to fail: {reply}")


async def snapshot(db: Any, run_id: str) -> dict[str, Any]:
    """Everything a write could change for one run."""
    run = await db.fetchrow("SELECT * FROM agent_runs WHERE id = $1::uuid", run_id)
    return {
        "run": dict(run),
        "checkpoints": [dict(r) for r in await db.fetch(
            "SELECT * FROM agent_checkpoints WHERE run_id = $1::uuid ORDER BY version", run_id)],
        "ledger": [dict(r) for r in await db.fetch(
            "SELECT * FROM tool_executions WHERE run_id = $1::uuid ORDER BY step_key", run_id)],
        "events": [dict(r) for r in await db.fetch(
            "SELECT * FROM outbox WHERE run_id = $1::uuid ORDER BY id", run_id)],
        "journal": [dict(r) for r in await db.fetch(
            "SELECT * FROM run_journal WHERE run_id = $1::uuid ORDER BY seq", run_id)],
    }


async def commit_unknown_count(db: Any) -> int:
    """runtime_counters' count of runs frozen by commit-unknown recovery."""
    return await db.fetchval(
        "SELECT coalesce((SELECT value FROM runtime_counters WHERE name = 'commit_unknown_inconsistent'), 0)")
