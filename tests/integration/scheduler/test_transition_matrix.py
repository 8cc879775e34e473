"""The state x operation matrix, through the real gRPC services.

For every run status (plus RUNNING and WAITING_TOOL with a lapsed lease) a run
is brought into that status through the API only, then one operation is
applied. What should happen is derived from scheduler.states.TRANSITIONS, the one
table the scheduler enforces:

* allowed → the call succeeds and the run lands in the status the table names;
* a fenced WorkService write without a live lease held by the caller →
  FAILED_PRECONDITION / LEASE_LOST;
* anything else → FAILED_PRECONDITION / INVALID_TRANSITION (ClaimWork simply
  claims nothing);

and a refused call changes nothing: the whole of agent_runs, agent_checkpoints,
tool_executions and outbox is compared before and after.

All cases share one migrated database (created per module, for speed); each
case uses its own run under its own agent name, so claims never cross cases.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc
import pytest
from support import Stack, claim, eid, lease_ref, reason_of, scheduler_stack, submit, tool_state

from scheduler.api.convert import RUN_STATUS_NAME
from scheduler.states import LEASED, TERMINAL, TRANSITIONS, Op, RunStatus, sources, transition
from shared.db import init_connection
from shared.errors import InvalidTransition
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration

S = RunStatus
S1, S2 = "refund.create/attempt-1", "refund.notify/attempt-1"
TOOL = "payments.refund"
REQ1, REQ2 = {"order": 1, "amount": 10}, {"order": 1, "notify": True}
FP = grpc.StatusCode.FAILED_PRECONDITION


# ---------------------------------------------------------------------- unit level: the table itself


def test_sources_and_transition_agree_with_the_table():
    for op in Op:
        assert sources(op) == sorted(status.value for (status, candidate) in TRANSITIONS if candidate is op)
        for status in RunStatus:
            if (status, op) in TRANSITIONS:
                assert transition(status, op) is TRANSITIONS[(status, op)]
                assert transition(status.value, op) is TRANSITIONS[(status, op)]
                assert status.value in sources(op)
            else:
                with pytest.raises(InvalidTransition) as refused:
                    transition(status, op)
                assert refused.value.metadata == {"status": status.value, "operation": op.value}
                assert status.value not in sources(op)


def test_table_shape():
    assert all(isinstance(target, RunStatus) for target in TRANSITIONS.values())
    assert {op for (_, op) in TRANSITIONS} == set(Op), "every operation is allowed from somewhere"
    for status in TERMINAL:
        assert not [op for (source, op) in TRANSITIONS if source is status], f"{status} must be final"
    # Every status is reachable from QUEUED, and every non-terminal one can still end.
    reachable, frontier = {S.QUEUED}, [S.QUEUED]
    while frontier:
        current = frontier.pop()
        for (source, _), target in TRANSITIONS.items():
            if source is current and target not in reachable:
                reachable.add(target)
                frontier.append(target)
    assert reachable == set(RunStatus)
    for status in set(RunStatus) - TERMINAL:
        seen, frontier = {status}, [status]
        while frontier:
            current = frontier.pop()
            for (source, _), target in TRANSITIONS.items():
                if source is current and target not in seen:
                    seen.add(target)
                    frontier.append(target)
        assert seen & TERMINAL, f"{status} can never end"
    # Invariant 1 in the table: only claims enter a leased status from an unleased one.
    for (source, op), target in TRANSITIONS.items():
        if target in LEASED and source not in LEASED:
            assert op is Op.CLAIM


# ---------------------------------------------------------------------- a database for this module


@pytest.fixture(scope="module")
def shared_db_url(pg_server_url: str, template_db: str) -> Iterator[str]:
    name = f"agentrt_matrix_{uuid.uuid4().hex[:12]}"

    async def admin(statement: str) -> None:
        conn = await asyncpg.connect(pg_server_url)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"'))
    try:
        yield f"{pg_server_url.rpartition('/')[0]}/{name}"
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
async def sdb(shared_db_url: str):
    conn = await asyncpg.connect(shared_db_url)
    await init_connection(conn)
    try:
        yield conn
    finally:
        await conn.close()


async def snapshot(db: asyncpg.Connection) -> dict[str, list[dict[str, Any]]]:
    """Every row of the tables a call could touch."""
    tables = ("agent_runs", "agent_checkpoints", "tool_executions", "outbox")
    found = {table: [dict(r) for r in await db.fetch(f"SELECT * FROM {table} ORDER BY 1, 2")] for table in tables}
    # Any claim may turn other, due runs of earlier cases claim-ready (claim_work's `waking`, a flag of
    # the claim index, not a transition): the table leaves that flag out.
    for run in found["agent_runs"]:
        run.pop("claim_ready", None)
    return found


# ---------------------------------------------------------------------- building a run in a status via the API


@dataclass
class World:
    stack: Stack
    db: asyncpg.Connection
    agent: str
    run_id: str
    lease: ws.LeaseRef  # the latest lease issued for the run (stale once it is not leased)
    version: int

    async def row(self) -> asyncpg.Record:
        return await self.db.fetchrow("SELECT * FROM agent_runs WHERE id = $1", uuid.UUID(self.run_id))


async def save(w: World, state: dict[str, Any], step_key: str) -> None:
    reply = await w.stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=w.lease, expected_version=w.version, state_json=json.dumps(state), schema_version=1,
        step_key=step_key, event_id=eid()))
    w.version = reply.version


async def finish(w: World, outcome: int, **fields: Any) -> ws.FinishRunResponse:
    return await w.stack.work.FinishRun(ws.FinishRunRequest(
        lease=w.lease, expected_version=w.version, outcome=outcome, event_id=eid(), **fields))


async def build(stack: Stack, db: asyncpg.Connection, status: S, lapsed: bool, max_attempts: int) -> World:
    """A run in `status`, reached through the API only. QUEUED runs were never claimed."""
    agent = f"m-{uuid.uuid4().hex[:10]}"
    run = await submit(stack, agent=agent, payload={"order": 1}, max_attempts=max_attempts)
    w = World(stack, db, agent, run.run_id, ws.LeaseRef(run_id=run.run_id, worker_id="w1", fencing_token=1), 0)
    if status is S.CANCELLED:
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=w.run_id, reason="built for the matrix"),
                                   metadata=stack.md())
    elif status is not S.QUEUED:
        lease = await claim(stack, worker="w1", agents=(agent,))
        assert lease is not None
        w.lease = lease_ref(lease)
        if status in (S.WAITING_TOOL, S.PAUSED_INDOUBT):
            await save(w, tool_state(S1, TOOL, REQ1), S1)
            await stack.work.BeginToolCall(ws.BeginToolCallRequest(
                lease=w.lease, expected_version=w.version, step_key=S1, tool_name=TOOL, idempotency_key=f"{agent}-k1",
                request_json=json.dumps(REQ1), execution_id=eid(), event_id=eid()))
            if status is S.PAUSED_INDOUBT:
                await stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(
                    lease=w.lease, step_key=S1, error_code="timeout", event_id=eid()))
        else:
            # RUNNING with the decision for the next tool call already checkpointed (Tx1's precondition).
            await save(w, tool_state(S2, TOOL, REQ2), S2)
            finishing = {S.PAUSED_HUMAN: ws.FINISH_OUTCOME_PAUSED_HUMAN, S.COMPLETED: ws.FINISH_OUTCOME_COMPLETED,
                         S.FAILED: ws.FINISH_OUTCOME_FAILED}
            if status in finishing:
                await finish(w, finishing[status], reason="built for the matrix")
    if lapsed:
        # Simulates time passing: the lease lapses by database time without waiting for it.
        await db.execute("UPDATE agent_runs SET lease_expires_at = clock_timestamp() - interval '1 second' "
                         "WHERE id = $1", uuid.UUID(w.run_id))
    assert (await w.row())["status"] == status.value
    return w


# ---------------------------------------------------------------------- the operations


@dataclass(frozen=True)
class Operation:
    kind: str  # "work": fenced WorkService write; "operator": RunService; "claim": ClaimWork
    op: Callable[[S], Op]  # the table's operation this call is, from the given status
    call: Callable[[World], Awaitable[Any]]
    reported: Callable[[Any], int | None]  # the status the reply names, if it names one
    max_attempts: int = 12


def fixed(op: Op) -> Callable[[S], Op]:
    return lambda status: op


def _none(reply: Any) -> None:
    return None


def _status(reply: Any) -> int:
    return reply.status


def _run_status(reply: Any) -> int:
    return reply.run.status


def _finish(outcome: int, **fields: Any) -> Callable[[World], Awaitable[Any]]:
    return lambda w: finish(w, outcome, **fields)


def _complete(outcome: int, end: int = 0) -> Callable[[World], Awaitable[Any]]:
    def call(w: World) -> Awaitable[Any]:
        extra: dict[str, Any] = (
            {"evidence_json": '{"lookup": "no such refund"}'} if outcome == ws.TOOL_OUTCOME_NOT_EXECUTED
            else {"state_json": '{"cursor": "after-refund"}', "schema_version": 1,
                  "response_json": '{"refund_id": "r-1"}'})
        if end:
            extra["end"] = ws.RunEnd(outcome=end, reason="ended with the last step", result_json='{"ok": 1}',
                                     event_id=eid())
        return w.stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
            lease=w.lease, expected_version=w.version, step_key=S1, outcome=outcome, event_id=eid(), **extra))
    return call


def _resolve(outcome: int) -> Callable[[World], Awaitable[Any]]:
    def call(w: World) -> Awaitable[Any]:
        result = '{"refund_id": "r-1"}' if outcome == rs.RESOLUTION_OUTCOME_SUCCEEDED else ""
        return w.stack.runs.ResolveToolExecution(rs.ResolveToolExecutionRequest(
            run_id=w.run_id, step_key=S1, outcome=outcome, result_json=result,
            evidence_json='{"lookup": "checked downstream"}', resolved_by="operator-1"), metadata=w.stack.md())
    return call


def _claim_op(status: S) -> Op:
    return Op.CLAIM_EXPIRED if status in LEASED else Op.CLAIM


def _cancel_op(status: S) -> Op:
    return Op.REQUEST_CANCEL if status in LEASED else Op.CANCEL


async def _claim(w: World) -> ws.ClaimWorkResponse:
    return await w.stack.work.ClaimWork(ws.ClaimWorkRequest(worker_id="w2", agents=[w.agent]), timeout=30)


OPERATIONS: dict[str, Operation] = {
    "Heartbeat": Operation("work", fixed(Op.HEARTBEAT),
                           lambda w: w.stack.work.Heartbeat(ws.HeartbeatRequest(lease=w.lease)), _none),
    "SaveCheckpoint": Operation("work", fixed(Op.SAVE_CHECKPOINT), lambda w: w.stack.work.SaveCheckpoint(
        ws.SaveCheckpointRequest(lease=w.lease, expected_version=w.version, state_json='{"cursor": "later"}',
                                 schema_version=1, event_id=eid())), _none),
    "BeginToolCall": Operation("work", fixed(Op.BEGIN_TOOL_CALL), lambda w: w.stack.work.BeginToolCall(
        ws.BeginToolCallRequest(lease=w.lease, expected_version=w.version, step_key=S2, tool_name=TOOL,
                                idempotency_key=f"{w.agent}-k2", request_json=json.dumps(REQ2),
                                execution_id=eid(), event_id=eid())), _none),
    "CompleteToolCall(SUCCEEDED)": Operation("work", fixed(Op.COMPLETE_TOOL_CALL),
                                             _complete(ws.TOOL_OUTCOME_SUCCEEDED), _status),
    "CompleteToolCall(FAILED)": Operation("work", fixed(Op.COMPLETE_TOOL_CALL),
                                          _complete(ws.TOOL_OUTCOME_FAILED), _status),
    "CompleteToolCall(SUCCEEDED, end COMPLETED)": Operation(
        "work", fixed(Op.COMPLETE_TOOL_CALL_AND_COMPLETE),
        _complete(ws.TOOL_OUTCOME_SUCCEEDED, ws.FINISH_OUTCOME_COMPLETED), _status),
    "CompleteToolCall(FAILED, end FAILED)": Operation(
        "work", fixed(Op.COMPLETE_TOOL_CALL_AND_FAIL),
        _complete(ws.TOOL_OUTCOME_FAILED, ws.FINISH_OUTCOME_FAILED), _status),
    "CompleteToolCall(NOT_EXECUTED)": Operation("work", fixed(Op.TOOL_NOT_EXECUTED),
                                                _complete(ws.TOOL_OUTCOME_NOT_EXECUTED), _status),
    # Tx2 of S1 with the next decision (S2) checkpointed, and Tx1 of S2, in one write.
    "CompleteAndBeginToolCall": Operation("work", fixed(Op.COMPLETE_AND_BEGIN_TOOL_CALL), lambda w: (
        w.stack.work.CompleteAndBeginToolCall(ws.CompleteAndBeginToolCallRequest(
            lease=w.lease, expected_version=w.version, step_key=S1, outcome=ws.TOOL_OUTCOME_SUCCEEDED,
            response_json='{"refund_id": "r-1"}', state_json=json.dumps(tool_state(S2, TOOL, REQ2)),
            schema_version=1, event_id=eid(),
            next=ws.NextToolCall(step_key=S2, tool_name=TOOL, idempotency_key=f"{w.agent}-k2",
                                 request_json=json.dumps(REQ2), execution_id=eid(), event_id=eid())))),
        _status),
    "MarkToolInDoubt": Operation("work", fixed(Op.MARK_TOOL_IN_DOUBT), lambda w: w.stack.work.MarkToolInDoubt(
        ws.MarkToolInDoubtRequest(lease=w.lease, step_key=S1, error_code="timeout", event_id=eid())), _status),
    "FinishRun(COMPLETED)": Operation("work", fixed(Op.FINISH_COMPLETED),
                                      _finish(ws.FINISH_OUTCOME_COMPLETED, result_json='{"ok": true}'), _status),
    "FinishRun(FAILED)": Operation("work", fixed(Op.FINISH_FAILED),
                                   _finish(ws.FINISH_OUTCOME_FAILED, reason="gave up"), _status),
    "FinishRun(PAUSED_HUMAN)": Operation("work", fixed(Op.FINISH_PAUSED_HUMAN),
                                         _finish(ws.FINISH_OUTCOME_PAUSED_HUMAN, reason="needs approval"), _status),
    "FinishRun(RETRY)": Operation("work", fixed(Op.FINISH_RETRY),
                                  _finish(ws.FINISH_OUTCOME_RETRY, reason="429"), _status),
    "FinishRun(RETRY, exhausted)": Operation("work", fixed(Op.FINISH_RETRY_EXHAUSTED),
                                             _finish(ws.FINISH_OUTCOME_RETRY, reason="429"), _status, max_attempts=1),
    "FinishRun(RETRY, exhausted, pause)": Operation(
        "work", fixed(Op.FINISH_RETRY_EXHAUSTED_PAUSE),
        _finish(ws.FINISH_OUTCOME_RETRY, reason="429", pause_when_exhausted=True), _status, max_attempts=1),
    "FinishRun(SLEEP)": Operation("work", fixed(Op.FINISH_SLEEP),
                                  _finish(ws.FINISH_OUTCOME_SLEEP, sleep_ms=60_000), _status),
    "CancelRun": Operation("operator", _cancel_op, lambda w: w.stack.runs.CancelRun(
        rs.CancelRunRequest(run_id=w.run_id, reason="operator stop"), metadata=w.stack.md()), _status),
    "ResumeRun": Operation("operator", fixed(Op.RESUME), lambda w: w.stack.runs.ResumeRun(
        rs.ResumeRunRequest(run_id=w.run_id, decision=rs.RESUME_DECISION_APPROVE, operator="alice"),
        metadata=w.stack.md()), _status),
    "ResolveToolExecution(SUCCEEDED)": Operation("operator", fixed(Op.RESOLVE_SUCCEEDED),
                                                 _resolve(rs.RESOLUTION_OUTCOME_SUCCEEDED), _run_status),
    "ResolveToolExecution(NOT_EXECUTED)": Operation("operator", fixed(Op.RESOLVE_NOT_EXECUTED),
                                                    _resolve(rs.RESOLUTION_OUTCOME_NOT_EXECUTED), _run_status),
    "ResolveToolExecution(UNKNOWN)": Operation("operator", fixed(Op.RESOLVE_UNKNOWN),
                                               _resolve(rs.RESOLUTION_OUTCOME_UNKNOWN), _run_status),
    "ClaimWork": Operation("claim", _claim_op, _claim,
                           lambda reply: reply.lease.run.status if reply.HasField("lease") else None),
}

# Rows of the matrix: every status, plus the two leased ones after their lease lapsed.
ROWS = [(status, False) for status in RunStatus] + [(S.RUNNING, True), (S.WAITING_TOOL, True)]


def row_id(row: tuple[S, bool]) -> str:
    return f"{row[0].value}{'(lapsed)' if row[1] else ''}"


@dataclass(frozen=True)
class Expected:
    target: S | None = None  # allowed: the status the run lands in
    reason: str | None = None  # refused: the ErrorInfo reason (FAILED_PRECONDITION)
    nothing_claimed: bool = False
    unchanged: bool = False  # answered with the run as it is (a repeated cancel), nothing written


def expected(status: S, lapsed: bool, operation: Operation) -> Expected:
    live_lease = status in LEASED and not lapsed
    if operation.kind == "work" and not live_lease:
        return Expected(reason="LEASE_LOST")
    op = operation.op(status)
    if status is S.CANCELLED and op is Op.CANCEL:
        return Expected(target=S.CANCELLED, unchanged=True)  # a retried cancel answers with its outcome
    if operation.kind == "claim" and live_lease:
        return Expected(nothing_claimed=True)  # a live lease is not claimable
    target = TRANSITIONS.get((status, op))
    if target is None:
        return Expected(nothing_claimed=True) if operation.kind == "claim" else Expected(reason="INVALID_TRANSITION")
    return Expected(target=target)


CASES = [pytest.param(row, name, id=f"{row_id(row)}-{name}") for row in ROWS for name in OPERATIONS]


@pytest.mark.parametrize(("row", "name"), CASES)
async def test_matrix(shared_db_url, sdb, row, name):
    status, lapsed = row
    operation = OPERATIONS[name]
    want = expected(status, lapsed, operation)
    async with scheduler_stack(shared_db_url, lease_duration_ms=60_000) as stack:
        w = await build(stack, sdb, status, lapsed, operation.max_attempts)
        before_row, before = await w.row(), await snapshot(sdb)
        if want.reason is not None:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await operation.call(w)
            assert (refused.value.code(), reason_of(refused.value)) == (FP, want.reason), refused.value.details()
            assert await snapshot(sdb) == before, "a refused call changed something"
            return
        reply = await operation.call(w)
        if want.nothing_claimed:
            assert not reply.HasField("lease")
            assert await snapshot(sdb) == before, "claiming nothing changed something"
            return
        after = await w.row()
        assert after["status"] == want.target.value
        reported = operation.reported(reply)
        if reported is not None:
            assert RUN_STATUS_NAME[reported] == want.target.value
        if want.unchanged:
            assert await snapshot(sdb) == before, "a repeated cancel changed something"
            return
        assert_moved_consistently(operation.op(status), before_row, after)


def assert_moved_consistently(op: Op, before: asyncpg.Record, after: asyncpg.Record) -> None:
    """Side conditions of an allowed move (invariant 1, fences, terminal bookkeeping)."""
    target = S(after["status"])
    if target not in LEASED:
        assert after["lease_owner"] is None and after["lease_expires_at"] is None
    assert (after["finished_at"] is not None) == (target in TERMINAL)
    if op in (Op.CLAIM, Op.CLAIM_EXPIRED):
        assert after["fencing_token"] == before["fencing_token"] + 1
        assert after["lease_owner"] == "w2"
        assert after["attempt_count"] == before["attempt_count"] + (op is Op.CLAIM)
    else:
        assert after["fencing_token"] == before["fencing_token"], "only a claim moves the fence"
    if op is Op.REQUEST_CANCEL:
        assert after["cancel_requested_at"] is not None
        assert (after["lease_owner"], after["lease_expires_at"]) == (before["lease_owner"], before["lease_expires_at"])
    if op is Op.HEARTBEAT:
        assert after["lease_expires_at"] > before["lease_expires_at"]


# ---------------------------------------------------------------------- Tx1 on a step that is already in the ledger


async def test_begin_tool_call_on_a_recorded_step(shared_db_url, sdb):
    """The holder gets the existing row (never a licence to resend); a stale lease gets LEASE_LOST."""
    async with scheduler_stack(shared_db_url, lease_duration_ms=60_000) as stack:
        w = await build(stack, sdb, S.WAITING_TOOL, False, 12)

        def again(lease: ws.LeaseRef) -> Awaitable[ws.BeginToolCallResponse]:
            return stack.work.BeginToolCall(ws.BeginToolCallRequest(
                lease=lease, expected_version=w.version, step_key=S1, tool_name=TOOL,
                idempotency_key=f"{w.agent}-k1", request_json=json.dumps(REQ1), execution_id=eid(),
                event_id=eid()))

        before = await snapshot(sdb)
        reply = await again(w.lease)
        assert reply.existing and not reply.replayed
        assert reply.execution.status == pb.TOOL_EXECUTION_STATUS_OUTBOUND_INTENT
        assert await snapshot(sdb) == before

        stale = ws.LeaseRef(run_id=w.run_id, worker_id=w.lease.worker_id, fencing_token=w.lease.fencing_token)
        # Simulates time passing: the holder's lease lapses and another worker takes the run over.
        await sdb.execute("UPDATE agent_runs SET lease_expires_at = clock_timestamp() - interval '1 second' "
                          "WHERE id = $1", uuid.UUID(w.run_id))
        taken = await claim(stack, worker="w2", agents=(w.agent,))
        assert taken is not None and taken.run.fencing_token == stale.fencing_token + 1
        before = await snapshot(sdb)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await again(stale)
        assert (refused.value.code(), reason_of(refused.value)) == (FP, "LEASE_LOST")
        assert await snapshot(sdb) == before

