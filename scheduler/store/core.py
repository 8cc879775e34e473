"""What every part of the store shares: the pool, the retry/unavailable wrapper, the fenced-write
runner and the one outbox insert of the operator paths.

Statements come from sql/queries.sql (scheduler/store/queries.py) and run with their parameters by
name (`shared.db.fetchrow(conn, Q.x, name=...)`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import asyncpg
from asyncpg import Record

from scheduler.config import SchedulerSettings
from scheduler.flow_limits import LimitRow, overlay
from scheduler.states import Op, sources
from scheduler.store.queries import Q
from scheduler.store.rows import RunRow
from scheduler.store.types import LeaseRef, WriteBinding
from shared.canonical import uuid7
from shared.db import (
    CONNECTION_ERRORS,
    RETRYABLE,
    Query,
    execute,
    expire_stale,
    fetch,
    fetchrow,
    init_connection,
    keep_session,
)
from shared.errors import AgentrtError, AlreadyExists, NotFound, Unavailable
from shared.tracing import Trace, annotate

log = logging.getLogger("scheduler.store")

P = ParamSpec("P")
T = TypeVar("T")

COMMIT_UNKNOWN_COUNTER = "commit_unknown_inconsistent"
_ASSERT_SQLSTATE = "AR001"


def db_call(func: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Retries serialization failures/deadlocks (bounded); a lost database or primary (shared.db's
    table: connection loss, admin shutdown, `read-only transaction`...) is UNAVAILABLE, and the
    store's pools drop sessions that may point at a demoted primary."""

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
                store = args[0] if args else None
                await expire_stale(exc, getattr(store, "pool", None), getattr(store, "work_pool", None))
                raise Unavailable(f"database unavailable: {type(exc).__name__}") from None
        raise AssertionError("unreachable")

    return wrapper


def prefixed(row: Record, prefix: str) -> dict[str, Any] | None:
    """The columns of `row` named `prefix...` (without it); None when all are NULL (a LEFT JOIN missed)."""
    data = {key[len(prefix):]: row[key] for key in row.keys() if key.startswith(prefix)}
    if all(value is None for value in data.values()):
        return None
    return data


def fence_params(lease: LeaseRef, op: Op) -> dict[str, Any]:
    """The `fenced_guard` fragment's parameters: the lease and the statuses `op` may start from."""
    return {"run_id": lease.run_id, "worker_id": lease.worker_id, "fencing_token": lease.fencing_token,
            "allowed_statuses": sources(op)}


def trace_params(trace: Trace) -> dict[str, str | None]:
    return {"traceparent": trace.traceparent, "tracestate": trace.tracestate}


def binding_params(binding: WriteBinding) -> dict[str, Any]:
    return {"write_op": binding.op, "write_hash": binding.digest}


async def fenced_write(conn: asyncpg.Connection, query: Query, **params: Any) -> Record | None:
    """Runs one single-statement fenced write from queries.sql, its parameters by name.

    None when it matched no row, or when a unique key (an event id already used)
    or an agentrt_assert refused it; nothing was written then, and the caller
    explains why (replay by event id, or the refusal diagnosis in scheduler/store/recovery.py).
    """
    try:
        if conn.is_in_transaction():
            async with conn.transaction():  # a savepoint: a refused write leaves the caller's transaction usable
                row = await fetchrow(conn, query, **params)
        else:
            row = await fetchrow(conn, query, **params)
    except asyncpg.UniqueViolationError:
        return None
    except asyncpg.PostgresError as exc:
        if exc.sqlstate != _ASSERT_SQLSTATE:
            raise
        return None
    if row is not None:
        annotate(tenant_id=row["tenant_id"])
    return row


# The row-level security scopes (migration 0016): the work path's connections hold WORK_SCOPE for
# their whole session; ADMIN_SCOPE is set per transaction by admin_tx only.
WORK_SCOPE = "work"
ADMIN_SCOPE = "admin"


async def connect_pool(dsn: str, *, min_size: int = 2, max_size: int = 20,
                       command_timeout: float = 30.0, scope: str | None = None) -> asyncpg.Pool:
    """A pool; with `scope`, each of its sessions starts in that row-level security scope
    (`agentrt.scope`, sent in the startup packet: no round trip per call)."""
    pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=init_connection,
                                     command_timeout=command_timeout, reset=keep_session,
                                     server_settings={"agentrt.scope": scope} if scope else None)
    assert pool is not None
    return pool


async def check_row_security(conn: asyncpg.Connection, required: bool) -> None:
    """Refuses (`required`) or warns about a database role that row-level security does not bind."""
    state = await fetchrow(conn, Q.row_security_state)
    assert state is not None
    if not (state["bypasses"] or state["owns"]):
        return
    why = "bypasses row-level security (superuser or BYPASSRLS)" if state["bypasses"] else "owns the tables"
    message = (f"the scheduler connects as {state['who']!r}, which {why}: tenant isolation rests on the "
               "queries alone; connect as the scheduler role (`agentrt roles apply`)")
    if required:
        raise ValueError(message + " (require_row_security is true)")
    log.warning(message)


class Database:
    """The connections and settings every repository of the store shares.

    `pool`: RunService's connections, in no scope: a statement sees a tenant's rows only inside
    `tenant_tx` (or the audit trail inside `admin_tx`), and nothing otherwise (fail closed).
    `work_pool`: the work path's and the background tasks' connections, in the work scope
    (every tenant). Without one, `pool` serves both (a superuser or an owner without RLS: tools, tests)."""

    def __init__(self, pool: asyncpg.Pool, settings: SchedulerSettings,
                 work_pool: asyncpg.Pool | None = None) -> None:
        self.pool = pool
        self.work_pool = work_pool or pool
        self.settings = settings
        self._flow = settings
        self._flow_read_at = float("-inf")

    async def flow(self, conn: asyncpg.Connection) -> SchedulerSettings:
        """The settings with the runtime limits of flow_limits applied (migration 0015): read again when
        the copy is limits_refresh_ms old, so a change reaches every replica within that time."""
        fresh = self.flow_if_fresh()
        if fresh is not None:
            return fresh
        rows = await fetch(conn, Q.list_flow_limits)
        self._flow = overlay(self.settings, (LimitRow.of(row) for row in rows))
        self._flow_read_at = time.monotonic()
        return self._flow

    def flow_if_fresh(self) -> SchedulerSettings | None:
        """`flow`'s copy while it is fresh, read without a connection; None when it is due a read."""
        if time.monotonic() >= self._flow_read_at + self.settings.limits_refresh_ms / 1000:
            return None
        return self._flow

    @db_call
    async def current_flow(self) -> SchedulerSettings:
        async with self.pool.acquire() as conn:
            return await self.flow(conn)

    def forget_flow(self) -> None:
        """This replica's next claim, submit or Tx1 reads flow_limits again (after SetLimit, ClearLimit)."""
        self._flow_read_at = float("-inf")

    @contextlib.asynccontextmanager
    async def tenant_tx(self, tenant_id: str, *, isolation: str | None = None,
                        readonly: bool = False) -> AsyncIterator[asyncpg.Connection]:
        """A transaction on RunService's pool that sees and writes `tenant_id`'s rows only
        (`agentrt.tenant`, set for this transaction alone)."""
        async with self.pool.acquire() as conn, conn.transaction(isolation=isolation, readonly=readonly):
            await execute(conn, Q.set_tenant, tenant_id=tenant_id)
            yield conn

    @contextlib.asynccontextmanager
    async def admin_tx(self, reason: str) -> AsyncIterator[asyncpg.Connection]:
        """A transaction in the admin scope: the audit trail of every tenant (and only that), for an
        admin's audit query or key management. Logged with its reason; the caller's own audit row
        (key.create, key.revoke) is written in it."""
        log.info("row-level security: admin scope for %s", reason)
        async with self.pool.acquire() as conn, conn.transaction():
            await execute(conn, Q.set_scope, scope=ADMIN_SCOPE)
            yield conn


class Repository:
    """One part of the store (runs, work, schedules, keys...): built over the shared `Database`, and over the
    other parts it needs, passed to its constructor (scheduler/store/__init__.py wires them)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.pool = db.pool
        self.work_pool = db.work_pool
        self.settings = db.settings


async def lock_tenant_run(conn: asyncpg.Connection, tenant_id: str, run_id: uuid.UUID) -> Record:
    """The run's row, locked for this transaction; NOT_FOUND when it is not `tenant_id`'s."""
    run = await fetchrow(conn, Q.lock_run, run_id=run_id)
    if run is None or run["tenant_id"] != tenant_id:
        raise NotFound(f"run {run_id} not found", run_id=run_id)
    return run


async def insert_event(conn: asyncpg.Connection, run: Record | RunRow, event_type: str, payload: dict[str, Any],
                       trace: Trace, *, event_id: uuid.UUID | None = None,
                       bound: tuple[str, bytes] | None = None) -> None:
    """One outbox row announcing a change of the locked `run`, in its transaction."""
    await execute(
        conn, Q.insert_event, event_id=event_id or uuid7(), run_id=run["id"], tenant_id=run["tenant_id"],
        event_type=event_type, payload={"status": run["status"], **payload},
        fencing_token=run["fencing_token"], run_version=run["version"], **trace_params(trace),
        write_op=bound[0] if bound else None, write_hash=bound[1] if bound else None)


# Never change: the event id of a request named by its request_id must be the one its first attempt wrote.
_REQUEST_EVENTS = uuid.UUID("3c1f6a52-8d0e-5b7a-9f24-61e0d4a7c2b9")


def request_event_id(subject: uuid.UUID | str, action: str, request_id: str) -> uuid.UUID:
    """The outbox event id of an operator action on `subject` (a run) named by its caller's request_id:
    the same for every retry, so the retry finds what its first attempt committed."""
    return uuid.uuid5(_REQUEST_EVENTS, f"{subject}\x1f{action}\x1f{request_id}")


async def replayed_request(conn: asyncpg.Connection, event_id: uuid.UUID, action: str, request_hash: bytes) -> bool:
    """True when the request that `event_id` names already committed (its event is in the outbox, kept
    published_retention_s); ALREADY_EXISTS when that id was used for another request."""
    previous = await fetchrow(conn, Q.event_by_id, event_id=event_id)
    if previous is None:
        return False
    if previous["write_op"] != action or previous["write_hash"] is None \
            or bytes(previous["write_hash"]) != request_hash:
        raise AlreadyExists(f"request_id was already used for another {action} request; nothing was written",
                            field="request_id")
    return True


__all__ = ["ADMIN_SCOPE", "COMMIT_UNKNOWN_COUNTER", "WORK_SCOPE", "Database", "Repository", "binding_params",
           "check_row_security", "connect_pool", "db_call", "fence_params", "fenced_write", "insert_event",
           "lock_tenant_run", "log", "prefixed", "replayed_request", "request_event_id", "trace_params"]
