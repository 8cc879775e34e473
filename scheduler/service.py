"""RPC handlers for RunService (public, tenant-scoped) and WorkService (executors).

Handlers validate, call the Store, and convert; they hold no SQL. Every typed
error becomes a gRPC status through shared.errors' one table; anything else is
logged here and answered INTERNAL without a stack trace.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import functools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from scheduler import convert
from scheduler import validate as v
from scheduler.config import SchedulerSettings
from scheduler.notifier import WorkNotifier
from scheduler.store import (
    HISTORY_PARTS,
    NO_JOURNAL,
    HistoryCursor,
    Journal,
    LeaseRef,
    ResolveOutcome,
    RunEnd,
    Store,
    SubmitSpec,
    ToolIntent,
)
from scheduler.wire import MalformedRequest
from shared.canonical import uuid7
from shared.errors import AgentrtError, InvalidArgument, status_code_for, to_grpc_status
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.gen.agentrt.v1 import work_service_pb2_grpc as ws_grpc
from shared.tracing import annotate, continued, current_trace, extract_context
from shared.writes import MAX_BATCH_ITEMS, MAX_JOURNAL_ENTRIES, WRITE_OPS

log = logging.getLogger(__name__)
R = TypeVar("R")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]

_STATUS_FILTER = {number: name for name, number in convert.RUN_STATUS.items()}
_RESUME = {rs.RESUME_DECISION_APPROVE: "APPROVE", rs.RESUME_DECISION_REJECT: "REJECT",
           rs.RESUME_DECISION_INPUT: "INPUT"}
_RESOLVE = {rs.RESOLUTION_OUTCOME_SUCCEEDED: "SUCCEEDED", rs.RESOLUTION_OUTCOME_NOT_EXECUTED: "NOT_EXECUTED",
            rs.RESOLUTION_OUTCOME_UNKNOWN: "UNKNOWN"}
_TOOL_OUTCOME = {ws.TOOL_OUTCOME_SUCCEEDED: "SUCCEEDED", ws.TOOL_OUTCOME_FAILED: "FAILED",
                 ws.TOOL_OUTCOME_NOT_EXECUTED: "NOT_EXECUTED"}
_HISTORY_PART = {rs.HISTORY_PART_CHECKPOINTS: "checkpoints", rs.HISTORY_PART_TOOL_EXECUTIONS: "tool_executions",
                 rs.HISTORY_PART_EVENTS: "events", rs.HISTORY_PART_JOURNAL: "journal"}
_DEFINITE_OUTCOME = {ws.TOOL_OUTCOME_SUCCEEDED: "SUCCEEDED", ws.TOOL_OUTCOME_FAILED: "FAILED"}
_FINISH = {ws.FINISH_OUTCOME_COMPLETED: "COMPLETED", ws.FINISH_OUTCOME_FAILED: "FAILED",
           ws.FINISH_OUTCOME_PAUSED_HUMAN: "PAUSED_HUMAN", ws.FINISH_OUTCOME_RETRY: "RETRY",
           ws.FINISH_OUTCOME_SLEEP: "SLEEP"}
MAX_PAGE_SIZE = 500
MAX_JOURNAL_PAGE_SIZE = 5000  # ReadJournal
DEFAULT_JOURNAL_PAGE_SIZE = 1000
MAX_TOOL_RESULT_STEPS = 500  # GetToolResults
MAX_SLEEP_MS = 366 * 24 * 3600 * 1000


def rpc(handler: Handler[R]) -> Handler[R]:
    """Maps typed errors to statuses; nothing else (and no stack trace) reaches the client.

    Bytes that did not decode as the request message arrive as a MalformedRequest (wire.py)
    and are answered INVALID_ARGUMENT before the handler runs.
    """

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            if isinstance(request, MalformedRequest):
                raise request.error()
            return await handler(self, request, context)
        except AgentrtError as error:
            annotate(error_reason=error.reason)
            await context.abort_with_status(to_grpc_status(error))
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception:
            log.exception("unhandled error in %s", handler.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error (logged by the scheduler)")
        raise AssertionError("unreachable")

    wrapper.core = handler  # type: ignore[attr-defined]  # the body without the status mapping (WriteBatch)
    return wrapper


def _lease(request: Any) -> LeaseRef:
    run_id, worker, fence = v.require_lease(request.lease)
    annotate(run_id=str(run_id), fencing_token=fence, worker_id=worker)
    return LeaseRef(run_id, worker, fence)


def _event_id(value: str) -> uuid.UUID:
    return v.require_uuid("event_id", value)


def _expected_version(value: int) -> int:
    if value < 0:
        raise InvalidArgument("expected_version", "must not be negative")
    return value


class RunServicer(rs_grpc.RunServiceServicer):
    def __init__(self, store: Store, settings: SchedulerSettings, notifier: WorkNotifier | None = None) -> None:
        self.store = store
        self.notifier = notifier
        self.settings = settings
        self.limit = settings.max_payload_bytes

    def _tenant(self, context: grpc.aio.ServicerContext) -> str:
        tenant = v.tenant_from_metadata(context.invocation_metadata())
        annotate(tenant_id=tenant)
        return tenant

    @rpc
    async def SubmitRun(self, request: rs.SubmitRunRequest, context: grpc.aio.ServicerContext) -> rs.SubmitRunResponse:
        tenant = self._tenant(context)
        agent = v.require_name("agent_name", request.agent_name)
        version = v.optional_text("agent_version", request.agent_version, max_len=100) or ""
        payload = v.parse_json("input_json", request.input_json, self.limit, default={})
        client_request_id = v.optional_text("client_request_id", request.client_request_id, max_len=200)
        if request.max_attempts < 0 or request.max_attempts > 1000:
            raise InvalidArgument("max_attempts", "must be between 0 (server default) and 1000")
        budget = request.budget
        if budget.max_steps < 0:
            raise InvalidArgument("budget.max_steps", "must not be negative")
        if budget.max_tokens < 0:
            raise InvalidArgument("budget.max_tokens", "must not be negative")
        v.require_non_negative("budget.max_cost_usd", budget.max_cost_usd)
        try:
            deadline = budget.deadline.ToDatetime(tzinfo=dt.UTC) if budget.HasField("deadline") else None
        except ValueError:  # seconds past year 9999 or nanos out of range
            raise InvalidArgument("budget.deadline", "is not a valid timestamp") from None
        labels = dict(request.labels)
        if len(labels) > 64 or any(len(k) > 100 or len(val) > 500 for k, val in labels.items()):
            raise InvalidArgument("labels", "at most 64 labels, keys up to 100 and values up to 500 characters")
        if any("\x00" in k or "\x00" in val for k, val in labels.items()):
            raise InvalidArgument("labels", "must not contain NUL characters")
        spec = SubmitSpec(
            agent_name=agent, agent_version=version, input=payload, client_request_id=client_request_id,
            max_attempts=request.max_attempts or self.settings.default_max_attempts, labels=labels,
            max_steps=budget.max_steps, max_tokens=budget.max_tokens, max_cost_usd=budget.max_cost_usd,
            deadline_at=deadline,
        )
        row, created = await self.store.submit_run(tenant, spec, current_trace())
        if created and self.notifier is not None:
            self.notifier.poke()
        annotate(run_id=str(row["id"]), run_version=row["version"], fencing_token=row["fencing_token"])
        return rs.SubmitRunResponse(run=convert.run_to_proto(row), created=created)

    @rpc
    async def GetRun(self, request: rs.GetRunRequest, context: grpc.aio.ServicerContext) -> pb.Run:
        tenant = self._tenant(context)
        run_id = v.require_uuid("run_id", request.run_id)
        annotate(run_id=str(run_id))
        row = await self.store.get_run(tenant, run_id)
        annotate(fencing_token=row["fencing_token"], run_version=row["version"])
        return convert.run_to_proto(row)

    @rpc
    async def ListRuns(self, request: rs.ListRunsRequest, context: grpc.aio.ServicerContext) -> rs.ListRunsResponse:
        tenant = self._tenant(context)
        statuses = sorted({v.require_enum("statuses", s, _STATUS_FILTER) for s in request.statuses}) or None
        agent = v.require_name("agent_name", request.agent_name) if request.agent_name else None
        if request.page_size < 0 or request.page_size > MAX_PAGE_SIZE:
            raise InvalidArgument("page_size", f"must be between 0 and {MAX_PAGE_SIZE}")
        size = request.page_size or 50
        filter_key = json.dumps([statuses, agent])
        after = _decode_page_token(request.page_token, filter_key) if request.page_token else None
        rows = await self.store.list_runs(tenant, statuses, agent, after, size + 1)
        token = ""
        if len(rows) > size:
            rows = rows[:size]
            token = _encode_page_token(rows[-1]["created_at"], rows[-1]["id"], filter_key)
        return rs.ListRunsResponse(runs=[convert.run_to_proto(r) for r in rows], next_page_token=token)

    @rpc
    async def CancelRun(self, request: rs.CancelRunRequest, context: grpc.aio.ServicerContext) -> pb.Run:
        tenant = self._tenant(context)
        run_id = v.require_uuid("run_id", request.run_id)
        annotate(run_id=str(run_id))
        reason = v.optional_text("reason", request.reason, max_len=1000) or "cancelled by request"
        row = await self.store.cancel_run(tenant, run_id, reason, current_trace())
        return convert.run_to_proto(row)

    @rpc
    async def ResumeRun(self, request: rs.ResumeRunRequest, context: grpc.aio.ServicerContext) -> pb.Run:
        tenant = self._tenant(context)
        run_id = v.require_uuid("run_id", request.run_id)
        annotate(run_id=str(run_id))
        decision = v.require_enum("decision", request.decision, _RESUME)
        operator = v.require_text("operator", request.operator)
        value = v.parse_json("input_json", request.input_json, self.limit, default=None)
        comment = v.optional_text("comment", request.comment, max_len=2000)
        human_input = {"decision": decision, "input": value, "operator": operator, "comment": comment}
        row = await self.store.resume_run(tenant, run_id, human_input, current_trace())
        return convert.run_to_proto(row)

    @rpc
    async def ResolveToolExecution(self, request: rs.ResolveToolExecutionRequest,
                                   context: grpc.aio.ServicerContext) -> rs.ResolveToolExecutionResponse:
        tenant = self._tenant(context)
        run_id = v.require_uuid("run_id", request.run_id)
        annotate(run_id=str(run_id))
        step_key = v.require_step_key("step_key", request.step_key)
        outcome = v.require_enum("outcome", request.outcome, _RESOLVE)
        tool_response = self.settings.limits.tool_response
        v.require_size("result_json", request.result_json, tool_response, "max_tool_response_bytes")
        result = v.parse_json("result_json", request.result_json, tool_response, required=outcome == "SUCCEEDED",
                              object_only=False)
        evidence = v.parse_json("evidence_json", request.evidence_json, self.limit, required=True)
        resolved_by = v.require_text("resolved_by", request.resolved_by)
        rule_version = v.optional_text("rule_version", request.rule_version, max_len=200)
        remote_id = v.optional_text("remote_resource_id", request.remote_resource_id, max_len=500)
        event_id = v.optional_uuid("event_id", request.event_id)
        evidence = {**evidence, "resolved_by": resolved_by, "rule_version": rule_version}
        run, execution = await self.store.resolve_tool_execution(
            tenant, run_id, step_key, cast(ResolveOutcome, outcome), result, remote_id, evidence, resolved_by, event_id,
            current_trace(),
        )
        return rs.ResolveToolExecutionResponse(run=convert.run_to_proto(run),
                                               execution=convert.execution_to_proto(execution))

    @rpc
    async def GetRunHistory(self, request: rs.GetRunHistoryRequest, context: grpc.aio.ServicerContext) -> rs.RunHistory:
        tenant = self._tenant(context)
        run_id = v.require_uuid("run_id", request.run_id)
        annotate(run_id=str(run_id))
        if request.page_size < 0 or request.page_size > MAX_PAGE_SIZE:
            raise InvalidArgument("page_size", f"must be between 0 and {MAX_PAGE_SIZE}")
        parts = frozenset(v.require_enum("include", p, _HISTORY_PART) for p in request.include) or frozenset(
            HISTORY_PARTS)
        cursor = _decode_history_token(request.page_token, run_id, parts) if request.page_token else HistoryCursor()
        history, following = await self.store.history(tenant, run_id, parts, cursor, request.page_size or 100,
                                                      page_bytes=4 * self.limit)
        return rs.RunHistory(
            run=convert.run_to_proto(history.run),
            checkpoints=[convert.checkpoint_to_proto(c) for c in history.checkpoints],
            tool_executions=[convert.execution_to_proto(e) for e in history.executions],
            events=[convert.event_to_proto(e) for e in history.events],
            journal=[convert.journal_to_proto(j) for j in history.journal],
            next_page_token="" if following.exhausted else _encode_history_token(following, run_id, parts),
        )


    @rpc
    async def GetStats(self, request: rs.GetStatsRequest, context: grpc.aio.ServicerContext) -> rs.RunStats:
        tenant = self._tenant(context)
        row = await self.store.tenant_stats(tenant)
        stats = rs.RunStats(
            runs_by_status={name: int(n) for name, n in row["by_status"].items()},
            oldest_queued_age_s=float(row["oldest_queued_s"] or 0), in_doubt_runs=row["in_doubt"],
            oldest_in_doubt_age_s=float(row["oldest_in_doubt_s"] or 0), outbox_pending=row["outbox_pending"],
            outbox_oldest_pending_age_s=float(row["outbox_oldest_s"] or 0),
        )
        convert.set_time(stats, "database_time", row["db_now"])
        return stats


def _encode_page_token(created_at: dt.datetime, run_id: uuid.UUID, filter_key: str) -> str:
    raw = json.dumps({"c": created_at.isoformat(), "i": str(run_id), "f": filter_key})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_page_token(token: str, filter_key: str) -> tuple[dt.datetime, uuid.UUID]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        created_at, run_id = dt.datetime.fromisoformat(data["c"]).astimezone(dt.UTC), uuid.UUID(data["i"])
        same_filter = data["f"] == filter_key
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
        raise InvalidArgument("page_token", "is not a token this server issued") from None
    if not same_filter:
        raise InvalidArgument("page_token", "was issued for a different filter")
    return created_at, run_id


def _encode_history_token(cursor: HistoryCursor, run_id: uuid.UUID, parts: frozenset[str]) -> str:
    ledger = cursor.tool_executions
    raw = json.dumps({"r": str(run_id), "p": sorted(parts), "c": cursor.checkpoints, "e": cursor.events,
                      "j": cursor.journal,
                      "l": [ledger[0].isoformat(), str(ledger[1])] if isinstance(ledger, tuple) else ledger})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_history_token(token: str, run_id: uuid.UUID, parts: frozenset[str]) -> HistoryCursor:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        ledger = data["l"]
        if isinstance(ledger, list):
            ledger = (dt.datetime.fromisoformat(ledger[0]), uuid.UUID(ledger[1]))
        elif ledger not in (None, "start"):
            raise ValueError("ledger cursor")
        cursor = HistoryCursor(checkpoints=data["c"], tool_executions=ledger, events=data["e"],
                               journal=data.get("j"))
        if not all(c is None or (isinstance(c, int) and not isinstance(c, bool) and c >= 0)
                   for c in (cursor.checkpoints, cursor.events, cursor.journal)):
            raise ValueError("cursor")
        same = data["r"] == str(run_id) and data["p"] == sorted(parts)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError):
        raise InvalidArgument("page_token", "is not a token this server issued") from None
    if not same:
        raise InvalidArgument("page_token", "was issued for another run or another include list")
    return cursor


def batch_error(error: AgentrtError) -> ws.WriteBatchError:
    code = status_code_for(error)
    return ws.WriteBatchError(code=code.value[0], message=error.message, reason=error.reason,
                              metadata=error.metadata)


class WorkServicer(ws_grpc.WorkServiceServicer):
    def __init__(self, store: Store, settings: SchedulerSettings, notifier: WorkNotifier, *,
                 tracer: Any = None, observe: Callable[[str, str, float], None] | None = None,
                 recording: bool = True) -> None:
        self.store = store
        self.settings = settings
        self.notifier = notifier
        self.limit = settings.max_payload_bytes
        self.limits = settings.limits
        self._tracer = tracer or trace.get_tracer("agentrt.grpc.server")
        self._observe = observe
        self._recording = recording  # False: no spans of our own, only the caller's context carried on

    @rpc
    async def WriteBatch(self, request: ws.WriteBatchRequest,
                         context: grpc.aio.ServicerContext) -> ws.WriteBatchResponse:
        if not request.items:
            raise InvalidArgument("items", "must hold at least one write")
        if len(request.items) > MAX_BATCH_ITEMS:
            raise InvalidArgument("items", f"at most {MAX_BATCH_ITEMS} writes per batch")
        annotate(batch_items=len(request.items))
        results = await asyncio.gather(*(self._batch_item(i, item) for i, item in enumerate(request.items)))
        return ws.WriteBatchResponse(results=results)

    async def _batch_item(self, index: int, item: ws.WriteBatchItem) -> ws.WriteBatchResult:
        """One item as its own call: its own span (continuing its caller's trace), transaction and answer."""
        op = item.WhichOneof("op")
        if op is None:
            return ws.WriteBatchResult(error=batch_error(InvalidArgument(
                f"items[{index}].op", "name one write (heartbeat, save_checkpoint, begin_tool_call, ...)")))
        method = WRITE_OPS[op]
        carrier = {"traceparent": item.traceparent, "tracestate": item.tracestate} if item.traceparent else None
        started = time.perf_counter()
        if not self._recording:
            with continued(carrier):
                result, code = await self._write(method, op, getattr(item, op))
        else:
            with self._tracer.start_as_current_span(
                f"/agentrt.v1.WorkService/{method}", context=extract_context(carrier) if carrier else None,
                kind=SpanKind.SERVER, record_exception=False, set_status_on_exception=False,
                attributes={"rpc.system": "grpc", "rpc.service": "agentrt.v1.WorkService", "rpc.method": method,
                            "agentrt.batch_index": index},
            ) as span:
                result, code = await self._write(method, op, getattr(item, op))
                if code is not grpc.StatusCode.OK:
                    span.set_attribute("rpc.grpc.status_code", code.value[0])
                    span.set_status(Status(StatusCode.ERROR, code.name))
        if self._observe is not None:
            self._observe(method, code.name, time.perf_counter() - started)
        return result

    async def _write(self, method: str, field: str, request: Any) -> tuple[ws.WriteBatchResult, grpc.StatusCode]:
        """The single call's body; its typed error becomes this item's answer."""
        try:
            reply = await getattr(WorkServicer, method).core(self, request, None)
            return ws.WriteBatchResult(**{field: reply}), grpc.StatusCode.OK
        except AgentrtError as error:
            annotate(error_reason=error.reason)
            return ws.WriteBatchResult(error=batch_error(error)), status_code_for(error)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("unhandled error in WriteBatch item %s", method)
            internal = grpc.StatusCode.INTERNAL
            return ws.WriteBatchResult(error=ws.WriteBatchError(
                code=internal.value[0], message="internal error (logged by the scheduler)")), internal

    @rpc
    async def ClaimWork(self, request: ws.ClaimWorkRequest, context: grpc.aio.ServicerContext) -> ws.ClaimWorkResponse:
        worker = v.require_text("worker_id", request.worker_id)
        if not request.agents:
            raise InvalidArgument("agents", "name at least one agent this executor serves")
        agents = sorted({v.require_name("agents", a) for a in request.agents})
        if request.wait_ms < 0:
            raise InvalidArgument("wait_ms", "must not be negative")
        wait_s = min(request.wait_ms, self.settings.max_claim_wait_ms) / 1000
        remaining = context.time_remaining()
        if remaining is not None:  # answer (empty) before the caller's deadline
            wait_s = min(wait_s, max(remaining - 0.25, 0.0))
        deadline = time.monotonic() + wait_s
        poll_s = self.settings.claim_poll_interval_ms / 1000
        annotate(worker_id=worker)
        while True:
            epoch = self.notifier.epoch()
            claimed = await self.store.claim(worker, agents, current_trace())
            if claimed is not None:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                return ws.ClaimWorkResponse()
            await self.notifier.wait(epoch, min(poll_s, left))
        run = claimed.run
        annotate(run_id=str(run["id"]), tenant_id=run["tenant_id"], fencing_token=run["fencing_token"],
                 run_version=run["version"], agent=run["agent_name"])
        limits = self.limits
        lease = ws.Lease(run=convert.run_to_proto(run), lease_duration_ms=claimed.lease_duration_ms,
                         heartbeat_interval_ms=self.settings.heartbeat_interval_ms,
                         limits=ws.PayloadLimits(
                             max_tool_request_bytes=limits.tool_request, max_tool_response_bytes=limits.tool_response,
                             max_checkpoint_bytes=limits.checkpoint, max_journal_entry_bytes=limits.journal_entry,
                             max_payload_bytes=limits.payload),
                         journal_length=run["journal_length"])
        convert.set_time(lease, "lease_expires_at", run["lease_expires_at"])
        if claimed.checkpoint is not None:
            lease.checkpoint.CopyFrom(convert.checkpoint_to_proto(claimed.checkpoint, run_id=run["id"]))
        if claimed.step_execution is not None:
            execution = convert.execution_to_proto(claimed.step_execution, run_id=run["id"])
            lease.current_step_execution.CopyFrom(execution)
            if run["status"] == "WAITING_TOOL" and claimed.step_execution["status"] == "OUTBOUND_INTENT":
                lease.pending_tool.CopyFrom(execution)
        return ws.ClaimWorkResponse(lease=lease)

    @rpc
    async def Heartbeat(self, request: ws.HeartbeatRequest, context: grpc.aio.ServicerContext) -> ws.HeartbeatResponse:
        lease = _lease(request)
        expires = await self.store.heartbeat(lease)
        response = ws.HeartbeatResponse()
        convert.set_time(response, "lease_expires_at", expires)
        return response

    @rpc
    async def SaveCheckpoint(self, request: ws.SaveCheckpointRequest,
                             context: grpc.aio.ServicerContext) -> ws.SaveCheckpointResponse:
        lease = _lease(request)
        expected = _expected_version(request.expected_version)
        state, state_text = self._state(request.state_json)
        schema_version = v.require_positive("schema_version", request.schema_version)
        step_key = v.require_step_key("step_key", request.step_key) if request.step_key else None
        event_id = _event_id(request.event_id)
        event_type = v.require_name("event_type", request.event_type) if request.event_type else "agent.checkpoint"
        payload = v.parse_json("event_payload_json", request.event_payload_json, self.limit, default={})
        journal = self._journal(request.journal)
        version, replayed = await self.store.save_checkpoint(
            lease, expected, state, schema_version, step_key, event_id, event_type, payload, current_trace(),
            state_text=state_text, journal=journal)
        annotate(run_version=version, replayed=replayed)
        return ws.SaveCheckpointResponse(version=version, replayed=replayed)

    @rpc
    async def BeginToolCall(self, request: ws.BeginToolCallRequest,
                            context: grpc.aio.ServicerContext) -> ws.BeginToolCallResponse:
        lease = _lease(request)
        expected = _expected_version(request.expected_version)
        step_key = v.require_step_key("step_key", request.step_key)
        tool = v.require_name("tool_name", request.tool_name)
        key = v.require_text("idempotency_key", request.idempotency_key, max_len=400)
        payload = self._tool_request("request_json", request.request_json)
        execution_id = v.require_uuid("execution_id", request.execution_id)
        event_id = _event_id(request.event_id)
        annotate(step_key=step_key, tool=tool)
        row, existing, replayed = await self.store.begin_tool_call(
            lease, expected, step_key, tool, key, payload, execution_id, event_id, current_trace())
        return ws.BeginToolCallResponse(execution=convert.execution_to_proto(row), existing=existing,
                                        replayed=replayed)

    @rpc
    async def CompleteToolCall(self, request: ws.CompleteToolCallRequest,
                               context: grpc.aio.ServicerContext) -> ws.CompleteToolCallResponse:
        lease = _lease(request)
        expected = _expected_version(request.expected_version)
        step_key = v.require_step_key("step_key", request.step_key)
        outcome = v.require_enum("outcome", request.outcome, _TOOL_OUTCOME)
        event_id = _event_id(request.event_id)
        error_code = v.optional_text("error_code", request.error_code, max_len=200)
        evidence = v.parse_json("evidence_json", request.evidence_json, self.limit, default=None)
        annotate(step_key=step_key)
        if outcome == "NOT_EXECUTED":
            if request.HasField("end"):
                raise InvalidArgument("end", "is not allowed with NOT_EXECUTED (the run goes back to QUEUED)")
            if evidence is None:
                raise InvalidArgument("evidence_json", "is required for NOT_EXECUTED")
            if request.journal:
                raise InvalidArgument("journal", "is not allowed with NOT_EXECUTED (it writes no checkpoint)")
            version, status, replayed = await self.store.tool_not_executed(
                lease, expected, step_key, error_code, evidence, event_id, current_trace())
            return ws.CompleteToolCallResponse(version=version, status=convert.RUN_STATUS[status],
                                               replayed=replayed)
        response = self._tool_response(request.response_json)
        state, state_text = self._state(request.state_json)
        schema_version = v.require_positive("schema_version", request.schema_version)
        next_step = v.require_step_key("next_step_key", request.next_step_key) if request.next_step_key else None
        remote_id = v.optional_text("remote_resource_id", request.remote_resource_id, max_len=500)
        end = self._run_end(request.end, event_id) if request.HasField("end") else None
        journal = self._journal(request.journal)
        version, status, replayed = await self.store.complete_tool_call(
            lease, expected, step_key, outcome == "SUCCEEDED", response, remote_id, error_code, state,
            schema_version, next_step, evidence, event_id, current_trace(), state_text=state_text, end=end,
            journal=journal)
        annotate(run_version=version, replayed=replayed)
        return ws.CompleteToolCallResponse(version=version, status=convert.RUN_STATUS[status], replayed=replayed)

    def _state(self, text: str) -> tuple[Any, Any]:
        """A checkpoint's state_json (max_checkpoint_bytes): the value and its canonical text."""
        v.require_size("state_json", text, self.limits.checkpoint, "max_checkpoint_bytes")
        return v.parse_json_canonical("state_json", text, self.limits.checkpoint, required=True)

    def _tool_request(self, field: str, text: str) -> Any:
        v.require_size(field, text, self.limits.tool_request, "max_tool_request_bytes")
        return v.parse_json(field, text, self.limits.tool_request, required=True)

    def _tool_response(self, text: str) -> Any:
        v.require_size("response_json", text, self.limits.tool_response, "max_tool_response_bytes")
        return v.parse_json("response_json", text, self.limits.tool_response, object_only=False)

    def _journal(self, entries: Any) -> Journal:
        """The journal entries a checkpoint-writing call appends (none on the schema-1 path: no work)."""
        if not entries:
            return NO_JOURNAL
        return Journal.of(v.require_journal(entries, self.limits.journal_entry, MAX_JOURNAL_ENTRIES))

    def _run_end(self, end: ws.RunEnd, event_id: uuid.UUID) -> RunEnd:
        outcome = v.require_enum("end.outcome", end.outcome, _FINISH)
        if outcome not in ("COMPLETED", "FAILED"):
            raise InvalidArgument("end.outcome", "must be COMPLETED or FAILED (other ends go through FinishRun)")
        end_event = v.require_uuid("end.event_id", end.event_id)
        if end_event == event_id:
            raise InvalidArgument("end.event_id", "must differ from event_id (the end has its own event)")
        return RunEnd(
            outcome=outcome,
            reason=v.optional_text("end.reason", end.reason, max_len=4000) or "",
            result=v.parse_json("end.result_json", end.result_json, self.limit, object_only=False),
            error_class=v.optional_text("end.error_class", end.error_class, max_len=100) or "",
            event_id=end_event,
        )

    @rpc
    async def CompleteAndBeginToolCall(self, request: ws.CompleteAndBeginToolCallRequest,
                                       context: grpc.aio.ServicerContext) -> ws.CompleteAndBeginToolCallResponse:
        lease = _lease(request)
        expected = _expected_version(request.expected_version)
        step_key = v.require_step_key("step_key", request.step_key)
        outcome = v.require_enum("outcome", request.outcome, _DEFINITE_OUTCOME)
        event_id = _event_id(request.event_id)
        error_code = v.optional_text("error_code", request.error_code, max_len=200)
        evidence = v.parse_json("evidence_json", request.evidence_json, self.limit, default=None)
        response = self._tool_response(request.response_json)
        state, state_text = self._state(request.state_json)
        schema_version = v.require_positive("schema_version", request.schema_version)
        remote_id = v.optional_text("remote_resource_id", request.remote_resource_id, max_len=500)
        nxt = request.next
        next_step = v.require_step_key("next.step_key", nxt.step_key)
        if next_step == step_key:
            raise InvalidArgument("next.step_key", "must differ from step_key (the step being completed)")
        intent = ToolIntent(
            step_key=next_step,
            tool_name=v.require_name("next.tool_name", nxt.tool_name),
            idempotency_key=v.require_text("next.idempotency_key", nxt.idempotency_key, max_len=400),
            request=self._tool_request("next.request_json", nxt.request_json),
            execution_id=v.require_uuid("next.execution_id", nxt.execution_id),
            event_id=v.require_uuid("next.event_id", nxt.event_id),
        )
        if intent.event_id == event_id:
            raise InvalidArgument("next.event_id", "must differ from event_id (each half has its own event)")
        journal = self._journal(request.journal)
        annotate(step_key=step_key, tool=intent.tool_name)
        version, row, replayed = await self.store.complete_and_begin_tool_call(
            lease, expected, step_key, outcome == "SUCCEEDED", response, remote_id, error_code, state,
            schema_version, evidence, event_id, intent, current_trace(), state_text=state_text, journal=journal)
        annotate(run_version=version, replayed=replayed)
        return ws.CompleteAndBeginToolCallResponse(version=version, status=pb.RUN_STATUS_WAITING_TOOL,
                                                   execution=convert.execution_to_proto(row), replayed=replayed)

    @rpc
    async def MarkToolInDoubt(self, request: ws.MarkToolInDoubtRequest,
                              context: grpc.aio.ServicerContext) -> ws.MarkToolInDoubtResponse:
        lease = _lease(request)
        step_key = v.require_step_key("step_key", request.step_key)
        error_code = v.require_text("error_code", request.error_code)
        detail = v.optional_text("detail", request.detail, max_len=4000) or ""
        event_id = _event_id(request.event_id)
        annotate(step_key=step_key)
        replayed = await self.store.mark_tool_in_doubt(lease, step_key, error_code, detail, event_id,
                                                       current_trace())
        return ws.MarkToolInDoubtResponse(status=pb.RUN_STATUS_PAUSED_INDOUBT, replayed=replayed)

    @rpc
    async def FinishRun(self, request: ws.FinishRunRequest, context: grpc.aio.ServicerContext) -> ws.FinishRunResponse:
        lease = _lease(request)
        expected = _expected_version(request.expected_version)
        outcome = v.require_enum("outcome", request.outcome, _FINISH)
        reason = v.optional_text("reason", request.reason, max_len=4000) or ""
        result = v.parse_json("result_json", request.result_json, self.limit, object_only=False)
        if outcome == "SLEEP" and not 0 < request.sleep_ms <= MAX_SLEEP_MS:
            raise InvalidArgument("sleep_ms", f"must be between 1 and {MAX_SLEEP_MS} for SLEEP")
        if outcome != "SLEEP" and request.sleep_ms:
            raise InvalidArgument("sleep_ms", "is only allowed with SLEEP")
        error_class = v.optional_text("error_class", request.error_class, max_len=100) or ""
        event_id = _event_id(request.event_id)
        status, next_at, replayed = await self.store.finish_run(
            lease, expected, outcome, reason, result, request.sleep_ms, request.pause_when_exhausted,
            error_class, event_id, current_trace())
        response = ws.FinishRunResponse(status=convert.RUN_STATUS[status], replayed=replayed)
        if next_at is not None:
            convert.set_time(response, "next_attempt_at", next_at)
        return response

    @rpc
    async def ReadJournal(self, request: ws.ReadJournalRequest,
                          context: grpc.aio.ServicerContext) -> ws.ReadJournalResponse:
        lease = _lease(request)
        if request.after_seq < 0:
            raise InvalidArgument("after_seq", "must not be negative")
        if not 0 <= request.page_size <= MAX_JOURNAL_PAGE_SIZE:
            raise InvalidArgument("page_size", f"must be between 0 ({DEFAULT_JOURNAL_PAGE_SIZE}) and "
                                               f"{MAX_JOURNAL_PAGE_SIZE}")
        if request.compact:
            text, more = await self.store.read_journal_compact(
                lease, request.after_seq, request.page_size or DEFAULT_JOURNAL_PAGE_SIZE, page_bytes=4 * self.limit)
            return ws.ReadJournalResponse(entries_json=text, more=more)
        rows, more = await self.store.read_journal(lease, request.after_seq,
                                                   request.page_size or DEFAULT_JOURNAL_PAGE_SIZE,
                                                   page_bytes=4 * self.limit)
        return ws.ReadJournalResponse(entries=[convert.journal_to_proto(row, with_time=False) for row in rows],
                                      more=more)

    @rpc
    async def GetToolResults(self, request: ws.GetToolResultsRequest,
                             context: grpc.aio.ServicerContext) -> ws.GetToolResultsResponse:
        lease = _lease(request)
        if not 1 <= len(request.step_keys) <= MAX_TOOL_RESULT_STEPS:
            raise InvalidArgument("step_keys", f"name 1 to {MAX_TOOL_RESULT_STEPS} step keys")
        step_keys = sorted({v.require_step_key("step_keys", key) for key in request.step_keys})
        rows = await self.store.tool_results(lease, step_keys, answer_bytes=4 * self.limit)
        return ws.GetToolResultsResponse(executions=[convert.execution_to_proto(row) for row in rows])


def new_event_id() -> str:
    return str(uuid7())
