"""The event contract (docs/events/asyncapi.yaml) against real records: a workload through the scheduler's
gRPC API on a real PostgreSQL, published by the relay to a real Kafka-protocol broker, read back.

Every record's type is documented, its payload validates against that type's schema, its headers are
those the document lists and well-formed, its key is its ce_subject, its ce_sequence and attributes
are its outbox row's, and per key the records come in ce_sequence order. The workload reaches every
documented type (a frozen run by deleting half of a committed write, as commit-unknown recovery guards)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import grpc
import pytest
from event_contract import contract
from relay_support import TopicReader, pending_count, relay_settings, running_relay, wait_until
from support import claim, eid, lease_ref, scheduler_stack, submit, tool_state
from tool_call_support import REQ1, S1, TOOL, combined

from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = [pytest.mark.integration, pytest.mark.kafka]



async def claimed(stack: Any, agent: str) -> ws.LeaseRef:
    lease = await claim(stack, f"w-{agent}", agents=(agent,), wait_ms=5_000)
    assert lease is not None, f"no {agent} run to claim"
    return lease_ref(lease)


async def finish(stack: Any, ref: ws.LeaseRef, version: int, outcome: int, **fields: Any) -> ws.FinishRunResponse:
    return await stack.work.FinishRun(ws.FinishRunRequest(lease=ref, expected_version=version, outcome=outcome,
                                                          event_id=eid(), **fields))


async def waiting_on_s1(stack: Any, agent: str) -> tuple[str, ws.LeaseRef]:
    run = await submit(stack, agent=agent, client_request_id=f"contract-{agent}")
    ref = await claimed(stack, agent)
    await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=ref, expected_version=0, state_json=json.dumps(tool_state(S1, TOOL, REQ1)), schema_version=1,
        step_key=S1, event_id=eid()))
    await stack.work.BeginToolCall(ws.BeginToolCallRequest(
        lease=ref, expected_version=1, step_key=S1, tool_name=TOOL, idempotency_key=f"k1-{run.run_id}",
        request_json=json.dumps(REQ1), execution_id=eid(), event_id=eid()))
    return run.run_id, ref


async def tools_pause_signal_retry_sleep_complete(stack: Any) -> None:
    """Tool calls that succeed and fail, an approval, a signal consumed, a retry, a sleep, the end."""
    agent = "ct-main"
    run_id, ref = await waiting_on_s1(stack, agent)
    await stack.work.CompleteAndBeginToolCall(combined(ref))  # tool_succeeded + tool_requested
    await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
        lease=ref, expected_version=2, step_key="refund.notify/attempt-1", outcome=ws.TOOL_OUTCOME_FAILED,
        error_code="mail_refused", state_json=json.dumps({"cursor": "after"}), schema_version=1,
        event_id=eid()))
    await finish(stack, ref, 3, ws.FINISH_OUTCOME_PAUSED_HUMAN, reason="approve the refund")
    await stack.runs.ResumeRun(rs.ResumeRunRequest(run_id=run_id, decision=rs.RESUME_DECISION_APPROVE,
                                                   operator="alice"), metadata=stack.md())
    ref = await claimed(stack, agent)
    signal = await stack.runs.SignalRun(rs.SignalRunRequest(run_id=run_id, name="customer.reply",
                                                            payload_json='{"text": "yes"}', request_id="mail-1"),
                                        metadata=stack.md())
    await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=ref, expected_version=3, state_json=json.dumps({"cursor": "signalled"}), schema_version=1,
        step_key="reply", event_id=eid(), consume_signal_seqs=[signal.signal.seq]))
    await finish(stack, ref, 4, ws.FINISH_OUTCOME_RETRY, reason="upstream 503", error_class="transient")
    ref = await claimed(stack, agent)
    await finish(stack, ref, 4, ws.FINISH_OUTCOME_SLEEP, sleep_ms=1)
    ref = await claimed(stack, agent)
    await finish(stack, ref, 4, ws.FINISH_OUTCOME_COMPLETED, result_json='{"ok": true}')


async def in_doubt_resolved_then_cancelled(stack: Any) -> None:
    agent = "ct-doubt"
    run_id, ref = await waiting_on_s1(stack, agent)
    await stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(lease=ref, step_key=S1, error_code="timeout",
                                                               event_id=eid()))
    await stack.runs.ResolveToolExecution(rs.ResolveToolExecutionRequest(
        run_id=run_id, step_key=S1, outcome=rs.RESOLUTION_OUTCOME_NOT_EXECUTED,
        evidence_json='{"lookup": "absent"}', resolved_by="op"), metadata=stack.md())
    ref = await claimed(stack, agent)
    await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run_id, reason="customer withdrew"),
                               metadata=stack.md())  # flagged: cancel_requested
    with pytest.raises(grpc.aio.AioRpcError):  # the holder's next write applies it: run_cancelled
        await finish(stack, ref, 1, ws.FINISH_OUTCOME_COMPLETED, result_json="{}")
    history = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=run_id, export=True),
                                             metadata=stack.md())
    assert history.events
    await stack.runs.GetRun(rs.GetRunRequest(run_id=run_id, reveal=True), metadata=stack.md())


async def not_executed_then_cancelled(stack: Any) -> None:
    run_id, ref = await waiting_on_s1(stack, "ct-notexec")
    await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
        lease=ref, expected_version=1, step_key=S1, outcome=ws.TOOL_OUTCOME_NOT_EXECUTED, error_code="absent",
        evidence_json='{"lookup": "no such refund"}', event_id=eid()))
    await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run_id, reason="stop"), metadata=stack.md())


async def children_then_rejected(stack: Any) -> None:
    """Children joined, the parent rejected at its approval and FAILED, then retried as a new run."""
    agent = "ct-parent"
    run_id = (await submit(stack, agent=agent)).run_id
    ref = await claimed(stack, agent)
    await stack.work.SpawnChildren(ws.SpawnChildrenRequest(
        lease=ref, spawn_key="research", join=ws.JOIN_MODE_ALL,
        children=[ws.ChildSpec(agent_name="ct-child", input_json=json.dumps({"topic": t})) for t in "ab"]))
    await finish(stack, ref, 0, ws.FINISH_OUTCOME_SLEEP, sleep_ms=1, wait_children=True)
    for _ in range(2):
        child = await claimed(stack, "ct-child")
        await finish(stack, child, 0, ws.FINISH_OUTCOME_COMPLETED, result_json='{"found": 1}')
    ref = await claimed(stack, agent)
    await finish(stack, ref, 0, ws.FINISH_OUTCOME_PAUSED_HUMAN, reason="check the findings")
    await stack.runs.ResumeRun(rs.ResumeRunRequest(run_id=run_id, decision=rs.RESUME_DECISION_REJECT),
                               metadata=stack.md())
    ref = await claimed(stack, agent)
    await finish(stack, ref, 0, ws.FINISH_OUTCOME_FAILED, reason="rejected", error_class="permanent")
    retried = await stack.runs.RetryRun(rs.RetryRunRequest(run_id=run_id, request_id=f"contract-retry-{run_id}"),
                                        metadata=stack.md())  # agent.audit.run.retry (and a new run submitted)
    assert retried.created and retried.run.retry_of_run_id == run_id


async def operator_objects(stack: Any) -> None:
    """Audited objects that are not runs: a schedule, a limit, an API key."""
    spec = rs.ScheduleSpec(agent_name="ct-scheduled", interval_ms=3_600_000)
    created = await stack.runs.CreateSchedule(rs.CreateScheduleRequest(name="contract", spec=spec),
                                              metadata=stack.md())
    schedule_id = created.schedule.schedule_id
    spec.interval_ms = 7_200_000
    await stack.runs.UpdateSchedule(rs.UpdateScheduleRequest(schedule_id=schedule_id, spec=spec), metadata=stack.md())
    for paused in (True, False):
        await stack.runs.PauseSchedule(rs.PauseScheduleRequest(schedule_id=schedule_id, paused=paused),
                                       metadata=stack.md())
    await stack.runs.DeleteSchedule(rs.DeleteScheduleRequest(schedule_id=schedule_id), metadata=stack.md())
    limit = {"scope": "tool", "subject": "ct.tool", "name": "rate"}
    await stack.runs.SetLimit(rs.SetLimitRequest(**limit, value="10/s"), metadata=stack.md())
    await stack.runs.ClearLimit(rs.ClearLimitRequest(**limit), metadata=stack.md())
    key = await stack.runs.CreateApiKey(rs.CreateApiKeyRequest(name="contract", role=rs.API_KEY_ROLE_VIEWER),
                                        metadata=stack.md())
    await stack.runs.RevokeApiKey(rs.RevokeApiKeyRequest(key_id=key.key.key_id), metadata=stack.md())


async def frozen_by_half_a_commit(stack: Any, db: Any) -> None:
    """A retried write finds its event without its checkpoint: the run is frozen (agent.run_frozen)."""
    agent = "ct-frozen"
    await submit(stack, agent=agent)
    ref = await claimed(stack, agent)
    request = ws.SaveCheckpointRequest(lease=ref, expected_version=0, state_json='{"cursor": "a"}',
                                       schema_version=1, event_id=eid())
    await stack.work.SaveCheckpoint(request)
    assert await db.execute("DELETE FROM agent_checkpoints WHERE event_id = $1::uuid",
                            request.event_id) == "DELETE 1"
    with pytest.raises(grpc.aio.AioRpcError):
        await stack.work.SaveCheckpoint(request)


def check_record(record: Any, row: Any) -> str:
    """One record against the document and its outbox row; returns its type."""
    c = contract()
    names = [name for name, _ in record.headers]
    assert len(names) == len(set(names)), f"a header twice: {names}"
    headers = {name: value.decode() for name, value in record.headers}
    header_schema = c.header_schema()
    assert set(headers) <= set(header_schema["properties"]), set(headers) - set(header_schema["properties"])
    errors = [e.message for e in c.validator("#/components/schemas/CloudEventHeaders").iter_errors(headers)]
    assert not errors, (headers, errors)
    event_type = headers["ce_type"]
    assert event_type in c.messages(), f"{event_type} is not in docs/events/asyncapi.yaml"
    payload = json.loads(record.value)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in c.payload_validator(event_type).iter_errors(payload)]
    assert not errors, (event_type, payload, errors)
    assert record.key == headers["ce_subject"].encode(), "the key is the event's ce_subject"
    # The attributes are the outbox row's.
    assert (headers["ce_id"], headers["ce_subject"], headers["ce_tenantid"]) == (
        str(row["event_id"]), str(row["run_id"]), row["tenant_id"])
    assert int(headers["ce_sequence"]) == row["id"]
    assert (int(headers["ce_fencingtoken"]), int(headers["ce_runversion"])) == (
        row["fencing_token"], row["run_version"])
    assert headers.get("ce_traceparent") == row["traceparent"]
    assert ("traceparent" in headers) == (row["traceparent"] is not None)
    return event_type


async def test_every_record_on_the_topic_keeps_the_documented_contract(db_url, db, kafka_bootstrap):
    settings = relay_settings(db_url, kafka_bootstrap)
    async with scheduler_stack(db_url) as stack:
        await tools_pause_signal_retry_sleep_complete(stack)
        await in_doubt_resolved_then_cancelled(stack)
        await not_executed_then_cancelled(stack)
        await children_then_rejected(stack)
        await operator_objects(stack)
        await frozen_by_half_a_commit(stack, db)
    rows = {row["event_id"]: row for row in await db.fetch("SELECT * FROM outbox ORDER BY id")}
    assert any(row["traceparent"] for row in rows.values()), "the API's writes carry trace context"
    async with running_relay(settings):
        await wait_until(lambda: _none_pending(db), 60, "the relay to publish the outbox")
    reader = await TopicReader(kafka_bootstrap, [settings.topic]).start()
    try:
        await reader.read_until(lambda records: len(records) >= len(rows), 60, "every outbox row on the topic")
    finally:
        await reader.stop()
    assert len(reader.records) == len(rows)  # the workload's every row, once (no fault: no redelivery)

    seen = {check_record(r, rows[r.event.id]) for r in reader.records}
    documented = set(contract().messages())
    assert seen == documented, f"not driven: {sorted(documented - seen)}"

    # Per key, in partition order, ce_sequence grows (the documented order of a subject's events).
    by_key: dict[bytes, list[Any]] = {}
    for record in sorted(reader.records, key=lambda r: (r.event.partition, r.event.offset)):
        by_key.setdefault(record.key, []).append(record)
    assert len({r.event.partition for r in by_key[next(iter(by_key))]}) == 1
    for key, records in by_key.items():
        sequences = [r.event.sequence for r in records]
        assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences), key
    # Audit events of non-run objects are keyed by the object: the API key's id, the schedule's.
    key_events = [r for r in reader.records if r.event.type.startswith("agent.audit.key.")]
    assert len(key_events) == 2 and len({r.key for r in key_events}) == 1
    assert await db.fetchval("SELECT count(*) FROM api_keys WHERE id = $1", uuid.UUID(key_events[0].key.decode())) == 1


async def _none_pending(db: Any) -> bool:
    return await pending_count(db) == 0

