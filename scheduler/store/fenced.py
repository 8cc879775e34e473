"""The fenced writes of the lease holder, one request object each.

The handler (scheduler/api/work_service.py) validates a call and builds its request once; the
repository takes it whole, binds its event id to it (`binding`) and hands its fields to the
statement. A write's binding is persisted on its outbox rows, and a retry of the write replays only
when it computes the same binding again, across restarts and upgrades. The field names and the
values hashed are therefore fixed (tests/unit/test_write_bindings.py holds them).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from scheduler.store.types import NO_JOURNAL, Journal, LeaseRef, RunEnd, ToolIntent, WriteBinding, bind_write
from shared.canonical import CanonicalJson, sha256_of


class _WritesState:
    """What a write that stores a checkpoint's state has: the state, or its canonical text when the
    handler has it already (`state_text`: stored and hashed as is, never encoded again)."""

    state: Any
    state_text: CanonicalJson | None

    @property
    def stored(self) -> Any:
        return self.state if self.state_text is None else self.state_text

    @cached_property
    def state_hash(self) -> bytes:
        return sha256_of(self.stored)


@dataclass(frozen=True, kw_only=True)
class CheckpointWrite(_WritesState):
    """SaveCheckpoint: a new checkpoint at `expected_version` + 1, with its event, its journal entries and
    the signals it consumes. `state_text`, when given, is canonical_json(state): stored and hashed as is."""

    expected_version: int
    state: Any
    schema_version: int
    event_id: uuid.UUID
    step_key: str | None = None
    event_type: str = "agent.checkpoint"
    event_payload: dict[str, Any] | None = None
    state_text: CanonicalJson | None = None
    journal: Journal = NO_JOURNAL
    consume_signal_seqs: tuple[int, ...] = ()

    @property
    def payload(self) -> dict[str, Any]:
        return {} if self.event_payload is None else self.event_payload

    def binding(self, lease: LeaseRef) -> WriteBinding:
        consumed = {"consume_signal_seqs": list(self.consume_signal_seqs)} if self.consume_signal_seqs else {}
        return bind_write("SaveCheckpoint", lease, expected_version=self.expected_version, state=self.state_hash,
                          schema_version=self.schema_version, step_key=self.step_key, event_id=self.event_id,
                          event_type=self.event_type, event_payload=self.payload, **self.journal.binding_fields(),
                          **consumed)


@dataclass(frozen=True, kw_only=True)
class BeginCall:
    """BeginToolCall (Tx1): the intent of `intent.step_key`, recorded before the tool is called."""

    expected_version: int
    intent: ToolIntent

    def binding(self, lease: LeaseRef, request_hash: bytes) -> WriteBinding:
        """`request_hash`: over the plain request (the stored one may have sealed values)."""
        intent = self.intent
        return bind_write("BeginToolCall", lease, expected_version=self.expected_version, step_key=intent.step_key,
                          tool_name=intent.tool_name, idempotency_key=intent.idempotency_key, request=request_hash,
                          execution_id=intent.execution_id, event_id=intent.event_id)


@dataclass(frozen=True, kw_only=True)
class ToolOutcome(_WritesState):
    """The definite outcome of the open call `step_key` (Tx2), with the checkpoint it writes."""

    expected_version: int
    step_key: str
    succeeded: bool
    response: Any
    state: Any
    schema_version: int
    event_id: uuid.UUID
    remote_resource_id: str | None = None
    error_code: str | None = None
    evidence: dict[str, Any] | None = None
    state_text: CanonicalJson | None = None
    journal: Journal = NO_JOURNAL

    @property
    def outcome(self) -> str:
        return "SUCCEEDED" if self.succeeded else "FAILED"

    @property
    def close_as(self) -> tuple[str, Any, str | None, str | None]:
        """How the ledger row is closed, for a refusal's explanation (Recovery.tool_refusal)."""
        return self.outcome, self.response, self.remote_resource_id, self.error_code

    def params(self) -> dict[str, Any]:
        """The statement parameters of the Tx2 half."""
        return {"expected_version": self.expected_version, "step_key": self.step_key, "outcome": self.outcome,
                "state": self.stored, "schema_version": self.schema_version, "response": self.response,
                "remote_resource_id": self.remote_resource_id, "error_code": self.error_code,
                "evidence": self.evidence, "state_hash": self.state_hash, "event_id": self.event_id,
                **self.journal.params}


@dataclass(frozen=True, kw_only=True)
class CompleteCall(ToolOutcome):
    """CompleteToolCall with a definite outcome; with `end`, the run ends in the same statement."""

    next_step_key: str | None = None
    end: RunEnd | None = None

    def binding(self, lease: LeaseRef) -> WriteBinding:
        end = self.end
        return bind_write(
            "CompleteToolCall", lease, expected_version=self.expected_version, step_key=self.step_key,
            outcome=self.outcome, next_step_key=self.next_step_key, state=self.state_hash,
            schema_version=self.schema_version, response=sha256_of(self.response).hex(),
            remote_resource_id=self.remote_resource_id, error_code=self.error_code, evidence=self.evidence,
            event_id=self.event_id,
            end=None if end is None else [end.outcome, end.reason, sha256_of(end.result).hex(), end.error_class,
                                          str(end.event_id)], **self.journal.binding_fields())


@dataclass(frozen=True, kw_only=True)
class CompleteAndBegin(ToolOutcome):
    """CompleteAndBeginToolCall: Tx2 of `step_key` and Tx1 of `intent` in one statement."""

    intent: ToolIntent

    def binding(self, lease: LeaseRef, request_hash: bytes) -> WriteBinding:
        """`request_hash`: over the next call's plain request."""
        intent = self.intent
        return bind_write(
            "CompleteAndBeginToolCall", lease, expected_version=self.expected_version, step_key=self.step_key,
            outcome=self.outcome, state=self.state_hash, schema_version=self.schema_version,
            response=sha256_of(self.response).hex(), remote_resource_id=self.remote_resource_id,
            error_code=self.error_code, evidence=self.evidence, event_id=self.event_id,
            next=[intent.step_key, intent.tool_name, intent.idempotency_key, request_hash.hex(),
                  str(intent.execution_id), str(intent.event_id)], **self.journal.binding_fields())


@dataclass(frozen=True, kw_only=True)
class NotExecuted:
    """CompleteToolCall NOT_EXECUTED: the open call `step_key` provably never ran; the run goes back
    to QUEUED with a backoff."""

    expected_version: int
    step_key: str
    evidence: dict[str, Any]
    event_id: uuid.UUID
    error_code: str | None = None

    def binding(self, lease: LeaseRef) -> WriteBinding:
        return bind_write("CompleteToolCall.NOT_EXECUTED", lease, expected_version=self.expected_version,
                          step_key=self.step_key, error_code=self.error_code, evidence=self.evidence,
                          event_id=self.event_id)


@dataclass(frozen=True, kw_only=True)
class InDoubt:
    """MarkToolInDoubt: the outcome of the open call `step_key` is unknown; the run freezes."""

    step_key: str
    error_code: str
    detail: str
    event_id: uuid.UUID

    def binding(self, lease: LeaseRef) -> WriteBinding:
        return bind_write("MarkToolInDoubt", lease, step_key=self.step_key, error_code=self.error_code,
                          detail=self.detail, event_id=self.event_id)


@dataclass(frozen=True, kw_only=True)
class RunFinish:
    """FinishRun: outcome COMPLETED | FAILED | PAUSED_HUMAN | RETRY | SLEEP (with `wait_signal`, a wait
    for a signal; with `wait_children`, a wait for the children's join)."""

    expected_version: int
    outcome: str
    event_id: uuid.UUID
    reason: str = ""
    result: Any = None
    sleep_ms: int = 0
    pause_when_exhausted: bool = False
    error_class: str = ""
    wait_signal: str | None = None
    signals_seen: int = 0
    wait_children: bool = False

    def binding(self, lease: LeaseRef) -> WriteBinding:
        waits: dict[str, Any] = ({"wait_signal": self.wait_signal, "signals_seen": self.signals_seen}
                                 if self.wait_signal else {})
        if self.wait_children:
            waits["wait_children"] = True
        return bind_write("FinishRun", lease, expected_version=self.expected_version, outcome=self.outcome,
                          reason=self.reason, result=sha256_of(self.result).hex(), sleep_ms=self.sleep_ms,
                          pause_when_exhausted=self.pause_when_exhausted, error_class=self.error_class,
                          event_id=self.event_id, **waits)


__all__ = ["BeginCall", "CheckpointWrite", "CompleteAndBegin", "CompleteCall", "InDoubt", "NotExecuted",
           "RunFinish", "ToolOutcome"]
