"""WorkService: what executors call (claim, heartbeat, the fenced writes, WriteBatch, journal and
tool-result reads). Handlers validate, call the Store, and convert (scheduler/api/rpc.py has the
shared wrapper).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc
import jsonschema
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from scheduler.admission import admit, check_key_template
from scheduler.api import convert
from scheduler.api import validate as v
from scheduler.api.auth import WorkAuth
from scheduler.api.metrics import SchedulerMetrics
from scheduler.api.rpc import (
    DEFAULT_JOURNAL_PAGE_SIZE,
    DEFINITE_OUTCOME,
    FINISH_OUTCOME,
    MAX_SLEEP_MS,
    MAX_TOOL_RESULT_STEPS,
    TOOL_OUTCOME,
    batch_error,
    event_id_of,
    expected_version_of,
    lease_of,
    log,
    rpc,
)
from scheduler.api.shield import Shield
from scheduler.background.notifier import WorkNotifier
from scheduler.config import SchedulerSettings
from scheduler.security.sealing import check_sensitivity
from scheduler.states import TERMINAL, RunStatus
from scheduler.store import (
    NO_JOURNAL,
    AgentSpec,
    BeginCall,
    CheckpointWrite,
    ChildSpec,
    CompleteAndBegin,
    CompleteCall,
    InDoubt,
    Journal,
    NotExecuted,
    RunEnd,
    RunFinish,
    Store,
    ToolIntent,
)
from shared.canonical import canonical_json
from shared.errors import AgentNotRegistered, AgentrtError, InvalidArgument, status_code_for
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.gen.agentrt.v1 import work_service_pb2_grpc as ws_grpc
from shared.sensitive import declared_marks
from shared.tracing import annotate, continued, current_trace, extract_context
from shared.writes import MAX_BATCH_ITEMS, MAX_JOURNAL_ENTRIES, WRITE_OPS


class WorkServicer(ws_grpc.WorkServiceServicer):
    def __init__(self, store: Store, settings: SchedulerSettings, notifier: WorkNotifier, *,
                 tracer: Any = None, observe: Callable[[str, str, float], None] | None = None,
                 recording: bool = True, metrics: SchedulerMetrics | None = None) -> None:
        self.store = store
        self.settings = settings
        self.notifier = notifier
        self.limit = settings.max_payload_bytes
        self.limits = settings.limits
        self._tracer = tracer or trace.get_tracer("agentrt.grpc.server")
        self._observe = observe
        self._recording = recording  # False: no spans of our own, only the caller's context carried on
        self._metrics = metrics
        self.shield = Shield(store)
        # Called by the rpc wrapper (scheduler/api/rpc.py) and by WriteBatch items with each typed refusal.
        self.refused: Callable[[str, str], None] | None = metrics.refused if metrics is not None else None
        token = settings.work_token.get_secret_value() if settings.work_token else None
        self.guard = WorkAuth(token, settings.work_client_identities).admit

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
                self._observed(method, code, started)
        else:
            with self._tracer.start_as_current_span(
                f"/agentrt.v1.WorkService/{method}", context=extract_context(carrier) if carrier else None,
                kind=SpanKind.SERVER, record_exception=False, set_status_on_exception=False,
                attributes={"rpc.system": "grpc", "rpc.service": "agentrt.v1.WorkService", "rpc.method": method,
                            "agentrt.batch_index": index},
            ) as span:
                result, code = await self._write(method, op, getattr(item, op))
                span.set_attribute("rpc.grpc.status_code", code.value[0])
                if code is not grpc.StatusCode.OK:
                    span.set_status(Status(StatusCode.ERROR, code.name))
                self._observed(method, code, started)  # inside the item's span: its trace is the exemplar
        return result

    def _observed(self, method: str, code: grpc.StatusCode, started: float) -> None:
        if self._observe is not None:
            self._observe(method, code.name, time.perf_counter() - started)

    async def _write(self, method: str, field: str, request: Any) -> tuple[ws.WriteBatchResult, grpc.StatusCode]:
        """The single call's body; its typed error becomes this item's answer."""
        try:
            reply = await getattr(WorkServicer, method).core(self, request, None)
            return ws.WriteBatchResult(**{field: reply}), grpc.StatusCode.OK
        except AgentrtError as error:
            annotate(error_reason=error.reason)
            if self.refused is not None:
                self.refused(method, error.reason)
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
        wait_s = min(request.wait_ms, self.settings.max_claim_wait_ms) / 1000
        remaining = context.time_remaining()
        if remaining is not None:  # answer (empty) before the caller's deadline
            wait_s = min(wait_s, max(remaining - 0.25, 0.0))
        deadline = time.monotonic() + wait_s
        poll_s = self.settings.claim_poll_interval_ms / 1000
        annotate(worker_id=worker)
        while True:
            epoch = self.notifier.epoch()
            claimed = await self.store.work.claim(worker, agents, current_trace())
            if claimed is not None:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                return ws.ClaimWorkResponse()
            await self.notifier.wait(epoch, min(poll_s, left))
        run = claimed.run
        if self._metrics is not None and claimed.claim_wait_s is not None:
            self._metrics.claimed(run.tenant_id, claimed.claim_wait_s)
        annotate(run_id=str(run.id), tenant_id=run.tenant_id, fencing_token=run.fencing_token,
                 run_version=run.version, agent=run.agent_name)
        limits = self.limits
        lease = ws.Lease(run=convert.run_to_proto(run), lease_duration_ms=claimed.lease_duration_ms,
                         heartbeat_interval_ms=self.settings.heartbeat_interval_ms,
                         limits=ws.PayloadLimits(
                             max_tool_request_bytes=limits.tool_request, max_tool_response_bytes=limits.tool_response,
                             max_checkpoint_bytes=limits.checkpoint, max_journal_entry_bytes=limits.journal_entry,
                             max_payload_bytes=limits.payload),
                         journal_length=run.journal_length, last_signal_seq=claimed.signals_seen,
                         signals=[convert.signal_to_proto(signal) for signal in claimed.signals])
        convert.set_time(lease, "lease_expires_at", run.lease_expires_at)
        if claimed.checkpoint is not None:
            lease.checkpoint.CopyFrom(convert.checkpoint_to_proto(claimed.checkpoint))
        if claimed.step_execution is not None:
            execution = convert.execution_to_proto(claimed.step_execution)
            lease.current_step_execution.CopyFrom(execution)
            if run.status is RunStatus.WAITING_TOOL and claimed.step_execution.status == "OUTBOUND_INTENT":
                lease.pending_tool.CopyFrom(execution)
        if not claimed.has_data_key:
            self.store.keys.known_keyless(run.id)  # nothing sealed to open: no key lookup for this run
        await self.shield.opened(run.id, lease)  # tools get the plain values
        return ws.ClaimWorkResponse(lease=lease)

    @rpc
    async def RegisterAgents(self, request: ws.RegisterAgentsRequest,
                             context: grpc.aio.ServicerContext) -> ws.RegisterAgentsResponse:
        worker = v.require_text("worker_id", request.worker_id)
        if len(request.agents) > 1000:
            raise InvalidArgument("agents", "at most 1000 agent versions per executor")
        specs: dict[tuple[str, str], AgentSpec] = {}
        for index, item in enumerate(request.agents):
            spec = _agent_spec(f"agents[{index}]", item, self.limit)
            if (spec.name, spec.version) in specs:
                raise InvalidArgument(f"agents[{index}]", f"{spec.name} {spec.version} is listed twice")
            specs[(spec.name, spec.version)] = spec
        annotate(worker_id=worker)
        expires = await self.store.registry.register_agents(worker, agents=list(specs.values()), ttl_ms=request.ttl_ms)
        response = ws.RegisterAgentsResponse()
        convert.set_time(response, "expires_at", expires)
        return response

    @rpc
    async def Heartbeat(self, request: ws.HeartbeatRequest, context: grpc.aio.ServicerContext) -> ws.HeartbeatResponse:
        lease = lease_of(request)
        expires = await self.store.work.heartbeat(lease)
        response = ws.HeartbeatResponse()
        convert.set_time(response, "lease_expires_at", expires)
        return response

    @rpc
    async def SaveCheckpoint(self, request: ws.SaveCheckpointRequest,
                             context: grpc.aio.ServicerContext) -> ws.SaveCheckpointResponse:
        lease = lease_of(request)
        expected = expected_version_of(request.expected_version)
        state, state_text = self._state(request.state_json)
        schema_version = v.require_positive("schema_version", request.schema_version)
        step_key = v.require_step_key("step_key", request.step_key) if request.step_key else None
        event_id = event_id_of(request.event_id)
        event_type = v.require_name("event_type", request.event_type) if request.event_type else "agent.checkpoint"
        payload = v.parse_json("event_payload_json", request.event_payload_json, self.limit, default={})
        journal = self._journal(request.journal)
        consumed = tuple(request.consume_signal_seqs)
        if len(consumed) > 100 or len(set(consumed)) != len(consumed) or any(seq <= 0 for seq in consumed):
            raise InvalidArgument("consume_signal_seqs", "at most 100 distinct positive signal seqs")
        version, replayed = await self.store.work.save_checkpoint(lease, CheckpointWrite(
            expected_version=expected, state=state, schema_version=schema_version, step_key=step_key,
            event_id=event_id, event_type=event_type, event_payload=payload, state_text=state_text, journal=journal,
            consume_signal_seqs=consumed), current_trace())
        annotate(run_version=version, replayed=replayed)
        return ws.SaveCheckpointResponse(version=version, replayed=replayed)

    @rpc
    async def BeginToolCall(self, request: ws.BeginToolCallRequest,
                            context: grpc.aio.ServicerContext) -> ws.BeginToolCallResponse:
        lease = lease_of(request)
        expected = expected_version_of(request.expected_version)
        step_key = v.require_step_key("step_key", request.step_key)
        tool = v.require_name("tool_name", request.tool_name)
        key = v.require_text("idempotency_key", request.idempotency_key, max_len=400)
        payload = self._tool_request("request_json", request.request_json)
        execution_id = v.require_uuid("execution_id", request.execution_id)
        event_id = event_id_of(request.event_id)
        annotate(step_key=step_key, tool=tool)
        row, existing, replayed = await self.store.tools.begin_tool_call(lease, BeginCall(
            expected_version=expected, intent=ToolIntent(step_key=step_key, tool_name=tool, idempotency_key=key,
                                                         request=payload, execution_id=execution_id,
                                                         event_id=event_id)), current_trace())
        execution = await self.shield.opened(lease.run_id, convert.execution_to_proto(row))
        return ws.BeginToolCallResponse(execution=execution, existing=existing, replayed=replayed)

    @rpc
    async def CompleteToolCall(self, request: ws.CompleteToolCallRequest,
                               context: grpc.aio.ServicerContext) -> ws.CompleteToolCallResponse:
        lease = lease_of(request)
        expected = expected_version_of(request.expected_version)
        step_key = v.require_step_key("step_key", request.step_key)
        outcome = v.require_enum("outcome", request.outcome, TOOL_OUTCOME)
        event_id = event_id_of(request.event_id)
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
            version, status, replayed = await self.store.tools.tool_not_executed(lease, NotExecuted(
                expected_version=expected, step_key=step_key, error_code=error_code, evidence=evidence,
                event_id=event_id), current_trace())
            return ws.CompleteToolCallResponse(version=version, status=convert.RUN_STATUS[status],
                                               replayed=replayed)
        response = self._tool_response(request.response_json)
        state, state_text = self._state(request.state_json)
        schema_version = v.require_positive("schema_version", request.schema_version)
        next_step = v.require_step_key("next_step_key", request.next_step_key) if request.next_step_key else None
        remote_id = v.optional_text("remote_resource_id", request.remote_resource_id, max_len=500)
        end = self._run_end(request.end, event_id) if request.HasField("end") else None
        journal = self._journal(request.journal)
        version, status, replayed = await self.store.work.complete_tool_call(lease, CompleteCall(
            expected_version=expected, step_key=step_key, succeeded=outcome == "SUCCEEDED", response=response,
            remote_resource_id=remote_id, error_code=error_code, state=state, schema_version=schema_version,
            next_step_key=next_step, evidence=evidence, event_id=event_id, state_text=state_text, end=end,
            journal=journal), current_trace())
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
        """A tool's answer as its canonical text (stored and hashed as is: the value is never needed)."""
        v.require_size("response_json", text, self.limits.tool_response, "max_tool_response_bytes")
        value, canonical = v.parse_json_canonical("response_json", text, self.limits.tool_response,
                                                  object_only=False)
        return canonical if value is not None else None  # JSON null is stored as no answer (SQL NULL), as before

    def _journal(self, entries: Any) -> Journal:
        """The journal entries a checkpoint-writing call appends (none on the schema-1 path: no work)."""
        if not entries:
            return NO_JOURNAL
        return Journal.of(v.require_journal(entries, self.limits.journal_entry, MAX_JOURNAL_ENTRIES))

    def _run_end(self, end: ws.RunEnd, event_id: uuid.UUID) -> RunEnd:
        outcome = v.require_enum("end.outcome", end.outcome, FINISH_OUTCOME)
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
        lease = lease_of(request)
        expected = expected_version_of(request.expected_version)
        step_key = v.require_step_key("step_key", request.step_key)
        outcome = v.require_enum("outcome", request.outcome, DEFINITE_OUTCOME)
        event_id = event_id_of(request.event_id)
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
        version, row, replayed = await self.store.tools.complete_and_begin_tool_call(lease, CompleteAndBegin(
            expected_version=expected, step_key=step_key, succeeded=outcome == "SUCCEEDED", response=response,
            remote_resource_id=remote_id, error_code=error_code, state=state, schema_version=schema_version,
            evidence=evidence, event_id=event_id, intent=intent, state_text=state_text, journal=journal),
            current_trace())
        annotate(run_version=version, replayed=replayed)
        execution = await self.shield.opened(lease.run_id, convert.execution_to_proto(row))
        return ws.CompleteAndBeginToolCallResponse(version=version, status=pb.RUN_STATUS_WAITING_TOOL,
                                                   execution=execution, replayed=replayed)

    @rpc
    async def MarkToolInDoubt(self, request: ws.MarkToolInDoubtRequest,
                              context: grpc.aio.ServicerContext) -> ws.MarkToolInDoubtResponse:
        lease = lease_of(request)
        step_key = v.require_step_key("step_key", request.step_key)
        error_code = v.require_text("error_code", request.error_code)
        detail = v.optional_text("detail", request.detail, max_len=4000) or ""
        event_id = event_id_of(request.event_id)
        annotate(step_key=step_key)
        replayed = await self.store.tools.mark_tool_in_doubt(
            lease, InDoubt(step_key=step_key, error_code=error_code, detail=detail, event_id=event_id),
            current_trace())
        if not replayed and self._metrics is not None:
            self._metrics.in_doubt_marks.inc()
        return ws.MarkToolInDoubtResponse(status=pb.RUN_STATUS_PAUSED_INDOUBT, replayed=replayed)

    @rpc
    async def FinishRun(self, request: ws.FinishRunRequest, context: grpc.aio.ServicerContext) -> ws.FinishRunResponse:
        lease = lease_of(request)
        expected = expected_version_of(request.expected_version)
        outcome = v.require_enum("outcome", request.outcome, FINISH_OUTCOME)
        reason = v.optional_text("reason", request.reason, max_len=4000) or ""
        result = v.parse_json("result_json", request.result_json, self.limit, object_only=False)
        if outcome == "SLEEP" and not 0 < request.sleep_ms <= MAX_SLEEP_MS:
            raise InvalidArgument("sleep_ms", f"must be between 1 and {MAX_SLEEP_MS} for SLEEP")
        if outcome != "SLEEP" and request.sleep_ms:
            raise InvalidArgument("sleep_ms", "is only allowed with SLEEP")
        error_class = v.optional_text("error_class", request.error_class, max_len=100) or ""
        wait_signal = v.require_name("wait_signal", request.wait_signal) if request.wait_signal else None
        if wait_signal is not None and outcome != "SLEEP":
            raise InvalidArgument("wait_signal", "is only allowed with SLEEP (sleep_ms is the wait's timeout)")
        if request.signals_seen < 0 or (request.signals_seen and wait_signal is None):
            raise InvalidArgument("signals_seen", "must not be negative, and is only allowed with wait_signal")
        if request.wait_children and (outcome != "SLEEP" or wait_signal is not None):
            raise InvalidArgument("wait_children", "is only allowed with SLEEP and without wait_signal")
        event_id = event_id_of(request.event_id)
        status, next_at, replayed = await self.store.work.finish_run(lease, RunFinish(
            expected_version=expected, outcome=outcome, reason=reason, result=result, sleep_ms=request.sleep_ms,
            pause_when_exhausted=request.pause_when_exhausted, error_class=error_class, event_id=event_id,
            wait_signal=wait_signal, signals_seen=request.signals_seen, wait_children=request.wait_children),
            current_trace())
        response = ws.FinishRunResponse(status=convert.RUN_STATUS[status], replayed=replayed)
        if next_at is not None:
            convert.set_time(response, "next_attempt_at", next_at)
        return response

    @rpc
    async def ReadJournal(self, request: ws.ReadJournalRequest,
                          context: grpc.aio.ServicerContext) -> ws.ReadJournalResponse:
        lease = lease_of(request)
        if request.compact:
            text, more = await self.store.work.read_journal_compact(
                lease, after_seq=request.after_seq, page_size=request.page_size or DEFAULT_JOURNAL_PAGE_SIZE,
                page_bytes=4 * self.limit)
            # Opened like the entries below: the holder replays plain values.
            return await self.shield.opened(lease.run_id, ws.ReadJournalResponse(entries_json=text, more=more))
        rows, more = await self.store.work.read_journal(lease, after_seq=request.after_seq,
                                                        page_size=request.page_size or DEFAULT_JOURNAL_PAGE_SIZE,
                                                        page_bytes=4 * self.limit)
        answer = ws.ReadJournalResponse(entries=[convert.journal_to_proto(row, with_time=False) for row in rows],
                                        more=more)
        return await self.shield.opened(lease.run_id, answer)

    @rpc
    async def SpawnChildren(self, request: ws.SpawnChildrenRequest,
                            context: grpc.aio.ServicerContext) -> ws.SpawnChildrenResponse:
        lease = lease_of(request)
        spawn_key = v.require_step_key("spawn_key", request.spawn_key)
        join = _JOIN_MODES.get(request.join)
        if join is None:
            raise InvalidArgument("join", "must be JOIN_MODE_ALL or JOIN_MODE_ANY")
        if not 1 <= len(request.children) <= MAX_CHILDREN:
            raise InvalidArgument("children", f"spawn 1 to {MAX_CHILDREN} children")
        specs = [await self._child_spec(f"children[{i}]", child, lease.run_id)
                 for i, child in enumerate(request.children)]
        spawned = await self.store.children.spawn_children(
            lease, spawn_key=spawn_key, children=specs, join_mode=join, detach=request.detach,
            max_attempts=self.settings.default_max_attempts, trace=current_trace())
        if spawned.created and self.notifier is not None:
            self.notifier.poke()
        response = ws.SpawnChildrenResponse(created=spawned.created, join_met=spawned.join_met)
        for row in spawned.children:
            response.children.add(
                index=row.spawn_index, run_id=str(row.id), agent_name=row.agent_name,
                status=convert.RUN_STATUS[row.status],
                result_json=convert.json_text(row.result) if row.status is RunStatus.COMPLETED else "",
                error=(row.terminal_reason or "") if row.status in TERMINAL - {RunStatus.COMPLETED} else "",
                cost_usd=row.cost_usd)
        return response

    async def _child_spec(self, field: str, child: ws.ChildSpec, parent: uuid.UUID) -> ChildSpec:
        """One child as SubmitRun would take it: its agent served (unless the scheduler queues
        unregistered agents) and its input fitting that agent's schema."""
        agent = v.require_name(f"{field}.agent_name", child.agent_name)
        version = v.optional_text(f"{field}.agent_version", child.agent_version, max_len=100) or ""
        payload = v.parse_json(f"{field}.input_json", child.input_json, self.limit, default={})
        labels = dict(child.labels)
        if len(labels) > 64 or any(len(k) > 100 or len(val) > 500 or "\x00" in k + val for k, val in labels.items()):
            raise InvalidArgument(f"{field}.labels", "at most 64 labels, keys up to 100 and values up to 500 "
                                                     "characters, no NUL")
        budget = child.budget  # its numbers' ranges: scheduler/bounds.py
        if budget.HasField("deadline"):
            raise InvalidArgument(f"{field}.budget.deadline", "is not taken for a child run")
        versions = await self.store.registry.live_agent_versions(agent)
        try:
            served = admit(versions, agent, version, payload,
                           allow_unregistered=not self.settings.require_registered_agents)
        except AgentNotRegistered as exc:
            raise InvalidArgument(f"{field}.agent_name", exc.message) from None
        except InvalidArgument as exc:
            raise InvalidArgument(f"{field}.input_json", exc.message) from None
        return ChildSpec(agent_name=agent, agent_version=version, input=payload, labels=labels,
                         max_steps=budget.max_steps, max_tokens=budget.max_tokens, max_cost_usd=budget.max_cost_usd,
                         sensitive=served.sensitive if served is not None else None,
                         carried=await self.shield.carried(parent, payload))

    @rpc
    async def GetToolResults(self, request: ws.GetToolResultsRequest,
                             context: grpc.aio.ServicerContext) -> ws.GetToolResultsResponse:
        lease = lease_of(request)
        if not 1 <= len(request.step_keys) <= MAX_TOOL_RESULT_STEPS:
            raise InvalidArgument("step_keys", f"name 1 to {MAX_TOOL_RESULT_STEPS} step keys")
        step_keys = sorted({v.require_step_key("step_keys", key) for key in request.step_keys})
        rows = await self.store.work.tool_results(lease, step_keys, answer_bytes=4 * self.limit)
        answer = ws.GetToolResultsResponse(executions=[convert.execution_to_proto(row) for row in rows])
        return await self.shield.opened(lease.run_id, answer)


MAX_CHILDREN = 100  # SpawnChildren
MAX_SIGNALS = 100  # declared per agent version (RegisterAgents)
_JOIN_MODES = {ws.JOIN_MODE_ALL: "ALL", ws.JOIN_MODE_ANY: "ANY"}


def _agent_spec(field: str, item: ws.AgentRegistration, limit: int) -> AgentSpec:
    name = v.require_name(f"{field}.name", item.name)
    version = v.require_text(f"{field}.version", item.version, max_len=100)
    schema = v.parse_json(f"{field}.input_schema_json", item.input_schema_json, limit) if item.input_schema_json \
        else None
    if schema is not None:
        if not isinstance(schema, dict):
            raise InvalidArgument(f"{field}.input_schema_json", "must be a JSON Schema object")
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise InvalidArgument(f"{field}.input_schema_json", f"is not a valid JSON Schema: {exc.message}") \
                from None
    if len(item.tool_names) > 1000:
        raise InvalidArgument(f"{field}.tool_names", "at most 1000 tools")
    tools = tuple(v.require_name(f"{field}.tool_names", t) for t in item.tool_names)
    priority = v.optional_priority(f"{field}.default_priority", item.default_priority)
    key = item.concurrency_key or None
    if key is not None:
        v.require_text(f"{field}.concurrency_key", key, max_len=500)
        check_key_template(f"{field}.concurrency_key", key)
        if item.concurrency_max < 1:
            raise InvalidArgument(f"{field}.concurrency_max", "must be at least 1 with a concurrency_key")
    elif item.concurrency_max:
        raise InvalidArgument(f"{field}.concurrency_max", "needs a concurrency_key")
    sensitive = v.parse_json(f"{field}.sensitive_json", item.sensitive_json, limit) if item.sensitive_json \
        else None
    if sensitive is not None and (problem := check_sensitivity(sensitive)) is not None:
        raise InvalidArgument(f"{field}.sensitive_json", problem)
    declared = _signal_schemas(field, item, limit)
    if declared is not None:
        # The marks of the declared schemas, as the executor marks its input's (a run's data key covers
        # them), and the schemas themselves, which SignalRun checks (scheduler/admission.py).
        sensitive = {k: val for k, val in {**(sensitive or {}), **declared_marks(declared)}.items() if val}
        sensitive["declared"] = declared
    return AgentSpec(name=name, version=version, input_schema=schema, tool_names=tools, default_priority=priority,
                     concurrency_key=key, concurrency_max=item.concurrency_max if key else None,
                     sensitive=sensitive or None)


def _json_schema(field: str, text: str, limit: int) -> dict[str, Any]:
    schema = v.parse_json(field, text, limit, required=True)
    if not isinstance(schema, dict):
        raise InvalidArgument(field, "must be a JSON Schema object")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidArgument(field, f"is not a valid JSON Schema: {exc.message}") from None
    return schema


def _signal_schemas(field: str, item: ws.AgentRegistration, limit: int) -> dict[str, Any] | None:
    """{"signals": {name: schema}, "resume": schema} of a registration (None: it declares neither)."""
    declared: dict[str, Any] = {}
    if item.signals_json:
        signals = v.parse_json(f"{field}.signals_json", item.signals_json, limit)
        if not isinstance(signals, dict) or len(signals) > MAX_SIGNALS:
            raise InvalidArgument(f"{field}.signals_json", f"must map at most {MAX_SIGNALS} signal names to JSON "
                                                           "Schemas of their payloads")
        for name, schema in signals.items():
            v.require_name(f"{field}.signals_json", name)
            if not isinstance(schema, dict):
                raise InvalidArgument(f"{field}.signals_json", f"{name}: must be a JSON Schema object")
            _json_schema(f"{field}.signals_json", canonical_json(schema), limit)
        declared["signals"] = signals
    if item.resume_input_schema_json:
        declared["resume"] = _json_schema(f"{field}.resume_input_schema_json", item.resume_input_schema_json, limit)
    return declared or None
