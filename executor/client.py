"""WorkService client: typed errors, and retries that keep the caller's event id.

A call whose outcome is unknown (DEADLINE_EXCEEDED, UNAVAILABLE) is sent again
with the very same request, so the same event id: the scheduler answers
`replayed=true` from what committed, or runs it once. A new event id would
make "did it commit?" undecidable (docs/design.md §commit-unknown).

Writes go out through WriteBatch by default: while a batch is in flight, the
writes of the process's other runs queue up and leave together in the next
one (no timer, so a lone write is sent at once). Each item is answered on its
own, exactly as its single call would be; a batch whose answer is lost leaves
every item's outcome unknown, and each is sent again with its same event id.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from shared.canonical import canonical_json, uuid7
from shared.errors import AgentrtError, Unavailable, from_batch_error, from_rpc_error
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.gen.agentrt.v1 import work_service_pb2_grpc as ws_grpc
from shared.tracing import current_trace, inject_metadata
from shared.writes import MAX_BATCH_ITEMS, WRITE_OPS

log = logging.getLogger(__name__)
R = TypeVar("R")
_UNKNOWN_OUTCOME = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_UNKNOWN_CODES = {code.value[0] for code in _UNKNOWN_OUTCOME}


class OutcomeUnknown(Exception):
    """The write may or may not have committed (its answer was lost): send it again, same event id."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class _Queued:
    item: ws.WriteBatchItem
    op: str
    give_up_at: float
    answer: asyncio.Future[Any]


class WriteBatcher:
    """Coalesces concurrent writes into WriteBatch calls, at most `in_flight` at a time."""

    def __init__(self, stub: ws_grpc.WorkServiceStub, auth: list[tuple[str, str]], *, max_items: int = 64,
                 in_flight: int = 2) -> None:
        self.stub = stub
        self._auth = auth
        self.max_items = min(max_items, MAX_BATCH_ITEMS)
        self.in_flight = in_flight
        self._queue: list[_Queued] = []
        self._sending = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0  # WriteBatch calls made (for tests and metrics)
        self.items = 0

    async def write(self, op: str, request: Any, within_s: float) -> Any:
        """The item's own reply, or its typed error; OutcomeUnknown when its answer was lost."""
        caller = current_trace()  # the caller's span: each item continues its own trace
        item = ws.WriteBatchItem(traceparent=caller.traceparent or "", tracestate=caller.tracestate or "")
        getattr(item, op).CopyFrom(request)
        queued = _Queued(item, op, time.monotonic() + within_s, asyncio.get_running_loop().create_future())
        self._queue.append(queued)
        self._pump()
        return await queued.answer

    def _pump(self) -> None:
        while self._queue and self._sending < self.in_flight:
            batch, self._queue = self._queue[:self.max_items], self._queue[self.max_items:]
            self._sending += 1
            task = asyncio.create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Queued]) -> None:
        try:
            live = [q for q in batch if not q.answer.done()]  # a caller may have gone (cancelled)
            if not live:
                return
            timeout = max(0.05, min(q.give_up_at for q in live) - time.monotonic())
            self.batches += 1
            self.items += len(live)
            try:
                reply = await self.stub.WriteBatch(ws.WriteBatchRequest(items=[q.item for q in live]),
                                                   timeout=timeout, metadata=self._auth)
            except grpc.aio.AioRpcError as exc:
                error: BaseException = (OutcomeUnknown(exc.code().name) if exc.code() in _UNKNOWN_OUTCOME
                                        else from_rpc_error(exc))
                for q in live:
                    _settle(q.answer, error=error)
                return
            except BaseException as exc:  # cancelled at shutdown, channel closed: nobody knows what committed
                for q in live:
                    _settle(q.answer, error=OutcomeUnknown(type(exc).__name__))
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            if len(reply.results) != len(live):
                for q in live:
                    _settle(q.answer, error=AgentrtError(
                        f"scheduler answered {len(reply.results)} results for {len(live)} writes"))
                return
            for q, result in zip(live, reply.results, strict=True):
                kind = result.WhichOneof("result")
                if kind == "error":
                    failed = result.error
                    _settle(q.answer, error=(OutcomeUnknown(grpc.StatusCode.UNAVAILABLE.name)
                                             if failed.code in _UNKNOWN_CODES else from_batch_error(failed)))
                elif kind == q.op:
                    _settle(q.answer, value=getattr(result, kind))
                else:
                    _settle(q.answer, error=AgentrtError(f"scheduler answered {kind} to {q.op}"))
        finally:
            self._sending -= 1
            self._pump()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _settle(answer: asyncio.Future[Any], *, value: Any = None, error: BaseException | None = None) -> None:
    if answer.done():
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(value)


def new_event_id() -> str:
    return str(uuid7())


class WorkClient:
    def __init__(self, channel: grpc.aio.Channel, *, rpc_timeout_s: float = 10.0, token: str | None = None,
                 batch: bool = True, batch_max_items: int = 64, batch_in_flight: int = 2) -> None:
        self.stub = ws_grpc.WorkServiceStub(channel)
        self._auth = [("authorization", f"Bearer {token}")] if token else []
        self.rpc_timeout_s = rpc_timeout_s
        self.retries = 0  # calls re-sent after an unknown outcome (for tests and metrics)
        self.batcher = (WriteBatcher(self.stub, self._auth, max_items=batch_max_items, in_flight=batch_in_flight)
                        if batch else None)

    async def close(self) -> None:
        if self.batcher is not None:
            await self.batcher.close()

    async def _call(self, op: str, request: Any, give_up_at: float | None) -> Any:
        """Retries the same request until it gets a definite answer or `give_up_at` (monotonic) passes."""
        delay = 0.05
        while True:
            timeout = self.rpc_timeout_s
            if give_up_at is not None:
                timeout = max(0.05, min(timeout, give_up_at - time.monotonic()))
            try:
                if self.batcher is not None:
                    return await self.batcher.write(op, request, timeout)
                method = getattr(self.stub, WRITE_OPS[op])
                return await method(request, timeout=timeout, metadata=inject_metadata(self._auth))
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _UNKNOWN_OUTCOME:
                    raise from_rpc_error(exc) from None
                unknown = exc.code().name
            except OutcomeUnknown as exc:
                unknown = exc.code
            if give_up_at is not None and time.monotonic() + delay >= give_up_at:
                raise Unavailable(f"scheduler call {type(request).__name__} still unanswered: {unknown}")
            self.retries += 1
            log.debug("retrying %s with the same event id after %s", type(request).__name__, unknown)
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
        return await self._call("heartbeat", ws.HeartbeatRequest(lease=lease), give_up_at)

    async def save_checkpoint(self, lease: ws.LeaseRef, expected_version: int, state: dict[str, Any],
                              schema_version: int, step_key: str, give_up_at: float | None,
                              journal: list[pb.JournalEntry] | None = None,
                              consume_signal_seqs: list[int] | None = None) -> ws.SaveCheckpointResponse:
        request = ws.SaveCheckpointRequest(
            lease=lease, expected_version=expected_version, state_json=canonical_json(state),
            schema_version=schema_version, step_key=step_key, event_id=new_event_id(), journal=journal or [],
            consume_signal_seqs=consume_signal_seqs or [])
        return await self._call("save_checkpoint", request, give_up_at)

    async def read_journal(self, lease: ws.LeaseRef, after_seq: int, page_size: int = 1000, *,
                           compact: bool = False) -> ws.ReadJournalResponse:
        """A page of the run's journal (reads: retried like any call whose answer was lost)."""
        request = ws.ReadJournalRequest(lease=lease, after_seq=after_seq, page_size=page_size, compact=compact)
        return await self._read(self.stub.ReadJournal, request)

    async def tool_results(self, lease: ws.LeaseRef, step_keys: list[str]) -> list[pb.ToolExecution]:
        out: list[pb.ToolExecution] = []
        for start in range(0, len(step_keys), 500):
            request = ws.GetToolResultsRequest(lease=lease, step_keys=step_keys[start:start + 500])
            reply = await self._read(self.stub.GetToolResults, request)
            out.extend(reply.executions)
        return out

    async def spawn_children(self, lease: ws.LeaseRef, spawn_key: str, children: list[dict[str, Any]],
                             join: str, detach: bool) -> ws.SpawnChildrenResponse:
        """Spawns (or finds: idempotent by its arguments) the children of step `spawn_key` and records the
        join; retried like a read when the answer was lost."""
        request = ws.SpawnChildrenRequest(
            lease=lease, spawn_key=spawn_key, detach=detach,
            join=ws.JOIN_MODE_ANY if join == "any" else ws.JOIN_MODE_ALL if join == "all" else ws.JOIN_MODE_UNSPECIFIED)
        for child in children:
            budget = child.get("budget") or {}
            request.children.add(
                agent_name=child["agent"], agent_version=child.get("version", ""),
                input_json=canonical_json(child.get("input") or {}), labels=child.get("labels") or {},
                budget=pb.Budget(max_steps=budget.get("max_steps", 0), max_tokens=budget.get("max_tokens", 0),
                                 max_cost_usd=budget.get("max_cost_usd", 0.0)))
        return await self._read(self.stub.SpawnChildren, request)  # type: ignore[no-any-return]

    async def register_agents(self, worker_id: str, agents: list[ws.AgentRegistration],
                              ttl_ms: int) -> ws.RegisterAgentsResponse | None:
        """The agents this executor serves (all of them; an empty list withdraws them). Idempotent.

        None: the scheduler predates the agent registry (UNIMPLEMENTED)."""
        request = ws.RegisterAgentsRequest(worker_id=worker_id, agents=agents, ttl_ms=ttl_ms)
        try:
            return await self.stub.RegisterAgents(request, timeout=self.rpc_timeout_s,
                                                  metadata=inject_metadata(self._auth))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise from_rpc_error(exc) from None

    async def _read(self, method: Any, request: Any) -> Any:
        delay = 0.05
        for attempt in range(5):
            try:
                return await method(request, timeout=self.rpc_timeout_s, metadata=inject_metadata(self._auth))
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _UNKNOWN_OUTCOME or attempt == 4:
                    raise from_rpc_error(exc) from None
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    async def begin_tool_call(self, lease: ws.LeaseRef, expected_version: int, step_key: str, tool_name: str,
                              idempotency_key: str, request_body: dict[str, Any], give_up_at: float | None,
                              ) -> ws.BeginToolCallResponse:
        request = ws.BeginToolCallRequest(
            lease=lease, expected_version=expected_version, step_key=step_key, tool_name=tool_name,
            idempotency_key=idempotency_key, request_json=canonical_json(request_body),
            execution_id=new_event_id(), event_id=new_event_id())
        return await self._call("begin_tool_call", request, give_up_at)

    async def complete_tool_call(self, request: ws.CompleteToolCallRequest, give_up_at: float | None,
                                 ) -> ws.CompleteToolCallResponse:
        if not request.event_id:
            request.event_id = new_event_id()
        if request.HasField("end") and not request.end.event_id:
            request.end.event_id = new_event_id()
        return await self._call("complete_tool_call", request, give_up_at)

    async def complete_and_begin_tool_call(self, request: ws.CompleteAndBeginToolCallRequest,
                                           give_up_at: float | None) -> ws.CompleteAndBeginToolCallResponse:
        """Tx2 of one step and Tx1 of the next in one call; ids are made once, so a retry replays."""
        if not request.event_id:
            request.event_id = new_event_id()
        if not request.next.event_id:
            request.next.event_id = new_event_id()
        if not request.next.execution_id:
            request.next.execution_id = new_event_id()
        return await self._call("complete_and_begin_tool_call", request, give_up_at)

    async def mark_tool_in_doubt(self, lease: ws.LeaseRef, step_key: str, error_code: str, detail: str,
                                 give_up_at: float | None) -> ws.MarkToolInDoubtResponse:
        # The detail may quote a tool's exception; a NUL in it would make the freeze itself refused.
        request = ws.MarkToolInDoubtRequest(lease=lease, step_key=step_key, error_code=error_code,
                                            detail=detail.replace("\x00", "\\0")[:4000], event_id=new_event_id())
        return await self._call("mark_tool_in_doubt", request, give_up_at)

    async def finish_run(self, request: ws.FinishRunRequest, give_up_at: float | None) -> ws.FinishRunResponse:
        if not request.event_id:
            request.event_id = new_event_id()
        return await self._call("finish_run", request, give_up_at)


__all__ = ["AgentrtError", "WorkClient", "new_event_id"]
