"""RunService behaviour against a real PostgreSQL: submit idempotency, reads and
pagination, cancel (at once or at the holder's next write), resume, resolving
in-doubt tool calls, history, and tenant isolation."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc
import pytest
from support import Stack, claim, eid, lease_ref, reason_of, scheduler_stack, submit, tool_state

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration

STEP, TOOL, REQUEST = "label.create/attempt-1", "shipping.create_label", {"order": 17, "carrier": "ups"}
TABLES = ("agent_runs", "agent_checkpoints", "tool_executions", "outbox")


async def snapshot(db: asyncpg.Connection) -> dict[str, list[dict[str, Any]]]:
    return {table: [dict(r) for r in await db.fetch(f"SELECT * FROM {table} ORDER BY 1, 2")] for table in TABLES}


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    return error.value


async def events(db: asyncpg.Connection, run_id: str) -> list[str]:
    return [r["event_type"] for r in await db.fetch("SELECT event_type FROM outbox WHERE run_id = $1 ORDER BY id",
                                                    uuid.UUID(run_id))]


async def run_row(db: asyncpg.Connection, run_id: str) -> asyncpg.Record:
    return await db.fetchrow("SELECT * FROM agent_runs WHERE id = $1", uuid.UUID(run_id))


# ---------------------------------------------------------------------- runs in a given state, via the API


@dataclass
class Held:
    run_id: str
    lease: ws.LeaseRef
    version: int
    state: dict[str, Any] | None = None


async def running(stack: Stack, tenant: str = "tenant-a", agent: str = "demo") -> Held:
    run = await submit(stack, agent=agent, payload={"order": 17}, tenant=tenant)
    lease = await claim(stack, agents=(agent,))
    assert lease is not None and lease.run.run_id == run.run_id
    return Held(run.run_id, lease_ref(lease), 0)


async def save(stack: Stack, held: Held, state: dict[str, Any], step_key: str | None = None) -> None:
    reply = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=held.lease, expected_version=held.version, state_json=json.dumps(state), schema_version=1,
        step_key=step_key or "", event_id=eid()))
    held.version, held.state = reply.version, state


async def waiting_tool(stack: Stack, tenant: str = "tenant-a", agent: str = "demo") -> Held:
    held = await running(stack, tenant, agent)
    await save(stack, held, tool_state(STEP, TOOL, REQUEST, messages=["hi"], budget={"steps": 3}), STEP)
    await stack.work.BeginToolCall(ws.BeginToolCallRequest(
        lease=held.lease, expected_version=held.version, step_key=STEP, tool_name=TOOL,
        idempotency_key=f"idem-{held.run_id}", request_json=json.dumps(REQUEST), execution_id=eid(),
        event_id=eid()))
    return held


async def in_doubt(stack: Stack, tenant: str = "tenant-a", agent: str = "demo") -> Held:
    held = await waiting_tool(stack, tenant, agent)
    await stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(
        lease=held.lease, step_key=STEP, error_code="timeout", detail="no answer in 30s", event_id=eid()))
    return held


async def paused_human(stack: Stack, tenant: str = "tenant-a", agent: str = "demo") -> Held:
    held = await running(stack, tenant, agent)
    await stack.work.FinishRun(ws.FinishRunRequest(
        lease=held.lease, expected_version=0, outcome=ws.FINISH_OUTCOME_PAUSED_HUMAN,
        reason="refund above 500 needs approval", event_id=eid()))
    return held


# ---------------------------------------------------------------------- SubmitRun


async def test_submit_is_idempotent_by_client_request_id(db_url, db):
    async with scheduler_stack(db_url) as stack:
        def submit_once(text: str, tenant: str = "tenant-a", **fields: Any) -> Any:
            request = rs.SubmitRunRequest(agent_name="demo", input_json=text, client_request_id="order-17",
                                          labels={"team": "returns"}, **fields)
            return stack.runs.SubmitRun(request, metadata=stack.md(tenant))

        first = await submit_once('{"order": 17, "items": [1, 2]}')
        assert first.created and first.run.client_request_id == "order-17"
        # Same payload (key order and whitespace do not matter: it is compared canonically).
        again = await submit_once('{ "items": [1, 2],   "order": 17 }')
        assert (again.run.run_id, again.created) == (first.run.run_id, False)
        assert again.run == first.run
        assert await db.fetchval("SELECT count(*) FROM agent_runs") == 1
        assert await events(db, first.run.run_id) == ["agent.run_submitted"]

        # Same id, another payload: refused, and nothing written.
        before = await snapshot(db)
        for text, fields in [('{"order": 18, "items": [1, 2]}', {}),
                             ('{"order": 17, "items": [1, 2]}', {"max_attempts": 3}),
                             ('{"order": 17, "items": [1, 2]}', {"agent_version": "2"})]:
            error = await refused(submit_once(text, **fields))
            assert (error.code(), reason_of(error)) == (grpc.StatusCode.ALREADY_EXISTS, "ALREADY_EXISTS")
        assert await snapshot(db) == before

        # The id is scoped to the tenant: tenant B's identical request is a new run.
        other = await submit_once('{"order": 17, "items": [1, 2]}', tenant="tenant-b")
        assert other.created and other.run.run_id != first.run.run_id and other.run.tenant_id == "tenant-b"

        # No client id: every submit is a new run.
        plain = [await submit(stack, payload={"order": 17}) for _ in range(2)]
        assert plain[0].run_id != plain[1].run_id


async def test_integers_stay_integers(db_url, db):
    payload = '{"n": 1, "big": 9007199254740993, "price": 1.5, "nested": {"qty": [1, 2, 3]}}'
    async with scheduler_stack(db_url) as stack:
        reply = await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json=payload),
                                           metadata=stack.md())
        got = await stack.runs.GetRun(rs.GetRunRequest(run_id=reply.run.run_id), metadata=stack.md())
        lease = await claim(stack)
        for text in (reply.run.input_json, got.input_json, lease.run.input_json):
            assert '"n":1' in text and "1.0" not in text and "9007199254740993" in text
            value = json.loads(text)
            assert value == {"n": 1, "big": 9007199254740993, "price": 1.5, "nested": {"qty": [1, 2, 3]}}
            assert type(value["n"]) is int and type(value["nested"]["qty"][0]) is int
        assert await db.fetchval("SELECT input->>'n' FROM agent_runs") == "1"


# ---------------------------------------------------------------------- GetRun, ListRuns


async def test_get_run(db_url):
    async with scheduler_stack(db_url) as stack:
        reply = await stack.runs.SubmitRun(rs.SubmitRunRequest(
            agent_name="demo", agent_version="3.1", input_json='{"a": 1}', max_attempts=4, labels={"k": "v"},
            budget=pb.Budget(max_steps=5, max_tokens=100, max_cost_usd=0.25)), metadata=stack.md())
        run = await stack.runs.GetRun(rs.GetRunRequest(run_id=reply.run.run_id), metadata=stack.md())
        assert len(run.last_trace_id) == 32 and reply.run.last_trace_id == ""  # GetRun adds the last step's trace
        run.last_trace_id = ""
        assert run == reply.run
        assert (run.agent_name, run.agent_version, run.max_attempts, dict(run.labels)) == ("demo", "3.1", 4, {"k": "v"})
        assert (run.budget.max_steps, run.budget.max_tokens, run.budget.max_cost_usd) == (5, 100, 0.25)
        assert (run.status, run.version, run.fencing_token, run.attempt_count) == (pb.RUN_STATUS_QUEUED, 0, 0, 0)
        assert run.tenant_id == "tenant-a" and run.HasField("created_at") and not run.HasField("finished_at")
        error = await refused(stack.runs.GetRun(rs.GetRunRequest(run_id=str(uuid.uuid4())), metadata=stack.md()))
        assert (error.code(), reason_of(error)) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")


async def list_all(stack: Stack, page_size: int, **filters: Any) -> tuple[list[str], int]:
    """Every run id the filter yields, following page tokens; and the number of pages."""
    ids: list[str] = []
    token, pages = "", 0
    while True:
        page = await stack.runs.ListRuns(rs.ListRunsRequest(page_size=page_size, page_token=token, **filters),
                                         metadata=stack.md())
        pages += 1
        assert len(page.runs) <= page_size
        ids += [run.run_id for run in page.runs]
        token = page.next_page_token
        if not token:
            return ids, pages


async def test_list_runs_filters_and_keyset_pages(db_url, db):
    async with scheduler_stack(db_url) as stack:
        claimed = await running(stack, agent="alpha")  # alpha, RUNNING
        alpha = [(await submit(stack, agent="alpha", payload={"i": i})).run_id for i in range(5)]
        beta = [(await submit(stack, agent="beta")).run_id for _ in range(2)]
        await submit(stack, agent="alpha", tenant="tenant-b")  # another tenant's: never listed
        newest_first = [r["id"] for r in await db.fetch(
            "SELECT id::text FROM agent_runs WHERE tenant_id = 'tenant-a' ORDER BY created_at DESC, id DESC")]

        ids, pages = await list_all(stack, 2, statuses=[pb.RUN_STATUS_QUEUED], agent_name="alpha")
        assert ids == [i for i in newest_first if i in alpha] and len(set(ids)) == 5 and pages == 3
        ids, _ = await list_all(stack, 2, agent_name="alpha")
        assert sorted(ids) == sorted([*alpha, claimed.run_id])
        ids, _ = await list_all(stack, 3, statuses=[pb.RUN_STATUS_RUNNING])
        assert ids == [claimed.run_id]
        ids, _ = await list_all(stack, 3, statuses=[pb.RUN_STATUS_QUEUED, pb.RUN_STATUS_RUNNING])
        assert ids == newest_first
        ids, pages = await list_all(stack, 3)
        assert ids == newest_first and len(ids) == 8 and pages == 3
        assert sorted(beta) == sorted((await list_all(stack, 50, agent_name="beta"))[0])
        ids, _ = await list_all(stack, 5, statuses=[pb.RUN_STATUS_COMPLETED])
        assert ids == []

        # A token only continues the listing it was issued for.
        first = await stack.runs.ListRuns(rs.ListRunsRequest(page_size=2, agent_name="alpha"), metadata=stack.md())
        for other in ({"agent_name": "beta"}, {"agent_name": "alpha", "statuses": [pb.RUN_STATUS_QUEUED]}, {}):
            error = await refused(stack.runs.ListRuns(
                rs.ListRunsRequest(page_size=2, page_token=first.next_page_token, **other), metadata=stack.md()))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "different filter" in error.details()


# ---------------------------------------------------------------------- CancelRun


async def test_cancel_of_a_queued_run_ends_it_at_once(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack)
        cancelled = await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run.run_id, reason="customer withdrew"),
                                               metadata=stack.md())
        assert cancelled.status == pb.RUN_STATUS_CANCELLED and "customer withdrew" in cancelled.terminal_reason
        assert cancelled.HasField("finished_at") and cancelled.cancel_requested
        history = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=run.run_id), metadata=stack.md())
        assert [e.event_type for e in history.events] == ["agent.run_submitted", "agent.run_cancelled",
                                                          "agent.audit.run.cancel"]
        assert json.loads(history.events[-1].payload_json)["reason"] == "customer withdrew"
        assert await claim(stack) is None, "a cancelled run is never claimed"
        # Cancelling again answers with the outcome and writes nothing.
        before = await snapshot(db)
        again = await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run.run_id), metadata=stack.md())
        assert again.status == pb.RUN_STATUS_CANCELLED and "customer withdrew" in again.terminal_reason
        assert await snapshot(db) == before


def _heartbeat(stack: Stack, held: Held) -> Any:
    return stack.work.Heartbeat(ws.HeartbeatRequest(lease=held.lease))


def _checkpoint(stack: Stack, held: Held) -> Any:
    return stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=held.lease, expected_version=held.version, state_json='{"cursor": 9}', schema_version=1,
        event_id=eid()))


def _finish(stack: Stack, held: Held) -> Any:
    return stack.work.FinishRun(ws.FinishRunRequest(
        lease=held.lease, expected_version=held.version, outcome=ws.FINISH_OUTCOME_COMPLETED, event_id=eid()))


def _begin(stack: Stack, held: Held) -> Any:
    return stack.work.BeginToolCall(ws.BeginToolCallRequest(
        lease=held.lease, expected_version=held.version, step_key=STEP, tool_name=TOOL, idempotency_key="k",
        request_json=json.dumps(REQUEST), execution_id=eid(), event_id=eid()))


@pytest.mark.parametrize("write", [_heartbeat, _checkpoint, _finish, _begin], ids=lambda f: f.__name__[1:])
async def test_cancel_of_a_leased_run_ends_it_at_the_holders_next_write(db_url, db, write):
    async with scheduler_stack(db_url) as stack:
        held = await running(stack)
        await save(stack, held, tool_state(STEP, TOOL, REQUEST))
        flagged = await stack.runs.CancelRun(rs.CancelRunRequest(run_id=held.run_id, reason="operator stop"),
                                             metadata=stack.md())
        assert flagged.cancel_requested and flagged.status == pb.RUN_STATUS_RUNNING
        assert flagged.lease_owner == held.lease.worker_id and not flagged.HasField("finished_at")
        checkpoints = await db.fetchval("SELECT count(*) FROM agent_checkpoints")

        error = await refused(write(stack, held))
        assert (error.code(), reason_of(error)) == (grpc.StatusCode.FAILED_PRECONDITION, "RUN_CANCELLED")
        row = await run_row(db, held.run_id)
        assert row["status"] == "CANCELLED" and "operator stop" in row["terminal_reason"]
        assert (row["lease_owner"], row["lease_expires_at"]) == (None, None) and row["finished_at"] is not None
        assert row["version"] == held.version
        assert await db.fetchval("SELECT count(*) FROM agent_checkpoints") == checkpoints
        assert await db.fetchval("SELECT count(*) FROM tool_executions") == 0
        assert await events(db, held.run_id) == ["agent.run_submitted", "agent.checkpoint", "agent.cancel_requested",
                                                 "agent.audit.run.cancel", "agent.run_cancelled"]
        # Every later write is refused too (the lease is gone).
        error = await refused(_heartbeat(stack, held))
        assert reason_of(error) == "LEASE_LOST"


async def test_cancel_while_a_tool_call_is_open_keeps_its_outcome_in_the_ledger(db_url, db):
    async with scheduler_stack(db_url) as stack:
        held = await waiting_tool(stack)
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=held.run_id, reason="stop"), metadata=stack.md())
        error = await refused(stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
            lease=held.lease, expected_version=held.version, step_key=STEP, outcome=ws.TOOL_OUTCOME_SUCCEEDED,
            response_json='{"label": "1Z999"}', remote_resource_id="1Z999", state_json='{"cursor": 2}',
            schema_version=1, event_id=eid())))
        assert reason_of(error) == "RUN_CANCELLED"
        assert (await run_row(db, held.run_id))["status"] == "CANCELLED"
        ledger = await db.fetchrow("SELECT * FROM tool_executions")
        assert (ledger["status"], ledger["response_json"], ledger["remote_resource_id"]) == (
            "SUCCEEDED", {"label": "1Z999"}, "1Z999")
        assert await db.fetchval("SELECT count(*) FROM agent_checkpoints") == 1, "no checkpoint for a cancelled run"


async def test_cancel_of_an_in_doubt_run_keeps_the_ledger_row(db_url, db):
    async with scheduler_stack(db_url) as stack:
        held = await in_doubt(stack)
        ledger = dict(await db.fetchrow("SELECT * FROM tool_executions"))
        cancelled = await stack.runs.CancelRun(rs.CancelRunRequest(run_id=held.run_id, reason="refund by hand"),
                                               metadata=stack.md())
        assert cancelled.status == pb.RUN_STATUS_CANCELLED and "refund by hand" in cancelled.terminal_reason
        assert dict(await db.fetchrow("SELECT * FROM tool_executions")) == ledger
        assert ledger["status"] == "IN_DOUBT"


async def test_flagged_run_whose_holder_vanished_ends_at_the_next_claim(db_url, db):
    async with scheduler_stack(db_url) as stack:
        held = await running(stack)
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=held.run_id, reason="stop"), metadata=stack.md())
        # Simulates time passing: the holder never writes again and its lease lapses by database time.
        await db.execute("UPDATE agent_runs SET lease_expires_at = clock_timestamp() - interval '1 second'")
        assert await claim(stack, worker="w2") is None
        row = await run_row(db, held.run_id)
        assert row["status"] == "CANCELLED" and row["lease_owner"] is None and "stop" in row["terminal_reason"]
        assert row["fencing_token"] == held.lease.fencing_token + 1, "the claim that ended it took a new fence"


# ---------------------------------------------------------------------- ResumeRun


async def test_resume_records_the_operators_input_and_requeues(db_url, db):
    async with scheduler_stack(db_url) as stack:
        held = await paused_human(stack)
        paused = await stack.runs.GetRun(rs.GetRunRequest(run_id=held.run_id), metadata=stack.md())
        assert paused.status == pb.RUN_STATUS_PAUSED_HUMAN and "approval" in paused.pause_reason
        resumed = await stack.runs.ResumeRun(rs.ResumeRunRequest(
            run_id=held.run_id, decision=rs.RESUME_DECISION_INPUT, operator="alice",
            input_json='{"approved_amount": 450}', comment="partial refund"), metadata=stack.md())
        assert resumed.status == pb.RUN_STATUS_QUEUED and resumed.pause_reason == "" and resumed.attempt_count == 0
        human = {"decision": "INPUT", "operator": "alice", "input": {"approved_amount": 450},
                 "comment": "partial refund"}
        assert json.loads(resumed.human_input_json) == human
        assert (await run_row(db, held.run_id))["human_input"] == human
        event = await db.fetchrow("SELECT * FROM outbox WHERE run_id = $1 AND event_type NOT LIKE 'agent.audit.%' "
                                  "ORDER BY id DESC LIMIT 1", uuid.UUID(held.run_id))
        assert event["event_type"] == "agent.run_resumed"
        assert (event["payload"]["decision"], event["payload"]["operator"]) == ("INPUT", "alice")
        # The next holder sees the operator's answer.
        lease = await claim(stack)
        assert lease.run.run_id == held.run_id and json.loads(lease.run.human_input_json) == human
        assert lease.run.fencing_token == held.lease.fencing_token + 1


# ---------------------------------------------------------------------- ResolveToolExecution


def resolve(stack: Stack, held: Held, outcome: int, tenant: str = "tenant-a", **fields: Any) -> Any:
    request = rs.ResolveToolExecutionRequest(run_id=held.run_id, step_key=STEP, outcome=outcome,
                                             evidence_json='{"lookup": "GET /labels?key=..."}',
                                             resolved_by="reconciler-1", **fields)
    return stack.runs.ResolveToolExecution(request, metadata=stack.md(tenant))


async def test_resolve_succeeded_applies_the_result_like_tx2(db_url, db):
    async with scheduler_stack(db_url) as stack:
        held = await in_doubt(stack)
        reply = await resolve(stack, held, rs.RESOLUTION_OUTCOME_SUCCEEDED, result_json='{"label": "1Z999"}',
                              remote_resource_id="1Z999", rule_version="rules-7")
        assert reply.run.status == pb.RUN_STATUS_QUEUED and reply.run.version == held.version + 1
        assert reply.execution.status == pb.TOOL_EXECUTION_STATUS_SUCCEEDED

        ledger = await db.fetchrow("SELECT * FROM tool_executions")
        assert ledger["status"] == "SUCCEEDED" and ledger["response_json"] == {"label": "1Z999"}
        assert ledger["remote_resource_id"] == "1Z999" and ledger["resolved_by"] == "reconciler-1"
        assert ledger["completed_at"] is not None and ledger["reconciled_at"] is not None
        assert ledger["reconciliation_evidence"]["lookup"] == "GET /labels?key=..."
        assert ledger["reconciliation_evidence"]["resolved_by"] == "reconciler-1"
        assert ledger["reconciliation_evidence"]["rule_version"] == "rules-7"

        checkpoints = await db.fetch("SELECT * FROM agent_checkpoints ORDER BY version")
        assert [c["version"] for c in checkpoints] == [1, 2]
        state = checkpoints[-1]["state_json"]
        assert "pending_tool" not in state
        assert state["tool_results"][STEP]["response"] == {"label": "1Z999"}
        assert state["tool_results"][STEP]["status"] == "SUCCEEDED"
        kept = {k: v for k, v in held.state.items() if k != "pending_tool"}
        assert {k: state[k] for k in kept} == kept, "the rest of the state is carried over"
        row = await run_row(db, held.run_id)
        assert (row["status"], row["version"], row["lease_owner"]) == ("QUEUED", 2, None)

        # The next holder resumes from the new checkpoint, with no pending tool call.
        lease = await claim(stack)
        assert lease.checkpoint.version == 2 and json.loads(lease.checkpoint.state_json) == state
        assert not lease.HasField("pending_tool")


async def test_resolve_not_executed_requeues_and_keeps_the_row(db_url, db):
    async with scheduler_stack(db_url) as stack:
        held = await in_doubt(stack)
        reply = await resolve(stack, held, rs.RESOLUTION_OUTCOME_NOT_EXECUTED)
        assert reply.run.status == pb.RUN_STATUS_QUEUED and reply.run.version == held.version
        ledger = await db.fetchrow("SELECT * FROM tool_executions")
        assert ledger["status"] == "NOT_EXECUTED" and ledger["completed_at"] is not None
        assert ledger["reconciliation_evidence"]["lookup"] == "GET /labels?key=..."
        assert await db.fetchval("SELECT count(*) FROM agent_checkpoints") == 1, "no new checkpoint"
        lease = await claim(stack)
        assert lease.run.run_id == held.run_id and lease.checkpoint.version == held.version
        assert lease.current_step_execution.status == pb.TOOL_EXECUTION_STATUS_NOT_EXECUTED
        assert not lease.HasField("pending_tool")


async def test_resolve_unknown_records_evidence_and_stays_paused(db_url, db):
    async with scheduler_stack(db_url) as stack:
        held = await in_doubt(stack)
        reply = await resolve(stack, held, rs.RESOLUTION_OUTCOME_UNKNOWN)
        assert reply.run.status == pb.RUN_STATUS_PAUSED_INDOUBT
        ledger = await db.fetchrow("SELECT * FROM tool_executions")
        assert ledger["status"] == "IN_DOUBT" and ledger["completed_at"] is None
        assert ledger["reconciled_at"] is not None and ledger["resolved_by"] == "reconciler-1"
        assert ledger["reconciliation_evidence"]["lookup"] == "GET /labels?key=..."
        assert await db.fetchval("SELECT count(*) FROM agent_checkpoints") == 1
        assert await claim(stack) is None, "a paused run is not claimable"
        # Later evidence can still settle it.
        settled = await resolve(stack, held, rs.RESOLUTION_OUTCOME_SUCCEEDED, result_json='"ok"')
        assert settled.run.status == pb.RUN_STATUS_QUEUED


async def test_resolve_retried_with_the_same_event_id_applies_once(db_url, db):
    async with scheduler_stack(db_url) as stack:
        held = await in_doubt(stack)
        event_id = eid()
        first = await resolve(stack, held, rs.RESOLUTION_OUTCOME_SUCCEEDED, result_json='{"label": "1Z"}',
                              event_id=event_id)
        before = await snapshot(db)
        again = await resolve(stack, held, rs.RESOLUTION_OUTCOME_SUCCEEDED, result_json='{"label": "1Z"}',
                              event_id=event_id)
        assert again.run.version == first.run.version and again.execution == first.execution
        assert await snapshot(db) == before
        # A resolved row is not resolved again.
        error = await refused(resolve(stack, held, rs.RESOLUTION_OUTCOME_NOT_EXECUTED))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_resolve_of_an_unknown_step_is_not_found(db_url, db):
    async with scheduler_stack(db_url) as stack:
        held = await in_doubt(stack)
        before = await snapshot(db)
        error = await refused(stack.runs.ResolveToolExecution(rs.ResolveToolExecutionRequest(
            run_id=held.run_id, step_key="no.such/step", outcome=rs.RESOLUTION_OUTCOME_NOT_EXECUTED,
            evidence_json="{}", resolved_by="op"), metadata=stack.md()))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert await snapshot(db) == before


# ---------------------------------------------------------------------- GetRunHistory


async def test_history_returns_checkpoints_ledger_and_events_in_order(db_url):
    async with scheduler_stack(db_url) as stack:
        held = await waiting_tool(stack)
        await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
            lease=held.lease, expected_version=held.version, step_key=STEP, outcome=ws.TOOL_OUTCOME_SUCCEEDED,
            response_json='{"label": "1Z"}', state_json='{"cursor": "notify"}', schema_version=1, event_id=eid()))
        await save(stack, Held(held.run_id, held.lease, 2), {"cursor": "done"})
        await stack.work.FinishRun(ws.FinishRunRequest(
            lease=held.lease, expected_version=3, outcome=ws.FINISH_OUTCOME_COMPLETED, result_json='{"ok": 1}',
            event_id=eid()))
        history = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=held.run_id), metadata=stack.md())
        assert history.run.status == pb.RUN_STATUS_COMPLETED and json.loads(history.run.result_json) == {"ok": 1}
        assert [c.version for c in history.checkpoints] == [1, 2, 3]
        assert [json.loads(c.state_json).get("cursor") for c in history.checkpoints] == [STEP, "notify", "done"]
        assert all(c.run_id == held.run_id and len(c.state_hash) == 64 for c in history.checkpoints)
        [execution] = history.tool_executions
        assert (execution.step_key, execution.status) == (STEP, pb.TOOL_EXECUTION_STATUS_SUCCEEDED)
        assert json.loads(execution.response_json) == {"label": "1Z"}
        assert [e.event_type for e in history.events] == [
            "agent.run_submitted", "agent.checkpoint", "agent.tool_requested", "agent.tool_succeeded",
            "agent.checkpoint", "agent.run_completed"]
        assert [e.id for e in history.events] == sorted(e.id for e in history.events)
        assert [e.run_version for e in history.events] == [0, 1, 1, 2, 3, 3]


# ---------------------------------------------------------------------- tenants


async def test_another_tenant_sees_and_changes_nothing(db_url, db):
    async with scheduler_stack(db_url) as stack:
        doubt = await in_doubt(stack, agent="alpha")
        human = await paused_human(stack, agent="beta")
        own = await submit(stack, tenant="tenant-b")
        before = await snapshot(db)
        b = stack.md("tenant-b")
        missing = str(uuid.uuid4())
        absent = await refused(stack.runs.GetRun(rs.GetRunRequest(run_id=missing), metadata=b))
        for held in (doubt, human):
            calls = {
                "GetRun": stack.runs.GetRun(rs.GetRunRequest(run_id=held.run_id), metadata=b),
                "CancelRun": stack.runs.CancelRun(rs.CancelRunRequest(run_id=held.run_id), metadata=b),
                "ResumeRun": stack.runs.ResumeRun(rs.ResumeRunRequest(
                    run_id=held.run_id, decision=rs.RESUME_DECISION_APPROVE, operator="mallory"), metadata=b),
                "ResolveToolExecution": resolve(stack, held, rs.RESOLUTION_OUTCOME_SUCCEEDED, tenant="tenant-b",
                                                result_json='{"label": "forged"}'),
                "GetRunHistory": stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=held.run_id), metadata=b),
            }
            for name, call in calls.items():
                error = await refused(call)
                assert (error.code(), reason_of(error)) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND"), name
                # Indistinguishable from a run that does not exist at all.
                assert error.details().replace(held.run_id, "ID") == absent.details().replace(missing, "ID"), name
        listed = await stack.runs.ListRuns(rs.ListRunsRequest(), metadata=b)
        assert [run.run_id for run in listed.runs] == [own.run_id]
        for status in pb.RunStatus.values()[1:]:
            page = await stack.runs.ListRuns(rs.ListRunsRequest(statuses=[status], agent_name="alpha"), metadata=b)
            assert not page.runs
        assert await snapshot(db) == before
        # Tenant A still can.
        assert (await stack.runs.GetRun(rs.GetRunRequest(run_id=doubt.run_id), metadata=stack.md())).run_id
