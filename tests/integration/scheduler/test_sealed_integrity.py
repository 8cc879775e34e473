"""A sealed value that does not open under its run's (or schedule's) data key, copied from another run
or altered at rest, is SEALED_VALUE_INVALID (DATA_LOSS) naming the field and never the value, with a
log line and agentrt_sealed_value_failures_total; never INTERNAL, never a crash (issue 24, defect 6).

Swept over every path that opens sealed values: the reveals (GetRun, GetRunHistory), the lease
holder's opens (ClaimWork's lease, GetToolResults, ReadJournal), the scheduler learning a run's
marked values (a write of the holder still succeeds), and a schedule's fire. The RPCs whose answers
carry JSON are enumerated by reflection: each one either opens (and is tested here) or only redacts."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import time

import grpc
import pytest
from support import claim, eid, lease_ref, reason_of, rpc_error, scheduler_stack, tool_state

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration

CARD_A = "4111-A-integrity-card-0c11"
CARD_B = "4111-B-integrity-card-93d2"
SCHEMA = {"type": "object", "properties": {"card": {"type": "string", "x-agentrt-sensitive": True},
                                           "amount": {"type": "integer"}}}
SENSITIVE = {"input": [["card"]], "tools": {"pay.charge": {"input": [["card"]], "output": [["token"]]}}}
KEYS = json.dumps({"current": "k1", "keys": {"k1": base64.b64encode(os.urandom(32)).decode()}})

SERVICES = (ws.DESCRIPTOR.services_by_name["WorkService"], rs.DESCRIPTOR.services_by_name["RunService"])
# Answers that open sealed values: each is called below with a foreign value in place.
OPENS = {"GetRun", "GetRunHistory", "ClaimWork", "GetToolResults", "ReadJournal"}
# Answers that open only the ledger row the same call has just written (sealed by this scheduler under
# the run's key a moment before): the same open as GetToolResults'.
OPENS_OWN_WRITE = {"BeginToolCall", "CompleteAndBeginToolCall"}
# Answers that never open: sealed values shown "[redacted]" (or no sealed value at all: registry schemas).
REDACTS = {"SubmitRun", "ListRuns", "CancelRun", "RetryRun", "SignalRun", "ResumeRun", "ResolveToolExecution",
           "GetRunTree", "SpawnChildren", "WriteBatch", "CreateSchedule", "UpdateSchedule", "PauseSchedule",
           "DeleteSchedule", "ListSchedules", "ListAgents", "ListAuditEvents"}


def carries_json(descriptor, seen=frozenset()) -> bool:
    for field in descriptor.fields:
        if field.message_type is not None and not field.message_type.GetOptions().map_entry:
            if field.message_type.full_name not in seen and carries_json(field.message_type,
                                                                        seen | {descriptor.full_name}):
                return True
        elif field.name.endswith("_json"):
            return True
    return False


def test_every_answer_carrying_json_is_classified_by_reflection():
    with_json = {m.name for s in SERVICES for m in s.methods if carries_json(m.output_type)}
    assert with_json == OPENS | OPENS_OWN_WRITE | REDACTS
    assert not (OPENS & REDACTS or OPENS_OWN_WRITE & REDACTS)


async def register(stack) -> None:
    await stack.work.RegisterAgents(ws.RegisterAgentsRequest(worker_id="w1", ttl_ms=60_000, agents=[
        ws.AgentRegistration(name="payer", version="1", tool_names=["pay.charge"], input_schema_json=json.dumps(SCHEMA),
                             sensitive_json=json.dumps(SENSITIVE))]))


async def a_run_with_sealed_values(stack, card: str) -> str:
    """A run whose input, checkpoint, journal and ledger hold sealed values; left QUEUED (a RETRY)."""
    run_id = (await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="payer", input_json=json.dumps(
        {"card": card, "amount": 1})), metadata=stack.md())).run.run_id
    lease = await claim(stack, agents=("payer",))
    assert lease.run.run_id == run_id
    ref = lease_ref(lease)
    request = {"card": card, "amount": 1}
    saved = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=ref, expected_version=0, schema_version=2, event_id=eid(), step_key="s1",
        state_json=json.dumps(tool_state("s1", "pay.charge", request, note=f"for {card}")),
        journal=[pb.JournalEntry(seq=1, kind="tool", step_key="s1", detail_json=json.dumps({"card": card}))]))
    compact = await stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref, compact=True))
    assert json.loads(compact.entries_json)[0][5] == {"card": card}  # the holder replays the plain value
    assert "$sealed" in await db_text(stack, run_id)
    await stack.work.BeginToolCall(ws.BeginToolCallRequest(
        lease=ref, expected_version=saved.version, step_key="s1", tool_name="pay.charge", idempotency_key=f"k-{run_id}",
        request_json=json.dumps(request), execution_id=eid(), event_id=eid()))
    done = await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
        lease=ref, expected_version=saved.version, step_key="s1", outcome=ws.TOOL_OUTCOME_SUCCEEDED,
        response_json=json.dumps({"token": f"tok-{card}"}), state_json='{"cursor": "paid"}', schema_version=2,
        event_id=eid()))
    await stack.work.FinishRun(ws.FinishRunRequest(lease=ref, expected_version=done.version,
                                                   outcome=ws.FINISH_OUTCOME_RETRY, reason="again", event_id=eid()))
    return run_id


async def db_text(stack, run_id: str) -> str:
    async with stack.server.store.work_pool.acquire() as conn:
        return await conn.fetchval("SELECT detail::text FROM run_journal WHERE run_id = $1::uuid", run_id)


SEALED_TEXT = r'"\$sealed": "[^"]*"'


async def copy_sealed(db, source: str, target: str) -> str:
    """Every sealed value of run `target` replaced by run `source`'s sealed card (which opens only under
    `source`'s key): its input, checkpoints, journal and ledger. Returns that sealed text."""
    foreign = await db.fetchval("SELECT input->'card'->>'$sealed' FROM agent_runs WHERE id = $1::uuid", source)
    swap = f"regexp_replace(%s::text, '{SEALED_TEXT}', '\"$sealed\": \"{foreign}\"', 'g')::jsonb"
    for table, column, key in (("agent_runs", "input", "id"), ("agent_checkpoints", "state_json", "run_id"),
                               ("run_journal", "detail", "run_id"), ("tool_executions", "request_json", "run_id"),
                               ("tool_executions", "response_json", "run_id")):
        await db.execute(f"UPDATE {table} SET {column} = {swap % column} WHERE {key} = $1::uuid", target)
    return foreign


def integrity_error(error: grpc.aio.AioRpcError, field: str, *hidden: str) -> None:
    assert error.code() == grpc.StatusCode.DATA_LOSS, (error.code(), error.details())
    assert reason_of(error) == "SEALED_VALUE_INVALID"
    assert error.details().startswith(f"{field}: a sealed value does not open"), error.details()
    assert not any(h in error.details() for h in hidden)


async def test_a_foreign_sealed_value_is_a_typed_integrity_error_on_every_open(db_url, db, caplog):
    caplog.set_level(logging.WARNING, logger="scheduler.store")
    async with scheduler_stack(db_url, encryption_keys=KEYS, metrics_addr="127.0.0.1:0") as stack:
        await register(stack)
        run_a = await a_run_with_sealed_values(stack, CARD_A)
        run_b = await a_run_with_sealed_values(stack, CARD_B)
    # A fresh scheduler (nothing cached): it learns run B's values from what is stored.
    foreign = await copy_sealed(db, run_a, run_b)
    hidden = (CARD_A, CARD_B, foreign)
    async with scheduler_stack(db_url, encryption_keys=KEYS, metrics_addr="127.0.0.1:0") as stack:
        for call, field in ((stack.runs.GetRun(rs.GetRunRequest(run_id=run_b, reveal=True), metadata=stack.md()),
                             "input_json"),
                            (stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=run_b, reveal=True),
                                                      metadata=stack.md()), "run.input_json")):
            integrity_error(await rpc_error(call), field, *hidden)
        # Without reveal nothing is opened: the answers are redacted as always.
        shown = await stack.runs.GetRun(rs.GetRunRequest(run_id=run_b), metadata=stack.md())
        assert json.loads(shown.input_json)["card"] == "[redacted]"
        await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=run_b), metadata=stack.md())
        # Run A, untouched, still opens.
        one = await stack.runs.GetRun(rs.GetRunRequest(run_id=run_a, reveal=True), metadata=stack.md())
        assert json.loads(one.input_json)["card"] == CARD_A
        # The lease holder's opens: the claim's lease, the ledger, the journal.
        await db.execute("UPDATE agent_runs SET next_attempt_at = clock_timestamp() WHERE id = $1::uuid", run_b)
        await db.execute("UPDATE agent_runs SET status = 'CANCELLED', finished_at = clock_timestamp() "
                         "WHERE id = $1::uuid", run_a)
        deadline = time.monotonic() + 20
        while True:
            try:
                await stack.work.ClaimWork(ws.ClaimWorkRequest(worker_id="w2", agents=["payer"], wait_ms=500))
            except grpc.aio.AioRpcError as error:
                integrity_error(error, "run.input_json", *hidden)
                break
            assert time.monotonic() < deadline, "run B never claimed"
        fence = await db.fetchval("SELECT fencing_token FROM agent_runs WHERE id = $1::uuid", run_b)
        ref = ws.LeaseRef(run_id=run_b, worker_id="w2", fencing_token=fence)
        integrity_error(await rpc_error(stack.work.GetToolResults(ws.GetToolResultsRequest(
            lease=ref, step_keys=["s1"]))), "executions[0].request_json", *hidden)
        integrity_error(await rpc_error(stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref))),
                        "entries[0].detail_json", *hidden)
        integrity_error(await rpc_error(stack.work.ReadJournal(ws.ReadJournalRequest(lease=ref, compact=True))),
                        "entries_json", *hidden)
        # Learning the run's marked values skipped the foreign ones (logged, counted): the holder's
        # writes go on.
        version = await db.fetchval("SELECT version FROM agent_runs WHERE id = $1::uuid", run_b)
        saved = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=ref, expected_version=version, state_json='{"cursor": "on"}', schema_version=2, event_id=eid()))
        assert saved.version == version + 1
        failures = {s.labels["field"]: s.value for m in stack.server.metrics.metrics.registry.collect()
                    if m.name == "agentrt_sealed_value_failures" for s in m.samples if s.name.endswith("_total")}
        assert {"input_json", "run.input_json", "executions.request_json", "entries.detail_json", "entries_json",
                "request_json", "response_json"} <= set(failures), failures
    lines = [r.getMessage() for r in caplog.records if "sealed value integrity failure" in r.getMessage()]
    assert lines and any(f"run {run_b}" in line for line in lines)
    assert not any(h in line for line in lines for h in hidden)
    assert "unhandled error" not in caplog.text


async def test_a_schedule_with_a_foreign_sealed_value_is_skipped_with_a_typed_error(db_url, db, caplog):
    caplog.set_level(logging.WARNING)
    spec = {"agent_name": "payer", "interval_ms": 1000}
    async with scheduler_stack(db_url, encryption_keys=KEYS, schedule_poll_interval_ms=0) as stack:
        await register(stack)
        ids = {}
        for name, card in (("good", CARD_A), ("bad", CARD_B)):
            made = await stack.runs.CreateSchedule(rs.CreateScheduleRequest(name=name, spec=rs.ScheduleSpec(
                input_json=json.dumps({"card": card}), **spec)), metadata=stack.md())
            ids[name] = made.schedule.schedule_id
    await db.execute("UPDATE agent_schedules SET input = (SELECT input FROM agent_schedules WHERE id = $1::uuid) "
                     "WHERE id = $2::uuid", ids["good"], ids["bad"])
    async with scheduler_stack(db_url, encryption_keys=KEYS, schedule_poll_interval_ms=100,
                               metrics_addr="127.0.0.1:0") as stack:
        deadline = time.monotonic() + 20
        while not await db.fetchval("SELECT count(*) FROM agent_runs WHERE labels->>'agentrt.schedule' = 'good'"):
            assert time.monotonic() < deadline, "the good schedule never fired"
            await asyncio.sleep(0.1)
        while "sealed value integrity failure: spec.input_json of schedule" not in caplog.text:
            assert time.monotonic() < deadline, "the bad schedule's open was not logged"
            await asyncio.sleep(0.1)
        failures = [s for m in stack.server.metrics.metrics.registry.collect()
                    if m.name == "agentrt_sealed_value_failures" for s in m.samples
                    if s.name.endswith("_total") and s.labels["field"] == "spec.input_json"]
        assert failures and failures[0].value >= 1
    assert await db.fetchval("SELECT count(*) FROM agent_runs WHERE labels->>'agentrt.schedule' = 'bad'") == 0
    assert CARD_A not in caplog.text and CARD_B not in caplog.text
