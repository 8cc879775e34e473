"""RunService calls made with the signed-in person's credential, over the console's one channel.

Each request builds an `Api` from its session: the channel is shared (one HTTP/2 connection to the
scheduler), the metadata (the credential, the tenant, the request id) is the person's own, so the
scheduler authorises every call as it would the CLI's. Failures come back as shared.errors types.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from shared.errors import from_rpc_error
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc
from shared.tracing import inject_metadata

T = TypeVar("T")
STATUSES = [name.removeprefix("RUN_STATUS_") for name in pb.RunStatus.keys() if not name.endswith("UNSPECIFIED")]
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED"})


def status_name(number: int) -> str:
    return pb.RunStatus.Name(number).removeprefix("RUN_STATUS_")


def tool_status_name(number: int) -> str:
    return pb.ToolExecutionStatus.Name(number).removeprefix("TOOL_EXECUTION_STATUS_")


class Api:
    def __init__(self, channel: grpc.aio.Channel, *, credential: str = "", tenant: str = "",
                 timeout_s: float = 10.0) -> None:
        self._stub = rs_grpc.RunServiceStub(channel)
        self._metadata: list[tuple[str, str]] = [("x-request-id", f"console-{uuid.uuid4()}")]
        if credential:
            self._metadata.append(("authorization", f"Bearer {credential}"))
        if tenant:
            self._metadata.append(("x-tenant-id", tenant))
        self._timeout_s = timeout_s

    async def _call(self, method: Callable[..., Awaitable[T]], request: Any) -> T:
        try:
            return await method(request, metadata=inject_metadata(list(self._metadata)), timeout=self._timeout_s)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None

    async def stats(self) -> rs.RunStats:
        return await self._call(self._stub.GetStats, rs.GetStatsRequest())

    async def list_runs(self, *, statuses: list[str], agent: str, page_size: int, page_token: str,
                        labels: dict[str, str] | None = None, min_priority: int = 0, max_priority: int = 0,
                        tenant_id: str = "", created_after: dt.datetime | None = None,
                        created_before: dt.datetime | None = None) -> rs.ListRunsResponse:
        """One page of runs, every filter applied by the scheduler (a page token goes with its filters)."""
        numbers: list[Any] = [pb.RunStatus.Value(f"RUN_STATUS_{s}") for s in statuses]
        request = rs.ListRunsRequest(statuses=numbers, agent_name=agent, page_size=page_size, page_token=page_token,
                                     labels=labels or {}, min_priority=min_priority, max_priority=max_priority,
                                     tenant_id=tenant_id)
        for name, value in (("created_after", created_after), ("created_before", created_before)):
            if value is not None:
                getattr(request, name).FromDatetime(value)
        return await self._call(self._stub.ListRuns, request)

    async def get_run(self, run_id: str, *, reveal: bool = False, reason: str = "") -> pb.Run:
        return await self._call(self._stub.GetRun, rs.GetRunRequest(run_id=run_id, reveal=reveal,
                                                                     note=rs.AuditNote(reason=reason)))

    async def history(self, run_id: str, *, page_size: int = 500, max_pages: int = 20, reveal: bool = False,
                      reason: str = "", parts: tuple[rs.HistoryPart, ...] = ()) -> tuple[rs.RunHistory, bool]:
        """The history's first `max_pages` pages merged (only `parts` when given),
        and whether there was more."""
        merged = rs.RunHistory()
        token = ""
        for _ in range(max_pages):
            page = await self._call(self._stub.GetRunHistory, rs.GetRunHistoryRequest(
                run_id=run_id, page_size=page_size, page_token=token, reveal=reveal, include=list(parts),
                note=rs.AuditNote(reason=reason)))
            merged.run.CopyFrom(page.run)
            merged.checkpoints.extend(page.checkpoints)
            merged.tool_executions.extend(page.tool_executions)
            merged.events.extend(page.events)
            merged.journal.extend(page.journal)
            token = page.next_page_token
            if not token:
                return merged, False
        return merged, True

    async def tree(self, run_id: str, max_runs: int = 200) -> rs.GetRunTreeResponse:
        return await self._call(self._stub.GetRunTree, rs.GetRunTreeRequest(run_id=run_id, max_runs=max_runs))

    async def resume(self, run_id: str, decision: str, *, input_json: str, comment: str, operator: str,
                     request_id: str) -> pb.Run:
        number = {"approve": rs.RESUME_DECISION_APPROVE, "reject": rs.RESUME_DECISION_REJECT,
                  "input": rs.RESUME_DECISION_INPUT}[decision]
        return await self._call(self._stub.ResumeRun, rs.ResumeRunRequest(
            run_id=run_id, decision=number, input_json=input_json, comment=comment, operator=operator,
            request_id=request_id, note=rs.AuditNote(reason=comment, comment=comment)))

    async def cancel(self, run_id: str, *, reason: str, request_id: str, keep_children: bool = False) -> pb.Run:
        return await self._call(self._stub.CancelRun, rs.CancelRunRequest(
            run_id=run_id, reason=reason, request_id=request_id, note=rs.AuditNote(reason=reason),
            keep_children=keep_children))

    async def retry(self, run_id: str, *, reason: str, request_id: str) -> rs.RetryRunResponse:
        return await self._call(self._stub.RetryRun, rs.RetryRunRequest(
            run_id=run_id, request_id=request_id, note=rs.AuditNote(reason=reason)))

    async def signal(self, run_id: str, name: str, *, payload_json: str, request_id: str) -> rs.SignalRunResponse:
        return await self._call(self._stub.SignalRun, rs.SignalRunRequest(
            run_id=run_id, name=name, payload_json=payload_json, request_id=request_id))

    async def resolve(self, run_id: str, step_key: str, outcome: str, *, evidence: dict[str, Any],
                      result_json: str, remote_resource_id: str, resolved_by: str, comment: str,
                      request_id: str) -> rs.ResolveToolExecutionResponse:
        number = {"SUCCEEDED": rs.RESOLUTION_OUTCOME_SUCCEEDED, "NOT_EXECUTED": rs.RESOLUTION_OUTCOME_NOT_EXECUTED,
                  "UNKNOWN": rs.RESOLUTION_OUTCOME_UNKNOWN}[outcome]
        return await self._call(self._stub.ResolveToolExecution, rs.ResolveToolExecutionRequest(
            run_id=run_id, step_key=step_key, outcome=number, result_json=result_json,
            remote_resource_id=remote_resource_id, evidence_json=json.dumps(evidence), resolved_by=resolved_by,
            rule_version="console/1", event_id=request_id,
            note=rs.AuditNote(reason=comment, comment=comment)))

    async def agents(self) -> rs.ListAgentsResponse:
        return await self._call(self._stub.ListAgents, rs.ListAgentsRequest())

    async def schedules(self) -> rs.ListSchedulesResponse:
        return await self._call(self._stub.ListSchedules, rs.ListSchedulesRequest())

    async def pause_schedule(self, schedule_id: str, paused: bool, request_id: str) -> rs.Schedule:
        return await self._call(self._stub.PauseSchedule, rs.PauseScheduleRequest(
            schedule_id=schedule_id, paused=paused, request_id=request_id))

    async def audit(self, *, run_id: str, principal: str, action: str, page_size: int,
                    page_token: str) -> rs.ListAuditEventsResponse:
        return await self._call(self._stub.ListAuditEvents, rs.ListAuditEventsRequest(
            run_id=run_id, principal=principal, action=action, page_size=page_size, page_token=page_token))

    async def create_schedule(self, name: str, spec: rs.ScheduleSpec, request_id: str) -> rs.CreateScheduleResponse:
        return await self._call(self._stub.CreateSchedule, rs.CreateScheduleRequest(
            name=name, spec=spec, request_id=request_id))

    async def keys(self, *, include_revoked: bool) -> list[rs.ApiKey]:
        keys: list[rs.ApiKey] = []
        token = ""
        for _ in range(100):
            reply = await self._call(self._stub.ListApiKeys, rs.ListApiKeysRequest(
                page_size=500, page_token=token, include_revoked=include_revoked))
            keys.extend(reply.keys)
            token = reply.next_page_token
            if not token:
                break
        return keys

    async def create_key(self, name: str, role: str, *, tenants: list[str], expires_in_s: int, reason: str,
                         request_id: str) -> rs.CreateApiKeyResponse:
        return await self._call(self._stub.CreateApiKey, rs.CreateApiKeyRequest(
            name=name, role=f"API_KEY_ROLE_{role.upper()}", tenants=tenants,
            expires_in_s=expires_in_s, request_id=request_id, note=rs.AuditNote(reason=reason)))

    async def revoke_key(self, key_id: str, *, reason: str, request_id: str) -> rs.ApiKey:
        return await self._call(self._stub.RevokeApiKey, rs.RevokeApiKeyRequest(
            key_id=key_id, request_id=request_id, note=rs.AuditNote(reason=reason)))

    async def set_limit(self, scope: str, name: str, value: str, *, tenant_id: str, subject: str, reason: str,
                        request_id: str) -> rs.FlowLimit:
        return await self._call(self._stub.SetLimit, rs.SetLimitRequest(
            scope=scope, tenant_id=tenant_id, subject=subject, name=name, value=value, request_id=request_id,
            note=rs.AuditNote(reason=reason)))
