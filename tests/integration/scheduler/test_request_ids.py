"""Every mutating RunService RPC takes a request id, and a retry with it never acts twice.

The RPCs are found from the service descriptor: a method that is not a read must have a request id
field and a scenario here, or this test fails. Each scenario sends the request, sends it again with
the same id (what a client does when an answer was lost), and checks the second answer is the
first one's and the database gained nothing (runs, events, audit rows, signals, keys); where the id
binds the request's payload, the same id with another payload is ALREADY_EXISTS and writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from support import Stack, claim, eid, lease_ref, rpc_error, scheduler_stack, submit, tool_state

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration

READS = {"GetRun", "ListRuns", "GetRunTree", "GetRunHistory", "GetStats", "ListAgents", "ListSchedules",
         "ListAuditEvents", "ListApiKeys", "ListLimits"}
# The field that names a request, by RPC (SubmitRun's predates the name request_id).
ID_FIELD = {"SubmitRun": "client_request_id"}
TOOL, STEP = "payments.charge", "pay/attempt-1"


async def counts(db: Any) -> dict[str, int]:
    tables = ("agent_runs", "outbox", "audit_log", "run_signals", "api_keys", "agent_schedules", "flow_limits",
              "tool_executions", "agent_checkpoints")
    return {t: await db.fetchval(f"SELECT count(*) FROM {t}") for t in tables}


async def paused_run(stack: Stack, agent: str) -> str:
    run = await submit(stack, agent=agent)
    lease = await claim(stack, worker=f"w-{agent}", agents=(agent,))
    assert lease is not None
    saved = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=lease_ref(lease), expected_version=0, state_json='{"cursor": 1}', schema_version=1,
        step_key="ask/attempt-1", event_id=eid()))
    await stack.work.FinishRun(ws.FinishRunRequest(lease=lease_ref(lease), expected_version=saved.version,
                                                   outcome=ws.FINISH_OUTCOME_PAUSED_HUMAN, event_id=eid()))
    return run.run_id


async def in_doubt_run(stack: Stack, agent: str) -> str:
    run = await submit(stack, agent=agent)
    lease = await claim(stack, worker=f"w-{agent}", agents=(agent,))
    assert lease is not None
    ref = lease_ref(lease)
    saved = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=ref, expected_version=0, state_json=json.dumps(tool_state(STEP, TOOL, {"amount": 5})),
        schema_version=1, step_key=STEP, event_id=eid()))
    await stack.work.BeginToolCall(ws.BeginToolCallRequest(
        lease=ref, expected_version=saved.version, step_key=STEP, tool_name=TOOL, idempotency_key=f"k-{agent}",
        request_json='{"amount": 5}', execution_id=eid(), event_id=eid()))
    await stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(lease=ref, step_key=STEP, error_code="timeout",
                                                               event_id=eid()))
    return run.run_id


@dataclass
class Case:
    """`make(stack)` sets the scene and answers (call, request with id, the same id with another payload or
    None where the RPC is idempotent by its nature, a function that picks what the two answers must share)."""

    make: Callable[[Stack], Awaitable[tuple[Callable[..., Any], Any, Any, Callable[[Any], Any]]]]


async def case_submit(stack: Stack):
    request = rs.SubmitRunRequest(agent_name="demo", input_json='{"amount": 80.0}', client_request_id="sub-1")
    other = rs.SubmitRunRequest(agent_name="demo", input_json='{"amount": 81}', client_request_id="sub-1")
    return stack.runs.SubmitRun, request, other, lambda r: r.run.run_id


async def case_cancel(stack: Stack):
    run = await submit(stack, agent="c-cancel")
    request = rs.CancelRunRequest(run_id=run.run_id, reason="customer left", request_id="cancel-1")
    other = rs.CancelRunRequest(run_id=run.run_id, reason="another reason", request_id="cancel-1")
    return stack.runs.CancelRun, request, other, lambda r: (r.run_id, r.status)


async def case_retry(stack: Stack):
    run = await submit(stack, agent="c-retry")
    await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run.run_id), metadata=stack.md())
    request = rs.RetryRunRequest(run_id=run.run_id, request_id="retry-1")
    # The request is its run alone: nothing else could differ under the same id.
    return stack.runs.RetryRun, request, None, lambda r: r.run.run_id


async def case_signal(stack: Stack):
    run = await submit(stack, agent="c-signal")
    request = rs.SignalRunRequest(run_id=run.run_id, name="go", payload_json='{"n": 1}', request_id="sig-1")
    other = rs.SignalRunRequest(run_id=run.run_id, name="go", payload_json='{"n": 2}', request_id="sig-1")
    return stack.runs.SignalRun, request, other, lambda r: r.signal.signal_id


async def case_resume(stack: Stack):
    run_id = await paused_run(stack, "c-resume")
    request = rs.ResumeRunRequest(run_id=run_id, decision=rs.RESUME_DECISION_APPROVE, comment="ok",
                                  request_id="approve-1")
    other = rs.ResumeRunRequest(run_id=run_id, decision=rs.RESUME_DECISION_REJECT, request_id="approve-1")
    return stack.runs.ResumeRun, request, other, lambda r: r.run_id


async def case_resolve(stack: Stack):
    run_id = await in_doubt_run(stack, "c-resolve")
    request = rs.ResolveToolExecutionRequest(
        run_id=run_id, step_key=STEP, outcome=rs.RESOLUTION_OUTCOME_SUCCEEDED, result_json='{"charged": 5}',
        evidence_json='{"ticket": "T-1"}', resolved_by="alice", request_id="resolve-1")
    other = rs.ResolveToolExecutionRequest(
        run_id=run_id, step_key=STEP, outcome=rs.RESOLUTION_OUTCOME_NOT_EXECUTED,
        evidence_json='{"ticket": "T-2"}', resolved_by="alice", request_id="resolve-1")
    return stack.runs.ResolveToolExecution, request, other, lambda r: (r.run.run_id, r.execution.status)


def _spec(cron: str = "*/5 * * * *") -> rs.ScheduleSpec:
    return rs.ScheduleSpec(agent_name="demo", input_json="{}", cron=cron)


async def case_create_schedule(stack: Stack):
    request = rs.CreateScheduleRequest(name="nightly", spec=_spec(), request_id="sched-1")
    return stack.runs.CreateSchedule, request, None, lambda r: r.schedule.schedule_id


async def _schedule(stack: Stack, name: str) -> str:
    made = await stack.runs.CreateSchedule(rs.CreateScheduleRequest(name=name, spec=_spec()), metadata=stack.md())
    return made.schedule.schedule_id


async def case_update_schedule(stack: Stack):
    schedule_id = await _schedule(stack, "to-update")
    request = rs.UpdateScheduleRequest(schedule_id=schedule_id, spec=_spec("0 * * * *"), request_id="upd-1")
    return stack.runs.UpdateSchedule, request, None, lambda r: (r.schedule_id, r.next_fire_at.ToJsonString())


async def case_pause_schedule(stack: Stack):
    schedule_id = await _schedule(stack, "to-pause")
    request = rs.PauseScheduleRequest(schedule_id=schedule_id, paused=True, request_id="pause-1")
    return stack.runs.PauseSchedule, request, None, lambda r: (r.schedule_id, r.paused)


async def case_create_key(stack: Stack):
    request = rs.CreateApiKeyRequest(name="ci", role=rs.API_KEY_ROLE_OPERATOR, request_id="key-1")
    return stack.runs.CreateApiKey, request, None, lambda r: r.key.key_id


async def _key(stack: Stack) -> str:
    made = await stack.runs.CreateApiKey(rs.CreateApiKeyRequest(name="old", role=rs.API_KEY_ROLE_VIEWER),
                                         metadata=stack.md())
    return made.key.key_id


async def case_revoke_key(stack: Stack):
    request = rs.RevokeApiKeyRequest(key_id=await _key(stack), request_id="revoke-1")
    return stack.runs.RevokeApiKey, request, None, lambda r: (r.key_id, r.revoked_at.ToJsonString())


async def case_set_limit(stack: Stack):
    request = rs.SetLimitRequest(scope="tool", subject="payments.charge", name="rate", value="50/s",
                                 request_id="limit-1")
    return stack.runs.SetLimit, request, None, lambda r: (r.value, r.updated_at.ToJsonString())


async def case_clear_limit(stack: Stack):
    await stack.runs.SetLimit(rs.SetLimitRequest(scope="tool", subject="x.y", name="rate", value="5/s"),
                              metadata=stack.md())
    request = rs.ClearLimitRequest(scope="tool", subject="x.y", name="rate", request_id="clear-1")
    # The retry finds nothing left to clear (cleared=false): the limit is gone either way.
    return stack.runs.ClearLimit, request, None, lambda r: "gone"


CASES: dict[str, Case] = {
    "SubmitRun": Case(case_submit), "CancelRun": Case(case_cancel), "SignalRun": Case(case_signal),
    "RetryRun": Case(case_retry),
    "ResumeRun": Case(case_resume), "ResolveToolExecution": Case(case_resolve),
    "CreateSchedule": Case(case_create_schedule), "UpdateSchedule": Case(case_update_schedule),
    "PauseSchedule": Case(case_pause_schedule), "CreateApiKey": Case(case_create_key),
    "RevokeApiKey": Case(case_revoke_key), "SetLimit": Case(case_set_limit), "ClearLimit": Case(case_clear_limit),
}
# A retried delete whose first attempt committed answers NOT_FOUND (docs/api.md says so): checked below.
SPECIAL = {"DeleteSchedule"}


def test_every_mutating_rpc_names_its_requests_and_has_a_case_here():
    service = rs.DESCRIPTOR.services_by_name["RunService"]
    for method in service.methods:
        if method.name in READS:
            continue
        field = ID_FIELD.get(method.name, "request_id")
        assert field in method.input_type.fields_by_name, f"{method.name} has no {field}"
        assert method.name in CASES or method.name in SPECIAL, f"no retry case for {method.name}"


@pytest.mark.parametrize("rpc", sorted(CASES))
async def test_a_retry_with_the_same_request_id_acts_once(db_url, db, rpc):
    async with scheduler_stack(db_url) as stack:
        call, request, other, same = await CASES[rpc].make(stack)
        first = await call(request, metadata=stack.md())
        before = await counts(db)
        if rpc == "CreateApiKey":
            # The secret was shown once and is not kept: the retry names the key it made.
            again = await rpc_error(call(request, metadata=stack.md()))
            assert again.code() == grpc.StatusCode.ALREADY_EXISTS
            assert first.key.key_id in (again.details() or "")
        else:
            second = await call(request, metadata=stack.md())
            assert same(second) == same(first)
        assert await counts(db) == before, "the retry wrote something"
        if other is not None:
            refused = await rpc_error(call(other, metadata=stack.md()))
            assert refused.code() == grpc.StatusCode.ALREADY_EXISTS, refused.details()
            assert await counts(db) == before, "the refused request wrote something"


async def test_a_retried_resume_answers_the_run_even_after_it_moved_on(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id = await paused_run(stack, "moved-on")
        request = rs.ResumeRunRequest(run_id=run_id, decision=rs.RESUME_DECISION_APPROVE, request_id="a-1")
        await stack.runs.ResumeRun(request, metadata=stack.md())
        lease = await claim(stack, worker="w2", agents=("moved-on",))  # an executor took it on
        assert lease is not None
        again = await stack.runs.ResumeRun(request, metadata=stack.md())
        assert again.status == pb.RUN_STATUS_RUNNING
        # Without a request id a second resume is what it always was: not allowed from RUNNING.
        bare = await rpc_error(stack.runs.ResumeRun(
            rs.ResumeRunRequest(run_id=run_id, decision=rs.RESUME_DECISION_APPROVE), metadata=stack.md()))
        assert bare.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_retried_delete_answers_not_found_and_deletes_nothing_else(db_url, db):
    async with scheduler_stack(db_url) as stack:
        keep = await _schedule(stack, "keep")
        gone = await _schedule(stack, "gone")
        request = rs.DeleteScheduleRequest(schedule_id=gone, request_id="del-1")
        await stack.runs.DeleteSchedule(request, metadata=stack.md())
        before = await counts(db)
        again = await rpc_error(stack.runs.DeleteSchedule(request, metadata=stack.md()))
        assert again.code() == grpc.StatusCode.NOT_FOUND
        assert await counts(db) == before
        assert await db.fetchval("SELECT count(*) FROM agent_schedules WHERE id = $1::uuid", keep) == 1
        audit = await db.fetch("SELECT request_id FROM audit_log WHERE action = 'schedule.delete'")
        assert [r["request_id"] for r in audit] == ["del-1"]


async def test_a_submit_without_a_client_request_id_gets_one_and_is_a_new_run_each_time(db_url, db):
    async with scheduler_stack(db_url) as stack:
        request = rs.SubmitRunRequest(agent_name="demo", input_json="{}")
        first = await stack.runs.SubmitRun(request, metadata=stack.md())
        second = await stack.runs.SubmitRun(request, metadata=stack.md())
        assert first.created and second.created and first.run.run_id != second.run.run_id
        assert first.run.client_request_id.startswith("generated-")
        assert first.run.client_request_id != second.run.client_request_id
        # The id it was given names it from then on: a retry with it is the same run.
        again = await stack.runs.SubmitRun(rs.SubmitRunRequest(
            agent_name="demo", input_json="{}", client_request_id=first.run.client_request_id), metadata=stack.md())
        assert again.run.run_id == first.run.run_id and not again.created
