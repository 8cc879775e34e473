"""A small async client for agentrt's public RunService.

    tls = ClientTls(ca_file="ca.crt")  # the CA that signed the scheduler's certificate
    async with AgentrtClient("scheduler:50051", api_key=os.environ["AGENTRT_API_KEY"], tls=tls) as client:
        run = await client.submit("returns", {"order_id": 42}, client_request_id="order-42")
        run = await client.wait(run.run_id, until={"COMPLETED", "FAILED", "PAUSED_HUMAN"})

The credential (an API key, or an OIDC token as `token=`) decides the tenant; `tenant=`
picks one when the credential may act for several, and is the only tenant source when
the scheduler runs with auth_mode none. A credential is never sent in clear to an address
that is not loopback unless `insecure=True` says so.

Submits are idempotent: every submit carries a client request id (made up if
you give none), so a retry after UNAVAILABLE or a deadline cannot create a
second run. Calls that only read, and calls the server makes idempotent, are
retried on UNAVAILABLE with capped exponential backoff; errors come back as the
typed classes of shared.errors (NotFound, AlreadyExists, InvalidArgument, …).
"""

from __future__ import annotations

import asyncio
import builtins
import datetime as dt
import json
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format

from shared.errors import InvalidArgument, Unavailable, from_rpc_error
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc
from shared.tracing import inject_metadata
from shared.transport import ClientTls, open_channel, require_tls

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")

T = TypeVar("T")
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED"})
_STATUS_NAMES = {value: name.removeprefix("RUN_STATUS_") for name, value in pb.RunStatus.items()}
_STATUS_NUMBERS = {name: value for value, name in _STATUS_NAMES.items()}


def _time(message: Any, name: str) -> dt.datetime | None:
    return message.__getattribute__(name).ToDatetime(tzinfo=dt.UTC) if message.HasField(name) else None


def _json(text: str) -> Any:
    return json.loads(text) if text else None


def _schedule(message: rs.Schedule) -> dict[str, Any]:
    data: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    spec = data.get("spec", {})
    spec["input"] = _json(spec.pop("input_json", "")) or {}
    return data


@dataclass(frozen=True)
class SignalInfo:
    """A signal queued for a run (SignalRun's answer)."""

    seq: int
    signal_id: str
    name: str
    payload: Any
    request_id: str
    received_at: dt.datetime | None
    created: bool  # False: an earlier SignalRun with this request id queued it
    run_status: str

    def as_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["received_at"] = self.received_at.isoformat() if self.received_at else None
        return data


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    tenant_id: str
    agent_name: str
    agent_version: str
    status: str
    version: int
    fencing_token: int
    attempt_count: int
    max_attempts: int
    input: dict[str, Any]
    labels: dict[str, str]
    current_step_key: str
    terminal_reason: str
    pause_reason: str
    cancel_requested: bool
    client_request_id: str
    result: Any
    human_input: Any
    created_at: dt.datetime | None
    updated_at: dt.datetime | None
    finished_at: dt.datetime | None
    next_attempt_at: dt.datetime | None
    last_trace_id: str = ""  # GetRun: the trace of the run's last step (look it up in your tracing backend)
    priority: int = 0  # 1 (lowest) .. 9 (highest)
    parent_run_id: str = ""  # a child run's parent (SpawnChildren); "" for a top-level run
    waiting_for: str = ""  # what it waits for, in words (approval, signal, children, timer, retry, slot)
    retry_of_run_id: str = ""  # RetryRun: the FAILED or CANCELLED run it starts again

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def from_proto(cls, run: pb.Run) -> RunInfo:
        return cls(
            run_id=run.run_id, tenant_id=run.tenant_id, agent_name=run.agent_name, agent_version=run.agent_version,
            status=_STATUS_NAMES.get(run.status, "UNSPECIFIED"), version=run.version,
            fencing_token=run.fencing_token, attempt_count=run.attempt_count, max_attempts=run.max_attempts,
            input=_json(run.input_json) or {}, labels=dict(run.labels), current_step_key=run.current_step_key,
            terminal_reason=run.terminal_reason, pause_reason=run.pause_reason,
            cancel_requested=run.cancel_requested, client_request_id=run.client_request_id,
            result=_json(run.result_json), human_input=_json(run.human_input_json),
            created_at=_time(run, "created_at"), updated_at=_time(run, "updated_at"),
            finished_at=_time(run, "finished_at"), next_attempt_at=_time(run, "next_attempt_at"),
            last_trace_id=run.last_trace_id, priority=run.priority, parent_run_id=run.parent_run_id,
            waiting_for=run.waiting_for, retry_of_run_id=run.retry_of_run_id,
        )

    def as_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        for key, value in data.items():
            if isinstance(value, dt.datetime):
                data[key] = value.isoformat()
        return data


@dataclass(frozen=True)
class AgentInfo:
    name: str
    version: str
    executors: list[str]
    tool_names: list[str]
    input_schema: dict[str, Any] | None
    last_seen: dt.datetime | None

    @classmethod
    def from_proto(cls, agent: rs.RegisteredAgent) -> AgentInfo:
        return cls(name=agent.name, version=agent.version, executors=list(agent.executors),
                   tool_names=list(agent.tool_names),
                   input_schema=json.loads(agent.input_schema_json) if agent.input_schema_json else None,
                   last_seen=agent.last_seen.ToDatetime(tzinfo=dt.UTC) if agent.HasField("last_seen") else None)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "executors": self.executors,
                "tool_names": self.tool_names, "input_schema": self.input_schema,
                "last_seen": self.last_seen.isoformat() if self.last_seen else None}


@dataclass(frozen=True)
class History:
    run: RunInfo
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    tool_executions: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    journal: list[dict[str, Any]] = field(default_factory=list)  # tool steps, sleeps, inputs, ... by seq


def _message_dict(message: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    data: dict[str, Any] = MessageToDict(message, preserving_proto_field_name=True)
    for key in [k for k in data if k.endswith("_json")]:
        data[key.removesuffix("_json")] = _json(data.pop(key))
    return data


def is_loopback(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0] if addr.count(":") == 1 or addr.startswith("[") else addr
    return host in LOOPBACK_HOSTS


class AgentrtClient:
    def __init__(self, addr: str, tenant: str | None = None, *, api_key: str | None = None,
                 token: str | None = None, tls: ClientTls | None = None, insecure: bool = False,
                 timeout_s: float = 10.0, max_retries: int = 5, channel: grpc.aio.Channel | None = None,
                 request_id: str | None = None) -> None:
        if api_key and token:
            raise ValueError("give an API key or a token, not both")
        credential = api_key or token
        if channel is None:
            require_tls(credential=bool(credential), tls=tls, insecure=insecure or is_loopback(addr),
                        what=f"RunService at {addr}")
        self.addr = addr
        self.tenant = tenant
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._metadata: list[tuple[str, str]] = [("x-tenant-id", tenant)] if tenant else []
        if credential:
            self._metadata.append(("authorization", f"Bearer {credential}"))
        if request_id:
            self._metadata.append(("x-request-id", request_id))
        self._channel = channel or open_channel(addr, tls)
        self._owns_channel = channel is None
        self._stub = rs_grpc.RunServiceStub(self._channel)

    async def __aenter__(self) -> AgentrtClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_channel:
            await self._channel.close()

    async def _call(self, method: Callable[..., Awaitable[T]], request: Any, *, retry: bool = True) -> T:
        """`retry=False` for a call a second copy of would do something again (a new API key)."""
        delay = 0.1
        for attempt in range(self.max_retries + 1 if retry else 1):
            try:
                return await method(request, metadata=inject_metadata(list(self._metadata)),
                                    timeout=self.timeout_s)
            except grpc.aio.AioRpcError as error:
                retryable = error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if not retryable or attempt == self.max_retries:
                    raise from_rpc_error(error) from None
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 5.0)
        raise Unavailable(f"{self.addr} unavailable")

    async def submit(self, agent_name: str, input: dict[str, Any] | None = None, *,
                     client_request_id: str | None = None, agent_version: str = "", max_attempts: int = 0,
                     labels: dict[str, str] | None = None, max_steps: int = 0, max_tokens: int = 0,
                     max_cost_usd: float = 0.0, deadline: dt.datetime | None = None,
                     allow_unregistered: bool = False, priority: int = 0) -> tuple[RunInfo, bool]:
        """Returns (run, created). The same client_request_id always answers with the same run.

        An agent (or version) no live executor serves is refused (FailedPrecondition,
        AGENT_NOT_REGISTERED) unless `allow_unregistered` queues it for one deployed later.
        `priority` 1 (lowest) .. 9 (highest); 0 = the agent's default."""
        request = rs.SubmitRunRequest(
            agent_name=agent_name, agent_version=agent_version, input_json=json.dumps(input or {}),
            client_request_id=client_request_id or f"client-{uuid.uuid4()}", max_attempts=max_attempts,
            labels=labels or {}, allow_unregistered=allow_unregistered, priority=priority,
        )
        request.budget.max_steps = max_steps
        request.budget.max_tokens = max_tokens
        request.budget.max_cost_usd = max_cost_usd
        if deadline is not None:
            request.budget.deadline.FromDatetime(deadline)
        reply = await self._call(self._stub.SubmitRun, request)
        return RunInfo.from_proto(reply.run), reply.created

    async def agents(self) -> list[AgentInfo]:
        """The agents live executors serve, by name and version, with the executors serving each."""
        reply = await self._call(self._stub.ListAgents, rs.ListAgentsRequest())
        return [AgentInfo.from_proto(a) for a in reply.agents]

    async def get(self, run_id: str) -> RunInfo:
        return RunInfo.from_proto(await self._call(self._stub.GetRun, rs.GetRunRequest(run_id=run_id)))

    async def list(self, *, statuses: Iterable[str] = (), agent_name: str = "", page_size: int = 50,
                   page_token: str = "", labels: dict[str, str] | None = None, min_priority: int = 0,
                   max_priority: int = 0, tenant_id: str = "", created_after: dt.datetime | None = None,
                   created_before: dt.datetime | None = None) -> tuple[list[RunInfo], str]:
        """One page, newest first. Every filter is the server's (labels: each key=value must match;
        tenant_id: another tenant's runs, for a credential of every tenant); a page token continues
        only the listing with the same filters."""
        numbers: list[Any] = [_STATUS_NUMBERS[s.upper()] for s in statuses]
        request = rs.ListRunsRequest(statuses=numbers, agent_name=agent_name, page_size=page_size,
                                     page_token=page_token, labels=labels or {}, min_priority=min_priority,
                                     max_priority=max_priority, tenant_id=tenant_id)
        for name, value in (("created_after", created_after), ("created_before", created_before)):
            if value is not None:
                getattr(request, name).FromDatetime(value)
        reply = await self._call(self._stub.ListRuns, request)
        return [RunInfo.from_proto(r) for r in reply.runs], reply.next_page_token

    async def list_all(self, **filters: Any) -> AsyncIterator[RunInfo]:
        token = ""
        while True:
            runs, token = await self.list(page_token=token, **filters)
            for run in runs:
                yield run
            if not token:
                return

    async def cancel(self, run_id: str, reason: str = "", *, ticket_id: str = "", comment: str = "",
                     keep_children: bool = False, request_id: str = "") -> RunInfo:
        """keep_children: the run alone (by default its children not spawned detached go with it)."""
        note = rs.AuditNote(reason=reason, comment=comment, ticket_id=ticket_id)
        return RunInfo.from_proto(await self._call(self._stub.CancelRun, rs.CancelRunRequest(
            run_id=run_id, reason=reason, note=note, keep_children=keep_children, request_id=request_id)))

    async def retry(self, run_id: str, *, request_id: str = "", reason: str = "", ticket_id: str = "",
                    comment: str = "") -> tuple[RunInfo, bool]:
        """A new run from a FAILED or CANCELLED one: (the new run, created). The same request_id answers
        the run its first call made (created False)."""
        reply = await self._call(self._stub.RetryRun, rs.RetryRunRequest(
            run_id=run_id, request_id=request_id or f"client-{uuid.uuid4()}",
            note=rs.AuditNote(reason=reason, comment=comment, ticket_id=ticket_id)))
        return RunInfo.from_proto(reply.run), reply.created

    async def tree(self, run_id: str, max_runs: int = 0) -> tuple[Sequence[tuple[int, RunInfo]], bool]:
        """The run and its descendants, breadth first, each with its depth; and whether more were left out."""
        nodes, token = await self.tree_page(run_id, max_runs)
        return nodes, bool(token)

    async def tree_page(self, run_id: str, max_runs: int = 0,
                        page_token: str = "") -> tuple[Sequence[tuple[int, RunInfo]], str]:
        """One page of the run's tree (breadth first, each node with its depth) and the token of the next
        page ("" on the last)."""
        reply = await self._call(self._stub.GetRunTree, rs.GetRunTreeRequest(run_id=run_id, max_runs=max_runs,
                                                                             page_token=page_token))
        return [(node.depth, RunInfo.from_proto(node.run)) for node in reply.nodes], reply.next_page_token

    async def signal(self, run_id: str, name: str, payload: Any = None, *, request_id: str = "") -> SignalInfo:
        """Queues signal `name` for the run (woken at once if it waits for it). Safe to retry with a request_id."""
        request = rs.SignalRunRequest(run_id=run_id, name=name, request_id=request_id,
                                      payload_json=json.dumps(payload) if payload is not None else "")
        reply = await self._call(self._stub.SignalRun, request)
        s = reply.signal
        return SignalInfo(seq=s.seq, signal_id=s.signal_id, name=s.name, payload=_json(s.payload_json),
                          request_id=s.request_id, received_at=_time(s, "received_at"), created=reply.created,
                          run_status=_STATUS_NAMES.get(reply.run.status, "UNSPECIFIED"))

    # ------------------------------------------------------------------ schedules (dicts: the Schedule message)

    async def create_schedule(self, name: str, spec: rs.ScheduleSpec) -> tuple[dict[str, Any], bool]:
        """Creates schedule `name` (the same name and spec answers with it: safe to retry)."""
        reply = await self._call(self._stub.CreateSchedule, rs.CreateScheduleRequest(name=name, spec=spec))
        return _schedule(reply.schedule), reply.created

    async def update_schedule(self, schedule_id: str, spec: rs.ScheduleSpec) -> dict[str, Any]:
        return _schedule(await self._call(self._stub.UpdateSchedule,
                                          rs.UpdateScheduleRequest(schedule_id=schedule_id, spec=spec)))

    async def pause_schedule(self, schedule_id: str, paused: bool = True) -> dict[str, Any]:
        return _schedule(await self._call(self._stub.PauseSchedule,
                                          rs.PauseScheduleRequest(schedule_id=schedule_id, paused=paused)))

    async def delete_schedule(self, schedule_id: str) -> dict[str, Any]:
        return _schedule(await self._call(self._stub.DeleteSchedule, rs.DeleteScheduleRequest(schedule_id=schedule_id)))

    async def list_schedules(self) -> builtins.list[dict[str, Any]]:
        reply = await self._call(self._stub.ListSchedules, rs.ListSchedulesRequest())
        return [_schedule(s) for s in reply.schedules]

    async def resume(self, run_id: str, *, operator: str = "", approve: bool | None = None,
                     input: Any = None, comment: str = "", reason: str = "", ticket_id: str = "") -> RunInfo:
        """approve=True/False answers an approval; input=... answers wait_for_input."""
        if approve is None and input is None:
            raise ValueError("resume needs approve=True/False or input=...")
        decision = (rs.RESUME_DECISION_INPUT if approve is None
                    else rs.RESUME_DECISION_APPROVE if approve else rs.RESUME_DECISION_REJECT)
        request = rs.ResumeRunRequest(run_id=run_id, decision=decision, operator=operator, comment=comment,
                                      input_json=json.dumps(input) if input is not None else "",
                                      note=rs.AuditNote(reason=reason, ticket_id=ticket_id))
        return RunInfo.from_proto(await self._call(self._stub.ResumeRun, request))

    async def resolve_tool(self, run_id: str, step_key: str, outcome: str, *, evidence: dict[str, Any],
                           resolved_by: str, result: Any = None, remote_resource_id: str = "",
                           rule_version: str = "", reason: str = "", comment: str = "",
                           ticket_id: str = "") -> tuple[RunInfo, dict[str, Any]]:
        """outcome: SUCCEEDED (with result) | NOT_EXECUTED | UNKNOWN. One event id across retries."""
        outcomes = {"SUCCEEDED": rs.RESOLUTION_OUTCOME_SUCCEEDED, "NOT_EXECUTED": rs.RESOLUTION_OUTCOME_NOT_EXECUTED,
                    "UNKNOWN": rs.RESOLUTION_OUTCOME_UNKNOWN}
        request = rs.ResolveToolExecutionRequest(
            run_id=run_id, step_key=step_key, outcome=outcomes[outcome.upper()],
            result_json=json.dumps(result) if result is not None else "", remote_resource_id=remote_resource_id,
            evidence_json=json.dumps(evidence), resolved_by=resolved_by, rule_version=rule_version,
            event_id=str(uuid.uuid4()), note=rs.AuditNote(reason=reason, comment=comment, ticket_id=ticket_id),
        )
        reply = await self._call(self._stub.ResolveToolExecution, request)
        return RunInfo.from_proto(reply.run), _message_dict(reply.execution)

    async def history_pages(self, run_id: str, *, page_size: int = 100, page_token: str = "",
                            include: Iterable[str] = (), export: bool = False, reason: str = "",
                            ticket_id: str = "") -> AsyncIterator[tuple[History, str]]:
        """A run's history page by page, with each page's next token ("" after the last).

        `include` names parts: checkpoints, tool_executions, events, journal (default all).
        """
        parts = [getattr(rs, f"HISTORY_PART_{name.upper()}") for name in include]
        token = page_token
        while True:
            reply = await self._call(self._stub.GetRunHistory, rs.GetRunHistoryRequest(
                run_id=run_id, page_size=page_size, page_token=token, include=parts, export=export,
                note=rs.AuditNote(reason=reason, ticket_id=ticket_id)))
            token = reply.next_page_token
            yield History(run=RunInfo.from_proto(reply.run),
                          checkpoints=[_message_dict(c) for c in reply.checkpoints],
                          tool_executions=[_message_dict(t) for t in reply.tool_executions],
                          events=[_message_dict(e) for e in reply.events],
                          journal=[_message_dict(j) for j in reply.journal]), token
            if not token:
                return

    async def history(self, run_id: str, *, include: Iterable[str] = ()) -> History:
        """The whole history (every page, in memory); use history_pages for long runs."""
        pages = [page async for page, _ in self.history_pages(run_id, page_size=500, include=include)]
        return History(run=pages[-1].run, checkpoints=[c for p in pages for c in p.checkpoints],
                       tool_executions=[t for p in pages for t in p.tool_executions],
                       events=[e for p in pages for e in p.events], journal=[j for p in pages for j in p.journal])

    async def stats(self) -> dict[str, Any]:
        """Runs by status, oldest due queued run, in-doubt count and age, outbox lag (database time)."""
        reply = await self._call(self._stub.GetStats, rs.GetStatsRequest())
        return {
            "runs_by_status": dict(reply.runs_by_status),
            "oldest_queued_age_s": reply.oldest_queued_age_s,
            "in_doubt_runs": reply.in_doubt_runs,
            "oldest_in_doubt_age_s": reply.oldest_in_doubt_age_s,
            "outbox_pending": reply.outbox_pending,
            "outbox_oldest_pending_age_s": reply.outbox_oldest_pending_age_s,
            "auth_mode": reply.auth_mode,
            "principal": reply.principal,
            "role": reply.role,
            "queued": reply.queued,
            "running": reply.running,
            "waiting_on_limit": dict(reply.waiting_on_limit),
            "limits": dict(reply.limits),
        }

    # ------------------------------------------------------------------ runtime flow limits (admin)

    async def set_limit(self, scope: str, name: str, value: str, *, tenant_id: str = "", subject: str = "",
                        reason: str = "", ticket_id: str = "") -> dict[str, Any]:
        """Sets a runtime limit (docs/flow-control.md); every replica applies it within limits_refresh_ms."""
        reply = await self._call(self._stub.SetLimit, rs.SetLimitRequest(
            scope=scope, tenant_id=tenant_id, subject=subject, name=name, value=value,
            note=rs.AuditNote(reason=reason, ticket_id=ticket_id)))
        return _message_dict(reply)

    async def clear_limit(self, scope: str, name: str, *, tenant_id: str = "", subject: str = "",
                          reason: str = "", ticket_id: str = "") -> dict[str, Any] | None:
        """Clears a runtime limit (the config file's value applies again); None when there was none."""
        reply = await self._call(self._stub.ClearLimit, rs.ClearLimitRequest(
            scope=scope, tenant_id=tenant_id, subject=subject, name=name,
            note=rs.AuditNote(reason=reason, ticket_id=ticket_id)))
        return _message_dict(reply.limit) if reply.cleared else None

    async def list_limits(self) -> builtins.list[dict[str, Any]]:
        reply = await self._call(self._stub.ListLimits, rs.ListLimitsRequest())
        return [_message_dict(limit) for limit in reply.limits]

    async def create_key(self, name: str, role: str, *, tenants: Iterable[str] = (), expires_in_s: int = 0,
                         reason: str = "", ticket_id: str = "") -> tuple[dict[str, Any], str]:
        """A new API key (admin): its description and the key itself, which is shown only here."""
        number = getattr(rs, f"API_KEY_ROLE_{role.upper()}", None)
        if number is None or not role:
            raise InvalidArgument("role", "must be viewer, submitter, operator or admin")
        reply = await self._call(self._stub.CreateApiKey, rs.CreateApiKeyRequest(
            name=name, role=number, tenants=list(tenants), expires_in_s=expires_in_s,
            note=rs.AuditNote(reason=reason, ticket_id=ticket_id)), retry=False)
        return _key_dict(reply.key), reply.secret

    async def list_keys(self, *, include_revoked: bool = False) -> builtins.list[dict[str, Any]]:
        keys: builtins.list[dict[str, Any]] = []
        token = ""
        while True:
            reply = await self._call(self._stub.ListApiKeys, rs.ListApiKeysRequest(
                page_size=500, page_token=token, include_revoked=include_revoked))
            keys += [_key_dict(k) for k in reply.keys]
            token = reply.next_page_token
            if not token:
                return keys

    async def revoke_key(self, key_id: str, *, reason: str = "", ticket_id: str = "") -> dict[str, Any]:
        reply = await self._call(self._stub.RevokeApiKey, rs.RevokeApiKeyRequest(
            key_id=key_id, note=rs.AuditNote(reason=reason, ticket_id=ticket_id)))
        return _key_dict(reply)

    async def audit_events(self, *, run_id: str = "", principal: str = "", action: str = "",
                           since: dt.datetime | None = None, until: dt.datetime | None = None,
                           page_size: int = 100, limit: int | None = None) -> builtins.list[dict[str, Any]]:
        """The tenant's audit trail, newest first (admin); at most `limit` entries."""
        request = rs.ListAuditEventsRequest(run_id=run_id, principal=principal, action=action, page_size=page_size)
        for name, value in (("since", since), ("until", until)):
            if value is not None:
                getattr(request, name).FromDatetime(value)
        events: builtins.list[dict[str, Any]] = []
        while limit is None or len(events) < limit:
            reply = await self._call(self._stub.ListAuditEvents, request)
            events += [_message_dict(e) for e in reply.events]
            if not reply.next_page_token:
                break
            request.page_token = reply.next_page_token
        return events[:limit] if limit is not None else events

    async def watch(self, run_id: str, *, poll_s: float = 0.5) -> AsyncIterator[RunInfo]:
        """Yields the run each time its status or version changes, until it is terminal."""
        last: tuple[str, int] | None = None
        while True:
            run = await self.get(run_id)
            if (run.status, run.version) != last:
                last = (run.status, run.version)
                yield run
            if run.terminal:
                return
            await asyncio.sleep(poll_s)

    async def wait(self, run_id: str, *, until: Iterable[str] = TERMINAL, timeout_s: float = 300,
                   poll_s: float = 0.5) -> RunInfo:
        """Polls until the run reaches one of `until`; TimeoutError after timeout_s."""
        wanted = {s.upper() for s in until}
        async with asyncio.timeout(timeout_s):
            while True:
                run = await self.get(run_id)
                if run.status in wanted:
                    return run
                await asyncio.sleep(poll_s)


def _key_dict(message: Any) -> dict[str, Any]:
    data = _message_dict(message)
    data["role"] = str(data.get("role", "")).removeprefix("API_KEY_ROLE_").lower()
    return data
