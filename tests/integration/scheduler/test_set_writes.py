"""Many runs' writes in one statement, on a real PostgreSQL: chained steps (CompleteAndBeginToolCall),
last steps that end their runs (CompleteToolCall with an end) and intents (BeginToolCall).

The items of one WriteBatch that make the same kind of write reach the store together and go out as
one set-form statement (scheduler/store/batched.py): one round trip and one commit for all of them. Each run's
write must still be judged alone and land alone: what commits for a run is exactly what its own
statement would have written (its rows, never a neighbour's), a write that matches nothing is refused
by itself while its neighbours commit, and a write that refuses the whole statement (a unique key)
is sent again by itself, so it cannot take its neighbours down with it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest
from support import claim, eid, lease_ref, scheduler_stack, snapshot, submit, tool_state
from tool_call_support import REQ1, REQ2, S1, S2, TOOL, TOOL2, combined, waiting_on_s1

from scheduler.states import Op, sources
from scheduler.store import connect_pool
from scheduler.store.batched import ALONE, SetWrite
from scheduler.store.queries import Q
from scheduler.store.types import NO_JOURNAL
from scheduler.store.work_tools import CHAIN_COLUMNS
from shared.canonical import CanonicalJson, canonical_json, request_hashes, sha256_of
from shared.db import is_primary_lost
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration


def item(request: ws.CompleteAndBeginToolCallRequest) -> ws.WriteBatchItem:
    return ws.WriteBatchItem(complete_and_begin_tool_call=request)


def entries(run: int) -> list[pb.JournalEntry]:
    """Run `run`'s journal entries for its step: as many as its number, each naming the run, so a row
    written for the wrong run (or a missing one) shows."""
    return [pb.JournalEntry(seq=n, kind="tool", step_key=S1, detail_json=json.dumps({"run": run, "n": n}))
            for n in range(1, run + 1)]


def chains(stack: Any) -> Any:
    return stack.server.store.tools.chains


def assert_chained(after: dict[str, Any], request: ws.CompleteAndBeginToolCallRequest, run: int) -> None:
    """What the run's own CompleteAndBeginToolCall writes, and nothing else."""
    row = after["run"]
    assert (row["status"], row["version"], row["current_step_key"], row["journal_length"]) == (
        "WAITING_TOOL", 2, S2, run)
    first, second = after["ledger"]
    assert (first["step_key"], first["status"], first["response_json"]) == (S1, "SUCCEEDED", {"refund": "r-1"})
    assert (second["step_key"], second["status"], second["id"], second["intent_event_id"],
            second["idempotency_key"], second["request_json"]) == (
        S2, "OUTBOUND_INTENT", uuid.UUID(request.next.execution_id), uuid.UUID(request.next.event_id),
        request.next.idempotency_key, REQ2)
    assert [(c["version"], c["event_id"]) for c in after["checkpoints"]][-1] == (2, uuid.UUID(request.event_id))
    assert bytes(after["checkpoints"][-1]["state_hash"]) == sha256_of(json.loads(request.state_json))
    assert [(e["event_type"], e["event_id"], e["run_version"]) for e in after["events"][-2:]] == [
        ("agent.tool_succeeded", uuid.UUID(request.event_id), 2),
        ("agent.tool_requested", uuid.UUID(request.next.event_id), 2)]
    assert [(j["seq"], j["detail"], j["run_version"]) for j in after["journal"]] == [
        (n, {"run": run, "n": n}, 2) for n in range(1, run + 1)]


async def test_the_chained_steps_of_many_runs_commit_in_one_statement_each_as_its_own(db_url, db):
    async with scheduler_stack(db_url) as stack:
        runs = [await waiting_on_s1(stack) for _ in range(6)]
        requests = [combined(ref, journal=entries(n)) for n, (_, ref) in enumerate(runs)]
        statements, writes = chains(stack).statements, chains(stack).writes

        reply = await stack.work.WriteBatch(ws.WriteBatchRequest(items=[item(r) for r in requests]))

        assert [r.WhichOneof("result") for r in reply.results] == ["complete_and_begin_tool_call"] * 6, reply
        assert [(r.complete_and_begin_tool_call.version, r.complete_and_begin_tool_call.replayed,
                 r.complete_and_begin_tool_call.execution.execution_id) for r in reply.results] == [
            (2, False, request.next.execution_id) for request in requests]
        assert (chains(stack).statements - statements, chains(stack).writes - writes) == (1, 6)
        for n, ((run_id, _), request) in enumerate(zip(runs, requests, strict=True)):
            assert_chained(await snapshot(db, run_id), request, n)

        # Sent again (the executor's retry after a lost answer): each answers from what committed.
        again = await stack.work.WriteBatch(ws.WriteBatchRequest(items=[item(r) for r in requests]))
        assert [(r.complete_and_begin_tool_call.version, r.complete_and_begin_tool_call.replayed)
                for r in again.results] == [(2, True)] * 6


async def test_a_write_that_matches_nothing_is_refused_by_itself_and_its_neighbours_commit(db_url, db):
    async with scheduler_stack(db_url) as stack:
        runs = [await waiting_on_s1(stack) for _ in range(4)]
        requests = [combined(ref) for _, ref in runs]
        requests[1] = combined(runs[1][1], expected=7)  # not the run's version
        stale = ws.LeaseRef()
        stale.CopyFrom(runs[2][1])
        stale.fencing_token += 1  # not the run's fence
        requests[2] = combined(stale)
        before = [await snapshot(db, run_id) for run_id, _ in runs]
        statements = chains(stack).statements

        reply = await stack.work.WriteBatch(ws.WriteBatchRequest(items=[item(r) for r in requests]))

        assert [r.WhichOneof("result") for r in reply.results] == [
            "complete_and_begin_tool_call", "error", "error", "complete_and_begin_tool_call"]
        assert [(r.error.code, r.error.reason) for r in reply.results[1:3]] == [
            (grpc.StatusCode.ABORTED.value[0], "VERSION_CONFLICT"),
            (grpc.StatusCode.FAILED_PRECONDITION.value[0], "LEASE_LOST")]
        assert chains(stack).statements - statements == 1  # the refusals were explained, not sent again
        for n in (1, 2):
            assert await snapshot(db, runs[n][0]) == before[n], "a refused write changed its run"
        for n in (0, 3):
            assert_chained(await snapshot(db, runs[n][0]), requests[n], 0)


async def test_a_write_that_refuses_the_whole_statement_is_sent_again_alone(db_url, db):
    """A unique key refused for one run rolls back the shared statement: no run's write is lost, the
    one at fault gets its own refusal, and nothing of it is written."""
    async with scheduler_stack(db_url) as stack:
        runs = [await waiting_on_s1(stack) for _ in range(3)]
        requests = [combined(ref) for _, ref in runs]
        # The next call's idempotency key is one the first run's open S1 row already holds.
        requests[2] = combined(runs[2][1], key=f"k1-{runs[0][0]}", next_tool=TOOL2)
        requests[2].next.tool_name = "payments.refund"
        state = json.loads(requests[2].state_json)
        state["pending_tool"].update(tool_name="payments.refund", request_hash=request_hashes(
            "payments.refund", REQ2)[0].hex())
        requests[2].state_json = json.dumps(state)
        before = await snapshot(db, runs[2][0])
        statements, alone = chains(stack).statements, chains(stack).alone_writes

        reply = await stack.work.WriteBatch(ws.WriteBatchRequest(items=[item(r) for r in requests]))

        assert [r.WhichOneof("result") for r in reply.results] == [
            "complete_and_begin_tool_call", "complete_and_begin_tool_call", "error"], reply
        assert (reply.results[2].error.code, reply.results[2].error.reason,
                reply.results[2].error.metadata["field"]) == (
            grpc.StatusCode.ALREADY_EXISTS.value[0], "ALREADY_EXISTS", "next.idempotency_key")
        assert (chains(stack).statements - statements, chains(stack).alone_writes - alone) == (0, 3), \
            "the shared statement was refused, and each write went again by itself"
        assert await snapshot(db, runs[2][0]) == before
        for n in (0, 1):
            assert_chained(await snapshot(db, runs[n][0]), requests[n], 0)


async def test_two_writes_of_one_run_never_share_a_statement(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        request = combined(ref)
        statements, writes = chains(stack).statements, chains(stack).writes

        reply = await stack.work.WriteBatch(ws.WriteBatchRequest(items=[item(request), item(request)]))

        answers = sorted((r.complete_and_begin_tool_call.version, r.complete_and_begin_tool_call.replayed)
                         for r in reply.results)
        assert answers == [(2, False), (2, True)], reply
        # The second waited for a statement of its own, matched nothing there and found the first's rows.
        assert (chains(stack).statements - statements, chains(stack).writes - writes) == (2, 2)
        assert_chained(await snapshot(db, run_id), request, 0)


def chain_values(run_id: uuid.UUID, worker: str, token: int, request: ws.CompleteAndBeginToolCallRequest
                 ) -> tuple[Any, ...]:
    """What ToolWrites gives SetWrite for `request` (CHAIN_COLUMNS' order), for calling it directly."""
    state = CanonicalJson(canonical_json(json.loads(request.state_json)))
    digest, legacy = request_hashes(TOOL2, REQ2)
    return (run_id, worker, token, 1, S1, "SUCCEEDED", state, sha256_of(state), 1, {"refund": "r-1"}, "r-1", None,
            None, uuid.UUID(request.event_id), S2, TOOL2, request.next.idempotency_key, digest, legacy,
            uuid.UUID(request.next.execution_id), REQ2, uuid.UUID(request.next.event_id), None, None,
            "CompleteAndBeginToolCall", b"\0" * 32)


async def test_a_caller_gone_before_the_statement_is_sent_writes_nothing(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await waiting_on_s1(stack)
        values = chain_values(uuid.UUID(run_id), ref.worker_id, ref.fencing_token, combined(ref))
        before = await snapshot(db, run_id)
        group = chains(stack)
        statements = group.statements

        gone = asyncio.ensure_future(group.write(uuid.UUID(run_id), values, NO_JOURNAL))
        await asyncio.sleep(0)  # it is queued for the next turn of the loop ...
        gone.cancel()  # ... and its caller leaves first
        with pytest.raises(asyncio.CancelledError):
            await gone
        await asyncio.sleep(0.05)
        assert (group.statements, await snapshot(db, run_id)) == (statements, before)

        # The same values, sent: the set statement writes exactly the one run.
        row = await group.write(uuid.UUID(run_id), values, NO_JOURNAL)
        assert row is not ALONE and row is not None and row["n"] == 1 and row["cp_version"] == 2
        assert (await snapshot(db, run_id))["run"]["version"] == 2


async def test_a_lost_database_is_each_callers_error_not_a_retry_each(db_url):
    """The shared statement's connection is lost: every caller hears the loss itself (its db_call answers
    UNAVAILABLE and expires stale sessions, as for a statement of its own), and none is sent again alone
    against the lost server."""
    from test_store_connection_loss import Relay, _through  # the TCP relay that cuts a database host away

    parts = urlsplit(db_url)
    if parts.hostname is None or parts.port is None:
        pytest.fail(f"the test database is not reachable over TCP: {db_url}")
    relay = Relay(parts.hostname, parts.port)
    pool = await connect_pool(_through(db_url, await relay.start()), min_size=1, max_size=1, scope="work")
    try:
        group = SetWrite(pool, Q.complete_and_begin_tool_call, CHAIN_COLUMNS,
                         {"allowed_statuses": sources(Op.COMPLETE_AND_BEGIN_TOOL_CALL)})

        def write() -> Any:
            run_id = uuid.uuid4()  # no such run: the statement matches nothing
            return group.write(run_id, chain_values(run_id, "w-1", 1, combined(ws.LeaseRef(run_id=str(run_id)))),
                               NO_JOURNAL)

        assert await asyncio.gather(write(), write()) == [None, None]
        assert (group.statements, group.writes) == (1, 2)
        await relay.cut()
        answers = await asyncio.wait_for(asyncio.gather(write(), write(), return_exceptions=True), timeout=20)
        assert all(is_primary_lost(answer) for answer in answers), answers
        assert (group.statements, group.alone_writes) == (1, 0)
    finally:
        pool.terminate()


# CompleteToolCall with an end ----------------------------------------------------------------------------


def ends(stack: Any, outcome: str = "COMPLETED") -> Any:
    op = Op.COMPLETE_TOOL_CALL_AND_COMPLETE if outcome == "COMPLETED" else Op.COMPLETE_TOOL_CALL_AND_FAIL
    return stack.server.store.work.ends[op]


def ending(ref: ws.LeaseRef, run: int, expected: int = 1) -> ws.WriteBatchItem:
    """Run `run`'s last Tx2: the call succeeded and the run ends COMPLETED with its own result."""
    return ws.WriteBatchItem(complete_tool_call=ws.CompleteToolCallRequest(
        lease=ref, expected_version=expected, step_key=S1, outcome=ws.TOOL_OUTCOME_SUCCEEDED,
        response_json=json.dumps({"run": run}), state_json=json.dumps({"cursor": "done", "run": run}),
        schema_version=1, event_id=eid(),
        journal=[pb.JournalEntry(seq=n, kind="result", step_key=S1, detail_json=json.dumps({"run": run, "n": n}))
                 for n in range(1, run + 1)],
        end=ws.RunEnd(outcome=ws.FINISH_OUTCOME_COMPLETED, reason=f"done {run}", result_json=json.dumps({"run": run}),
                      event_id=eid())))


def assert_ended(after: dict[str, Any], request: ws.CompleteToolCallRequest, run: int) -> None:
    row = after["run"]
    assert (row["status"], row["version"], row["lease_owner"], row["result"], row["terminal_reason"],
            row["journal_length"]) == ("COMPLETED", 2, None, {"run": run}, f"done {run}", run)
    (closed,) = after["ledger"]
    assert (closed["step_key"], closed["status"], closed["response_json"]) == (S1, "SUCCEEDED", {"run": run})
    assert [(c["version"], c["event_id"], c["state_json"]) for c in after["checkpoints"]][-1] == (
        2, uuid.UUID(request.event_id), {"cursor": "done", "run": run})
    assert [(e["event_type"], e["event_id"], e["run_version"]) for e in after["events"][-2:]] == [
        ("agent.tool_succeeded", uuid.UUID(request.event_id), 2),
        ("agent.run_completed", uuid.UUID(request.end.event_id), 2)]
    assert [(j["seq"], j["detail"], j["run_version"]) for j in after["journal"]] == [
        (n, {"run": run, "n": n}, 2) for n in range(1, run + 1)]


async def test_the_last_steps_of_many_runs_end_them_in_one_statement_each_as_its_own(db_url, db):
    async with scheduler_stack(db_url) as stack:
        runs = [await waiting_on_s1(stack) for _ in range(4)]
        items = [ending(ref, n) for n, (_, ref) in enumerate(runs)]
        group = ends(stack)
        statements, writes = group.statements, group.writes

        reply = await stack.work.WriteBatch(ws.WriteBatchRequest(items=items))

        assert [(r.WhichOneof("result"), r.complete_tool_call.version, r.complete_tool_call.status,
                 r.complete_tool_call.replayed) for r in reply.results] == [
            ("complete_tool_call", 2, pb.RUN_STATUS_COMPLETED, False)] * 4, reply
        assert (group.statements - statements, group.writes - writes) == (1, 4)
        for n, ((run_id, _), item_) in enumerate(zip(runs, items, strict=True)):
            assert_ended(await snapshot(db, run_id), item_.complete_tool_call, n)

        again = await stack.work.WriteBatch(ws.WriteBatchRequest(items=items))
        assert [(r.complete_tool_call.version, r.complete_tool_call.status, r.complete_tool_call.replayed)
                for r in again.results] == [(2, pb.RUN_STATUS_COMPLETED, True)] * 4


async def test_an_ending_refused_alone_or_refusing_the_statement_never_costs_its_neighbours(db_url, db):
    """A stale fence matches nothing and is refused by itself; an end event id already used refuses the
    shared statement (a unique key), so each write goes again alone: the good ones commit, the bad one
    is refused with nothing written."""
    async with scheduler_stack(db_url) as stack:
        runs = [await waiting_on_s1(stack) for _ in range(4)]
        items = [ending(ref, 1) for _, ref in runs]
        stale = ws.LeaseRef()
        stale.CopyFrom(runs[1][1])
        stale.fencing_token += 1
        items[1] = ending(stale, 1)
        taken = (await snapshot(db, runs[0][0]))["events"][0]["event_id"]  # run 0's submit event id
        items[2].complete_tool_call.end.event_id = str(taken)
        before = [await snapshot(db, run_id) for run_id, _ in runs]
        group = ends(stack)
        statements, alone = group.statements, group.alone_writes

        reply = await stack.work.WriteBatch(ws.WriteBatchRequest(items=items))

        assert [r.WhichOneof("result") for r in reply.results] == [
            "complete_tool_call", "error", "error", "complete_tool_call"], reply
        assert (reply.results[1].error.code, reply.results[1].error.reason) == (
            grpc.StatusCode.FAILED_PRECONDITION.value[0], "LEASE_LOST")
        assert (reply.results[2].error.code, reply.results[2].error.metadata["field"]) == (
            grpc.StatusCode.INVALID_ARGUMENT.value[0], "end.event_id")
        assert (group.statements - statements, group.alone_writes - alone) == (0, 4)
        for n in (1, 2):
            assert await snapshot(db, runs[n][0]) == before[n], "a refused write changed its run"
        for n in (0, 3):
            assert_ended(await snapshot(db, runs[n][0]), items[n].complete_tool_call, 1)


# BeginToolCall ----------------------------------------------------------------------------------------------


def intents(stack: Any) -> Any:
    return stack.server.store.tools.intents


async def decided(stack: Any) -> tuple[str, ws.LeaseRef]:
    """A run RUNNING at version 1 whose checkpoint records the decision to call TOOL with REQ1 as S1."""
    run = await submit(stack)
    lease = await claim(stack)
    assert lease is not None and lease.run.run_id == run.run_id
    ref = lease_ref(lease)
    await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=ref, expected_version=0, state_json=json.dumps(tool_state(S1, TOOL, REQ1)), schema_version=1,
        step_key=S1, event_id=eid()))
    return run.run_id, ref


def intent_item(run_id: str, ref: ws.LeaseRef, key: str | None = None) -> ws.WriteBatchItem:
    return ws.WriteBatchItem(begin_tool_call=ws.BeginToolCallRequest(
        lease=ref, expected_version=1, step_key=S1, tool_name=TOOL, idempotency_key=key or f"k1-{run_id}",
        request_json=json.dumps(REQ1), execution_id=eid(), event_id=eid()))


def assert_intended(after: dict[str, Any], request: ws.BeginToolCallRequest) -> None:
    row = after["run"]
    assert (row["status"], row["version"], row["current_step_key"]) == ("WAITING_TOOL", 1, S1)
    (opened,) = after["ledger"]
    assert (opened["step_key"], opened["status"], opened["id"], opened["intent_event_id"], opened["idempotency_key"],
            opened["request_json"]) == (S1, "OUTBOUND_INTENT", uuid.UUID(request.execution_id),
                                        uuid.UUID(request.event_id), request.idempotency_key, REQ1)
    assert [(e["event_type"], e["event_id"]) for e in after["events"][-1:]] == [
        ("agent.tool_requested", uuid.UUID(request.event_id))]


async def test_the_intents_of_many_runs_commit_in_one_statement_each_as_its_own(db_url, db):
    async with scheduler_stack(db_url) as stack:
        runs = [await decided(stack) for _ in range(5)]
        items = [intent_item(run_id, ref) for run_id, ref in runs]
        group = intents(stack)
        statements, writes = group.statements, group.writes

        reply = await stack.work.WriteBatch(ws.WriteBatchRequest(items=items))

        assert [(r.WhichOneof("result"), r.begin_tool_call.existing, r.begin_tool_call.replayed,
                 r.begin_tool_call.execution.execution_id) for r in reply.results] == [
            ("begin_tool_call", False, False, item_.begin_tool_call.execution_id) for item_ in items], reply
        assert (group.statements - statements, group.writes - writes) == (1, 5)
        for (run_id, _), item_ in zip(runs, items, strict=True):
            assert_intended(await snapshot(db, run_id), item_.begin_tool_call)

        again = await stack.work.WriteBatch(ws.WriteBatchRequest(items=items))
        assert [(r.begin_tool_call.existing, r.begin_tool_call.replayed) for r in again.results] == [
            (True, True)] * 5


async def test_an_intent_refusing_the_statement_is_refused_alone_and_its_neighbours_commit(db_url, db):
    """An idempotency key another run's row holds refuses the shared statement (a unique key): each
    write goes again alone, the good ones commit and the bad one gets ALREADY_EXISTS with nothing
    written; a version conflict beside them is refused by itself."""
    async with scheduler_stack(db_url) as stack:
        held_run, _ = await waiting_on_s1(stack)  # its open row holds k1-<held_run>
        runs = [await decided(stack) for _ in range(4)]
        items = [intent_item(run_id, ref) for run_id, ref in runs]
        items[1] = intent_item(runs[1][0], runs[1][1], key=f"k1-{held_run}")
        items[2].begin_tool_call.expected_version = 5
        before = [await snapshot(db, run_id) for run_id, _ in runs]
        group = intents(stack)
        statements, alone = group.statements, group.alone_writes

        reply = await stack.work.WriteBatch(ws.WriteBatchRequest(items=items))

        assert [r.WhichOneof("result") for r in reply.results] == [
            "begin_tool_call", "error", "error", "begin_tool_call"], reply
        assert [(r.error.code, r.error.metadata.get("field", "")) for r in reply.results[1:3]] == [
            (grpc.StatusCode.ALREADY_EXISTS.value[0], "idempotency_key"), (grpc.StatusCode.ABORTED.value[0], "")]
        assert (group.statements - statements, group.alone_writes - alone) == (0, 4)
        for n in (1, 2):
            assert await snapshot(db, runs[n][0]) == before[n], "a refused write changed its run"
        for n in (0, 3):
            assert_intended(await snapshot(db, runs[n][0]), items[n].begin_tool_call)
