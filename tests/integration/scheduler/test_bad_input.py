"""Bad input on every RPC of RunService and WorkService.

Each case starts from a request that the scheduler would accept (the control
tests below send each one unmodified to prove it) and breaks exactly one
thing: a missing field, a non-UUID id, invalid JSON, JSON that is not an
object, NaN, a number JSON can carry but JSON-the-spec cannot (1e400), a lone
surrogate, NUL characters PostgreSQL refuses, JSON nested too deep, an unknown
enum number, a value out of range, a payload over the configured size limit, a
bad page token, or a missing x-tenant-id header. The answer must be INVALID_ARGUMENT with an
ErrorInfo naming the field (UNAUTHENTICATED for the header), no stack trace
anywhere in the status, and no row changed in any table.

The refusal cases share one database with one set of runs (built once per
module): a refused call changes nothing, which is exactly what each case checks.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc
import pytest
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from support import TENANT, Stack, claim, eid, lease_ref, scheduler_stack, submit, tool_state

from shared.db import init_connection
from shared.errors import error_info
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.writes import MAX_JOURNAL_ENTRIES, WRITE_OPS

pytestmark = pytest.mark.integration

LIMIT = 2048  # max_payload_bytes for every stack in this module
SETTINGS = {"max_payload_bytes": LIMIT, "lease_duration_ms": 3_600_000}
S1, S2, TOOL = "refund.create/attempt-1", "refund.notify/attempt-1", "payments.refund"
REQ2 = {"order": 7, "notify": True}
INVALID = grpc.StatusCode.INVALID_ARGUMENT
TABLES = ("agent_runs", "agent_checkpoints", "tool_executions", "outbox", "runtime_counters", "run_journal",
          "agent_registry", "api_keys", "audit_log", "run_signals", "agent_schedules", "flow_limits")


# ---------------------------------------------------------------------- the runs every request refers to


@dataclass
class World:
    queued: str
    paused_human: str
    in_doubt: str
    running: ws.LeaseRef  # RUNNING, with the S2 tool decision checkpointed
    running_version: int
    waiting: ws.LeaseRef  # WAITING_TOOL on S1
    waiting_version: int
    page_token: str  # a real token, issued for ListRuns without filters
    key_id: str  # a live API key
    schedule_id: str = ""  # a yearly schedule (it never fires during a test)
    cancelled: str = ""  # CANCELLED: what RetryRun starts again


async def _leased(stack: Stack, agent: str, state: dict[str, Any], step_key: str) -> tuple[ws.LeaseRef, int]:
    await submit(stack, agent=agent)
    lease = await claim(stack, worker=f"w-{agent}", agents=(agent,))
    assert lease is not None
    ref = lease_ref(lease)
    saved = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=ref, expected_version=0, state_json=json.dumps(state), schema_version=1, step_key=step_key,
        event_id=eid()))
    return ref, saved.version


async def _begin(stack: Stack, ref: ws.LeaseRef, version: int, key: str) -> None:
    await stack.work.BeginToolCall(ws.BeginToolCallRequest(
        lease=ref, expected_version=version, step_key=S1, tool_name=TOOL, idempotency_key=key,
        request_json='{"order": 1}', execution_id=eid(), event_id=eid()))


async def build_world(stack: Stack) -> World:
    human, _ = await _leased(stack, "bi-human", {"cursor": 1}, S1)
    await stack.work.FinishRun(ws.FinishRunRequest(lease=human, expected_version=1,
                                                   outcome=ws.FINISH_OUTCOME_PAUSED_HUMAN, event_id=eid()))
    doubt, version = await _leased(stack, "bi-doubt", tool_state(S1, TOOL, {"order": 1}), S1)
    await _begin(stack, doubt, version, "k-doubt")
    await stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(lease=doubt, step_key=S1, error_code="timeout",
                                                               event_id=eid()))
    waiting, waiting_version = await _leased(stack, "bi-wait", tool_state(S1, TOOL, {"order": 1}), S1)
    await _begin(stack, waiting, waiting_version, "k-wait")
    running, running_version = await _leased(stack, "bi-run", tool_state(S2, TOOL, REQ2), S2)
    queued = await submit(stack, agent="bi-queued")
    cancelled = await submit(stack, agent="bi-cancelled")
    await stack.runs.CancelRun(rs.CancelRunRequest(run_id=cancelled.run_id), metadata=stack.md())
    page = await stack.runs.ListRuns(rs.ListRunsRequest(page_size=1), metadata=stack.md())
    assert page.next_page_token
    key = await stack.runs.CreateApiKey(rs.CreateApiKeyRequest(name="existing", role=rs.API_KEY_ROLE_VIEWER),
                                        metadata=stack.md())
    schedule = await stack.runs.CreateSchedule(rs.CreateScheduleRequest(
        name="bi-yearly", spec=rs.ScheduleSpec(agent_name="bi-queued", cron="0 0 1 1 *")), metadata=stack.md())
    return World(key_id=key.key.key_id, queued=queued.run_id, paused_human=human.run_id, in_doubt=doubt.run_id,
                 running=running, running_version=running_version, waiting=waiting, waiting_version=waiting_version,
                 page_token=page.next_page_token, schedule_id=schedule.schedule.schedule_id,
                 cancelled=cancelled.run_id)


# ---------------------------------------------------------------------- requests the scheduler accepts


def _spec() -> rs.ScheduleSpec:
    return rs.ScheduleSpec(agent_name="bi-new", agent_version="1", input_json='{"n": 1}', labels={"team": "a"},
                           cron="0 6 1 1 *", time_zone="Europe/Paris", overlap=rs.SCHEDULE_OVERLAP_SKIP,
                           catch_up_window_ms=60_000, jitter_ms=1000)


def base_request(rpc: str, w: World) -> Message:
    if rpc == "SubmitRun":
        return rs.SubmitRunRequest(agent_name="bi-new", agent_version="1.0", input_json='{"n": 1}',
                                   client_request_id="req-1", max_attempts=3, labels={"team": "a"},
                                   budget=pb.Budget(max_steps=10, max_tokens=1000, max_cost_usd=1.5,
                                                    deadline=Timestamp(seconds=4_102_444_800)))
    if rpc == "GetRun":
        return rs.GetRunRequest(run_id=w.queued)
    if rpc == "ListRuns":
        return rs.ListRunsRequest(statuses=[pb.RUN_STATUS_QUEUED], agent_name="bi-queued", page_size=10,
                                  min_priority=1, max_priority=9, created_after=Timestamp(seconds=1_700_000_000),
                                  created_before=Timestamp(seconds=4_102_444_800))
    if rpc == "CancelRun":
        return rs.CancelRunRequest(run_id=w.queued, reason="no longer needed")
    if rpc == "RetryRun":
        return rs.RetryRunRequest(run_id=w.cancelled, request_id="retry-1", note=rs.AuditNote(reason="try again"))
    if rpc == "CreateSchedule":
        return rs.CreateScheduleRequest(name="bi-new", spec=_spec())
    if rpc == "UpdateSchedule":
        return rs.UpdateScheduleRequest(schedule_id=w.schedule_id, spec=_spec())
    if rpc == "PauseSchedule":
        return rs.PauseScheduleRequest(schedule_id=w.schedule_id, paused=True)
    if rpc == "DeleteSchedule":
        return rs.DeleteScheduleRequest(schedule_id=w.schedule_id)
    if rpc == "ListSchedules":
        return rs.ListSchedulesRequest()
    if rpc == "SignalRun":
        return rs.SignalRunRequest(run_id=w.queued, name="customer.reply", payload_json='{"text": "yes"}',
                                   request_id="sig-1")
    if rpc == "ResumeRun":
        return rs.ResumeRunRequest(run_id=w.paused_human, decision=rs.RESUME_DECISION_APPROVE, operator="alice",
                                   input_json='{"approved": true}', comment="looks right")
    if rpc == "ResolveToolExecution":
        return rs.ResolveToolExecutionRequest(
            run_id=w.in_doubt, step_key=S1, outcome=rs.RESOLUTION_OUTCOME_SUCCEEDED, result_json='{"refund": "r1"}',
            remote_resource_id="r1", evidence_json='{"lookup": "found r1"}', resolved_by="reconciler",
            rule_version="v1", event_id=eid())
    if rpc == "GetRunHistory":
        return rs.GetRunHistoryRequest(run_id=w.queued)
    if rpc == "GetStats":
        return rs.GetStatsRequest()
    if rpc == "ListAgents":
        return rs.ListAgentsRequest()
    if rpc == "ListAuditEvents":
        return rs.ListAuditEventsRequest(run_id=w.queued, principal="anonymous", action="run.cancel", page_size=10,
                                         since=Timestamp(seconds=1_700_000_000))
    if rpc == "CreateApiKey":
        return rs.CreateApiKeyRequest(name="ci-bot", tenants=[TENANT], role=rs.API_KEY_ROLE_SUBMITTER,
                                      expires_in_s=3600, note=rs.AuditNote(reason="ci", ticket_id="OPS-1"))
    if rpc == "ListApiKeys":
        return rs.ListApiKeysRequest(page_size=10, include_revoked=True)
    if rpc == "RevokeApiKey":
        return rs.RevokeApiKeyRequest(key_id=w.key_id, note=rs.AuditNote(reason="rotated"))
    if rpc == "SetLimit":
        return rs.SetLimitRequest(scope="tool", subject="t.one", name="rate", value="10/s",
                                  note=rs.AuditNote(reason="provider quota"))
    if rpc == "ClearLimit":
        return rs.ClearLimitRequest(scope="tool", subject="t.one", name="rate", note=rs.AuditNote(reason="over"))
    if rpc == "ListLimits":
        return rs.ListLimitsRequest()
    if rpc == "RegisterAgents":
        return ws.RegisterAgentsRequest(worker_id="w-new", ttl_ms=30_000, agents=[ws.AgentRegistration(
            name="bi-reg", version="1", input_schema_json='{"type": "object"}', tool_names=["t.one"])])
    if rpc == "ClaimWork":
        return ws.ClaimWorkRequest(worker_id="w-new", agents=["bi-queued"], wait_ms=0)
    if rpc == "Heartbeat":
        return ws.HeartbeatRequest(lease=w.running)
    if rpc == "SaveCheckpoint":
        return ws.SaveCheckpointRequest(lease=w.running, expected_version=w.running_version,
                                        state_json='{"cursor": 2}', schema_version=1, step_key="next/1",
                                        event_id=eid(), event_type="agent.progress", event_payload_json='{"p": 1}')
    if rpc == "BeginToolCall":
        return ws.BeginToolCallRequest(lease=w.running, expected_version=w.running_version, step_key=S2,
                                       tool_name=TOOL, idempotency_key="k-run", request_json=json.dumps(REQ2),
                                       execution_id=eid(), event_id=eid())
    if rpc == "CompleteToolCall":
        return ws.CompleteToolCallRequest(lease=w.waiting, expected_version=w.waiting_version, step_key=S1,
                                          outcome=ws.TOOL_OUTCOME_SUCCEEDED, response_json='{"refund": "r2"}',
                                          remote_resource_id="r2", state_json='{"cursor": 3}', schema_version=1,
                                          next_step_key="next/1", event_id=eid())
    if rpc == "CompleteAndBeginToolCall":
        state = tool_state(S2, TOOL, REQ2, tool_results={S1: {"status": "SUCCEEDED"}})
        return ws.CompleteAndBeginToolCallRequest(
            lease=w.waiting, expected_version=w.waiting_version, step_key=S1, outcome=ws.TOOL_OUTCOME_SUCCEEDED,
            response_json='{"refund": "r3"}', remote_resource_id="r3", state_json=json.dumps(state),
            schema_version=1, event_id=eid(),
            next=ws.NextToolCall(step_key=S2, tool_name=TOOL, idempotency_key="k-next", request_json=json.dumps(REQ2),
                                 execution_id=eid(), event_id=eid()))
    if rpc == "MarkToolInDoubt":
        return ws.MarkToolInDoubtRequest(lease=w.waiting, step_key=S1, error_code="timeout", detail="read timed out",
                                         event_id=eid())
    if rpc == "FinishRun":
        return ws.FinishRunRequest(lease=w.running, expected_version=w.running_version,
                                   outcome=ws.FINISH_OUTCOME_COMPLETED, reason="done", result_json='{"ok": true}',
                                   event_id=eid(), error_class="none")
    if rpc == "WriteBatch":
        return ws.WriteBatchRequest(items=[ws.WriteBatchItem(heartbeat=ws.HeartbeatRequest(lease=w.running))])
    if rpc == "ReadJournal":
        return ws.ReadJournalRequest(lease=w.running, after_seq=0, page_size=10)
    if rpc == "GetToolResults":
        return ws.GetToolResultsRequest(lease=w.waiting, step_keys=[S1, S2])
    if rpc == "GetRunTree":
        return rs.GetRunTreeRequest(run_id=w.queued, max_runs=10)
    if rpc == "SpawnChildren":
        return ws.SpawnChildrenRequest(lease=w.running, spawn_key="fan/attempt-1", join=ws.JOIN_MODE_ALL, children=[
            ws.ChildSpec(agent_name="bi-child", agent_version="1", input_json='{"n": 1}', labels={"team": "a"},
                         budget=pb.Budget(max_steps=5, max_tokens=100, max_cost_usd=0.5))])
    raise AssertionError(rpc)


RUN_RPCS = ("SubmitRun", "GetRun", "ListRuns", "CancelRun", "RetryRun", "SignalRun", "ResumeRun",
            "ResolveToolExecution", "GetRunHistory", "GetStats", "CreateSchedule", "UpdateSchedule", "PauseSchedule",
            "DeleteSchedule", "ListSchedules", "ListAgents", "ListAuditEvents", "CreateApiKey", "ListApiKeys",
            "RevokeApiKey", "GetRunTree", "SetLimit", "ClearLimit", "ListLimits")
# Scoped by the credential's tenants, not by the header (SetLimit / ClearLimit: a '*' credential).
KEY_RPCS = ("CreateApiKey", "ListApiKeys", "RevokeApiKey", "SetLimit", "ClearLimit")
WORK_RPCS = ("ClaimWork", "Heartbeat", "SaveCheckpoint", "BeginToolCall", "CompleteToolCall", "MarkToolInDoubt",
             "FinishRun", "CompleteAndBeginToolCall", "WriteBatch", "ReadJournal", "GetToolResults", "RegisterAgents",
             "SpawnChildren")
WRITES = WORK_RPCS[1:-5]  # the fenced ones
HOLDER_READS = ("ReadJournal", "GetToolResults")  # reads for the live lease holder only
# A fenced write's single call -> its WriteBatchItem field.
ITEM_OPS = {method: op for op, method in WRITE_OPS.items()}
MISSING = object()  # header absent


async def call(stack: Stack, rpc: str, request: Message, tenant: Any = TENANT) -> Any:
    if rpc in RUN_RPCS:
        metadata = [] if tenant is MISSING else [("x-tenant-id", tenant)]
        return await getattr(stack.runs, rpc)(request, metadata=metadata, timeout=30)
    return await getattr(stack.work, rpc)(request, timeout=30)


# ---------------------------------------------------------------------- the bad cases

CLEAR = object()


def put(**changes: Any) -> Callable[[Message], None]:
    """Mutation of a request: `lease__run_id="x"` sets request.lease.run_id; CLEAR clears a field."""
    def mutate(request: Message) -> None:
        for key, value in changes.items():
            *path, name = key.split("__")
            target = request
            for part in path:
                target = getattr(target, part)
            if value is CLEAR:
                target.ClearField(name)
            elif isinstance(value, list):
                del getattr(target, name)[:]
                getattr(target, name).extend(value)
            elif isinstance(value, dict):
                getattr(target, name).clear()
                getattr(target, name).update(value)
            elif isinstance(value, Message):
                getattr(target, name).CopyFrom(value)
            else:
                setattr(target, name, value)
    return mutate


@dataclass(frozen=True)
class Bad:
    rpc: str
    what: str
    mutate: Callable[[Message], None]
    field: str | None  # the ErrorInfo "field"; None for UNAUTHENTICATED
    tenant: Any = TENANT
    code: grpc.StatusCode = INVALID

    @property
    def id(self) -> str:
        return f"{self.rpc}-{self.what}"


OVERSIZED = json.dumps({"blob": "x" * (LIMIT + 1)})
# Text that is not acceptable JSON for any *_json field: (label, text).
BROKEN_JSON = [
    ("invalid", '{"a": '),
    ("NaN", '{"a": NaN}'),
    ("Infinity", '{"a": -Infinity}'),
    ("overflowing number", '{"a": 1e400}'),
    ("lone surrogate", '{"a": "\\ud800"}'),
    ("NUL", '{"a": "x\\u0000y"}'),
    ("oversized", OVERSIZED),
    # Nested past validate.MAX_JSON_DEPTH (128): refused before decoding, never a RecursionError.
    ("nested 129 deep", '{"a": ' + "[" * 128 + "]" * 128 + "}"),
    ("nested 980 deep", '{"a": ' + "[" * 979 + "]" * 979 + "}"),
    ("NUL 400 deep", '{"a": ' + "[" * 399 + '"\\u0000"' + "]" * 399 + "}"),
]


def json_cases(rpc: str, field: str, *, object_only: bool = True, required: bool = False) -> list[Bad]:
    key = field.replace(".", "__")
    cases = [Bad(rpc, f"{field} {label}", put(**{key: text}), field) for label, text in BROKEN_JSON]
    if object_only:
        cases += [Bad(rpc, f"{field} array", put(**{key: "[1, 2]"}), field),
                  Bad(rpc, f"{field} string", put(**{key: '"text"'}), field),
                  Bad(rpc, f"{field} null", put(**{key: "null"}), field)]
    if required:
        cases.append(Bad(rpc, f"{field} missing", put(**{key: CLEAR}), field))
    return cases


def uuid_cases(rpc: str, field: str, *, required: bool = True) -> list[Bad]:
    key = field.replace(".", "__")
    cases = [Bad(rpc, f"{field} not a UUID", put(**{key: "run-42"}), field),
             Bad(rpc, f"{field} an integer", put(**{key: "42"}), field)]
    if required:
        cases.append(Bad(rpc, f"{field} missing", put(**{key: CLEAR}), field))
    return cases


def nul_case(rpc: str, field: str) -> Bad:
    return Bad(rpc, f"{field} with NUL", put(**{field.replace(".", "__"): "a\x00b"}), field)


def enum_cases(rpc: str, field: str) -> list[Bad]:
    key = field.replace(".", "__")
    return [Bad(rpc, f"{field} unknown number", put(**{key: 99}), field),
            Bad(rpc, f"{field} unspecified", put(**{key: 0}), field)]


def journal_cases(rpc: str) -> list[Bad]:
    """Bad journal entries on a checkpoint-writing call (the request is valid without them)."""
    valid = {"seq": 1, "kind": "tool", "step_key": "s/1", "detail_json": '{"n": 1}'}

    def entries(*changes: dict[str, Any]) -> Callable[[Message], None]:
        return put(journal=[pb.JournalEntry(**{**valid, **change}) for change in changes])

    return [
        Bad(rpc, "journal seq zero", entries({"seq": 0}), "journal[0].seq"),
        Bad(rpc, "journal seq negative", entries({"seq": -4}), "journal[0].seq"),
        Bad(rpc, "journal seqs not consecutive", entries({}, {"seq": 3}), "journal[1].seq"),
        Bad(rpc, "journal seq repeated", entries({}, {}), "journal[1].seq"),
        Bad(rpc, "journal not continuing the run's", entries({"seq": 2}), "journal[0].seq"),
        Bad(rpc, "journal kind unknown", entries({"kind": "nope"}), "journal[0].kind"),
        Bad(rpc, "journal kind missing", entries({"kind": ""}), "journal[0].kind"),
        Bad(rpc, "journal step_key with newline", entries({}, {"seq": 2, "step_key": "a\nb"}), "journal[1].step_key"),
        Bad(rpc, "journal step_key too long", entries({"step_key": "s" * 401}), "journal[0].step_key"),
        Bad(rpc, "journal node too long", entries({"node": "n" * 201}), "journal[0].node"),
        Bad(rpc, "journal tool with NUL", entries({"tool": "a\x00b"}), "journal[0].tool"),
        Bad(rpc, "journal too many entries",
            put(journal=[pb.JournalEntry(seq=n, kind="tool") for n in range(1, MAX_JOURNAL_ENTRIES + 2)]),
            "journal"),
        *[Bad(rpc, f"journal detail_json {label}", entries({"detail_json": text}), "journal[0].detail_json")
          for label, text in [*BROKEN_JSON, ("array", "[1]"), ("string", '"text"'), ("null", "null")]],
    ]


def spec_cases(rpc: str) -> list[Bad]:
    """Bad schedule specs (CreateSchedule, UpdateSchedule)."""
    return [
        Bad(rpc, "spec agent_name missing", put(spec__agent_name=CLEAR), "spec.agent_name"),
        Bad(rpc, "spec agent_name with spaces", put(spec__agent_name="my agent"), "spec.agent_name"),
        *json_cases(rpc, "spec.input_json"),
        Bad(rpc, "spec neither interval nor cron", put(spec__cron=CLEAR), "spec.interval_ms"),
        Bad(rpc, "spec both interval and cron", put(spec__interval_ms=5000), "spec.interval_ms"),
        Bad(rpc, "spec interval under a second", put(spec__cron=CLEAR, spec__time_zone=CLEAR, spec__interval_ms=999),
            "spec.interval_ms"),
        Bad(rpc, "spec time_zone with an interval", put(spec__cron=CLEAR, spec__interval_ms=5000),
            "spec.time_zone"),
        Bad(rpc, "spec cron with four fields", put(spec__cron="0 6 1 1"), "spec.cron"),
        Bad(rpc, "spec cron minute 60", put(spec__cron="60 6 1 1 *"), "spec.cron"),
        Bad(rpc, "spec cron 31 February", put(spec__cron="0 0 31 2 *"), "spec.cron"),
        Bad(rpc, "spec cron with NUL", put(spec__cron="0 0\x00 1 1 *"), "spec.cron"),
        Bad(rpc, "spec time_zone unknown", put(spec__time_zone="Mars/Olympus"), "spec.time_zone"),
        *enum_cases(rpc, "spec.overlap")[:1],
        Bad(rpc, "spec catch_up_window_ms negative", put(spec__catch_up_window_ms=-1), "spec.catch_up_window_ms"),
        Bad(rpc, "spec jitter_ms over an hour", put(spec__jitter_ms=3_600_001), "spec.jitter_ms"),
        Bad(rpc, "spec too many labels", put(spec__labels={f"k{i}": "v" for i in range(65)}), "spec.labels"),
    ]


def with_end(case: Bad) -> Bad:
    """`case` on a CompleteToolCall that also ends the run (a valid `end` first, then the breakage)."""
    def mutate(request: Message) -> None:
        request.end.CopyFrom(ws.RunEnd(outcome=ws.FINISH_OUTCOME_COMPLETED, result_json='{"ok": true}',
                                       event_id=eid()))
        case.mutate(request)

    return Bad(case.rpc, f"with end: {case.what}", mutate, case.field, case.tenant, case.code)


def token(data: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode()


NO_FILTER = json.dumps([None, None])
SAME_ID = "0190a8c2-0000-7000-8000-000000000001"
ISO = "2026-01-01T00:00:00+00:00"

CASES: list[Bad] = [
    # ---- RunService: every call needs the tenant header
    *[Bad(rpc, "no tenant header", lambda r: None, None, tenant=MISSING, code=grpc.StatusCode.UNAUTHENTICATED)
      for rpc in RUN_RPCS if rpc not in KEY_RPCS],
    *[Bad(rpc, "malformed tenant", lambda r: None, "x-tenant-id", tenant="bad tenant!")
      for rpc in ("SubmitRun", "GetRun", "ResolveToolExecution", "GetStats")],
    # ---- SubmitRun
    Bad("SubmitRun", "agent_name missing", put(agent_name=CLEAR), "agent_name"),
    Bad("SubmitRun", "agent_name with spaces", put(agent_name="my agent"), "agent_name"),
    Bad("SubmitRun", "agent_name too long", put(agent_name="a" * 201), "agent_name"),
    Bad("SubmitRun", "agent_version too long", put(agent_version="v" * 101), "agent_version"),
    nul_case("SubmitRun", "agent_version"),
    Bad("SubmitRun", "client_request_id too long", put(client_request_id="c" * 201), "client_request_id"),
    nul_case("SubmitRun", "client_request_id"),
    *json_cases("SubmitRun", "input_json"),
    Bad("SubmitRun", "max_attempts negative", put(max_attempts=-1), "max_attempts"),
    Bad("SubmitRun", "max_attempts too large", put(max_attempts=1001), "max_attempts"),
    Bad("SubmitRun", "max_steps negative", put(budget__max_steps=-1), "budget.max_steps"),
    Bad("SubmitRun", "max_tokens negative", put(budget__max_tokens=-5), "budget.max_tokens"),
    Bad("SubmitRun", "max_cost_usd negative", put(budget__max_cost_usd=-0.5), "budget.max_cost_usd"),
    Bad("SubmitRun", "max_cost_usd NaN", put(budget__max_cost_usd=math.nan), "budget.max_cost_usd"),
    Bad("SubmitRun", "max_cost_usd infinite", put(budget__max_cost_usd=math.inf), "budget.max_cost_usd"),
    Bad("SubmitRun", "deadline past year 9999", put(budget__deadline=Timestamp(seconds=10**12)), "budget.deadline"),
    Bad("SubmitRun", "deadline negative nanos", put(budget__deadline=Timestamp(seconds=1, nanos=-1)),
        "budget.deadline"),
    Bad("SubmitRun", "too many labels", put(labels={f"k{i}": "v" for i in range(65)}), "labels"),
    Bad("SubmitRun", "label key too long", put(labels={"k" * 101: "v"}), "labels"),
    Bad("SubmitRun", "label value with NUL", put(labels={"k": "v\x00"}), "labels"),
    Bad("SubmitRun", "priority negative", put(priority=-1), "priority"),
    Bad("SubmitRun", "priority too high", put(priority=10), "priority"),
    # ---- GetRun, GetRunHistory, CancelRun: the run id
    *uuid_cases("GetRun", "run_id"),
    *uuid_cases("GetRunHistory", "run_id"),
    Bad("GetRun", "reveal with a note.reason too long", put(reveal=True, note__reason="r" * 1001), "note.reason"),
    Bad("GetRunHistory", "reveal with a note.ticket_id too long", put(reveal=True, note__ticket_id="t" * 201),
        "note.ticket_id"),
    *uuid_cases("CancelRun", "run_id"),
    Bad("CancelRun", "reason too long", put(reason="r" * 1001), "reason"),
    nul_case("CancelRun", "reason"),
    # ---- RetryRun
    *uuid_cases("RetryRun", "run_id"),
    Bad("RetryRun", "request_id too long", put(request_id="r" * 201), "request_id"),
    Bad("RetryRun", "note.reason too long", put(note__reason="r" * 1001), "note.reason"),
    nul_case("RetryRun", "note.comment"),
    # ---- Schedules
    *[case for rpc in ("CreateSchedule", "UpdateSchedule") for case in spec_cases(rpc)],
    Bad("CreateSchedule", "name missing", put(name=CLEAR), "name"),
    Bad("CreateSchedule", "name with spaces", put(name="my schedule"), "name"),
    *[case for rpc in ("UpdateSchedule", "PauseSchedule", "DeleteSchedule") for case in uuid_cases(rpc, "schedule_id")],
    # ---- SignalRun
    *uuid_cases("SignalRun", "run_id"),
    Bad("SignalRun", "name missing", put(name=CLEAR), "name"),
    Bad("SignalRun", "name with spaces", put(name="customer reply"), "name"),
    Bad("SignalRun", "name too long", put(name="n" * 201), "name"),
    *json_cases("SignalRun", "payload_json", object_only=False),
    Bad("SignalRun", "request_id too long", put(request_id="r" * 201), "request_id"),
    nul_case("SignalRun", "request_id"),
    # ---- ListRuns
    Bad("ListRuns", "unknown status number", put(statuses=[42]), "statuses"),
    Bad("ListRuns", "unspecified status", put(statuses=[pb.RUN_STATUS_QUEUED, 0]), "statuses"),
    Bad("ListRuns", "agent_name with spaces", put(agent_name="my agent"), "agent_name"),
    Bad("ListRuns", "page_size negative", put(page_size=-1), "page_size"),
    Bad("ListRuns", "page_size too large", put(page_size=501), "page_size"),
    Bad("ListRuns", "min_priority too high", put(min_priority=10), "min_priority"),
    Bad("ListRuns", "max_priority negative", put(max_priority=-1), "max_priority"),
    Bad("ListRuns", "min_priority above max_priority", put(min_priority=6, max_priority=3), "min_priority"),
    Bad("ListRuns", "created_after out of range", put(created_after__seconds=10**12), "created_after"),
    Bad("ListRuns", "created_before not after created_after",
        put(created_after=Timestamp(seconds=1_800_000_000), created_before=Timestamp(seconds=1_800_000_000)),
        "created_before"),
    Bad("ListRuns", "too many labels", put(labels={f"k{i}": "v" for i in range(65)}), "labels"),
    Bad("ListRuns", "label value with NUL", put(labels={"k": "v\x00"}), "labels"),
    Bad("ListRuns", "tenant_id with spaces", put(tenant_id="a tenant"), "tenant_id"),
    Bad("ListRuns", "page_token garbage", put(page_token="!!not base64!!"), "page_token"),
    Bad("ListRuns", "page_token not JSON", put(page_token=base64.urlsafe_b64encode(b"\xff\x00").decode()),
        "page_token"),
    Bad("ListRuns", "page_token JSON list", put(page_token=token([1, 2])), "page_token"),
    Bad("ListRuns", "page_token missing keys", put(page_token=token({"c": ISO})), "page_token"),
    Bad("ListRuns", "page_token integer id", put(page_token=token({"c": ISO, "i": 42, "f": NO_FILTER}),
                                                  statuses=[], agent_name=""), "page_token"),
    Bad("ListRuns", "page_token time out of range",
        put(page_token=token({"c": "9999-12-31T23:59:59-14:00", "i": str(uuid.uuid4()), "f": NO_FILTER}),
            statuses=[], agent_name=""), "page_token"),
    # ---- ResumeRun
    *uuid_cases("ResumeRun", "run_id"),
    *enum_cases("ResumeRun", "decision"),
    Bad("ResumeRun", "operator too long", put(operator="o" * 201), "operator"),
    Bad("ResumeRun", "note.ticket_id too long", put(note__ticket_id="t" * 201), "note.ticket_id"),
    nul_case("ResumeRun", "note.reason"),
    # ---- the admin side: audit trail and keys
    *uuid_cases("ListAuditEvents", "run_id", required=False),
    nul_case("ListAuditEvents", "principal"),
    Bad("ListAuditEvents", "page_size negative", put(page_size=-1), "page_size"),
    Bad("ListAuditEvents", "page_size too large", put(page_size=501), "page_size"),
    Bad("ListAuditEvents", "page_token not ours", put(page_token="garbage"), "page_token"),
    Bad("ListAuditEvents", "since out of range", put(since__seconds=10**12), "since"),
    Bad("CreateApiKey", "name missing", put(name=CLEAR), "name"),
    nul_case("CreateApiKey", "name"),
    *enum_cases("CreateApiKey", "role"),
    Bad("CreateApiKey", "expires_in_s negative", put(expires_in_s=-5), "expires_in_s"),
    Bad("CreateApiKey", "tenant malformed", put(tenants=["bad tenant!"]), "tenants"),
    Bad("CreateApiKey", "several tenants for a submitter", put(tenants=[TENANT, "other"]), "tenants"),
    Bad("CreateApiKey", "note.comment too long", put(note__comment="c" * 2001), "note.comment"),
    Bad("ListApiKeys", "page_size too large", put(page_size=501), "page_size"),
    Bad("ListApiKeys", "page_token not ours", put(page_token="garbage"), "page_token"),
    *uuid_cases("RevokeApiKey", "key_id"),
    # ---- SetLimit / ClearLimit (ListLimits: the tenant header, above)
    *[case for rpc in ("SetLimit", "ClearLimit") for case in (
        Bad(rpc, "unknown scope", put(scope="tools"), "scope"),
        Bad(rpc, "scope empty", put(scope=""), "scope"),
        Bad(rpc, "name of another scope", put(name="max_running"), "name"),
        Bad(rpc, "tool without a subject", put(subject=""), "subject"),
        Bad(rpc, "subject with spaces", put(subject="a tool"), "subject"),
        Bad(rpc, "tool limit for tenant '*'", put(tenant_id="*"), "tenant_id"),
        Bad(rpc, "tenant limit with a subject", put(scope="tenant", name="max_running", tenant_id="t1"), "subject"),
        Bad(rpc, "agent limit of a tenant", put(scope="agent", name="max_running", tenant_id="t1"), "tenant_id"),
        nul_case(rpc, "note.reason"),
    )],
    Bad("SetLimit", "rate in words", put(value="ten a second"), "value"),
    Bad("SetLimit", "value empty", put(value=""), "value"),
    Bad("SetLimit", "negative count", put(name="concurrency", value="-1"), "value"),
    Bad("SetLimit", "fractional count", put(name="concurrency", value="1.5"), "value"),
    Bad("SetLimit", "count too large", put(name="concurrency", value="10000000000"), "value"),
    Bad("SetLimit", "weight zero", put(scope="tenant", name="weight", subject="", value="0"), "value"),
    Bad("SetLimit", "weight not a number", put(scope="tenant", name="weight", subject="", value="nan"), "value"),
    Bad("SetLimit", "weight of '*'", put(scope="tenant", name="weight", subject="", tenant_id="*", value="2"),
        "tenant_id"),
    nul_case("ResumeRun", "operator"),
    Bad("ResumeRun", "comment too long", put(comment="c" * 2001), "comment"),
    nul_case("ResumeRun", "comment"),
    *json_cases("ResumeRun", "input_json"),
    # ---- ResolveToolExecution
    *uuid_cases("ResolveToolExecution", "run_id"),
    *uuid_cases("ResolveToolExecution", "event_id", required=False),
    Bad("ResolveToolExecution", "step_key missing", put(step_key=CLEAR), "step_key"),
    Bad("ResolveToolExecution", "step_key with newline", put(step_key="a\nb"), "step_key"),
    Bad("ResolveToolExecution", "step_key too long", put(step_key="s" * 401), "step_key"),
    *enum_cases("ResolveToolExecution", "outcome"),
    *json_cases("ResolveToolExecution", "result_json", object_only=False, required=True),
    *json_cases("ResolveToolExecution", "evidence_json", required=True),
    Bad("ResolveToolExecution", "resolved_by missing", put(resolved_by=CLEAR), "resolved_by"),
    nul_case("ResolveToolExecution", "resolved_by"),
    nul_case("ResolveToolExecution", "rule_version"),
    Bad("ResolveToolExecution", "remote_resource_id too long", put(remote_resource_id="r" * 501),
        "remote_resource_id"),
    nul_case("ResolveToolExecution", "remote_resource_id"),
    # ---- ClaimWork
    Bad("ClaimWork", "worker_id missing", put(worker_id=CLEAR), "worker_id"),
    nul_case("ClaimWork", "worker_id"),
    Bad("ClaimWork", "agents empty", put(agents=[]), "agents"),
    Bad("ClaimWork", "agent name with spaces", put(agents=["bi-queued", "my agent"]), "agents"),
    Bad("ClaimWork", "wait_ms negative", put(wait_ms=-1), "wait_ms"),
    # ---- every fenced write: the lease
    *[case for rpc in (*WRITES, *HOLDER_READS, "SpawnChildren") for case in [
        Bad(rpc, "lease missing", put(lease=CLEAR), "lease.run_id"),
        *uuid_cases(rpc, "lease.run_id"),
        Bad(rpc, "lease.worker_id missing", put(lease__worker_id=CLEAR), "lease.worker_id"),
        nul_case(rpc, "lease.worker_id"),
        Bad(rpc, "lease.fencing_token zero", put(lease__fencing_token=0), "lease.fencing_token"),
        Bad(rpc, "lease.fencing_token negative", put(lease__fencing_token=-3), "lease.fencing_token"),
    ]],
    *[case for rpc in ("SaveCheckpoint", "BeginToolCall", "CompleteToolCall", "MarkToolInDoubt", "FinishRun",
                       "CompleteAndBeginToolCall")
      for case in uuid_cases(rpc, "event_id")],
    *[Bad(rpc, "expected_version negative", put(expected_version=-1), "expected_version")
      for rpc in ("SaveCheckpoint", "BeginToolCall", "CompleteToolCall", "FinishRun", "CompleteAndBeginToolCall")],
    # ---- SaveCheckpoint
    *json_cases("SaveCheckpoint", "state_json", required=True),
    *json_cases("SaveCheckpoint", "event_payload_json"),
    Bad("SaveCheckpoint", "schema_version zero", put(schema_version=0), "schema_version"),
    Bad("SaveCheckpoint", "step_key with control char", put(step_key="a\x01"), "step_key"),
    Bad("SaveCheckpoint", "event_type with spaces", put(event_type="my event"), "event_type"),
    Bad("SaveCheckpoint", "consume_signal_seqs repeated", put(consume_signal_seqs=[1, 1]), "consume_signal_seqs"),
    Bad("SaveCheckpoint", "consume_signal_seqs not positive", put(consume_signal_seqs=[0]), "consume_signal_seqs"),
    Bad("SaveCheckpoint", "consume_signal_seqs unknown", put(consume_signal_seqs=[10**12]), "consume_signal_seqs"),
    # ---- BeginToolCall
    Bad("BeginToolCall", "step_key missing", put(step_key=CLEAR), "step_key"),
    Bad("BeginToolCall", "tool_name missing", put(tool_name=CLEAR), "tool_name"),
    Bad("BeginToolCall", "tool_name with spaces", put(tool_name="pay ments"), "tool_name"),
    Bad("BeginToolCall", "idempotency_key missing", put(idempotency_key=CLEAR), "idempotency_key"),
    Bad("BeginToolCall", "idempotency_key too long", put(idempotency_key="k" * 401), "idempotency_key"),
    nul_case("BeginToolCall", "idempotency_key"),
    *uuid_cases("BeginToolCall", "execution_id"),
    *json_cases("BeginToolCall", "request_json", required=True),
    # ---- CompleteToolCall
    Bad("CompleteToolCall", "step_key missing", put(step_key=CLEAR), "step_key"),
    *enum_cases("CompleteToolCall", "outcome"),
    *json_cases("CompleteToolCall", "state_json", required=True),
    *json_cases("CompleteToolCall", "response_json", object_only=False),
    *json_cases("CompleteToolCall", "evidence_json"),
    Bad("CompleteToolCall", "NOT_EXECUTED without evidence", put(outcome=ws.TOOL_OUTCOME_NOT_EXECUTED),
        "evidence_json"),
    Bad("CompleteToolCall", "schema_version zero", put(schema_version=0), "schema_version"),
    Bad("CompleteToolCall", "next_step_key with newline", put(next_step_key="a\nb"), "next_step_key"),
    nul_case("CompleteToolCall", "error_code"),
    nul_case("CompleteToolCall", "remote_resource_id"),
    # ---- CompleteAndBeginToolCall: Tx2's fields, then the next step's Tx1 fields under `next`
    Bad("CompleteAndBeginToolCall", "step_key missing", put(step_key=CLEAR), "step_key"),
    Bad("CompleteAndBeginToolCall", "step_key too long", put(step_key="s" * 401), "step_key"),
    *enum_cases("CompleteAndBeginToolCall", "outcome"),
    Bad("CompleteAndBeginToolCall", "outcome NOT_EXECUTED", put(outcome=ws.TOOL_OUTCOME_NOT_EXECUTED), "outcome"),
    *json_cases("CompleteAndBeginToolCall", "state_json", required=True),
    *json_cases("CompleteAndBeginToolCall", "response_json", object_only=False),
    *json_cases("CompleteAndBeginToolCall", "evidence_json"),
    Bad("CompleteAndBeginToolCall", "schema_version zero", put(schema_version=0), "schema_version"),
    nul_case("CompleteAndBeginToolCall", "error_code"),
    nul_case("CompleteAndBeginToolCall", "remote_resource_id"),
    Bad("CompleteAndBeginToolCall", "remote_resource_id too long", put(remote_resource_id="r" * 501),
        "remote_resource_id"),
    Bad("CompleteAndBeginToolCall", "next missing", put(next=CLEAR), "next.step_key"),
    Bad("CompleteAndBeginToolCall", "next.step_key missing", put(next__step_key=CLEAR), "next.step_key"),
    Bad("CompleteAndBeginToolCall", "next.step_key with newline", put(next__step_key="a\nb"), "next.step_key"),
    Bad("CompleteAndBeginToolCall", "next.step_key is the completed step", put(next__step_key=S1), "next.step_key"),
    Bad("CompleteAndBeginToolCall", "next.tool_name missing", put(next__tool_name=CLEAR), "next.tool_name"),
    Bad("CompleteAndBeginToolCall", "next.tool_name with spaces", put(next__tool_name="pay ments"),
        "next.tool_name"),
    Bad("CompleteAndBeginToolCall", "next.idempotency_key missing", put(next__idempotency_key=CLEAR),
        "next.idempotency_key"),
    Bad("CompleteAndBeginToolCall", "next.idempotency_key too long", put(next__idempotency_key="k" * 401),
        "next.idempotency_key"),
    nul_case("CompleteAndBeginToolCall", "next.idempotency_key"),
    *json_cases("CompleteAndBeginToolCall", "next.request_json", required=True),
    *uuid_cases("CompleteAndBeginToolCall", "next.execution_id"),
    *uuid_cases("CompleteAndBeginToolCall", "next.event_id"),
    Bad("CompleteAndBeginToolCall", "next.event_id same as event_id",
        put(event_id=SAME_ID, next__event_id=SAME_ID), "next.event_id"),
    # ---- MarkToolInDoubt
    Bad("MarkToolInDoubt", "step_key missing", put(step_key=CLEAR), "step_key"),
    Bad("MarkToolInDoubt", "error_code missing", put(error_code=CLEAR), "error_code"),
    nul_case("MarkToolInDoubt", "error_code"),
    Bad("MarkToolInDoubt", "detail too long", put(detail="d" * 4001), "detail"),
    nul_case("MarkToolInDoubt", "detail"),
    # ---- FinishRun
    *enum_cases("FinishRun", "outcome"),
    *json_cases("FinishRun", "result_json", object_only=False),
    Bad("FinishRun", "sleep_ms without SLEEP", put(sleep_ms=1000), "sleep_ms"),
    Bad("FinishRun", "SLEEP without sleep_ms", put(outcome=ws.FINISH_OUTCOME_SLEEP), "sleep_ms"),
    Bad("FinishRun", "SLEEP over a year", put(outcome=ws.FINISH_OUTCOME_SLEEP, sleep_ms=10**12), "sleep_ms"),
    Bad("FinishRun", "reason too long", put(reason="r" * 4001), "reason"),
    Bad("FinishRun", "wait_signal without SLEEP", put(wait_signal="go"), "wait_signal"),
    Bad("FinishRun", "wait_signal with spaces", put(outcome=ws.FINISH_OUTCOME_SLEEP, sleep_ms=1000, wait_signal="a b"),
        "wait_signal"),
    Bad("FinishRun", "signals_seen without wait_signal", put(signals_seen=3), "signals_seen"),
    Bad("FinishRun", "signals_seen negative",
        put(outcome=ws.FINISH_OUTCOME_SLEEP, sleep_ms=1000, wait_signal="go", signals_seen=-1), "signals_seen"),
    nul_case("FinishRun", "reason"),
    nul_case("FinishRun", "error_class"),
    # ---- CompleteToolCall that ends the run
    *[with_end(case) for case in [
        *enum_cases("CompleteToolCall", "end.outcome"),
        Bad("CompleteToolCall", "end.outcome SLEEP", put(end__outcome=ws.FINISH_OUTCOME_SLEEP), "end.outcome"),
        Bad("CompleteToolCall", "end.outcome PAUSED_HUMAN", put(end__outcome=ws.FINISH_OUTCOME_PAUSED_HUMAN),
            "end.outcome"),
        *uuid_cases("CompleteToolCall", "end.event_id"),
        Bad("CompleteToolCall", "end.event_id same as event_id",
            lambda r: setattr(r.end, "event_id", r.event_id), "end.event_id"),
        *json_cases("CompleteToolCall", "end.result_json", object_only=False),
        Bad("CompleteToolCall", "end.reason too long", put(end__reason="r" * 4001), "end.reason"),
        nul_case("CompleteToolCall", "end.reason"),
        Bad("CompleteToolCall", "end.error_class too long", put(end__error_class="e" * 101), "end.error_class"),
        Bad("CompleteToolCall", "end with NOT_EXECUTED",
            put(outcome=ws.TOOL_OUTCOME_NOT_EXECUTED, evidence_json='{"lookup": "not_found"}'), "end"),
    ]],
    # ---- journal entries on the checkpoint-writing calls
    *[case for rpc in ("SaveCheckpoint", "CompleteToolCall", "CompleteAndBeginToolCall")
      for case in journal_cases(rpc)],
    Bad("CompleteToolCall", "journal with NOT_EXECUTED",
        put(outcome=ws.TOOL_OUTCOME_NOT_EXECUTED, evidence_json='{"lookup": "not_found"}',
            journal=[pb.JournalEntry(seq=1, kind="result")]), "journal"),
    # ---- ReadJournal and GetToolResults
    Bad("ReadJournal", "after_seq negative", put(after_seq=-1), "after_seq"),
    Bad("ReadJournal", "page_size negative", put(page_size=-1), "page_size"),
    Bad("ReadJournal", "page_size too large", put(page_size=5001), "page_size"),
    Bad("GetToolResults", "step_keys empty", put(step_keys=[]), "step_keys"),
    Bad("GetToolResults", "too many step_keys", put(step_keys=[f"s/{n}" for n in range(501)]), "step_keys"),
    Bad("GetToolResults", "step key with newline", put(step_keys=[S1, "a\nb"]), "step_keys"),
    Bad("GetToolResults", "step key empty", put(step_keys=[""]), "step_keys"),
    # ---- GetRunTree
    *uuid_cases("GetRunTree", "run_id"),
    Bad("GetRunTree", "max_runs negative", put(max_runs=-1), "max_runs"),
    Bad("GetRunTree", "max_runs too large", put(max_runs=10_001), "max_runs"),
    # ---- SpawnChildren
    Bad("SpawnChildren", "spawn_key missing", put(spawn_key=CLEAR), "spawn_key"),
    Bad("SpawnChildren", "spawn_key with newline", put(spawn_key="a\nb"), "spawn_key"),
    *enum_cases("SpawnChildren", "join"),
    Bad("SpawnChildren", "children empty", put(children=[]), "children"),
    Bad("SpawnChildren", "too many children", lambda r: r.children.extend([r.children[0]] * 100), "children"),
    Bad("SpawnChildren", "child agent missing", lambda r: r.children[0].ClearField("agent_name"),
        "children[0].agent_name"),
    Bad("SpawnChildren", "child agent with spaces", lambda r: setattr(r.children[0], "agent_name", "my agent"),
        "children[0].agent_name"),
    Bad("SpawnChildren", "second child input not JSON",
        lambda r: r.children.add(agent_name="bi-child", input_json="{"), "children[1].input_json"),
    Bad("SpawnChildren", "child input an array", lambda r: setattr(r.children[0], "input_json", "[1]"),
        "children[0].input_json"),
    Bad("SpawnChildren", "child label with NUL", lambda r: r.children[0].labels.update({"k": "v\x00"}),
        "children[0].labels"),
    Bad("SpawnChildren", "child max_steps negative", lambda r: setattr(r.children[0].budget, "max_steps", -1),
        "children[0].budget.max_steps"),
    Bad("SpawnChildren", "child max_cost_usd NaN", lambda r: setattr(r.children[0].budget, "max_cost_usd", math.nan),
        "children[0].budget.max_cost_usd"),
    Bad("SpawnChildren", "child deadline", lambda r: r.children[0].budget.deadline.FromSeconds(4_102_444_800),
        "children[0].budget.deadline"),
    # ---- RegisterAgents
    Bad("RegisterAgents", "worker_id missing", put(worker_id=CLEAR), "worker_id"),
    Bad("RegisterAgents", "ttl_ms too short", put(ttl_ms=999), "ttl_ms"),
    Bad("RegisterAgents", "ttl_ms too long", put(ttl_ms=3_600_001), "ttl_ms"),
    Bad("RegisterAgents", "agent name with spaces", lambda r: setattr(r.agents[0], "name", "my agent"),
        "agents[0].name"),
    Bad("RegisterAgents", "agent version missing", lambda r: r.agents[0].ClearField("version"), "agents[0].version"),
    Bad("RegisterAgents", "input schema not an object", lambda r: setattr(r.agents[0], "input_schema_json", "[1]"),
        "agents[0].input_schema_json"),
    Bad("RegisterAgents", "input schema not a schema",
        lambda r: setattr(r.agents[0], "input_schema_json", '{"type": "no-such-type"}'), "agents[0].input_schema_json"),
    Bad("RegisterAgents", "input schema not JSON", lambda r: setattr(r.agents[0], "input_schema_json", "{"),
        "agents[0].input_schema_json"),
    Bad("RegisterAgents", "tool name with spaces", lambda r: r.agents[0].tool_names.append("a tool"),
        "agents[0].tool_names"),
    Bad("RegisterAgents", "default priority too high", lambda r: setattr(r.agents[0], "default_priority", 10),
        "agents[0].default_priority"),
    Bad("RegisterAgents", "concurrency key with a bad placeholder",
        lambda r: setattr(r.agents[0], "concurrency_key", "${customer}"), "agents[0].concurrency_key"),
    Bad("RegisterAgents", "concurrency key without a max",
        lambda r: setattr(r.agents[0], "concurrency_key", "${input.customer_id}"), "agents[0].concurrency_max"),
    Bad("RegisterAgents", "concurrency max without a key", lambda r: setattr(r.agents[0], "concurrency_max", 2),
        "agents[0].concurrency_max"),
    Bad("RegisterAgents", "an agent version twice", lambda r: r.agents.append(r.agents[0]), "agents[1]"),
    # ---- WriteBatch (the call itself; its items are refused one by one: test_bad_batch_items_...)
    Bad("WriteBatch", "items empty", put(items=[]), "items"),
    Bad("WriteBatch", "too many items",
        lambda r: r.items.extend([r.items[0]] * 256), "items"),
]


def test_every_rpc_has_bad_cases():
    services = (rs.DESCRIPTOR.services_by_name["RunService"], ws.DESCRIPTOR.services_by_name["WorkService"])
    declared = {method.name for service in services for method in service.methods}
    assert declared == set(RUN_RPCS) | set(WORK_RPCS)
    assert {case.rpc for case in CASES} == declared
    assert len({case.id for case in CASES}) == len(CASES), "case ids must be unique"


# ---------------------------------------------------------------------- one database and world for the refusals


@pytest.fixture(scope="module")
def shared(pg_server_url: str, template_db: str) -> Iterator[tuple[str, World]]:
    name = f"agentrt_badin_{uuid.uuid4().hex[:12]}"
    url = f"{pg_server_url.rpartition('/')[0]}/{name}"

    async def admin(statement: str) -> None:
        conn = await asyncpg.connect(pg_server_url)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    async def setup() -> World:
        await admin(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
        async with scheduler_stack(url, **SETTINGS) as stack:
            return await build_world(stack)

    world = asyncio.run(setup())
    try:
        yield url, world
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def snapshot(url: str) -> dict[str, list[dict[str, Any]]]:
    conn = await asyncpg.connect(url)
    await init_connection(conn)
    try:
        return {table: [dict(r) for r in await conn.fetch(f"SELECT * FROM {table} ORDER BY 1, 2")] for table in TABLES}
    finally:
        await conn.close()


def assert_no_trace(error: grpc.aio.AioRpcError) -> None:
    texts = [error.details() or "", error.debug_error_string() or "", repr(error.trailing_metadata())]
    info = error_info(error)
    if info is not None:
        texts += [info.reason, *info.metadata.values()]
    for text in texts:
        assert "Traceback" not in text and 'File "' not in text, text


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
async def test_bad_input_is_refused_and_changes_nothing(shared, case):
    url, world = shared
    request = base_request(case.rpc, world)
    case.mutate(request)
    async with scheduler_stack(url, **SETTINGS) as stack:
        before = await snapshot(url)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(stack, case.rpc, request, case.tenant)
        after = await snapshot(url)
    error = refused.value
    info = error_info(error)
    assert error.code() == case.code, error.details()
    assert info is not None
    if case.code == INVALID:
        assert (info.reason, info.metadata.get("field")) == ("INVALID_ARGUMENT", case.field), error.details()
    else:
        assert info.reason == "TENANT_REQUIRED"
    assert_no_trace(error)
    assert after == before, "a refused call changed rows"


# ---------------------------------------------------------------------- controls: the base requests are accepted


@pytest.mark.parametrize("rpc", RUN_RPCS + WORK_RPCS)
async def test_base_request_is_accepted(db_url, rpc):
    """Each refusal above is caused by its one broken field, not by the request it started from."""
    async with scheduler_stack(db_url, **SETTINGS) as stack:
        world = await build_world(stack)
        reply = await call(stack, rpc, base_request(rpc, world))
        if rpc == "ClaimWork":
            assert reply.HasField("lease")
        if rpc == "ListRuns":
            assert [run.run_id for run in reply.runs] == [world.queued]
        if rpc == "WriteBatch":
            assert [r.WhichOneof("result") for r in reply.results] == ["heartbeat"]


# ---------------------------------------------------------------------- the same refusals as WriteBatch items

ITEM_CASES = [case for case in CASES if case.rpc in ITEM_OPS]


def as_item(case: Bad, world: World) -> ws.WriteBatchItem:
    request = base_request(case.rpc, world)
    case.mutate(request)
    item = ws.WriteBatchItem()
    getattr(item, ITEM_OPS[case.rpc]).CopyFrom(request)
    return item


async def test_bad_batch_items_are_refused_one_by_one_and_change_nothing(shared):
    """Every bad fenced write above, sent as a WriteBatch item, answers the same field in its own result."""
    url, world = shared
    assert len(ITEM_CASES) > 150
    async with scheduler_stack(url, **SETTINGS) as stack:
        before = await snapshot(url)
        for start in range(0, len(ITEM_CASES), 100):
            cases = ITEM_CASES[start:start + 100]
            reply = await stack.work.WriteBatch(
                ws.WriteBatchRequest(items=[as_item(case, world) for case in cases]), timeout=60)
            assert len(reply.results) == len(cases)
            for case, result in zip(cases, reply.results, strict=True):
                assert result.WhichOneof("result") == "error", case.id
                error = result.error
                assert (error.code, error.reason, error.metadata.get("field")) == (
                    INVALID.value[0], "INVALID_ARGUMENT", case.field), (case.id, error.message)
                assert "Traceback" not in error.message
        reply = await stack.work.WriteBatch(ws.WriteBatchRequest(items=[ws.WriteBatchItem()]), timeout=30)
        assert (reply.results[0].error.reason, reply.results[0].error.metadata["field"]) == (
            "INVALID_ARGUMENT", "items[0].op")
        after = await snapshot(url)
    assert after == before, "a refused item changed rows"


async def test_a_bad_item_leaves_the_good_items_of_its_batch_alone(db_url):
    async with scheduler_stack(db_url, **SETTINGS) as stack:
        world = await build_world(stack)
        good = base_request("FinishRun", world)
        bad = base_request("MarkToolInDoubt", world)
        bad.step_key = ""
        stale = ws.HeartbeatRequest(lease=ws.LeaseRef(run_id=world.waiting.run_id, worker_id="someone-else",
                                                      fencing_token=world.waiting.fencing_token))
        reply = await stack.work.WriteBatch(ws.WriteBatchRequest(items=[
            ws.WriteBatchItem(mark_tool_in_doubt=bad), ws.WriteBatchItem(finish_run=good),
            ws.WriteBatchItem(heartbeat=stale)]), timeout=30)
        kinds = [r.WhichOneof("result") for r in reply.results]
        assert kinds == ["error", "finish_run", "error"]
        assert reply.results[0].error.metadata["field"] == "step_key"
        assert reply.results[1].finish_run.status == pb.RUN_STATUS_COMPLETED
        assert (reply.results[2].error.code, reply.results[2].error.reason) == (
            grpc.StatusCode.FAILED_PRECONDITION.value[0], "LEASE_LOST")
        run = await stack.runs.GetRun(rs.GetRunRequest(run_id=world.running.run_id),
                                      metadata=[("x-tenant-id", TENANT)], timeout=30)
        assert run.status == pb.RUN_STATUS_COMPLETED
        waiting = await stack.runs.GetRun(rs.GetRunRequest(run_id=world.waiting.run_id),
                                          metadata=[("x-tenant-id", TENANT)], timeout=30)
        assert waiting.status == pb.RUN_STATUS_WAITING_TOOL  # the bad MarkToolInDoubt froze nothing


# ---------------------------------------------------------------------- below the message: the wire itself


async def test_field_sent_with_the_wrong_wire_type_reads_as_missing(shared):
    url, _ = shared
    async with scheduler_stack(url, **SETTINGS) as stack:
        raw = stack.channel.unary_unary("/agentrt.v1.RunService/GetRun", request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
        before = await snapshot(url)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await raw(b"\x08\x2a", metadata=stack.md())  # field 1 (run_id, a string) sent as the integer 42
        assert refused.value.code() == INVALID
        assert error_info(refused.value).metadata["field"] == "run_id"
        assert_no_trace(refused.value)
        assert await snapshot(url) == before


CORRUPT = b"\x0a\xff\xff\xff\xff\x0f"  # field 1 claims a length far past the end of the message


async def test_corrupt_message_changes_nothing_and_leaks_no_trace(shared):
    url, _ = shared
    async with scheduler_stack(url, **SETTINGS) as stack:
        for method in ("/agentrt.v1.RunService/SubmitRun", "/agentrt.v1.WorkService/FinishRun"):
            raw = stack.channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
            before = await snapshot(url)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await raw(CORRUPT, metadata=stack.md())
            assert refused.value.code() != grpc.StatusCode.OK
            assert_no_trace(refused.value)
            assert await snapshot(url) == before


async def test_corrupt_message_is_invalid_argument(shared):
    """grpcio decodes before any servicer code runs; scheduler/api/wire.py turns its DecodeError into this.

    Every method: tests/integration/scheduler/test_hostile_input.py.
    """
    url, _ = shared
    async with scheduler_stack(url, **SETTINGS) as stack:
        raw = stack.channel.unary_unary("/agentrt.v1.RunService/SubmitRun", request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await raw(CORRUPT, metadata=stack.md())
        assert refused.value.code() == INVALID
        assert error_info(refused.value).metadata["field"] == "request"
        assert refused.value.details() == "request: is not a valid agentrt.v1.SubmitRunRequest message"
