"""The store's typed rows (scheduler/store/rows.py) to protobuf messages (and the JSON text fields they carry)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from scheduler.states import RunStatus
from scheduler.store.rows import CheckpointRow, EventRow, ExecutionRow, JournalRow, RunRow, SignalRow
from shared.canonical import canonical_json
from shared.gen.agentrt.v1 import common_pb2 as pb

RUN_STATUS = {status: getattr(pb, f"RUN_STATUS_{status.value}") for status in RunStatus}
RUN_STATUS_NAME = {number: name for name, number in RUN_STATUS.items()}
TOOL_STATUS = {name: getattr(pb, f"TOOL_EXECUTION_STATUS_{name}") for name in
               ("OUTBOUND_INTENT", "SUCCEEDED", "FAILED", "IN_DOUBT", "NOT_EXECUTED")}


def timestamp(value: dt.datetime | None) -> Timestamp | None:
    if value is None or value in (dt.datetime.min, dt.datetime.max):
        return None
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def json_text(value: Any) -> str:
    return "" if value is None else canonical_json(value)


def set_time(message: Any, field: str, value: dt.datetime | None) -> None:
    ts = timestamp(value)
    if ts is not None:
        getattr(message, field).CopyFrom(ts)


def trace_id_of(traceparent: str | None) -> str:
    """The trace id of a W3C traceparent (version-traceid-spanid-flags), "" when there is none."""
    parts = (traceparent or "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 and parts[1] != "0" * 32 else ""


def signal_to_proto(row: SignalRow) -> pb.Signal:
    signal = pb.Signal(seq=row.seq, signal_id=str(row.signal_id), name=row.name, payload_json=json_text(row.payload),
                       request_id=row.request_id)
    set_time(signal, "received_at", row.received_at)
    return signal


def waiting_for(row: RunRow) -> str:
    """Run.waiting_for: what the row says the run waits for (common.proto lists the forms).
    Only the row's own timestamps are compared, never this process's clock."""
    if row.status is RunStatus.PAUSED_HUMAN:
        return f"approval: {row.pause_reason}" if row.pause_reason else "approval"
    if row.status is RunStatus.PAUSED_INDOUBT:
        return "reconciliation of an in-doubt tool call"
    if row.status is not RunStatus.QUEUED:
        return ""
    at = row.next_attempt_at.isoformat() if row.next_attempt_at else ""
    if row.awaiting_signal:
        return f"signal {row.awaiting_signal}" + (f" (times out at {at})" if at else "")
    if row.awaiting_join:
        return f"children: {row.join_done}/{row.join_total} ended (join {row.join_mode or 'ALL'})"
    if row.waiting_on:
        return f"a free slot ({row.waiting_on} limit)"
    # asyncpg reads the column's default '-infinity' (due at once) as a naive datetime.min.
    if row.next_attempt_at is None or row.next_attempt_at.tzinfo is None \
            or row.next_attempt_at <= row.updated_at:
        return ""  # due when it was last written (submitted, resumed): waits for an executor only
    if row.attempt_count == 0:  # a durable sleep resets the attempts; a retry keeps counting them
        return f"timer until {at}"
    return f"retry at {at} (attempt {row.attempt_count + 1} of {row.max_attempts})"


def run_to_proto(row: RunRow) -> pb.Run:
    run = pb.Run(
        run_id=str(row.id),
        tenant_id=row.tenant_id,
        agent_name=row.agent_name,
        agent_version=row.agent_version,
        status=RUN_STATUS[row.status],
        version=row.version,
        fencing_token=row.fencing_token,
        attempt_count=row.attempt_count,
        max_attempts=row.max_attempts,
        input_json=json_text(row.input),
        labels=row.labels,
        current_step_key=row.current_step_key or "",
        terminal_reason=row.terminal_reason or "",
        pause_reason=row.pause_reason or "",
        cancel_requested=row.cancel_requested_at is not None,
        client_request_id=row.client_request_id or "",
        result_json=json_text(row.result),
        lease_owner=row.lease_owner or "",
        human_input_json=json_text(row.human_input),
        last_trace_id=trace_id_of(row.last_traceparent),
        priority=row.priority,
        parent_run_id=str(row.parent_run_id) if row.parent_run_id else "",
        waiting_for=waiting_for(row),
        retry_of_run_id=str(row.retry_of_run_id) if row.retry_of_run_id else "",
    )
    run.budget.max_steps = row.budget_max_steps
    run.budget.max_tokens = row.budget_max_tokens
    run.budget.max_cost_usd = row.budget_max_cost_usd
    set_time(run.budget, "deadline", row.deadline_at)
    for name in ("next_attempt_at", "created_at", "updated_at", "finished_at", "lease_expires_at"):
        set_time(run, name, getattr(row, name))
    return run


def checkpoint_to_proto(row: CheckpointRow, run_id: Any = None) -> pb.Checkpoint:
    checkpoint = pb.Checkpoint(
        run_id=str(run_id if run_id is not None else row.run_id),
        version=row.version,
        state_json=json_text(row.state_json),
        state_hash=bytes(row.state_hash).hex(),
        schema_version=row.schema_version,
        fencing_token=row.fencing_token,
        event_id=str(row.event_id),
    )
    set_time(checkpoint, "created_at", row.created_at)
    return checkpoint


def execution_to_proto(row: ExecutionRow, run_id: Any = None) -> pb.ToolExecution:
    execution = pb.ToolExecution(
        execution_id=str(row.id),
        run_id=str(run_id if run_id is not None else row.run_id),
        step_key=row.step_key,
        tool_name=row.tool_name,
        idempotency_key=row.idempotency_key,
        request_json=json_text(row.request_json),
        request_hash=bytes(row.request_hash).hex(),
        status=TOOL_STATUS[row.status],
        remote_resource_id=row.remote_resource_id or "",
        response_json=json_text(row.response_json),
        error_code=row.error_code or "",
        fencing_token=row.fencing_token,
        reconciliation_evidence_json=json_text(row.reconciliation_evidence),
    )
    for name in ("outbound_intent_at", "completed_at", "reconciled_at"):
        set_time(execution, name, getattr(row, name))
    return execution


def event_to_proto(row: EventRow) -> pb.OutboxEvent:
    event = pb.OutboxEvent(
        id=row.id,
        event_id=str(row.event_id),
        run_id=str(row.run_id),
        event_type=row.event_type,
        payload_json=json_text(row.payload),
        fencing_token=row.fencing_token,
        run_version=row.run_version,
        traceparent=row.traceparent or "",
    )
    set_time(event, "created_at", row.created_at)
    set_time(event, "published_at", row.published_at)
    return event


def journal_to_proto(row: JournalRow, *, with_time: bool = True) -> pb.JournalEntry:
    """One journal row (history_journal, read_journal: detail as stored text) as its message.

    A takeover reads every entry of a long run: no per-entry JSON work here, and ReadJournal
    leaves out the time (`with_time=False`), which executors do not read.
    """
    entry = pb.JournalEntry(seq=row.seq, kind=row.kind, step_key=row.step_key, node=row.node, tool=row.tool,
                            detail_json=row.detail_text, run_version=row.run_version)
    if with_time:
        entry.created_at.FromDatetime(row.created_at)
    return entry
