"""RunService: the public, tenant-scoped API (submit, read, list, cancel, retry, resume, resolve,
history, stats; keys and audit in scheduler/api/admin_service.py). Operator actions are audited in their own
transaction, under the authenticated principal. Handlers validate, call the Store, and
convert (scheduler/api/rpc.py has the shared wrapper).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
import json
import uuid
from typing import Any, cast

import grpc

from scheduler.admission import LiveVersion, admit, check_signal, render_key
from scheduler.api import convert
from scheduler.api import validate as v
from scheduler.api.admin_service import AdminRpcs, audit_entry, time_field
from scheduler.api.auth import ANY_TENANT, RunAuth
from scheduler.api.rpc import HISTORY_PART, RESOLVE, RESUME, STATUS_FILTER, principal, rpc
from scheduler.api.schedule_service import ScheduleRpcs
from scheduler.api.shield import M, Shield, redact_message
from scheduler.background.notifier import WorkNotifier
from scheduler.config import SchedulerSettings
from scheduler.flow_limits import limits_of_tenant
from scheduler.store import (
    HISTORY_PARTS,
    HistoryCursor,
    ResolveOutcome,
    RunFilter,
    Store,
    SubmitSpec,
    request_event_id,
)
from scheduler.store.children import TreeCursor
from shared.canonical import canonical_json, uuid7
from shared.errors import AgentNotRegistered, InvalidArgument, PermissionDenied, TenantForbidden
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc
from shared.tracing import annotate, current_trace
from shared.version import agentrt_version


class RunServicer(AdminRpcs, ScheduleRpcs, rs_grpc.RunServiceServicer):
    def __init__(self, store: Store, settings: SchedulerSettings, auth: RunAuth,
                 notifier: WorkNotifier | None = None) -> None:
        self.store = store
        self.notifier = notifier
        self.settings = settings
        self.limit = settings.max_payload_bytes
        self.auth = auth
        self.keys = auth.keys
        self.guard = auth.admit  # scheduler/api/rpc.py: every call is admitted before its handler runs
        self.shield = Shield(store)

    def _tenant(self, context: grpc.aio.ServicerContext) -> str:
        """The call's tenant: the credential's, or the one x-tenant-id names among its tenants."""
        tenant = principal().tenant_of_call(context.invocation_metadata())
        annotate(tenant_id=tenant)
        return tenant

    @rpc
    async def SubmitRun(self, request: rs.SubmitRunRequest, context: grpc.aio.ServicerContext) -> rs.SubmitRunResponse:
        tenant = self._tenant(context)
        agent = v.require_name("agent_name", request.agent_name)
        version = v.optional_text("agent_version", request.agent_version, max_len=100) or ""
        payload = v.parse_json("input_json", request.input_json, self.limit, default={})
        client_request_id = v.optional_text("client_request_id", request.client_request_id, max_len=200)
        budget = request.budget  # the numbers' ranges: scheduler/bounds.py, checked before the handler
        try:
            deadline = budget.deadline.ToDatetime(tzinfo=dt.UTC) if budget.HasField("deadline") else None
        except ValueError:  # seconds past year 9999 or nanos out of range
            raise InvalidArgument("budget.deadline", "is not a valid timestamp") from None
        labels = _labels(request.labels)
        requested_priority = v.optional_priority("priority", request.priority) or 0
        spec = SubmitSpec(
            agent_name=agent, agent_version=version, input=payload, client_request_id=client_request_id,
            max_attempts=request.max_attempts or self.settings.default_max_attempts, labels=labels,
            max_steps=budget.max_steps, max_tokens=budget.max_tokens, max_cost_usd=budget.max_cost_usd,
            deadline_at=deadline, requested_priority=requested_priority,
        )
        served = await self._admit(tenant, spec, payload, request.allow_unregistered)
        default = served.default_priority if served is not None and served.default_priority else None
        key = None
        if served is not None and served.concurrency_key:
            key = render_key(served.concurrency_key, payload)
        spec = dataclasses.replace(
            # Without a client_request_id the submit is not safe to retry; the run still gets one (returned
            # in run.client_request_id) by which a later call or a person can name the request.
            spec, client_request_id=spec.client_request_id or f"generated-{uuid7()}",
            priority=requested_priority or default or self.settings.default_priority,
            concurrency_key=key, concurrency_max=served.concurrency_max if key and served else None,
            labels=self.shield.submit_labels(served.sensitive, payload, spec.labels) if served else spec.labels,
            sealed=self.shield.seal_submit(served.sensitive, payload) if served is not None else None)
        row, created = await self.store.runs.submit_run(tenant, spec, current_trace())
        if created and self.notifier is not None:
            self.notifier.poke()
        annotate(run_id=str(row.id), run_version=row.version, fencing_token=row.fencing_token)
        return redact_message(rs.SubmitRunResponse(run=convert.run_to_proto(row), created=created))

    @rpc
    async def GetRun(self, request: rs.GetRunRequest, context: grpc.aio.ServicerContext) -> pb.Run:
        tenant = self._tenant(context)
        run_id = v.require_uuid("run_id", request.run_id)
        annotate(run_id=str(run_id))
        if request.reveal:
            await self._reveal(context, tenant, run_id, request.note, "GetRun")
        row = await self.store.runs.get_run(tenant, run_id)
        annotate(fencing_token=row.fencing_token, run_version=row.version)
        return await self._shown(run_id, convert.run_to_proto(row), request.reveal)

    @rpc
    async def ListRuns(self, request: rs.ListRunsRequest, context: grpc.aio.ServicerContext) -> rs.ListRunsResponse:
        tenant = self._list_tenant(request, context)
        where = _run_filter(request)
        size = request.page_size or 50
        filter_key = _filter_key(tenant, where)
        after = _decode_page_token(request.page_token, filter_key) if request.page_token else None
        rows = await self.store.runs.list_runs(tenant, where, after=after, limit=size + 1)
        token = ""
        if len(rows) > size:
            rows = rows[:size]
            token = _encode_page_token(rows[-1].created_at, rows[-1].id, filter_key)
        return redact_message(rs.ListRunsResponse(runs=[convert.run_to_proto(r) for r in rows],
                                                  next_page_token=token))

    def _list_tenant(self, request: rs.ListRunsRequest, context: grpc.aio.ServicerContext) -> str:
        """ListRuns' tenant: the call's, or the one tenant_id names for a credential of every tenant ('*')."""
        if not request.tenant_id:
            return self._tenant(context)
        if ANY_TENANT not in principal().tenants:
            raise TenantForbidden("tenant_id: listing another tenant's runs needs a credential for every tenant "
                                  "('*')", tenant=request.tenant_id[:128], principal=principal().id)
        tenant = v.require_tenant("tenant_id", request.tenant_id)
        annotate(tenant_id=tenant)
        return tenant

    @rpc
    async def GetRunTree(self, request: rs.GetRunTreeRequest,
                         context: grpc.aio.ServicerContext) -> rs.GetRunTreeResponse:
        tenant = self._tenant(context)
        run_id = v.require_uuid("run_id", request.run_id)
        annotate(run_id=str(run_id))
        limit = request.max_runs or 1000
        after = _decode_tree_token(request.page_token, run_id) if request.page_token else None
        rows = await self.store.children.run_tree(tenant, run_id, limit=limit + 1, after=after)
        response = rs.GetRunTreeResponse(truncated=len(rows) > limit)
        for row in rows[:limit]:
            response.nodes.add(run=convert.run_to_proto(row), depth=row.depth or 0)
        if response.truncated:  # never a silent cut: the rest of the tree is one token away
            response.next_page_token = _encode_tree_token(TreeCursor.after(rows[limit - 1]), run_id)
        return redact_message(response)

    @rpc
    async def CancelRun(self, request: rs.CancelRunRequest, context: grpc.aio.ServicerContext) -> pb.Run:
        tenant = self._tenant(context)
        run_id = v.require_uuid("run_id", request.run_id)
        annotate(run_id=str(run_id))
        reason = v.optional_text("reason", request.reason, max_len=1000) or request.note.reason \
            or "cancelled by request"
        request_id = v.optional_text("request_id", request.request_id, max_len=200)
        audit = audit_entry(context, request.note, reason=reason, request_id=request_id)
        row = await self.store.runs.cancel_run(tenant, run_id, reason=reason, request_id=request_id,
                                               trace=current_trace(), audit=audit, keep_children=request.keep_children)
        return redact_message(convert.run_to_proto(row))

    @rpc
    async def RetryRun(self, request: rs.RetryRunRequest, context: grpc.aio.ServicerContext) -> rs.RetryRunResponse:
        tenant = self._tenant(context)
        run_id = v.require_uuid("run_id", request.run_id)
        annotate(run_id=str(run_id))
        request_id = v.optional_text("request_id", request.request_id, max_len=200)
        audit = audit_entry(context, request.note, request_id=request_id)
        row, created = await self.store.retries.retry_run(tenant, run_id, request_id=request_id, trace=current_trace(),
                                                          audit=audit)
        if created and self.notifier is not None:
            self.notifier.poke()
        annotate(retry_run_id=str(row.id))
        return redact_message(rs.RetryRunResponse(run=convert.run_to_proto(row), created=created))

    @rpc
    async def SignalRun(self, request: rs.SignalRunRequest, context: grpc.aio.ServicerContext) -> rs.SignalRunResponse:
        tenant = self._tenant(context)
        run_id = v.require_uuid("run_id", request.run_id)
        annotate(run_id=str(run_id))
        name = v.require_name("name", request.name)
        payload = v.parse_json("payload_json", request.payload_json, self.limit, object_only=False)
        request_id = v.optional_text("request_id", request.request_id, max_len=200)
        run = await self.store.runs.get_run(tenant, run_id)  # NOT_FOUND for another tenant's run, before any check
        # Checked in the clear: the edge's filter (scheduler/api/shield.py) has sealed its marked values already.
        versions = await self.store.registry.live_agent_versions(run.agent_name)
        check_signal(versions, run.agent_name, run.agent_version, name, await self.store.keys.plain(run_id, payload))
        signal, row, created, woke = await self.store.runs.signal_run(tenant, run_id, name=name, payload=payload,
                                                                      request_id=request_id, trace=current_trace())
        if woke and self.notifier is not None:
            self.notifier.poke()
        return redact_message(rs.SignalRunResponse(signal=convert.signal_to_proto(signal), created=created,
                                                   run=convert.run_to_proto(row)))

    @rpc
    async def ResumeRun(self, request: rs.ResumeRunRequest, context: grpc.aio.ServicerContext) -> pb.Run:
        tenant = self._tenant(context)
        run_id = v.require_uuid("run_id", request.run_id)
        annotate(run_id=str(run_id))
        decision = v.require_enum("decision", request.decision, RESUME)
        stated = v.optional_text("operator", request.operator, max_len=200)
        value = v.parse_json("input_json", request.input_json, self.limit, default=None)
        comment = v.optional_text("comment", request.comment, max_len=2000)
        caller = principal()
        # Who decided is the authenticated principal; a self-declared operator is kept as a comment.
        operator = (stated or caller.id) if self.auth.open else caller.id
        said = f"operator: {stated}" if stated and stated != operator else None
        human_input = {"decision": decision, "input": value, "operator": operator, "comment": comment}
        request_id = v.optional_text("request_id", request.request_id, max_len=200)
        audit = audit_entry(context, request.note, comment=" | ".join(p for p in (said, comment) if p) or None,
                            request_id=request_id)
        row = await self.store.runs.resume_run(tenant, run_id, human_input=human_input, request_id=request_id,
                                               trace=current_trace(), audit=audit)
        return redact_message(convert.run_to_proto(row))

    @rpc
    async def ResolveToolExecution(self, request: rs.ResolveToolExecutionRequest,
                                   context: grpc.aio.ServicerContext) -> rs.ResolveToolExecutionResponse:
        tenant = self._tenant(context)
        run_id = v.require_uuid("run_id", request.run_id)
        annotate(run_id=str(run_id))
        step_key = v.require_step_key("step_key", request.step_key)
        outcome = v.require_enum("outcome", request.outcome, RESOLVE)
        tool_response = self.settings.limits.tool_response
        v.require_size("result_json", request.result_json, tool_response, "max_tool_response_bytes")
        result = v.parse_json("result_json", request.result_json, tool_response, required=outcome == "SUCCEEDED",
                              object_only=False)
        evidence = v.parse_json("evidence_json", request.evidence_json, self.limit, required=True)
        stated = v.require_text("resolved_by", request.resolved_by)
        resolved_by = stated if self.auth.open else principal().id
        rule_version = v.optional_text("rule_version", request.rule_version, max_len=200)
        remote_id = v.optional_text("remote_resource_id", request.remote_resource_id, max_len=500)
        event_id = v.optional_uuid("event_id", request.event_id)
        request_id = v.optional_text("request_id", request.request_id, max_len=200)
        if event_id is not None and request_id is not None:
            raise InvalidArgument("request_id", "give request_id or event_id, not both")
        if request_id is not None:
            event_id = request_event_id(run_id, "ResolveToolExecution", request_id)
        evidence = {**evidence, "resolved_by": resolved_by, "rule_version": rule_version,
                    **({"stated_resolved_by": stated} if stated != resolved_by else {})}
        audit = audit_entry(context, request.note, comment=None if stated == resolved_by else f"resolved_by: {stated}",
                            request_id=request_id or (str(event_id) if event_id else None))
        run, execution = await self.store.runs.resolve_tool_execution(
            tenant, run_id, step_key=step_key, outcome=cast(ResolveOutcome, outcome), result=result,
            remote_resource_id=remote_id, evidence=evidence, resolved_by=resolved_by, event_id=event_id,
            trace=current_trace(), audit=audit)
        return redact_message(rs.ResolveToolExecutionResponse(run=convert.run_to_proto(run),
                                                              execution=convert.execution_to_proto(execution)))

    @rpc
    async def GetRunHistory(self, request: rs.GetRunHistoryRequest, context: grpc.aio.ServicerContext) -> rs.RunHistory:
        tenant = self._tenant(context)
        run_id = v.require_uuid("run_id", request.run_id)
        annotate(run_id=str(run_id))
        parts = frozenset(v.require_enum("include", p, HISTORY_PART) for p in request.include) or frozenset(
            HISTORY_PARTS)
        cursor = _decode_history_token(request.page_token, run_id, parts) if request.page_token else HistoryCursor()
        if request.export:
            if not principal().may("runs.export"):
                raise PermissionDenied(f"role {','.join(principal().roles)} may not runs.export",
                                       verb="runs.export", principal=principal().id)
            if not request.page_token:  # one audit row per export, at its first page
                await self.store.runs.record_export(tenant, run_id, parts=parts,
                                                    audit=audit_entry(context, request.note), trace=current_trace())
        if request.reveal and not request.page_token:  # one audit row per revealed read, at its first page
            await self._reveal(context, tenant, run_id, request.note, "GetRunHistory")
        elif request.reveal:
            self._may_reveal()
        history, following = await self.store.runs.history(
            tenant, run_id, parts=parts, cursor=cursor, page_size=request.page_size or 100, page_bytes=4 * self.limit)
        return await self._shown(run_id, rs.RunHistory(
            run=convert.run_to_proto(history.run),
            checkpoints=[convert.checkpoint_to_proto(c) for c in history.checkpoints],
            tool_executions=[convert.execution_to_proto(e) for e in history.executions],
            events=[convert.event_to_proto(e) for e in history.events],
            journal=[convert.journal_to_proto(j) for j in history.journal],
            next_page_token="" if following.exhausted else _encode_history_token(following, run_id, parts),
        ), request.reveal)

    @staticmethod
    def _may_reveal() -> None:
        if not principal().may("runs.reveal"):
            raise PermissionDenied(f"role {','.join(principal().roles)} may not runs.reveal",
                                   verb="runs.reveal", principal=principal().id)

    async def _reveal(self, context: grpc.aio.ServicerContext, tenant: str, run_id: uuid.UUID,
                      note: rs.AuditNote, rpc_name: str) -> None:
        """A reveal is allowed (runs.reveal) and audited before anything is read."""
        self._may_reveal()
        await self.store.runs.record_reveal(tenant, run_id, rpc=rpc_name, audit=audit_entry(context, note),
                                            trace=current_trace())

    async def _shown(self, run_id: uuid.UUID, message: M, reveal: bool) -> M:
        """The answer with its sensitive values redacted, or opened for a reveal."""
        if reveal:
            return await self.shield.opened(run_id, message)
        return redact_message(message)


    async def _admit(self, tenant: str, spec: SubmitSpec, payload: Any,
                     allow_unregistered: bool) -> LiveVersion | None:
        """The agent registry's check (scheduler/admission.py), before anything is written. A retry of a
        submit that created its run is answered with that run, even when its agent is no longer served or its
        schema has changed since (submit_run still refuses another payload under the same id)."""
        allow = allow_unregistered or not self.settings.require_registered_agents
        versions = await self.store.registry.live_agent_versions(spec.agent_name)
        try:
            return admit(versions, spec.agent_name, spec.agent_version, payload, allow_unregistered=allow)
        except (AgentNotRegistered, InvalidArgument):
            if spec.client_request_id is None or await self.store.runs.run_for_request(
                    tenant, spec.client_request_id) is None:
                raise
        return None

    @rpc
    async def ListAgents(self, request: rs.ListAgentsRequest,
                         context: grpc.aio.ServicerContext) -> rs.ListAgentsResponse:
        self._tenant(context)  # the registry is every tenant's, but the API is called as one
        response = rs.ListAgentsResponse()
        for row in await self.store.registry.registered_agents():
            agent = response.agents.add(
                name=row.agent_name, version=row.agent_version, tool_names=row.tool_names, executors=row.executors,
                input_schema_json=canonical_json(row.input_schema) if row.input_schema is not None else "")
            convert.set_time(agent, "last_seen", row.last_seen)
        return response

    @rpc
    async def GetStats(self, request: rs.GetStatsRequest, context: grpc.aio.ServicerContext) -> rs.RunStats:
        tenant = self._tenant(context)
        row = await self.store.runs.tenant_stats(tenant)
        flow = await self.store.limits.tenant_flow(tenant)
        stats = rs.RunStats(
            queued=flow.queued, running=flow.running, waiting_on_limit=flow.waiting_on,
            limits=limits_of_tenant(await self.store.db.current_flow(), tenant),
            runs_by_status={name: int(n) for name, n in row.by_status.items()},
            oldest_queued_age_s=float(row.oldest_queued_s or 0), in_doubt_runs=row.in_doubt,
            oldest_in_doubt_age_s=float(row.oldest_in_doubt_s or 0), outbox_pending=row.outbox_pending,
            outbox_oldest_pending_age_s=float(row.outbox_oldest_s or 0),
            auth_mode=self.settings.auth_mode, principal=principal().id, role=",".join(principal().roles),
            server_version=agentrt_version(),
        )
        convert.set_time(stats, "database_time", row.db_now)
        return stats


def _labels(given: Any, field: str = "labels") -> dict[str, str]:
    labels = dict(given)
    if len(labels) > 64 or any(len(k) > 100 or len(val) > 500 for k, val in labels.items()):
        raise InvalidArgument(field, "at most 64 labels, keys up to 100 and values up to 500 characters")
    if any("\x00" in k or "\x00" in val for k, val in labels.items()):
        raise InvalidArgument(field, "must not contain NUL characters")
    return labels


def _run_filter(request: rs.ListRunsRequest) -> RunFilter:
    """ListRuns' filters, each checked (the priorities' range: scheduler/bounds.py)."""
    statuses = sorted({v.require_enum("statuses", s, STATUS_FILTER) for s in request.statuses}) or None
    agent = v.require_name("agent_name", request.agent_name) if request.agent_name else None
    low, high = request.min_priority or None, request.max_priority or None
    if low is not None and high is not None and low > high:
        raise InvalidArgument("min_priority", f"must not be above max_priority ({high})")
    after, before = time_field(request, "created_after"), time_field(request, "created_before")
    if after is not None and before is not None and after >= before:
        raise InvalidArgument("created_before", "must be after created_after")
    return RunFilter(statuses=statuses, agent_name=agent, labels=_labels(request.labels) or None, min_priority=low,
                     max_priority=high, created_after=after, created_before=before)


def _filter_key(tenant: str, where: RunFilter) -> str:
    """What a page token is bound to: a hash of the tenant and every filter."""
    times = [t.isoformat() if t else None for t in (where.created_after, where.created_before)]
    document = [tenant, where.statuses, where.agent_name, sorted((where.labels or {}).items()), where.min_priority,
                where.max_priority, *times]
    return hashlib.sha256(json.dumps(document).encode()).hexdigest()[:32]


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


def _encode_tree_token(cursor: TreeCursor, run_id: uuid.UUID) -> str:
    raw = json.dumps({"r": str(run_id), "d": cursor.depth,
                      "p": str(cursor.parent_run_id) if cursor.parent_run_id else None, "k": cursor.spawn_key,
                      "x": cursor.spawn_index, "i": str(cursor.run_id)})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_tree_token(token: str, run_id: uuid.UUID) -> TreeCursor:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        same_run = data["r"] == str(run_id)
        depth, index = data["d"], data["x"]
        if not isinstance(depth, int) or depth < 0 or not (index is None or isinstance(index, int)):
            raise ValueError(token)
        cursor = TreeCursor(depth, uuid.UUID(data["p"]) if data["p"] else None, data["k"], index,
                            uuid.UUID(data["i"]))
        if depth > 0 and (cursor.parent_run_id is None or not isinstance(cursor.spawn_key, str) or index is None):
            raise ValueError(token)
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
        raise InvalidArgument("page_token", "is not a token this server issued") from None
    if not same_run:
        raise InvalidArgument("page_token", "was issued for another run's tree")
    return cursor


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


