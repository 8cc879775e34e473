"""The scheduler's data-access layer: the only code that runs SQL against run state.

Hot-path writes (claim, heartbeat, checkpoint, Tx1, Tx2, in-doubt, finish) are
single statements from sql/queries.sql: one round trip, atomic by
construction, every predicate on the database clock. When such a statement
matches no row, `_refusal` reads the row and says why (not found, lease lost,
cancelled, wrong state, version conflict) — the diagnosis never writes except
to apply a requested cancel or to freeze a run whose commit was half-visible.

Operator paths (cancel, resume, resolve) lock the run row, check the
transition table in code, then write, in one explicit transaction. No network
call other than to PostgreSQL ever happens while a run row is locked.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, ParamSpec, TypeVar

import asyncpg
from asyncpg import Record

from scheduler.config import SchedulerSettings
from scheduler.queries import Q
from scheduler.states import LEASED, TERMINAL, Op, RunStatus, sources, transition
from shared.canonical import CanonicalJson, request_hash, sha256_of, uuid7
from shared.db import CONNECTION_ERRORS, RETRYABLE, init_connection
from shared.errors import (
    AgentrtError,
    AlreadyExists,
    DecisionNotCheckpointed,
    InvalidArgument,
    InvalidTransition,
    LeaseLost,
    NotFound,
    RunCancelled,
    RunFrozen,
    Unavailable,
    VersionConflict,
)
from shared.tracing import NO_TRACE, Trace, annotate

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

COMMIT_UNKNOWN_COUNTER = "commit_unknown_inconsistent"
_ASSERT_SQLSTATE = "AR001"


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
    changes nothing (design: event ids).
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
    def args(self) -> list[list[Any]]:
        return [list(self.seqs), list(self.kinds), list(self.step_keys), list(self.nodes), list(self.tools),
                list(self.details)]

    def binding_fields(self) -> dict[str, Any]:
        """What the write binding adds for these entries: nothing when there are none (hashes of
        writes without entries stay what they were before the journal existed)."""
        if not self.seqs:
            return {}
        return {"journal": sha256_of([list(entry) for entry in zip(*self.args, strict=True)]).hex()}


NO_JOURNAL = Journal()


def tx2_binding(lease: LeaseRef, expected_version: int, step_key: str, outcome: str, next_step_key: str | None,
                state_hash: bytes, schema_version: int, response: Any, remote_resource_id: str | None,
                error_code: str | None, evidence: dict[str, Any] | None, event_id: uuid.UUID,
                end: RunEnd | None, journal: Journal = NO_JOURNAL) -> WriteBinding:
    """The binding of a definite Tx2 (CompleteToolCall), with or without the run's end."""
    return bind_write(
        "CompleteToolCall", lease, expected_version=expected_version, step_key=step_key, outcome=outcome,
        next_step_key=next_step_key, state=state_hash, schema_version=schema_version,
        response=sha256_of(response).hex(), remote_resource_id=remote_resource_id, error_code=error_code,
        evidence=evidence, event_id=event_id,
        end=None if end is None else [end.outcome, end.reason, sha256_of(end.result).hex(), end.error_class,
                                      str(end.event_id)], **journal.binding_fields())


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

    def submit_hash(self) -> bytes:
        return sha256_of(
            {
                "agent_name": self.agent_name,
                "agent_version": self.agent_version,
                "input": self.input,
                "max_attempts": self.max_attempts,
                "labels": self.labels,
                "budget": [self.max_steps, self.max_tokens, self.max_cost_usd,
                           self.deadline_at.isoformat() if self.deadline_at else None],
            }
        )


@dataclass
class Claimed:
    run: Record
    checkpoint: dict[str, Any] | None
    step_execution: dict[str, Any] | None
    lease_duration_ms: int


@dataclass
class History:
    run: Record
    checkpoints: list[Record] = field(default_factory=list)
    executions: list[Record] = field(default_factory=list)
    events: list[Record] = field(default_factory=list)
    journal: list[Record] = field(default_factory=list)


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



def db_call(func: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Retries serialization failures/deadlocks (bounded); a lost database is UNAVAILABLE."""

    @functools.wraps(func)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        for attempt in range(5):
            try:
                return await func(*args, **kwargs)
            except RETRYABLE:
                if attempt == 4:
                    raise Unavailable("database kept aborting the transaction; retry") from None
                await asyncio.sleep(0.005 * 2**attempt)
            except AgentrtError:
                raise
            except CONNECTION_ERRORS as exc:
                raise Unavailable(f"database unavailable: {type(exc).__name__}") from None
        raise AssertionError("unreachable")

    return wrapper


def _prefixed(row: Record, prefix: str) -> dict[str, Any] | None:
    data = {key[len(prefix):]: row[key] for key in row.keys() if key.startswith(prefix)}
    if all(value is None for value in data.values()):
        return None
    return data


async def _fenced_write(conn: asyncpg.Connection, query: str, *args: Any) -> Record | None:
    """Runs one single-statement fenced write from queries.sql.

    None when it matched no row, or when a unique key (an event id already used)
    or an agentrt_assert refused it; nothing was written then, and the caller
    explains why (replay by event id, or `_refusal`).
    """
    try:
        row = await conn.fetchrow(Q[query], *args)
    except asyncpg.UniqueViolationError:
        return None
    except asyncpg.PostgresError as exc:
        if exc.sqlstate != _ASSERT_SQLSTATE:
            raise
        return None
    if row is not None:
        annotate(tenant_id=row["tenant_id"])
    return row


_init_connection = init_connection  # the name tests/integration/test_stateful.py still imports


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release hook: nothing to undo, so no extra round trip per call.

    asyncpg's default reset sends `SELECT pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL` on every release: one more round trip per RPC. Pool
    connections never take session advisory locks, open cursors outside a
    transaction, LISTEN (the notifier has its own connection) or SET session
    settings, so there is nothing for it to undo. The pool still rolls back a
    transaction left open and drops listeners before calling this hook.
    """


async def connect_pool(dsn: str, *, min_size: int = 2, max_size: int = 20,
                       command_timeout: float = 30.0) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=init_connection,
                                     command_timeout=command_timeout, reset=_keep_session)
    assert pool is not None
    return pool


class Store:
    def __init__(self, pool: asyncpg.Pool, settings: SchedulerSettings) -> None:
        self.pool = pool
        self.settings = settings

    # ------------------------------------------------------------------ RunService

    @db_call
    async def submit_run(self, tenant_id: str, spec: SubmitSpec, trace: Trace = NO_TRACE) -> tuple[Record, bool]:
        digest = spec.submit_hash() if spec.client_request_id else None
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                Q["submit_run"], uuid7(), tenant_id, spec.agent_name, spec.agent_version, spec.input,
                spec.labels, spec.max_attempts, spec.max_steps, spec.max_tokens, spec.max_cost_usd,
                spec.deadline_at, spec.client_request_id, digest, uuid7(), trace.traceparent,
                trace.tracestate,
            )
            if row is not None:
                return row, True
            existing = await conn.fetchrow(Q["get_run_by_client_request"], tenant_id, spec.client_request_id)
        if existing is None:  # deleted between the two statements: retention never deletes runs
            raise Unavailable("submit raced with a concurrent change; retry")
        if bytes(existing["submit_hash"]) != digest:
            raise AlreadyExists(
                "client_request_id was already used with a different payload",
                client_request_id=spec.client_request_id, run_id=existing["id"],
            )
        return existing, False

    @db_call
    async def get_run(self, tenant_id: str, run_id: uuid.UUID) -> Record:
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(Q["get_run"], run_id, tenant_id)
        if row is None:
            raise NotFound(f"run {run_id} not found", run_id=run_id)
        return row

    @db_call
    async def list_runs(self, tenant_id: str, statuses: list[str] | None, agent_name: str | None,
                        after: tuple[dt.datetime, uuid.UUID] | None, limit: int) -> list[Record]:
        async with self.pool.acquire() as conn:
            return await conn.fetch(
                Q["list_runs"], tenant_id, statuses, agent_name,
                after[0] if after else None, after[1] if after else None, limit,
            )

    @db_call
    async def cancel_run(self, tenant_id: str, run_id: uuid.UUID, reason: str,
                         trace: Trace = NO_TRACE) -> Record:
        async with self.pool.acquire() as conn, conn.transaction():
            run = await self._lock_tenant_run(conn, tenant_id, run_id)
            status = RunStatus(run["status"])
            if status in TERMINAL and run["cancel_requested_at"] is not None:
                return run  # cancelled already: a retried cancel answers with the outcome
            if status in LEASED:
                if run["cancel_requested_at"] is not None:
                    return run  # already flagged: cancelling twice is not an error
                transition(status, Op.REQUEST_CANCEL)
                updated = await conn.fetchrow(Q["request_cancel"], run_id, reason)
                await self._event(conn, updated, "agent.cancel_requested", {"reason": reason}, trace)
                return updated
            transition(status, Op.CANCEL)
            updated = await conn.fetchrow(Q["end_run"], run_id, f"cancelled: {reason}", True, reason)
            await self._event(conn, updated, "agent.run_cancelled",
                              {"reason": reason, "intents_in_doubt": updated["doubted_intents"]}, trace)
            return updated

    @db_call
    async def resume_run(self, tenant_id: str, run_id: uuid.UUID, human_input: dict[str, Any],
                         trace: Trace = NO_TRACE) -> Record:
        async with self.pool.acquire() as conn, conn.transaction():
            run = await self._lock_tenant_run(conn, tenant_id, run_id)
            transition(run["status"], Op.RESUME)
            updated = await conn.fetchrow(Q["resume_run"], run_id, human_input)
            await self._event(conn, updated, "agent.run_resumed",
                              {"decision": human_input.get("decision"),
                               "operator": human_input.get("operator")}, trace)
            await conn.execute(Q["notify_work"], updated["agent_name"])
            return updated

    @db_call
    async def resolve_tool_execution(
        self, tenant_id: str, run_id: uuid.UUID, step_key: str, outcome: ResolveOutcome,
        result: Any, remote_resource_id: str | None, evidence: dict[str, Any], resolved_by: str,
        event_id: uuid.UUID | None, trace: Trace = NO_TRACE,
    ) -> tuple[Record, Record]:
        """Applies evidence to an IN_DOUBT ledger row, atomically with the run's move.

        SUCCEEDED writes the result and a new checkpoint (the latest state with
        the result recorded under tool_results[step_key] and pending_tool cleared),
        like Tx2, and re-queues the run. NOT_EXECUTED closes the row (kept, with
        evidence) and re-queues. UNKNOWN records the evidence and keeps the pause.

        A run on checkpoint schema 2 or later keeps tool answers in the ledger
        only: SUCCEEDED's checkpoint is the latest state without pending_tool and
        with journal_len counting a "result" journal entry appended with it;
        NOT_EXECUTED appends that entry without a checkpoint (the next holder
        learns of it through the lease's journal_length).
        """
        event_id = event_id or uuid7()
        op = {"SUCCEEDED": Op.RESOLVE_SUCCEEDED, "NOT_EXECUTED": Op.RESOLVE_NOT_EXECUTED,
              "UNKNOWN": Op.RESOLVE_UNKNOWN}[outcome]
        binding = sha256_of({"run_id": str(run_id), "step_key": step_key, "outcome": outcome, "result": result,
                             "remote_resource_id": remote_resource_id, "evidence": evidence,
                             "resolved_by": resolved_by})
        async with self.pool.acquire() as conn, conn.transaction():
            previous = await conn.fetchrow(Q["event_by_id"], event_id)
            if previous is not None:
                if previous["run_id"] != run_id or previous["event_type"] != "agent.tool_resolved":
                    raise InvalidArgument("event_id", "already used for another write")
                if previous["write_hash"] is not None and bytes(previous["write_hash"]) != binding:
                    raise AlreadyExists("event_id was already used for another resolution (another payload); "
                                        "nothing was written", field="event_id")
                run = await self._lock_tenant_run(conn, tenant_id, run_id)
                execution = await conn.fetchrow(Q["tool_execution_for_step"], run_id, step_key)
                return run, execution
            run = await self._lock_tenant_run(conn, tenant_id, run_id)
            transition(run["status"], op)
            execution = await conn.fetchrow(Q["lock_tool_execution"], run_id, step_key)
            if execution is None:
                raise NotFound(f"no tool execution for step {step_key!r} of run {run_id}", step_key=step_key)
            if execution["status"] != "IN_DOUBT":
                raise InvalidTransition(
                    f"tool execution {step_key!r} is {execution['status']}, only IN_DOUBT rows are resolved",
                    status=execution["status"],
                )
            ledger_status = "IN_DOUBT" if outcome == "UNKNOWN" else outcome
            execution = await conn.fetchrow(
                Q["resolve_tool_execution"], run_id, step_key, ledger_status,
                result if outcome == "SUCCEEDED" else None, remote_resource_id, evidence, resolved_by,
            )
            version = run["version"]
            latest = await conn.fetchrow(Q["latest_checkpoint"], run_id) if outcome != "UNKNOWN" else None
            schema_version = latest["schema_version"] if latest else run["checkpoint_schema_version"]
            journaled = outcome != "UNKNOWN" and schema_version >= 2
            if outcome == "SUCCEEDED":
                state = dict(latest["state_json"]) if latest else {}
                state.pop("pending_tool", None)
                if journaled:
                    state["journal_len"] = run["journal_length"] + 1
                else:
                    results = dict(state.get("tool_results") or {})
                    results[step_key] = {"status": "SUCCEEDED", "response": result,
                                         "remote_resource_id": remote_resource_id, "resolved_by": resolved_by}
                    state["tool_results"] = results
                version += 1
                await conn.execute(Q["insert_checkpoint"], run_id, version, state, sha256_of(state),
                                   schema_version, run["fencing_token"], event_id)
            if journaled:
                detail: dict[str, Any] = {"status": outcome, "resolved_by": resolved_by}
                if outcome == "SUCCEEDED":
                    detail["remote_resource_id"] = remote_resource_id
                await conn.execute(Q["append_journal_entry"], run_id, run["journal_length"] + 1, "result", step_key,
                                   "", execution["tool_name"], detail, run["fencing_token"], version)
            if outcome != "UNKNOWN":
                run = await conn.fetchrow(Q["requeue_resolved"], run_id, version, 1 if journaled else 0)
                await conn.execute(Q["notify_work"], run["agent_name"])
            await self._event(conn, run, "agent.tool_resolved",
                              {"step_key": step_key, "outcome": outcome, "resolved_by": resolved_by,
                               "evidence": evidence}, trace, event_id=event_id,
                              bound=("ResolveToolExecution", binding))
            return run, execution

    @db_call
    async def history(self, tenant_id: str, run_id: uuid.UUID, parts: frozenset[str] = frozenset(HISTORY_PARTS),
                      cursor: HistoryCursor = HistoryCursor(), page_size: int = 100,
                      page_bytes: int = 4 << 20) -> tuple[History, HistoryCursor]:
        """One page of a run's history: up to `page_size` items of each part in `parts`, after `cursor`.

        The page stops adding items past `page_bytes` of JSON (one item at least, so
        every page moves on). Returns the page and the cursor of the next one
        (`exhausted` when nothing is left). One snapshot for the whole page.
        """
        page_rows: dict[str, list[Record]] = {}
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            run = await conn.fetchrow(Q["get_run"], run_id, tenant_id)
            if run is None:
                raise NotFound(f"run {run_id} not found", run_id=run_id)
            if "checkpoints" in parts and cursor.checkpoints is not None:
                page_rows["checkpoints"] = await conn.fetch(Q["history_checkpoints"], run_id, cursor.checkpoints,
                                                            page_size + 1)
            after = cursor.tool_executions
            if "tool_executions" in parts and after is not None:
                start = after if isinstance(after, tuple) else (None, None)
                page_rows["tool_executions"] = await conn.fetch(Q["history_tool_executions"], run_id, *start,
                                                                page_size + 1)
            if "events" in parts and cursor.events is not None:
                page_rows["events"] = await conn.fetch(Q["history_events"], run_id, cursor.events, page_size + 1)
            if "journal" in parts and cursor.journal is not None:
                page_rows["journal"] = await conn.fetch(Q["history_journal"], run_id, cursor.journal,
                                                        page_size + 1)
        taken: dict[str, list[Record]] = {part: [] for part in HISTORY_PARTS}
        used = 0
        more: dict[str, bool] = {}
        for part in HISTORY_PARTS:
            rows = page_rows.get(part, [])
            for row in rows[:page_size]:
                size = row["page_bytes"] or 0
                if used and used + size > page_bytes:
                    break
                taken[part].append(row)
                used += size
            more[part] = len(taken[part]) < len(rows)
        last = {part: taken[part][-1] if taken[part] else None for part in HISTORY_PARTS}
        checkpoints, executions, events = last["checkpoints"], last["tool_executions"], last["events"]
        entry = last["journal"]
        next_cursor = HistoryCursor(
            checkpoints=None if "checkpoints" not in page_rows or not more["checkpoints"] else (
                checkpoints["version"] if checkpoints else cursor.checkpoints),
            tool_executions=None if "tool_executions" not in page_rows or not more["tool_executions"] else (
                (executions["outbound_intent_at"], executions["id"]) if executions else cursor.tool_executions),
            events=None if "events" not in page_rows or not more["events"] else (
                events["id"] if events else cursor.events),
            journal=None if "journal" not in page_rows or not more["journal"] else (
                entry["seq"] if entry else cursor.journal),
        )
        return History(run=run, checkpoints=taken["checkpoints"], executions=taken["tool_executions"],
                       events=taken["events"], journal=taken["journal"]), next_cursor

    @db_call
    async def global_stats(self) -> Record:
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(Q["global_stats"])
        assert row is not None
        return row

    @db_call
    async def tenant_stats(self, tenant_id: str) -> Record:
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(Q["tenant_stats"], tenant_id)
        assert row is not None
        return row

    # ------------------------------------------------------------------ WorkService

    @db_call
    async def claim(self, worker_id: str, agents: list[str], trace: Trace = NO_TRACE) -> Claimed | None:
        lease_ms = self.settings.lease_duration_ms
        async with self.pool.acquire() as conn:
            for _ in range(16):  # bounded: each pass ends one cancelled/expired run or returns
                row = await conn.fetchrow(Q["claim_work"], worker_id, lease_ms, agents)
                if row is None:
                    return None
                reason = None
                if row["cancel_requested_at"] is not None:
                    reason, event = f"cancelled: {row['cancel_reason']}", "agent.run_cancelled"
                elif row["deadline_at"] is not None and row["deadline_at"] <= row["db_now"]:
                    reason, event = "budget exhausted: deadline passed", "agent.run_failed"
                if reason is None:
                    return Claimed(run=row, checkpoint=_prefixed(row, "cp_"),
                                   step_execution=_prefixed(row, "te_"), lease_duration_ms=lease_ms)
                op = Op.APPLY_CANCEL if event == "agent.run_cancelled" else Op.EXPIRE_DEADLINE
                async with conn.transaction():
                    locked = await conn.fetchrow(Q["lock_run"], row["id"])
                    if locked["fencing_token"] != row["fencing_token"]:
                        continue  # taken over in between: its new holder will end it
                    transition(locked["status"], op)
                    ended = await conn.fetchrow(Q["end_run"], row["id"], reason, False, None)
                    await self._event(conn, ended, event,
                                      {"reason": reason, "intents_in_doubt": ended["doubted_intents"]}, trace)
        return None

    @db_call
    async def heartbeat(self, lease: LeaseRef) -> dt.datetime:
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(Q["heartbeat"], lease.run_id, lease.worker_id, lease.fencing_token,
                                      self.settings.lease_duration_ms)
            if row is not None:
                annotate(tenant_id=row["tenant_id"])
                return row["lease_expires_at"]
            raise await self._refusal(conn, Op.HEARTBEAT, lease, None)

    @db_call
    async def save_checkpoint(
        self, lease: LeaseRef, expected_version: int, state: dict[str, Any], schema_version: int,
        step_key: str | None, event_id: uuid.UUID, event_type: str, event_payload: dict[str, Any],
        trace: Trace = NO_TRACE, state_text: CanonicalJson | None = None, journal: Journal = NO_JOURNAL,
    ) -> tuple[int, bool]:
        """`state_text`, when given, is canonical_json(state): stored and hashed without encoding again.

        `journal`: the entries this checkpoint records, appended in the same statement.
        """
        stored = state if state_text is None else state_text
        state_hash = sha256_of(stored)
        binding = bind_write("SaveCheckpoint", lease, expected_version=expected_version, state=state_hash,
                             schema_version=schema_version, step_key=step_key, event_id=event_id,
                             event_type=event_type, event_payload=event_payload, **journal.binding_fields())
        async with self.pool.acquire() as conn:
            written = await _fenced_write(
                conn, "save_checkpoint", lease.run_id, lease.worker_id, lease.fencing_token,
                expected_version, sources(Op.SAVE_CHECKPOINT), schema_version, stored, step_key,
                state_hash, event_id, event_type, event_payload, trace.traceparent,
                trace.tracestate, binding.op, binding.digest, *journal.args)
            if written is not None:
                return written["version"], False
            replay = await self._replay(conn, lease, binding, event_id, "checkpoint")
            if replay is not None:
                return replay["version"], True
            raise await self._refusal(conn, Op.SAVE_CHECKPOINT, lease, expected_version, journal)

    @db_call
    async def begin_tool_call(
        self, lease: LeaseRef, expected_version: int, step_key: str, tool_name: str, idempotency_key: str,
        request: Any, execution_id: uuid.UUID, event_id: uuid.UUID, trace: Trace = NO_TRACE,
    ) -> tuple[Record, bool, bool]:
        """Tx1. Returns (ledger row, existing, replayed). `existing` is never a licence to resend."""
        digest = request_hash(tool_name, request)
        binding = bind_write("BeginToolCall", lease, expected_version=expected_version, step_key=step_key,
                             tool_name=tool_name, idempotency_key=idempotency_key, request=digest,
                             execution_id=execution_id, event_id=event_id)
        async with self.pool.acquire() as conn:
            row = await _fenced_write(
                conn, "begin_tool_call", lease.run_id, lease.worker_id, lease.fencing_token,
                expected_version, sources(Op.BEGIN_TOOL_CALL), step_key, tool_name, idempotency_key,
                request, digest, execution_id, event_id, trace.traceparent, trace.tracestate,
                binding.op, binding.digest)
            if row is not None:
                return row, False, False
            replay = await self._replay(conn, lease, binding, event_id, "ledger")
            if replay is not None:
                return replay, True, True
            existing = await conn.fetchrow(Q["tool_execution_for_step"], lease.run_id, step_key)
            if existing is not None:
                # The existing row is an answer for the live holder only; a stale fence gets LEASE_LOST.
                if await self._holds_lease(conn, lease):
                    return existing, True, False
            else:
                by_key = await conn.fetchrow(Q["tool_execution_by_key"], tool_name, idempotency_key)
                if by_key is not None:
                    raise AlreadyExists("idempotency_key is already recorded for another step",
                                        field="idempotency_key")
            refusal = await self._refusal(conn, Op.BEGIN_TOOL_CALL, lease, expected_version)
            # _refusal's last resort is a VersionConflict at the expected version ("changed
            # concurrently"): with everything else in order, the decision is what did not match.
            if not (isinstance(refusal, VersionConflict)
                    and refusal.metadata.get("version") == str(expected_version)):
                raise refusal
            raise DecisionNotCheckpointed(
                "the current checkpoint does not record this tool decision (step key, tool and request "
                "hash must match its pending_tool); save the decision before calling the tool",
                step_key=step_key, request_hash=digest.hex(),
            )

    @db_call
    async def complete_tool_call(
        self, lease: LeaseRef, expected_version: int, step_key: str, succeeded: bool, response: Any,
        remote_resource_id: str | None, error_code: str | None, state: dict[str, Any], schema_version: int,
        next_step_key: str | None, evidence: dict[str, Any] | None, event_id: uuid.UUID,
        trace: Trace = NO_TRACE, state_text: CanonicalJson | None = None, end: RunEnd | None = None,
        journal: Journal = NO_JOURNAL,
    ) -> tuple[int, str, bool]:
        """Tx2 with a definite outcome; with `end`, the run ends in the same statement.

        Returns (new version, run status, replayed).
        """
        stored = state if state_text is None else state_text
        outcome = "SUCCEEDED" if succeeded else "FAILED"
        op = Op.COMPLETE_TOOL_CALL if end is None else (
            Op.COMPLETE_TOOL_CALL_AND_COMPLETE if end.outcome == "COMPLETED" else Op.COMPLETE_TOOL_CALL_AND_FAIL)
        state_hash = sha256_of(stored)
        binding = tx2_binding(lease, expected_version, step_key, outcome, next_step_key, state_hash, schema_version,
                              response, remote_resource_id, error_code, evidence, event_id, end, journal)
        args = [lease.run_id, lease.worker_id, lease.fencing_token, expected_version, step_key, sources(op),
                outcome, next_step_key, stored, schema_version, response, remote_resource_id, error_code,
                evidence, state_hash, event_id, trace.traceparent, trace.tracestate]
        async with self.pool.acquire() as conn:
            if end is None:
                written = await _fenced_write(conn, "complete_tool_call", *args, binding.op, binding.digest,
                                              *journal.args)
                if written is not None:
                    return written["version"], "RUNNING", False
                replay = await self._replay(conn, lease, binding, event_id, "checkpoint")
                if replay is not None:
                    return replay["version"], "RUNNING", True
            else:
                written = await _fenced_write(conn, "complete_tool_call_and_end", *args, end.outcome, end.result,
                                              end.reason, end.error_class, end.event_id, binding.op,
                                              binding.digest, *journal.args)
                if written is not None:
                    return written["version"], written["status"], False
                found = await self._replay_all(conn, lease, binding, ((event_id, "checkpoint", "event_id"),
                                                                      (end.event_id, "run", "end.event_id")))
                if found is not None:
                    return found[0]["version"], end.outcome, True
            raise await self._tool_refusal(conn, op, lease, expected_version, step_key,
                                           close_as=(outcome, response, remote_resource_id, error_code),
                                           journal=journal)

    @db_call
    async def complete_and_begin_tool_call(
        self, lease: LeaseRef, expected_version: int, step_key: str, succeeded: bool, response: Any,
        remote_resource_id: str | None, error_code: str | None, state: dict[str, Any], schema_version: int,
        evidence: dict[str, Any] | None, event_id: uuid.UUID, intent: ToolIntent, trace: Trace = NO_TRACE,
        state_text: CanonicalJson | None = None, journal: Journal = NO_JOURNAL,
    ) -> tuple[int, Record, bool]:
        """Tx2 of `step_key` and Tx1 of `intent` in one statement. Returns (new version, new ledger row, replayed).

        Refusals are those of the two halves: LEASE_LOST, RUN_CANCELLED (the
        outcome is kept on the closed row), INVALID_TRANSITION, VERSION_CONFLICT,
        INVALID_ARGUMENT (not waiting on step_key), ALREADY_EXISTS (a ledger row
        for the next step or its idempotency key exists: nothing is written, and
        the caller falls back to Tx2 then Tx1, which answers with that row), and
        DECISION_NOT_CHECKPOINTED (the new checkpoint does not record the next call).
        """
        digest = request_hash(intent.tool_name, intent.request)
        stored = state if state_text is None else state_text
        state_hash = sha256_of(stored)
        outcome = "SUCCEEDED" if succeeded else "FAILED"
        binding = bind_write(
            "CompleteAndBeginToolCall", lease, expected_version=expected_version, step_key=step_key,
            outcome=outcome, state=state_hash, schema_version=schema_version, response=sha256_of(response).hex(),
            remote_resource_id=remote_resource_id, error_code=error_code, evidence=evidence, event_id=event_id,
            next=[intent.step_key, intent.tool_name, intent.idempotency_key, digest.hex(),
                  str(intent.execution_id), str(intent.event_id)], **journal.binding_fields())
        async with self.pool.acquire() as conn:
            row = await _fenced_write(
                conn, "complete_and_begin_tool_call", lease.run_id, lease.worker_id, lease.fencing_token,
                expected_version, step_key, sources(Op.COMPLETE_AND_BEGIN_TOOL_CALL),
                outcome, stored, schema_version, response, remote_resource_id,
                error_code, evidence, state_hash, intent.step_key, intent.tool_name,
                intent.idempotency_key, digest, intent.execution_id, intent.request, event_id,
                intent.event_id, trace.traceparent, trace.tracestate, binding.op, binding.digest,
                *journal.args)
            if row is not None:
                return row["cp_version"], row, False
            replay = await self._replay_all(conn, lease, binding, ((event_id, "checkpoint", "event_id"),
                                                                   (intent.event_id, "ledger", "next.event_id")))
            if replay is not None:
                checkpoint, execution = replay
                return checkpoint["version"], execution, True
            refusal = await self._tool_refusal(
                conn, Op.COMPLETE_AND_BEGIN_TOOL_CALL, lease, expected_version, step_key,
                close_as=("SUCCEEDED" if succeeded else "FAILED", response, remote_resource_id, error_code),
                journal=journal,
            )
            # The last resort is a VersionConflict at the expected version: with the run and the
            # completed step in order, the Tx1 half is what did not match. Say which part.
            if not (isinstance(refusal, VersionConflict)
                    and refusal.metadata.get("version") == str(expected_version)):
                raise refusal
            existing = await conn.fetchrow(Q["tool_execution_for_step"], lease.run_id, intent.step_key)
            if existing is not None:
                raise AlreadyExists(
                    f"a ledger row for step {intent.step_key!r} already exists ({existing['status']}); "
                    "nothing was written", field="next.step_key", status=existing["status"])
            if await conn.fetchrow(Q["tool_execution_by_key"], intent.tool_name, intent.idempotency_key):
                raise AlreadyExists("next.idempotency_key is already recorded for another step",
                                    field="next.idempotency_key")
            pending = state.get("pending_tool")
            if not (isinstance(pending, dict) and pending.get("step_key") == intent.step_key
                    and pending.get("tool_name") == intent.tool_name
                    and pending.get("request_hash") == digest.hex()):
                raise DecisionNotCheckpointed(
                    "the new checkpoint does not record the next tool decision (its pending_tool must "
                    "name next.step_key, next.tool_name and the hash of next.request_json); nothing was "
                    "written", step_key=intent.step_key, request_hash=digest.hex(),
                )
            raise refusal

    @db_call
    async def tool_not_executed(
        self, lease: LeaseRef, expected_version: int, step_key: str, error_code: str | None,
        evidence: dict[str, Any], event_id: uuid.UUID, trace: Trace = NO_TRACE,
    ) -> tuple[int, str, bool]:
        """Closes the open ledger row NOT_EXECUTED. Returns (version, run status, replayed)."""
        s = self.settings
        binding = bind_write("CompleteToolCall.NOT_EXECUTED", lease, expected_version=expected_version,
                             step_key=step_key, error_code=error_code, evidence=evidence, event_id=event_id)
        async with self.pool.acquire() as conn:
            row = await _fenced_write(
                conn, "tool_not_executed", lease.run_id, lease.worker_id, lease.fencing_token,
                expected_version, step_key, sources(Op.TOOL_NOT_EXECUTED), s.backoff_base_ms,
                s.backoff_cap_ms, s.backoff_jitter_ms, error_code, evidence, event_id,
                trace.traceparent, trace.tracestate, binding.op, binding.digest)
            if row is not None:
                return row["version"], row["status"], False
            replay = await self._replay(conn, lease, binding, event_id, "run")
            if replay is not None:
                return replay["run_version"], replay["payload"].get("status", "QUEUED"), True
            raise await self._tool_refusal(conn, Op.TOOL_NOT_EXECUTED, lease, expected_version, step_key,
                                           close_as=None)

    @db_call
    async def mark_tool_in_doubt(
        self, lease: LeaseRef, step_key: str, error_code: str, detail: str, event_id: uuid.UUID,
        trace: Trace = NO_TRACE,
    ) -> bool:
        """Freeze on an unknown outcome. Returns replayed."""
        binding = bind_write("MarkToolInDoubt", lease, step_key=step_key, error_code=error_code, detail=detail,
                             event_id=event_id)
        async with self.pool.acquire() as conn:
            row = await _fenced_write(
                conn, "mark_tool_in_doubt", lease.run_id, lease.worker_id, lease.fencing_token, step_key,
                sources(Op.MARK_TOOL_IN_DOUBT), error_code, event_id, detail, trace.traceparent,
                trace.tracestate, binding.op, binding.digest)
            if row is not None:
                return False
            if await self._replay(conn, lease, binding, event_id, "run") is not None:
                return True
            raise await self._tool_refusal(conn, Op.MARK_TOOL_IN_DOUBT, lease, None, step_key,
                                           close_as=("IN_DOUBT", None, None, error_code))

    @db_call
    async def finish_run(
        self, lease: LeaseRef, expected_version: int, outcome: str, reason: str, result: Any,
        sleep_ms: int, pause_when_exhausted: bool, error_class: str, event_id: uuid.UUID,
        trace: Trace = NO_TRACE,
    ) -> tuple[str, dt.datetime | None, bool]:
        """outcome: COMPLETED | FAILED | PAUSED_HUMAN | RETRY | SLEEP. Returns (status, next_attempt_at, replayed)."""
        mode, target, op = {
            "COMPLETED": ("end", "COMPLETED", Op.FINISH_COMPLETED),
            "FAILED": ("end", "FAILED", Op.FINISH_FAILED),
            "PAUSED_HUMAN": ("end", "PAUSED_HUMAN", Op.FINISH_PAUSED_HUMAN),
            "RETRY": ("retry", "QUEUED", Op.FINISH_RETRY),
            "SLEEP": ("sleep", "QUEUED", Op.FINISH_SLEEP),
        }[outcome]
        exhausted = "PAUSED_HUMAN" if pause_when_exhausted else "FAILED"
        s = self.settings
        binding = bind_write("FinishRun", lease, expected_version=expected_version, outcome=outcome,
                             reason=reason, result=sha256_of(result).hex(), sleep_ms=sleep_ms,
                             pause_when_exhausted=pause_when_exhausted, error_class=error_class, event_id=event_id)
        async with self.pool.acquire() as conn:
            row = await _fenced_write(
                conn, "finish_run", lease.run_id, lease.worker_id, lease.fencing_token, expected_version,
                sources(op), target, mode, sleep_ms, s.backoff_base_ms, s.backoff_cap_ms,
                s.backoff_jitter_ms, exhausted, result, reason, event_id, error_class,
                trace.traceparent, trace.tracestate, binding.op, binding.digest)
            if row is not None:
                status = row["status"]
                return status, row["next_attempt_at"] if status == "QUEUED" else None, False
            event = await self._replay(conn, lease, binding, event_id, "run")
            if event is not None:
                payload = event["payload"]
                next_at = payload.get("next_attempt_at")
                return payload["status"], dt.datetime.fromisoformat(next_at) if next_at else None, True
            raise await self._refusal(conn, op, lease, expected_version)

    @db_call
    async def read_journal_compact(self, lease: LeaseRef, after_seq: int, page_size: int,
                                   page_bytes: int) -> tuple[str, bool]:
        """As read_journal, the page as one JSON array text built by PostgreSQL: (entries_json, more)."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(Q["read_journal_compact"], lease.run_id, lease.worker_id, lease.fencing_token,
                                      after_seq, page_size, page_bytes)
            if row["fetched"] == 0 and not await self._holds_lease(conn, lease):
                raise await self._lease_refusal(conn, lease)
        return row["items"], row["beyond"] > 0

    async def read_journal(self, lease: LeaseRef, after_seq: int, page_size: int,
                           page_bytes: int) -> tuple[list[Record], bool]:
        """The holder's journal entries after `after_seq`, in seq order: (entries, more).

        Up to `page_size` entries and `page_bytes` of detail JSON (one entry at
        least). Not the live holder → LEASE_LOST (or NOT_FOUND), nothing written.
        """
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(Q["read_journal"], lease.run_id, lease.worker_id, lease.fencing_token,
                                    after_seq, page_size + 1)
            if not rows and not await self._holds_lease(conn, lease):
                raise await self._lease_refusal(conn, lease)
        taken: list[Record] = []
        used = 0
        for row in rows[:page_size]:  # (the byte budget as read_journal_compact applies it)
            if taken and used + row["page_bytes"] > page_bytes:
                break
            taken.append(row)
            used += row["page_bytes"]
        return taken, len(taken) < len(rows)

    @db_call
    async def tool_results(self, lease: LeaseRef, step_keys: list[str], answer_bytes: int) -> list[Record]:
        """The holder's ledger rows of `step_keys` (those that exist); LEASE_LOST for anyone else.

        More than `answer_bytes` of JSON in more than one row is refused (ask for
        fewer steps): an answer never silently leaves a row out.
        """
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(Q["tool_results_for_steps"], lease.run_id, lease.worker_id,
                                    lease.fencing_token, step_keys)
            if not rows and not await self._holds_lease(conn, lease):
                raise await self._lease_refusal(conn, lease)
        size = sum(row["page_bytes"] for row in rows)
        if len(rows) > 1 and size > answer_bytes:
            raise InvalidArgument("step_keys", f"the {len(rows)} results hold {size} bytes of JSON, more than one "
                                               f"answer carries ({answer_bytes}); ask for fewer steps at a time")
        return rows

    @db_call
    async def prune_checkpoints(self, after: uuid.UUID, batch_runs: int, keep_last: int,
                                max_versions_per_run: int) -> tuple[uuid.UUID | None, int, int, int]:
        """One pruning statement over the runs after `after`: (last run id, runs looked at, deleted, behind).

        `behind` counts runs with more to prune than this statement took.
        """
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(Q["prune_checkpoints"], after, batch_runs, keep_last, max_versions_per_run)
        assert row is not None
        return row["last_id"], row["runs"], row["deleted"], row["behind"]

    # ------------------------------------------------------------------ helpers

    async def _lock_tenant_run(self, conn: asyncpg.Connection, tenant_id: str, run_id: uuid.UUID) -> Record:
        run = await conn.fetchrow(Q["lock_run"], run_id)
        if run is None or run["tenant_id"] != tenant_id:
            raise NotFound(f"run {run_id} not found", run_id=run_id)
        return run

    async def _event(self, conn: asyncpg.Connection, run: Record, event_type: str, payload: dict[str, Any],
                     trace: Trace, event_id: uuid.UUID | None = None,
                     bound: tuple[str, bytes] | None = None) -> None:
        await conn.execute(
            Q["insert_event"], event_id or uuid7(), run["id"], run["tenant_id"], event_type,
            {"status": run["status"], **payload}, run["fencing_token"], run["version"],
            trace.traceparent, trace.tracestate, bound[0] if bound else None, bound[1] if bound else None,
        )

    async def _replay(self, conn: asyncpg.Connection, lease: LeaseRef, binding: WriteBinding,
                      event_id: uuid.UUID, effect: Effect) -> Record | None:
        """Commit-unknown recovery by the caller's event id (design: commit-unknown recovery).

        The event and its write both committed, bound to this very write → the
        earlier call succeeded: answer from what committed. Neither → None: the
        caller may run the write. Otherwise see `_replay_all`.
        """
        found = await self._replay_all(conn, lease, binding, ((event_id, effect, "event_id"),))
        return found[0] if found is not None else None

    async def _replay_all(self, conn: asyncpg.Connection, lease: LeaseRef, binding: WriteBinding,
                          writes: tuple[tuple[uuid.UUID, Effect, str], ...]) -> list[Record] | None:
        """`_replay` for a write made of several (event id, effect, request field) parts committed together.

        Every event present and bound to this write (same operation, same hash
        over lease and request) with every effect present → the artifacts, in
        order. None of them present → None. An event id bound to another write
        (another operation, payload, lease, or an operator's or submit's event)
        is refused and changes nothing: ALREADY_EXISTS for the live holder or the
        same writer's retry, LEASE_LOST for anyone else. Half a commit freezes
        the run only when the caller holds its live lease: a stale or forged
        lease never changes the run (design: event ids).
        """
        run_id = lease.run_id
        present: list[str] = []
        missing: list[str] = []
        artifacts: list[Record] = []
        foreign: tuple[str, Record] | None = None
        fences: set[int] = set()  # the fences that wrote what is present
        for event_id, effect, field_name in writes:
            event = await conn.fetchrow(Q["event_by_id"], event_id)
            if effect == "checkpoint":
                artifact = await conn.fetchrow(Q["checkpoint_by_event"], event_id)
                if artifact is None and event is not None and event["run_id"] == run_id:
                    artifact = await self._pruned_checkpoint(conn, event)
            elif effect == "ledger":
                artifact = await conn.fetchrow(Q["tool_execution_by_intent_event"], event_id)
            else:
                # A later write overwrites the marker, so with the event present the
                # write committed whatever the marker says now.
                marker = await conn.fetchrow(Q["run_by_last_event"], run_id, event_id)
                artifact = event if event is not None else marker
            for row in (event, artifact):
                if row is not None and row["run_id"] != run_id:
                    raise InvalidArgument(field_name, "already used for a write on another run")
                if row is not None:
                    fences.add(row["fencing_token"])
            if event is not None and foreign is None and (
                    event["write_op"] != binding.op or event["write_hash"] is None
                    or bytes(event["write_hash"]) != binding.digest):
                foreign = (field_name, event)
            (present if event is not None else missing).append(f"event {event_id}")
            (present if artifact is not None else missing).append(f"{effect} of event {event_id}")
            if artifact is not None:
                artifacts.append(artifact)
        if not present:
            return None
        if foreign is not None:
            field_name, event = foreign
            same_writer = event["write_op"] == binding.op and event["fencing_token"] == lease.fencing_token
            if same_writer or await self._holds_lease(conn, lease):
                raise AlreadyExists(
                    f"{field_name} was already used for another write "
                    f"({'another payload' if event['write_op'] == binding.op else 'another operation'}); "
                    "nothing was written", field=field_name)
            raise await self._lease_refusal(conn, lease)
        if not missing:
            return artifacts
        # Half a commit. Only its writer (the fence that wrote what is present) may
        # learn of it, and only while that fence is still the run's does it freeze.
        if fences != {lease.fencing_token}:
            raise await self._lease_refusal(conn, lease)
        if len(writes) == 1:
            event_id, effect, _ = writes[0]
            has_event = present[0].startswith("event ")
            reason = (f"commit state inconsistent for event {event_id}: "
                      f"{'event' if has_event else effect} present without {effect if has_event else 'event'}")
        else:
            reason = (f"commit state inconsistent for events {', '.join(str(w[0]) for w in writes)}: "
                      f"{', '.join(present)} present without {', '.join(missing)}")
        async with conn.transaction():
            run = await conn.fetchrow(Q["lock_run"], run_id)
            await conn.execute(Q["bump_counter"], COMMIT_UNKNOWN_COUNTER)
            if (run is not None and RunStatus(run["status"]) in LEASED
                    and run["fencing_token"] == lease.fencing_token):
                transition(run["status"], Op.FREEZE)
                frozen = await conn.fetchrow(Q["freeze_run"], run_id, reason)
                await self._event(conn, frozen, "agent.run_frozen", {"reason": reason}, NO_TRACE)
        first = writes[0][0]
        log.error("froze run %s: %s", run_id, reason)
        raise RunFrozen(reason, run_id=run_id, event_id=first)

    @staticmethod
    async def _pruned_checkpoint(conn: asyncpg.Connection, event: Record) -> dict[str, Any] | None:
        """The checkpoint an event announced, when pruning deleted it: its version and fence.

        Pruning records its horizon on the run row in the statement that deletes,
        so this read (after the checkpoint's) sees the horizon of any delete it
        missed the row to. A checkpoint missing above the horizon was never
        pruned: None, and the caller sees half a commit.
        """
        run = await conn.fetchrow(Q["read_run"], event["run_id"])
        if run is None or event["run_version"] > run["checkpoints_pruned_through"]:
            return None
        return {"run_id": event["run_id"], "version": event["run_version"],
                "fencing_token": event["fencing_token"], "event_id": event["event_id"], "pruned": True}

    @staticmethod
    async def _holds_lease(conn: asyncpg.Connection, lease: LeaseRef) -> bool:
        run = await conn.fetchrow(Q["read_run"], lease.run_id)
        return (run is not None and run["lease_owner"] == lease.worker_id
                and run["fencing_token"] == lease.fencing_token and bool(run["lease_live"]))

    @staticmethod
    async def _lease_refusal(conn: asyncpg.Connection, lease: LeaseRef) -> AgentrtError:
        run = await conn.fetchrow(Q["read_run"], lease.run_id)
        if run is None:
            return NotFound(f"run {lease.run_id} not found", run_id=lease.run_id)
        return LeaseLost(
            f"lease on run {lease.run_id} is not held by {lease.worker_id} with fence "
            f"{lease.fencing_token} (current fence {run['fencing_token']}, status {run['status']})",
            run_id=lease.run_id, fencing_token=run["fencing_token"], status=run["status"])

    async def _refusal(self, conn: asyncpg.Connection, op: Op, lease: LeaseRef,
                       expected_version: int | None, journal: Journal = NO_JOURNAL) -> AgentrtError:
        """Why a fenced write matched no row. Applies a requested cancel (the holder's write ends it)."""
        run = await conn.fetchrow(Q["read_run"], lease.run_id)
        if (run is None or run["lease_owner"] != lease.worker_id or run["fencing_token"] != lease.fencing_token
                or not run["lease_live"]):
            return await self._lease_refusal(conn, lease)
        if run["cancel_requested_at"] is not None:
            return await self._apply_cancel(conn, lease, None, None)
        if run["status"] not in sources(op):
            try:
                transition(run["status"], op)
            except InvalidTransition as refusal:
                return refusal
        if expected_version is not None and run["version"] != expected_version:
            return VersionConflict(
                f"run {lease.run_id} is at version {run['version']}, not {expected_version}",
                run_id=lease.run_id, version=run["version"],
            )
        length = run["journal_length"]
        if journal and journal.seqs[0] != length + 1:
            return InvalidArgument("journal[0].seq", f"must be {length + 1}, the run's journal has {length} entries")
        return VersionConflict(f"run {lease.run_id} changed concurrently; re-read and retry",
                               run_id=lease.run_id, version=run["version"])

    async def _tool_refusal(self, conn: asyncpg.Connection, op: Op, lease: LeaseRef,
                            expected_version: int | None, step_key: str,
                            close_as: tuple[str, Any, str | None, str | None] | None,
                            journal: Journal = NO_JOURNAL) -> AgentrtError:
        run = await conn.fetchrow(Q["read_run"], lease.run_id)
        if (run is not None and run["cancel_requested_at"] is not None and run["lease_live"]
                and run["lease_owner"] == lease.worker_id and run["fencing_token"] == lease.fencing_token):
            return await self._apply_cancel(conn, lease, step_key, close_as)
        refusal = await self._refusal(conn, op, lease, expected_version, journal)
        if not isinstance(refusal, VersionConflict) or run is None:
            return refusal
        if run["current_step_key"] != step_key:
            return InvalidArgument("step_key", f"the run is waiting on step {run['current_step_key']!r}")
        execution = await conn.fetchrow(Q["tool_execution_for_step"], lease.run_id, step_key)
        if execution is None or execution["status"] != "OUTBOUND_INTENT":
            return InvalidTransition(
                f"tool execution {step_key!r} is {execution['status'] if execution else 'missing'}, "
                "not OUTBOUND_INTENT", step_key=step_key,
            )
        return refusal

    async def _apply_cancel(self, conn: asyncpg.Connection, lease: LeaseRef, step_key: str | None,
                            close_as: tuple[str, Any, str | None, str | None] | None) -> RunCancelled:
        async with conn.transaction():
            run = await conn.fetchrow(Q["lock_run"], lease.run_id)
            holder = (run is not None and run["lease_owner"] == lease.worker_id
                      and run["fencing_token"] == lease.fencing_token and run["lease_live"])
            if not holder or run["cancel_requested_at"] is None:
                raise LeaseLost(f"lease on run {lease.run_id} is no longer held", run_id=lease.run_id)
            transition(run["status"], Op.APPLY_CANCEL)
            if step_key is not None and close_as is not None:
                # The tool's outcome is a fact about the world: keep it even though the run ends.
                status, response, remote_id, error_code = close_as
                await conn.execute(Q["close_open_execution"], lease.run_id, step_key, status, response,
                                   remote_id, error_code)
            reason = f"cancelled: {run['cancel_reason']}"
            ended = await conn.fetchrow(Q["end_run"], lease.run_id, reason, False, None)
            await self._event(conn, ended, "agent.run_cancelled", {"reason": run["cancel_reason"]}, NO_TRACE)
        return RunCancelled(f"run {lease.run_id} was cancelled: {run['cancel_reason']}", run_id=lease.run_id)

    @db_call
    async def counter(self, name: str) -> int:
        async with self.pool.acquire() as conn:
            value = await conn.fetchval(Q["get_counter"], name)
        return int(value or 0)


__all__ = ["NO_JOURNAL", "TERMINAL", "Claimed", "History", "Journal", "LeaseRef", "Store", "SubmitSpec",
           "ToolIntent", "Trace", "connect_pool"]
