"""WorkService client: typed errors, and retries that keep the caller's event id.

A call whose outcome is unknown (DEADLINE_EXCEEDED, UNAVAILABLE) is sent again
with the very same request, so the same event id: the scheduler answers
`replayed=true` from what committed, or runs it once. A new event id would
make "did it commit?" undecidable (reference 6.1).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from shared.canonical import canonical_json, uuid7
from shared.errors import AgentrtError, Unavailable, from_rpc_error
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.gen.agentrt.v1 import work_service_pb2_grpc as ws_grpc
from shared.tracing import inject_metadata

log = logging.getLogger(__name__)
R = TypeVar("R")
_UNKNOWN_OUTCOME = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def new_event_id() -> str:
    return str(uuid7())


class WorkClient:
    def __init__(self, channel: grpc.aio.Channel, *, rpc_timeout_s: float = 10.0, token: str | None = None) -> None:
        self.stub = ws_grpc.WorkServiceStub(channel)
        self._auth = [("authorization", f"Bearer {token}")] if token else []
        self.rpc_timeout_s = rpc_timeout_s
        self.retries = 0  # calls re-sent after an unknown outcome (for tests and metrics)

    async def _call(self, method: Callable[..., Awaitable[R]], request: Any, give_up_at: float | None) -> R:
        """Retries the same request until it gets a definite answer or `give_up_at` (monotonic) passes."""
        delay = 0.05
        while True:
            timeout = self.rpc_timeout_s
            if give_up_at is not None:
                timeout = max(0.05, min(timeout, give_up_at - time.monotonic()))
            try:
                return await method(request, timeout=timeout, metadata=inject_metadata(self._auth))
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _UNKNOWN_OUTCOME:
                    raise from_rpc_error(exc) from None
                if give_up_at is not None and time.monotonic() + delay >= give_up_at:
                    raise Unavailable(f"scheduler call {type(request).__name__} still unanswered: "
                                      f"{exc.code().name}") from None
                self.retries += 1
                log.debug("retrying %s with the same event id after %s", type(request).__name__, exc.code().name)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def claim(self, worker_id: str, agents: list[str], wait_ms: int) -> ws.Lease | None:
        request = ws.ClaimWorkRequest(worker_id=worker_id, agents=agents, wait_ms=wait_ms)
        try:
            reply = await self.stub.ClaimWork(request, timeout=wait_ms / 1000 + self.rpc_timeout_s,
                                              metadata=inject_metadata(self._auth))
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        return reply.lease if reply.HasField("lease") else None

    async def heartbeat(self, lease: ws.LeaseRef, give_up_at: float) -> ws.HeartbeatResponse:
        return await self._call(self.stub.Heartbeat, ws.HeartbeatRequest(lease=lease), give_up_at)

    async def save_checkpoint(self, lease: ws.LeaseRef, expected_version: int, state: dict[str, Any],
                              schema_version: int, step_key: str, give_up_at: float | None,
                              ) -> ws.SaveCheckpointResponse:
        request = ws.SaveCheckpointRequest(
            lease=lease, expected_version=expected_version, state_json=canonical_json(state),
            schema_version=schema_version, step_key=step_key, event_id=new_event_id())
        return await self._call(self.stub.SaveCheckpoint, request, give_up_at)

    async def begin_tool_call(self, lease: ws.LeaseRef, expected_version: int, step_key: str, tool_name: str,
                              idempotency_key: str, request_body: dict[str, Any], give_up_at: float | None,
                              ) -> ws.BeginToolCallResponse:
        request = ws.BeginToolCallRequest(
            lease=lease, expected_version=expected_version, step_key=step_key, tool_name=tool_name,
            idempotency_key=idempotency_key, request_json=canonical_json(request_body),
            execution_id=new_event_id(), event_id=new_event_id())
        return await self._call(self.stub.BeginToolCall, request, give_up_at)

    async def complete_tool_call(self, request: ws.CompleteToolCallRequest, give_up_at: float | None,
                                 ) -> ws.CompleteToolCallResponse:
        if not request.event_id:
            request.event_id = new_event_id()
        return await self._call(self.stub.CompleteToolCall, request, give_up_at)

    async def complete_and_begin_tool_call(self, request: ws.CompleteAndBeginToolCallRequest,
                                           give_up_at: float | None) -> ws.CompleteAndBeginToolCallResponse:
        """Tx2 of one step and Tx1 of the next in one call; ids are made once, so a retry replays."""
        if not request.event_id:
            request.event_id = new_event_id()
        if not request.next.event_id:
            request.next.event_id = new_event_id()
        if not request.next.execution_id:
            request.next.execution_id = new_event_id()
        return await self._call(self.stub.CompleteAndBeginToolCall, request, give_up_at)

    async def mark_tool_in_doubt(self, lease: ws.LeaseRef, step_key: str, error_code: str, detail: str,
                                 give_up_at: float | None) -> ws.MarkToolInDoubtResponse:
        request = ws.MarkToolInDoubtRequest(lease=lease, step_key=step_key, error_code=error_code,
                                            detail=detail[:4000], event_id=new_event_id())
        return await self._call(self.stub.MarkToolInDoubt, request, give_up_at)

    async def finish_run(self, request: ws.FinishRunRequest, give_up_at: float | None) -> ws.FinishRunResponse:
        if not request.event_id:
            request.event_id = new_event_id()
        return await self._call(self.stub.FinishRun, request, give_up_at)


__all__ = ["AgentrtError", "WorkClient", "new_event_id"]
