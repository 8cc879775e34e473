"""What the store hands the RPC layer: typed rows and named results, never asyncpg Records.

Row classes are frozen dataclasses built from a record by field name (`RunRow.of(record)`, through
one constructor compiled per shape of record); columns a statement adds beyond a class's fields
are left out. A row is also subscriptable by column name (`row["status"]`), as a record is.
Results of writes are NamedTuples, so they unpack in place:
`version, replayed = await store.work.save_checkpoint(lease, write)`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple, Self

from scheduler.states import RunStatus, run_status

# ------------------------------------------------------------------ rows


class Row:
    """Base of the typed rows: built by field name, readable by column name."""

    __slots__ = ()
    _names: ClassVar[tuple[str, ...]] = ()
    # One constructor per shape of record (its column names), compiled on first sight.
    _builders: ClassVar[dict[tuple[str, ...], Callable[[Any], Any]]]
    # Fields read as an enum of the one vocabulary (e.g. a run's status as RunStatus).
    _coerce: ClassVar[dict[str, Callable[[Any], Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._names = ()  # filled in once the dataclass decorator has run (see `of`)
        cls._builders = {}

    @classmethod
    def of(cls, record: Mapping[str, Any], **overrides: Any) -> Self:
        """The row of `record`'s columns named like its fields; other columns are left out."""
        if overrides:
            names = cls._names or cls._field_names()
            present = set(record.keys())
            values = {name: record[name] for name in names if name in present}
            values.update(overrides)
            for name, coerce in cls._coerce.items():
                if name in values:
                    values[name] = coerce(values[name])
            return cls(**values)
        columns = tuple(record.keys())
        build = cls._builders.get(columns)
        if build is None:
            build = cls._builders[columns] = cls._compile(columns)
        return build(record)  # type: ignore[no-any-return]

    @classmethod
    def _compile(cls, columns: tuple[str, ...]) -> Callable[[Any], Any]:
        """A function that sets each field from the record by position (defaults for the fields the
        record lacks), as the dataclass's own __init__ would, without building a dict per row.
        A record that lacks a field with no default gets the dataclass's own TypeError."""
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        position = {name: i for i, name in enumerate(columns)}
        env: dict[str, Any] = {"_new": object.__new__, "_set": object.__setattr__, "cls": cls}
        lines = ["def build(record):", "    self = _new(cls)"]
        for f in fields:
            if f.name in position and f.name in cls._coerce:
                env[f"_c_{f.name}"] = cls._coerce[f.name]
                lines.append(f"    _set(self, {f.name!r}, _c_{f.name}(record[{position[f.name]}]))")
            elif f.name in position:
                lines.append(f"    _set(self, {f.name!r}, record[{position[f.name]}])")
            elif f.default is not dataclasses.MISSING:
                env[f"_d_{f.name}"] = f.default
                lines.append(f"    _set(self, {f.name!r}, _d_{f.name})")
            elif f.default_factory is not dataclasses.MISSING:
                env[f"_f_{f.name}"] = f.default_factory
                lines.append(f"    _set(self, {f.name!r}, _f_{f.name}())")
            else:
                names = [g.name for g in fields if g.name in position]
                coerce = cls._coerce
                return lambda record: cls(**{name: coerce[name](record[name]) if name in coerce else record[name]
                                             for name in names})
        if hasattr(cls, "__post_init__"):
            lines.append("    self.__post_init__()")
        lines.append("    return self")
        exec("\n".join(lines), env)  # source built above from the dataclass's own field names
        return env["build"]  # type: ignore[no-any-return]

    @classmethod
    def _field_names(cls) -> tuple[str, ...]:
        cls._names = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        return cls._names

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def keys(self) -> tuple[str, ...]:
        return type(self)._names or type(self)._field_names()

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


@dataclasses.dataclass(frozen=True, slots=True)
class RunRow(Row):
    """An agent_runs row (`SELECT *`), plus what lock_run/read_run/end_run/claim_work add."""

    _coerce: ClassVar[dict[str, Callable[[Any], Any]]] = {"status": run_status}

    id: uuid.UUID
    tenant_id: str
    agent_name: str
    agent_version: str
    status: RunStatus
    version: int
    fencing_token: int
    lease_owner: str | None
    lease_expires_at: dt.datetime | None
    next_attempt_at: dt.datetime | None
    attempt_count: int
    max_attempts: int
    current_step_key: str | None
    checkpoint_schema_version: int
    model_version: str | None
    prompt_version: str | None
    input: Any
    labels: Any
    budget_max_steps: int
    budget_max_tokens: int
    budget_max_cost_usd: float
    deadline_at: dt.datetime | None
    client_request_id: str | None
    submit_hash: bytes | None
    result: Any
    terminal_reason: str | None
    pause_reason: str | None
    human_input: Any
    cancel_requested_at: dt.datetime | None
    cancel_reason: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    last_event_id: uuid.UUID | None
    journal_length: int
    checkpoints_pruned_through: int
    last_signal_seq: int = 0
    awaiting_signal: str | None = None
    priority: int = 5
    enqueued_at: dt.datetime | None = None
    lease_live: bool | None = None
    db_now: dt.datetime | None = None
    doubted_intents: int | None = None
    last_traceparent: str | None = None  # get_run only: the latest event's W3C traceparent
    parent_run_id: uuid.UUID | None = None
    spawn_key: str | None = None
    spawn_index: int | None = None
    detached: bool = False
    root_run_id: uuid.UUID | None = None  # a child's tree's top run (migration 0019)
    spawn_depth: int = 0  # 0 for a top-level run, 1 for its children...
    depth: int | None = None  # run_tree only
    awaiting_join: bool = False  # waits for its children (wait_children)
    join_mode: str | None = None
    join_total: int = 0
    join_done: int = 0
    waiting_on: str | None = None  # parked by flow control: tenant, agent or key
    retry_of_run_id: uuid.UUID | None = None  # RetryRun: the run it starts again (migration 0020)


@dataclasses.dataclass(frozen=True, slots=True)
class ChildRow(Row):
    """One child of a spawn group (spawn_group), as the join's answer shows it."""

    _coerce: ClassVar[dict[str, Callable[[Any], Any]]] = {"status": run_status}

    id: uuid.UUID
    agent_name: str
    status: RunStatus
    result: Any
    terminal_reason: str | None
    spawn_index: int
    cost_usd: float = 0.0


class Spawned(NamedTuple):
    children: list[ChildRow]
    created: int
    join_met: bool


@dataclasses.dataclass(frozen=True, slots=True)
class SignalRow(Row):
    """A run_signals row (or one of the pending signals a claim reads, by the same names)."""

    seq: int
    signal_id: uuid.UUID
    name: str
    payload: Any
    received_at: dt.datetime
    request_id: str
    run_id: uuid.UUID | None = None
    consumed_at: dt.datetime | None = None

    @classmethod
    def of_row(cls, record: Mapping[str, Any]) -> SignalRow:
        """From a run_signals row, whose seq is its `id`."""
        return cls.of(record, seq=record["id"])

    @classmethod
    def of_claim(cls, item: Mapping[str, Any]) -> SignalRow:
        """From one item of claim_work's pending_signals (jsonb: ids and times as text)."""
        return cls(seq=int(item["seq"]), signal_id=uuid.UUID(item["signal_id"]), name=item["name"],
                   payload=item["payload"], received_at=dt.datetime.fromisoformat(item["received_at"]),
                   request_id=item["request_id"])


@dataclasses.dataclass(frozen=True, slots=True)
class ExecutionRow(Row):
    """A tool_executions (ledger) row."""

    id: uuid.UUID
    run_id: uuid.UUID
    step_key: str
    tool_name: str
    idempotency_key: str
    request_json: Any
    request_hash: bytes
    status: str
    remote_resource_id: str | None
    response_json: Any
    error_code: str | None
    fencing_token: int
    outbound_intent_at: dt.datetime | None
    completed_at: dt.datetime | None
    reconciled_at: dt.datetime | None
    reconciliation_evidence: Any
    intent_event_id: uuid.UUID | None = None
    resolved_by: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointRow(Row):
    """An agent_checkpoints row."""

    run_id: uuid.UUID
    version: int
    state_json: Any
    state_hash: bytes
    schema_version: int
    fencing_token: int
    event_id: uuid.UUID
    created_at: dt.datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class EventRow(Row):
    """An outbox row."""

    id: int
    event_id: uuid.UUID
    run_id: uuid.UUID
    tenant_id: str
    event_type: str
    payload: Any
    fencing_token: int | None
    run_version: int | None
    traceparent: str | None
    tracestate: str | None
    published_at: dt.datetime | None
    created_at: dt.datetime
    write_op: str | None = None
    write_hash: bytes | None = None


class JournalRow(NamedTuple):
    """One journal entry in history_journal's / read_journal's column order (`JournalRow(*record)`):
    the detail as the text jsonb prints, so a long run's journal costs no JSON work per entry."""

    seq: int
    kind: str
    step_key: str
    node: str
    tool: str
    detail_text: str
    run_version: int
    created_at: dt.datetime
    page_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class TenantStats(Row):
    """tenant_stats: one tenant's counts and ages by database time."""

    by_status: dict[str, int]
    oldest_queued_s: float | None
    in_doubt: int
    oldest_in_doubt_s: float | None
    outbox_pending: int
    outbox_oldest_s: float | None
    db_now: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class GlobalStats(Row):
    """global_stats: the metrics' view of all tenants."""

    by_status: dict[str, int]
    oldest_queued_s: float | None
    oldest_in_doubt_s: float | None
    outbox_pending: int
    outbox_oldest_s: float | None
    commit_unknown_inconsistent: int
    database_bytes: int = 0
    client_connections: int = 0
    max_connections: int = 0
    waiting_on_limit: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class DbTableHealth(Row):
    """db_health_tables: one table's tuples, sizes, freeze age and time since its last vacuum."""

    table_name: str
    live_tuples: int
    dead_tuples: int
    table_bytes: int
    index_bytes: int
    xid_age: int
    vacuum_age_s: float | None
    autovacuum_count: int


@dataclasses.dataclass(frozen=True)
class DbHealth:
    """The database health figures of one refresh (scheduler/background/db_health.py)."""

    xid_age: int
    wal_bytes: int | None  # None on a standby
    db_clock_s: float
    tables: list[DbTableHealth]
    # pg_stat_statements: None when it is not installed here, or not loaded (then `statements_problem`).
    slow_count: int | None = None
    slowest: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    statements_problem: str = ""


# ------------------------------------------------------------------ results


class Submitted(NamedTuple):
    run: RunRow
    created: bool  # False: the same client_request_id was already submitted with this payload


class Signalled(NamedTuple):
    """SignalRun."""

    signal: SignalRow
    run: RunRow
    created: bool  # False: the same request id already queued this very signal
    woke: bool  # the run was parked waiting for this signal and is due now


class Resolved(NamedTuple):
    run: RunRow
    execution: ExecutionRow


class Written(NamedTuple):
    """SaveCheckpoint."""

    version: int
    replayed: bool


class Began(NamedTuple):
    """BeginToolCall (Tx1). `existing` is never a licence to resend."""

    execution: ExecutionRow
    existing: bool
    replayed: bool


class Completed(NamedTuple):
    """CompleteToolCall (Tx2, with or without the run's end) and its NOT_EXECUTED form."""

    version: int
    status: RunStatus
    replayed: bool


class Chained(NamedTuple):
    """CompleteAndBeginToolCall: the new version and the next step's ledger row."""

    version: int
    execution: ExecutionRow
    replayed: bool


class Finished(NamedTuple):
    """FinishRun."""

    status: RunStatus
    next_attempt_at: dt.datetime | None
    replayed: bool


class JournalPage(NamedTuple):
    entries: list[JournalRow]
    more: bool


class CompactJournalPage(NamedTuple):
    entries_json: str  # one JSON array text, built by PostgreSQL
    more: bool


class Purged(NamedTuple):
    """One retention batch: runs looked at, rows deleted (or, dry, that would be) by table, and
    where the next batch starts."""

    scanned: int
    runs: int
    checkpoints: int
    ledger: int
    journal: int
    outbox: int
    signals: int
    last_finished: dt.datetime | None
    last_id: uuid.UUID | None


class Pruned(NamedTuple):
    """One pruning statement: the last run id it looked at, how many runs, checkpoints deleted, and
    runs with more to prune than one statement takes."""

    last_id: uuid.UUID | None
    runs: int
    deleted: int
    behind: int


__all__ = ["Began", "Chained", "CheckpointRow", "CompactJournalPage", "Completed", "EventRow", "ExecutionRow",
           "Finished", "GlobalStats", "JournalPage", "JournalRow", "Pruned", "Resolved", "Row", "RunRow",
           "Submitted", "TenantStats", "Written"]


@dataclasses.dataclass(frozen=True, slots=True)
class RegisteredAgentRow(Row):
    """A live agent version of the registry, with the executors serving it."""

    agent_name: str
    agent_version: str
    input_schema: dict[str, Any] | None
    tool_names: list[str]
    executors: list[str]
    last_seen: dt.datetime
