"""The store's vocabulary: the lease a fenced write names, the fields of its request, and how
an event id is bound to the write it announces (docs/design.md §commit-unknown)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from scheduler.store.rows import CheckpointRow, EventRow, ExecutionRow, JournalRow, RunRow, SignalRow
from shared.canonical import CanonicalJson, content_hash, sha256_of


@dataclass(frozen=True)
class LeaseRef:
    run_id: uuid.UUID
    worker_id: str
    fencing_token: int


@dataclass(frozen=True)
class WriteBinding:
    """What a caller's event id is bound to: the operation and a hash over the lease and the request.

    Recorded on the write's outbox rows (write_op, write_hash). A retry with the
    same event id replays only when both match; anything else is refused and
    changes nothing (docs/design.md §commit-unknown).
    """

    op: str
    digest: bytes


def bind_write(op: str, lease: LeaseRef, **fields: Any) -> WriteBinding:
    """The binding of one fenced write: every field that decides what it writes, plus the lease."""
    normalised = {name: _hashable(value) for name, value in fields.items()}
    return WriteBinding(op, sha256_of({"op": op, "lease": [str(lease.run_id), lease.worker_id, lease.fencing_token],
                                       "fields": normalised}))


def _hashable(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, CanonicalJson):
        return sha256_of(value).hex()
    return value


@dataclass(frozen=True)
class ToolIntent:
    """Tx1's fields for the next step of a combined Tx2 + Tx1 write."""

    step_key: str
    tool_name: str
    idempotency_key: str
    request: Any
    execution_id: uuid.UUID
    event_id: uuid.UUID


@dataclass(frozen=True)
class RunEnd:
    """How a run ends in the same transaction as its last Tx2 (the checkpoint records the end)."""

    outcome: str  # COMPLETED | FAILED
    reason: str
    result: Any
    error_class: str
    event_id: uuid.UUID


@dataclass(frozen=True)
class Journal:
    """The journal entries one write appends, as the parallel arrays its statement unnests.

    `details` are canonical JSON object texts (stored as jsonb). Empty: the
    write appends nothing (every schema-1 write).
    """

    seqs: tuple[int, ...] = ()
    kinds: tuple[str, ...] = ()
    step_keys: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    details: tuple[str, ...] = ()

    @classmethod
    def of(cls, entries: Iterable[tuple[int, str, str, str, str, str]]) -> Journal:
        columns = tuple(zip(*entries, strict=True))
        return cls(*columns) if columns else NO_JOURNAL  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def columns(self) -> list[list[Any]]:
        return [list(self.seqs), list(self.kinds), list(self.step_keys), list(self.nodes), list(self.tools),
                list(self.details)]

    @property
    def params(self) -> dict[str, list[Any]]:
        """The statement parameters (`:journal_seqs` ... `:journal_details`) these entries bind."""
        return {"journal_seqs": list(self.seqs), "journal_kinds": list(self.kinds),
                "journal_step_keys": list(self.step_keys), "journal_nodes": list(self.nodes),
                "journal_tools": list(self.tools), "journal_details": list(self.details)}

    def binding_fields(self) -> dict[str, Any]:
        """What the write binding adds for these entries: nothing when there are none (hashes of
        writes without entries stay what they were before the journal existed)."""
        if not self.seqs:
            return {}
        return {"journal": sha256_of([list(entry) for entry in zip(*self.columns, strict=True)]).hex()}


NO_JOURNAL = Journal()


@dataclass(frozen=True)
class SealedSubmit:
    run_id: uuid.UUID
    input: dict[str, Any]
    key_id: str
    wrapped_key: bytes
    sensitive: dict[str, Any]


@dataclass(frozen=True)
class RunFilter:
    """ListRuns' filters (list_runs): None is no filter. `labels`: every key=value must match."""

    statuses: list[str] | None = None
    agent_name: str | None = None
    labels: dict[str, str] | None = None
    min_priority: int | None = None
    max_priority: int | None = None
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None

    def params(self) -> dict[str, Any]:
        return {"statuses": self.statuses, "agent_name": self.agent_name, "labels": self.labels,
                "min_priority": self.min_priority, "max_priority": self.max_priority,
                "created_after": self.created_after, "created_before": self.created_before}


@dataclass(frozen=True)
class SubmitSpec:
    agent_name: str
    agent_version: str
    input: dict[str, Any]
    client_request_id: str | None
    max_attempts: int
    labels: dict[str, str]
    max_steps: int = 0
    max_tokens: int = 0
    max_cost_usd: float = 0.0
    deadline_at: dt.datetime | None = None
    priority: int = 5  # 1 (lowest) .. 9 (highest), claimed first among due runs
    requested_priority: int = 0  # as submitted (0 = the agent's default): what a retried submit must repeat
    concurrency_key: str | None = None  # rendered from the input by the agent's key template
    concurrency_max: int | None = None
    # Set when the agent marks sensitive fields: the run's id, its input with those sealed, and its
    # wrapped data key (stored together by the submit statement). The hash is over the plain input.
    sealed: SealedSubmit | None = None
    retry_of: uuid.UUID | None = None  # RetryRun: the run it starts again (its request is that run alone)

    def submit_hash(self) -> bytes:
        return content_hash(self.submit_identity())

    def submit_identity(self) -> dict[str, Any]:
        """What a retried submit with the same client_request_id must repeat."""
        if self.retry_of is not None:  # the input is sealed again under a new key on each attempt
            return {"retry_of_run_id": str(self.retry_of)}
        # The requested priority counts only when set, so the hashes of submits made before it existed hold.
        extra = {"priority": self.requested_priority} if self.requested_priority else {}
        return {
            **extra,
            "agent_name": self.agent_name,
            "agent_version": self.agent_version,
            "input": self.input,
            "max_attempts": self.max_attempts,
            "labels": self.labels,
            "budget": [self.max_steps, self.max_tokens, self.max_cost_usd,
                       self.deadline_at.isoformat() if self.deadline_at else None],
        }


@dataclass(frozen=True)
class Claimed:
    """A claim: the run under its new lease, its current checkpoint and its current step's ledger row."""

    run: RunRow
    checkpoint: CheckpointRow | None
    step_execution: ExecutionRow | None
    lease_duration_ms: int
    signals: tuple[SignalRow, ...] = ()  # pending, oldest first (at most 100)
    signals_seen: int = 0  # the latest signal's seq in the claim's snapshot
    claim_wait_s: float | None = None  # a queued run's wait since it was last due (None: a lease taken over)
    has_data_key: bool = True  # False: the run holds no data key, so nothing of it is sealed


@dataclass(frozen=True)
class History:
    run: RunRow
    checkpoints: list[CheckpointRow] = field(default_factory=list)
    executions: list[ExecutionRow] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)
    journal: list[JournalRow] = field(default_factory=list)


HISTORY_PARTS = ("checkpoints", "tool_executions", "events", "journal")


@dataclass(frozen=True)
class HistoryCursor:
    """Where each part of a run's history continues; None for a part with nothing left."""

    checkpoints: int | None = 0  # the last version returned
    tool_executions: tuple[dt.datetime, uuid.UUID] | Literal["start"] | None = "start"
    events: int | None = 0  # the last outbox id returned
    journal: int | None = 0  # the last seq returned

    @property
    def exhausted(self) -> bool:
        return (self.checkpoints is None and self.tool_executions is None and self.events is None
                and self.journal is None)


ResolveOutcome = Literal["SUCCEEDED", "NOT_EXECUTED", "UNKNOWN"]
# What a write leaves besides its outbox event: a checkpoint, a ledger row, or
# (for writes that leave neither) the run row's last_event_id marker.
Effect = Literal["checkpoint", "ledger", "run"]


HISTORY_START = HistoryCursor()  # the first page's cursor


class HistoryPage(NamedTuple):
    history: History
    cursor: HistoryCursor  # where the next page starts (`exhausted`: nothing left)


@dataclass(frozen=True)
class AuditEntry:
    """Who acts and why, for the audit row an operator path writes in its transaction
    (docs/design.md §security). The action and the states before and after come from the path."""

    principal: str
    principal_kind: str  # api_key | jwt | anonymous | local
    reason: str | None = None
    comment: str | None = None
    ticket_id: str | None = None
    request_id: str | None = None
