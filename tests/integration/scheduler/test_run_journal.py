"""The run journal (issue 12: long runs at flat cost), on a real PostgreSQL.

Checkpoint-writing calls append their journal entries in the very statement
that writes the checkpoint, under the same fence, owner, version and
live-lease checks: a refused write appends nothing, a stale holder's entries
never appear, and the entries continue the run's journal without a gap or a
rewrite. The entries are bound into the write's event id (a retry with other
entries is ALREADY_EXISTS). The holder reads them back (ReadJournal) with the
ledger's tool answers (GetToolResults); operators page them in GetRunHistory.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from support import claim, eid, lease_ref, reason_of, rpc_error, scheduler_stack, snapshot, submit, tool_state
from support import commit_unknown_count as counter

from shared.errors import error_info
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.writes import MAX_JOURNAL_ENTRIES

pytestmark = pytest.mark.integration

S1, S2, S3 = "crm.ticket/1", "crm.notify/1", "crm.close/1"
TOOL = "crm.open_ticket"
REQ1, REQ2, REQ3 = {"customer": 7}, {"customer": 7, "notify": True}, {"close": 1}
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def entry(seq: int, kind: str = "tool", step_key: str = "", detail: dict[str, Any] | None = None,
          **fields: Any) -> pb.JournalEntry:
    return pb.JournalEntry(seq=seq, kind=kind, step_key=step_key, detail_json=json.dumps(detail or {"n": seq}),
                           **fields)


def checkpoint(ref: ws.LeaseRef, version: int, journal: list[pb.JournalEntry], event_id: str | None = None,
               state: dict[str, Any] | None = None, step_key: str = "") -> ws.SaveCheckpointRequest:
    return ws.SaveCheckpointRequest(
        lease=ref, expected_version=version, schema_version=2, step_key=step_key, event_id=event_id or eid(),
        state_json=json.dumps(state or {"cursor": f"v{version + 1}", "journal_len": journal[-1].seq if journal
                                        else 0}),
        journal=journal)


async def started(stack: Any, worker: str = "w1") -> tuple[str, ws.LeaseRef]:
    run = await submit(stack)
    lease = await claim(stack, worker)
    assert lease is not None and lease.run.run_id == run.run_id
    return run.run_id, lease_ref(lease)


async def lapse(db: Any, run_id: str) -> None:
    await db.execute("UPDATE agent_runs SET lease_expires_at = clock_timestamp() - interval '1 second' "
                     "WHERE id = $1::uuid", run_id)


async def journal_rows(db: Any, run_id: str) -> list[Any]:
    return await db.fetch("SELECT * FROM run_journal WHERE run_id = $1::uuid ORDER BY seq", run_id)


def field_of(error: grpc.aio.AioRpcError) -> str | None:
    info = error_info(error)
    return info.metadata.get("field") if info else None


# ---------------------------------------------------------------------------- appended with the checkpoint


async def test_entries_are_appended_with_their_checkpoint_and_read_back_in_order(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        first = await stack.work.SaveCheckpoint(checkpoint(ref, 0, [entry(1, step_key=S1), entry(2, "answer")]))
        second = await stack.work.SaveCheckpoint(checkpoint(ref, 1, [entry(3, "sleep", node="wait", tool="")]))
        empty = await stack.work.SaveCheckpoint(checkpoint(ref, 2, []))  # a checkpoint need not record any
        assert (first.version, second.version, empty.version) == (1, 2, 3)
        rows = await journal_rows(db, run_id)
        assert [(r["seq"], r["kind"], r["run_version"], r["fencing_token"]) for r in rows] == [
            (1, "tool", 1, 1), (2, "answer", 1, 1), (3, "sleep", 2, 1)]
        assert rows[0]["step_key"] == S1 and rows[2]["node"] == "wait" and rows[0]["detail"] == {"n": 1}
        assert await db.fetchval("SELECT journal_length FROM agent_runs WHERE id = $1::uuid", run_id) == 3

        page = await stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref, page_size=2))
        assert [e.seq for e in page.entries] == [1, 2] and page.more
        assert page.entries[0].run_version == 1 and not page.entries[0].HasField("created_at")
        assert json.loads(page.entries[0].detail_json) == {"n": 1} and page.entries[0].step_key == S1
        rest = await stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref, after_seq=2, page_size=2))
        assert [(e.seq, e.kind, e.run_version) for e in rest.entries] == [(3, "sleep", 2)] and not rest.more
        whole = await stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref))  # page_size 0 = 1000
        assert [e.seq for e in whole.entries] == [1, 2, 3] and not whole.more
        past = await stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref, after_seq=3))
        assert not past.entries and not past.more

        # The next holder learns the journal's length and the limits with its lease.
        await lapse(db, run_id)
        lease = await claim(stack, "w2")
        assert lease is not None and lease.journal_length == 3
        assert lease.limits.max_journal_entry_bytes == 65536 and lease.limits.max_checkpoint_bytes == 1048576
        assert lease.limits.max_payload_bytes == 1048576
        # The former holder reads nothing any more.
        error = await rpc_error(stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref)))
        assert reason_of(error) == "LEASE_LOST"


async def test_tool_steps_append_entries_and_the_holder_reads_the_ledger(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        await stack.work.SaveCheckpoint(checkpoint(ref, 0, [entry(1, "tool", S1)],
                                                   state={**tool_state(S1, TOOL, REQ1), "journal_len": 1},
                                                   step_key=S1))
        await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, tool_name=TOOL, idempotency_key=f"k1-{run_id}",
            request_json=json.dumps(REQ1), execution_id=eid(), event_id=eid()))
        combined = await stack.work.CompleteAndBeginToolCall(ws.CompleteAndBeginToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, outcome=ws.TOOL_OUTCOME_SUCCEEDED,
            response_json='{"ticket": "T-1"}', state_json=json.dumps({**tool_state(S2, TOOL, REQ2), "journal_len": 3}),
            schema_version=2, event_id=eid(), journal=[entry(2, "result", S1), entry(3, "tool", S2)],
            next=ws.NextToolCall(step_key=S2, tool_name=TOOL, idempotency_key=f"k2-{run_id}",
                                 request_json=json.dumps(REQ2), execution_id=eid(), event_id=eid())))
        assert combined.version == 2
        tx2 = await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
            lease=ref, expected_version=2, step_key=S2, outcome=ws.TOOL_OUTCOME_SUCCEEDED,
            response_json='{"sent": true}', state_json=json.dumps({"cursor": S2, "journal_len": 4}),
            schema_version=2, event_id=eid(), journal=[entry(4, "result", S2)]))
        assert tx2.version == 3
        rows = await journal_rows(db, run_id)
        assert [(r["seq"], r["kind"], r["step_key"], r["run_version"]) for r in rows] == [
            (1, "tool", S1, 1), (2, "result", S1, 2), (3, "tool", S2, 2), (4, "result", S2, 3)]

        results = await stack.work.GetToolResults(ws.GetToolResultsRequest(lease=ref, step_keys=[S1, S2, "nope/1"]))
        answers = {e.step_key: (e.status, json.loads(e.response_json)) for e in results.executions}
        assert answers == {S1: (pb.TOOL_EXECUTION_STATUS_SUCCEEDED, {"ticket": "T-1"}),
                           S2: (pb.TOOL_EXECUTION_STATUS_SUCCEEDED, {"sent": True})}
        assert not (await stack.work.GetToolResults(ws.GetToolResultsRequest(lease=ref, step_keys=["x/1"]))).executions

        # The last Tx2 ends the run and records its entry with it.
        await stack.work.SaveCheckpoint(checkpoint(ref, 3, [entry(5, "tool", S3)],
                                                   state={**tool_state(S3, TOOL, REQ3), "journal_len": 5},
                                                   step_key=S3))
        await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=ref, expected_version=4, step_key=S3, tool_name=TOOL, idempotency_key=f"k3-{run_id}",
            request_json=json.dumps(REQ3), execution_id=eid(), event_id=eid()))
        end = await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
            lease=ref, expected_version=4, step_key=S3, outcome=ws.TOOL_OUTCOME_SUCCEEDED, response_json="{}",
            state_json=json.dumps({"cursor": S3, "journal_len": 7}), schema_version=2, event_id=eid(),
            journal=[entry(6, "result", S3), entry(7, "finish")],
            end=ws.RunEnd(outcome=ws.FINISH_OUTCOME_COMPLETED, result_json='{"ok": true}', event_id=eid())))
        assert end.status == pb.RUN_STATUS_COMPLETED
        assert [r["seq"] for r in await journal_rows(db, run_id)] == [1, 2, 3, 4, 5, 6, 7]
        run = await db.fetchrow("SELECT journal_length, status FROM agent_runs WHERE id = $1::uuid", run_id)
        assert (run["journal_length"], run["status"]) == (7, "COMPLETED")
        # Ended: nobody holds the run, so nobody reads through WorkService.
        assert reason_of(await rpc_error(stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref)))) == "LEASE_LOST"
        assert reason_of(await rpc_error(stack.work.GetToolResults(
            ws.GetToolResultsRequest(lease=ref, step_keys=[S1])))) == "LEASE_LOST"


# ---------------------------------------------------------------------------- refusals write nothing


async def test_a_stale_holders_entries_never_appear(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, a = await started(stack, "w-a")
        await stack.work.SaveCheckpoint(checkpoint(a, 0, [entry(1)]))
        await lapse(db, run_id)
        lease_b = await claim(stack, "w-b")
        assert lease_b is not None
        b = lease_ref(lease_b)
        before = await snapshot(db, run_id)
        for request in (checkpoint(a, 1, [entry(2)]), checkpoint(a, 1, [entry(2)], event_id=eid())):
            error = await rpc_error(stack.work.SaveCheckpoint(request))
            assert reason_of(error) == "LEASE_LOST", error.details()
        forged = ws.LeaseRef(run_id=run_id, worker_id="mallory", fencing_token=b.fencing_token)
        for ref in (a, forged):
            for call in (stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref)),
                         stack.work.GetToolResults(ws.GetToolResultsRequest(lease=ref, step_keys=[S1]))):
                assert reason_of(await rpc_error(call)) == "LEASE_LOST"
        assert await snapshot(db, run_id) == before
        # The live holder continues the journal where it is.
        assert (await stack.work.SaveCheckpoint(checkpoint(b, 1, [entry(2)]))).version == 2
        assert [(r["seq"], r["fencing_token"]) for r in await journal_rows(db, run_id)] == [(1, 1), (2, 2)]


async def test_a_version_conflict_appends_nothing(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        await stack.work.SaveCheckpoint(checkpoint(ref, 0, [entry(1)]))
        before = await snapshot(db, run_id)
        error = await rpc_error(stack.work.SaveCheckpoint(checkpoint(ref, 0, [entry(2)])))
        assert error.code() == grpc.StatusCode.ABORTED and reason_of(error) == "VERSION_CONFLICT"
        assert await snapshot(db, run_id) == before


@pytest.mark.parametrize("seqs", [[3], [1], [1, 2], [5, 6]], ids=["gap", "repeat", "repeat-then-next", "far"])
async def test_entries_that_do_not_continue_the_journal_are_refused(db_url, db, seqs):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        await stack.work.SaveCheckpoint(checkpoint(ref, 0, [entry(1)]))
        before = await snapshot(db, run_id)
        error = await rpc_error(stack.work.SaveCheckpoint(checkpoint(ref, 1, [entry(s) for s in seqs])))
        assert (error.code(), field_of(error)) == (INVALID, "journal[0].seq"), error.details()
        assert "must be 2, the run's journal has 1 entries" in error.details()
        assert await snapshot(db, run_id) == before


async def test_entries_must_be_consecutive_within_a_call(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        before = await snapshot(db, run_id)
        error = await rpc_error(stack.work.SaveCheckpoint(checkpoint(ref, 0, [entry(1), entry(2), entry(2)])))
        assert (error.code(), field_of(error)) == (INVALID, "journal[2].seq")
        error = await rpc_error(stack.work.SaveCheckpoint(checkpoint(ref, 0, [entry(1), entry(3)])))
        assert (error.code(), field_of(error)) == (INVALID, "journal[1].seq")
        assert await snapshot(db, run_id) == before


async def test_journal_gap_on_tool_calls_is_refused_and_writes_nothing(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        await stack.work.SaveCheckpoint(checkpoint(ref, 0, [entry(1)], state={**tool_state(S1, TOOL, REQ1)},
                                                   step_key=S1))
        await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, tool_name=TOOL, idempotency_key=f"k1-{run_id}",
            request_json=json.dumps(REQ1), execution_id=eid(), event_id=eid()))
        before = await snapshot(db, run_id)
        tx2 = ws.CompleteToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, outcome=ws.TOOL_OUTCOME_SUCCEEDED, response_json="{}",
            state_json='{"cursor": "x"}', schema_version=2, event_id=eid(), journal=[entry(3, "result")])
        combined = ws.CompleteAndBeginToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, outcome=ws.TOOL_OUTCOME_SUCCEEDED, response_json="{}",
            state_json=json.dumps(tool_state(S2, TOOL, REQ2)), schema_version=2, event_id=eid(),
            journal=[entry(1, "result")],
            next=ws.NextToolCall(step_key=S2, tool_name=TOOL, idempotency_key=f"k2-{run_id}",
                                 request_json=json.dumps(REQ2), execution_id=eid(), event_id=eid()))
        ending = ws.CompleteToolCallRequest()
        ending.CopyFrom(tx2)
        ending.event_id = eid()
        ending.end.CopyFrom(ws.RunEnd(outcome=ws.FINISH_OUTCOME_COMPLETED, result_json="{}", event_id=eid()))
        for call in (stack.work.CompleteToolCall(tx2), stack.work.CompleteAndBeginToolCall(combined),
                     stack.work.CompleteToolCall(ending)):
            error = await rpc_error(call)
            assert (error.code(), field_of(error)) == (INVALID, "journal[0].seq"), error.details()
        assert await snapshot(db, run_id) == before
        not_executed = ws.CompleteToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, outcome=ws.TOOL_OUTCOME_NOT_EXECUTED,
            evidence_json='{"lookup": "none"}', event_id=eid(), journal=[entry(2, "result")])
        error = await rpc_error(stack.work.CompleteToolCall(not_executed))
        assert (error.code(), field_of(error)) == (INVALID, "journal")
        assert await snapshot(db, run_id) == before


async def test_a_committed_entry_is_never_rewritten(db_url, db):
    """The primary key (run, seq) stands behind the statement's check."""
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        await stack.work.SaveCheckpoint(checkpoint(ref, 0, [entry(1)]))
        with pytest.raises(Exception, match="run_journal_pkey"):
            await db.execute("INSERT INTO run_journal (run_id, seq, kind, detail, fencing_token, run_version) "
                             "VALUES ($1::uuid, 1, 'tool', '{}', 1, 1)", run_id)


# ---------------------------------------------------------------------------- commit-unknown recovery


async def test_same_event_id_and_entries_replays_other_entries_are_already_exists(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        event_id = eid()
        request = checkpoint(ref, 0, [entry(1), entry(2, "answer")], event_id=event_id)
        assert (await stack.work.SaveCheckpoint(request)).replayed is False
        committed = await snapshot(db, run_id)
        again = await stack.work.SaveCheckpoint(request)
        assert (again.version, again.replayed) == (1, True)
        assert await snapshot(db, run_id) == committed
        for other in ([entry(1)], [entry(1), entry(2, "answer", detail={"n": 99})], [entry(1), entry(2, "sleep")],
                      []):
            changed = checkpoint(ref, 0, other, event_id=event_id)
            changed.state_json = request.state_json
            error = await rpc_error(stack.work.SaveCheckpoint(changed))
            assert error.code() == grpc.StatusCode.ALREADY_EXISTS, (other, error.details())
        assert await snapshot(db, run_id) == committed and await counter(db) == 0


async def test_tx2_with_entries_replays_and_refuses_other_entries(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        await stack.work.SaveCheckpoint(checkpoint(ref, 0, [entry(1)], state=tool_state(S1, TOOL, REQ1), step_key=S1))
        await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, tool_name=TOOL, idempotency_key=f"k1-{run_id}",
            request_json=json.dumps(REQ1), execution_id=eid(), event_id=eid()))
        tx2 = ws.CompleteToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, outcome=ws.TOOL_OUTCOME_SUCCEEDED, response_json="{}",
            state_json='{"cursor": "x"}', schema_version=2, event_id=eid(), journal=[entry(2, "result", S1)])
        assert (await stack.work.CompleteToolCall(tx2)).version == 2
        committed = await snapshot(db, run_id)
        assert (await stack.work.CompleteToolCall(tx2)).replayed
        other = ws.CompleteToolCallRequest()
        other.CopyFrom(tx2)
        other.journal[0].kind = "fail"
        error = await rpc_error(stack.work.CompleteToolCall(other))
        assert error.code() == grpc.StatusCode.ALREADY_EXISTS
        assert await snapshot(db, run_id) == committed


async def test_nothing_committed_runs_and_half_a_commit_freezes(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        event_id = eid()
        refused = checkpoint(ref, 0, [entry(2)], event_id=event_id)  # gap: nothing written
        assert (await rpc_error(stack.work.SaveCheckpoint(refused))).code() == INVALID
        request = checkpoint(ref, 0, [entry(1)], event_id=event_id)  # the same id is free: it runs
        assert (await stack.work.SaveCheckpoint(request)).replayed is False
        assert await db.execute("DELETE FROM agent_checkpoints WHERE event_id = $1::uuid", event_id) == "DELETE 1"
        error = await rpc_error(stack.work.SaveCheckpoint(request))
        assert reason_of(error) == "COMMIT_STATE_INCONSISTENT"
        assert await db.fetchval("SELECT status FROM agent_runs WHERE id = $1::uuid", run_id) == "PAUSED_INDOUBT"
        assert await counter(db) == 1
        assert [r["seq"] for r in await journal_rows(db, run_id)] == [1]  # freezing is not undoing


# ---------------------------------------------------------------------------- per-field limits


LIMITS = {"max_payload_bytes": 4096, "max_tool_request_bytes": 1024, "max_tool_response_bytes": 2048,
          "max_checkpoint_bytes": 3072, "max_journal_entry_bytes": 512}


def blob(size: int) -> str:
    return json.dumps({"blob": "x" * size})


async def test_per_field_limits_name_the_field_the_setting_and_the_size(db_url, db):
    async with scheduler_stack(db_url, **LIMITS) as stack:
        run_id, ref = await started(stack)
        lease = await stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref))
        assert not lease.entries
        await stack.work.SaveCheckpoint(checkpoint(ref, 0, [], state={**tool_state(S1, TOOL, REQ1),
                                                                      "pad": "x" * 2700}, step_key=S1))
        before = await snapshot(db, run_id)
        big_state = ws.SaveCheckpointRequest(lease=ref, expected_version=1, state_json=blob(3100), schema_version=2,
                                             event_id=eid())
        big_entry = checkpoint(ref, 1, [pb.JournalEntry(seq=1, kind="tool", detail_json=blob(600))])
        big_request = ws.BeginToolCallRequest(lease=ref, expected_version=1, step_key=S1, tool_name=TOOL,
                                              idempotency_key="k", request_json=blob(1100), execution_id=eid(),
                                              event_id=eid())
        cases = [(stack.work.SaveCheckpoint(big_state), "state_json", "max_checkpoint_bytes"),
                 (stack.work.SaveCheckpoint(big_entry), "journal[0].detail_json", "max_journal_entry_bytes"),
                 (stack.work.BeginToolCall(big_request), "request_json", "max_tool_request_bytes")]
        for call, field, setting in cases:
            error = await rpc_error(call)
            assert (error.code(), field_of(error)) == (INVALID, field), error.details()
            assert setting in error.details() and "bytes" in error.details(), error.details()
        await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, tool_name=TOOL, idempotency_key="k",
            request_json=json.dumps(REQ1), execution_id=eid(), event_id=eid()))
        before = await snapshot(db, run_id)
        big_response = ws.CompleteToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, outcome=ws.TOOL_OUTCOME_SUCCEEDED,
            response_json=blob(2100), state_json="{}", schema_version=2, event_id=eid())
        next_big = ws.CompleteAndBeginToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, outcome=ws.TOOL_OUTCOME_SUCCEEDED, response_json="{}",
            state_json="{}", schema_version=2, event_id=eid(),
            next=ws.NextToolCall(step_key=S2, tool_name=TOOL, idempotency_key="k2", request_json=blob(1100),
                                 execution_id=eid(), event_id=eid()))
        too_many = ws.CompleteToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, outcome=ws.TOOL_OUTCOME_SUCCEEDED, response_json="{}",
            state_json="{}", schema_version=2, event_id=eid(),
            journal=[pb.JournalEntry(seq=n, kind="tool") for n in range(1, MAX_JOURNAL_ENTRIES + 2)])
        for call, field in ((stack.work.CompleteToolCall(big_response), "response_json"),
                            (stack.work.CompleteAndBeginToolCall(next_big), "next.request_json"),
                            (stack.work.CompleteToolCall(too_many), "journal")):
            error = await rpc_error(call)
            assert (error.code(), field_of(error)) == (INVALID, field), error.details()
        assert await snapshot(db, run_id) == before
        # Within the limits (a 2000-byte answer is over no limit but the tool response's own): accepted.
        ok = await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, outcome=ws.TOOL_OUTCOME_SUCCEEDED, response_json=blob(1900),
            state_json=blob(2900), schema_version=2, event_id=eid(),
            journal=[pb.JournalEntry(seq=1, kind="result", detail_json=blob(450))]))
        assert ok.version == 2


async def test_lease_carries_the_configured_limits(db_url):
    async with scheduler_stack(db_url, **LIMITS) as stack:
        await submit(stack)
        lease = await claim(stack)
        assert lease is not None
        assert lease.limits == ws.PayloadLimits(max_tool_request_bytes=1024, max_tool_response_bytes=2048,
                                                max_checkpoint_bytes=3072, max_journal_entry_bytes=512,
                                                max_payload_bytes=4096)
        assert lease.journal_length == 0


async def test_read_journal_and_tool_results_bounds(db_url):
    async with scheduler_stack(db_url) as stack:
        _, ref = await started(stack)
        for request, field in ((ws.ReadJournalRequest(lease=ref, page_size=5001), "page_size"),
                               (ws.ReadJournalRequest(lease=ref, page_size=-1), "page_size"),
                               (ws.ReadJournalRequest(lease=ref, after_seq=-1), "after_seq")):
            error = await rpc_error(stack.work.ReadJournal(request))
            assert (error.code(), field_of(error)) == (INVALID, field)
        assert (await stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref, page_size=5000))).more is False
        for keys in ([], [f"s/{n}" for n in range(501)], ["a\nb"]):
            error = await rpc_error(stack.work.GetToolResults(ws.GetToolResultsRequest(lease=ref, step_keys=keys)))
            assert (error.code(), field_of(error)) == (INVALID, "step_keys")


async def test_read_journal_pages_stop_at_the_byte_budget(db_url):
    # 4 x max_payload_bytes per page: with 4 KB, entries of ~1.9 KB fill a page after 8.
    async with scheduler_stack(db_url, max_payload_bytes=4096) as stack:
        _, ref = await started(stack)
        entries = [pb.JournalEntry(seq=n, kind="tool", detail_json=blob(1900)) for n in range(1, 21)]
        await stack.work.SaveCheckpoint(checkpoint(ref, 0, entries))
        seen: list[int] = []
        after, more = 0, True
        while more:
            page = await stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref, after_seq=after))
            assert 1 <= len(page.entries) <= 9
            seen += [e.seq for e in page.entries]
            after, more = page.entries[-1].seq, page.more
        assert seen == list(range(1, 21))


async def test_compact_pages_hold_the_same_entries_within_the_same_bounds(db_url, db):
    async with scheduler_stack(db_url, max_payload_bytes=4096) as stack:
        run_id, ref = await started(stack)
        entries = [entry(n, "tool" if n % 2 else "result", f"s/{n // 2}", {"n": n, "pad": "x" * (n * 97 % 1900)},
                         node=f"node@{n}", tool="t" if n % 2 else "") for n in range(1, 41)]
        await stack.work.SaveCheckpoint(checkpoint(ref, 0, entries))
        full = []
        after, more = 0, True
        while more:
            page = await stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref, after_seq=after, page_size=7))
            full += page.entries
            after, more = page.entries[-1].seq, page.more
        compact, pages = [], []
        after, more = 0, True
        for _ in range(40):
            page = await stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref, after_seq=after, page_size=7,
                                                                      compact=True))
            assert not page.entries
            items = json.loads(page.entries_json)
            pages.append(len(items))
            compact += items
            after, more = items[-1][0], page.more
            if not more:
                break
        # Same entries, same order, the same fields; pages cut by count (7) and by bytes (4 x 4096).
        assert [[e.seq, e.kind, e.step_key, e.node, e.tool, json.loads(e.detail_json)] for e in full] == compact
        assert 1 <= min(pages) and max(pages) <= 7 and sum(pages) == 40 and len(pages) > 40 // 7
        # Past the end: an empty array; a stale holder: LEASE_LOST, as without compact.
        page = await stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref, after_seq=40, compact=True))
        assert (page.entries_json, page.more) == ("[]", False)
        await lapse(db, run_id)
        error = await rpc_error(stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref, compact=True)))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and error_info(error).reason == "LEASE_LOST"


# ---------------------------------------------------------------------------- resolution on schema 2


async def in_doubt_on_schema_2(stack: Any, db: Any) -> tuple[str, ws.LeaseRef]:
    """A schema-2 run frozen on S1: journal [tool S1], checkpoint v1 with pending_tool and journal_len 1."""
    run_id, ref = await started(stack)
    await stack.work.SaveCheckpoint(checkpoint(ref, 0, [entry(1, "tool", S1)],
                                               state={**tool_state(S1, TOOL, REQ1), "journal_len": 1}, step_key=S1))
    await stack.work.BeginToolCall(ws.BeginToolCallRequest(
        lease=ref, expected_version=1, step_key=S1, tool_name=TOOL, idempotency_key=f"k1-{run_id}",
        request_json=json.dumps(REQ1), execution_id=eid(), event_id=eid()))
    await stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(lease=ref, step_key=S1, error_code="timeout",
                                                               event_id=eid()))
    return run_id, ref


async def test_resolve_succeeded_on_schema_2_appends_a_result_entry(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, _ = await in_doubt_on_schema_2(stack, db)
        reply = await stack.runs.ResolveToolExecution(rs.ResolveToolExecutionRequest(
            run_id=run_id, step_key=S1, outcome=rs.RESOLUTION_OUTCOME_SUCCEEDED, result_json='{"ticket": "T-7"}',
            remote_resource_id="T-7", evidence_json='{"lookup": "found"}', resolved_by="alice"),
            metadata=stack.md())
        assert reply.run.status == pb.RUN_STATUS_QUEUED and reply.run.version == 2
        latest = await db.fetchrow("SELECT * FROM agent_checkpoints WHERE run_id = $1::uuid ORDER BY version DESC "
                                   "LIMIT 1", run_id)
        assert latest["version"] == 2 and latest["schema_version"] == 2
        assert "tool_results" not in latest["state_json"] and "pending_tool" not in latest["state_json"]
        assert latest["state_json"]["journal_len"] == 2 and latest["state_json"]["cursor"] == S1
        rows = await journal_rows(db, run_id)
        assert [(r["seq"], r["kind"], r["step_key"], r["tool"], r["run_version"]) for r in rows] == [
            (1, "tool", S1, "", 1), (2, "result", S1, TOOL, 2)]
        assert rows[1]["detail"] == {"status": "SUCCEEDED", "resolved_by": "alice", "remote_resource_id": "T-7"}
        # The answer itself stays in the ledger only; the next holder finds both.
        lease = await claim(stack, "w2")
        assert lease is not None and lease.journal_length == 2 and lease.checkpoint.version == 2
        ref = lease_ref(lease)
        page = await stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref, after_seq=1))
        assert [(e.seq, e.kind) for e in page.entries] == [(2, "result")]
        results = await stack.work.GetToolResults(ws.GetToolResultsRequest(lease=ref, step_keys=[S1]))
        assert json.loads(results.executions[0].response_json) == {"ticket": "T-7"}
        # It continues the journal from there.
        assert (await stack.work.SaveCheckpoint(checkpoint(ref, 2, [entry(3, "finish")]))).version == 3


async def test_resolve_not_executed_on_schema_2_appends_without_a_checkpoint(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, _ = await in_doubt_on_schema_2(stack, db)
        reply = await stack.runs.ResolveToolExecution(rs.ResolveToolExecutionRequest(
            run_id=run_id, step_key=S1, outcome=rs.RESOLUTION_OUTCOME_NOT_EXECUTED,
            evidence_json='{"lookup": "none"}', resolved_by="reconciler"), metadata=stack.md())
        assert reply.run.status == pb.RUN_STATUS_QUEUED and reply.run.version == 1
        assert await db.fetchval("SELECT count(*) FROM agent_checkpoints WHERE run_id = $1::uuid", run_id) == 1
        rows = await journal_rows(db, run_id)
        assert [(r["seq"], r["kind"], r["tool"], r["run_version"]) for r in rows] == [
            (1, "tool", "", 1), (2, "result", TOOL, 1)]
        assert rows[1]["detail"] == {"status": "NOT_EXECUTED", "resolved_by": "reconciler"}
        lease = await claim(stack, "w2")
        assert lease is not None and lease.journal_length == 2
        # UNKNOWN changes neither (schema 1 resolutions are covered by test_run_service).


async def test_resolve_on_schema_1_keeps_results_in_the_checkpoint(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=ref, expected_version=0, state_json=json.dumps(tool_state(S1, TOOL, REQ1)), schema_version=1,
            step_key=S1, event_id=eid()))
        await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=ref, expected_version=1, step_key=S1, tool_name=TOOL, idempotency_key=f"k1-{run_id}",
            request_json=json.dumps(REQ1), execution_id=eid(), event_id=eid()))
        await stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(lease=ref, step_key=S1, error_code="t",
                                                                   event_id=eid()))
        await stack.runs.ResolveToolExecution(rs.ResolveToolExecutionRequest(
            run_id=run_id, step_key=S1, outcome=rs.RESOLUTION_OUTCOME_SUCCEEDED, result_json='{"t": 1}',
            evidence_json='{"lookup": "found"}', resolved_by="alice"), metadata=stack.md())
        state = await db.fetchval("SELECT state_json FROM agent_checkpoints WHERE run_id = $1::uuid AND version = 2",
                                  run_id)
        assert state["tool_results"][S1]["response"] == {"t": 1}
        assert not await journal_rows(db, run_id)


# ---------------------------------------------------------------------------- GetRunHistory


async def test_run_history_pages_the_journal(db_url):
    async with scheduler_stack(db_url) as stack:
        run_id, ref = await started(stack)
        await stack.work.SaveCheckpoint(checkpoint(ref, 0, [entry(n) for n in range(1, 6)]))
        await stack.work.SaveCheckpoint(checkpoint(ref, 1, [entry(6, "finish")]))
        seqs, token, pages = [], "", 0
        while True:
            page = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(
                run_id=run_id, page_size=2, page_token=token, include=[rs.HISTORY_PART_JOURNAL]), metadata=stack.md())
            assert not page.checkpoints and not page.events and len(page.journal) <= 2
            seqs += [(e.seq, e.run_version) for e in page.journal]
            pages += 1
            token = page.next_page_token
            if not token:
                break
        assert seqs == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 2)] and pages == 3
        everything = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=run_id), metadata=stack.md())
        assert [e.seq for e in everything.journal] == [1, 2, 3, 4, 5, 6] and len(everything.checkpoints) == 2
        assert not everything.next_page_token
