"""The relay's data-access layer: the only relay code that runs SQL.

Every method is one statement from relay/sql/queries.sql in autocommit (the
claim adds its planner settings in a read-only transaction of its own): no
method opens a transaction that spans a call to Kafka. Connection failures
surface as `shared.errors.Unavailable`.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, ParamSpec, TypeVar

import asyncpg

from shared.db import CONNECTION_ERRORS, DB_STATS, expire_stale, init_connection, keep_session, load_queries
from shared.errors import AgentrtError, NotFound, Unavailable

Q = load_queries(Path(__file__).parent / "sql" / "queries.sql")

P = ParamSpec("P")
T = TypeVar("T")

class ShardCountMismatch(AgentrtError):
    reason = "SHARD_COUNT_MISMATCH"


def db_call(func: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    @functools.wraps(func)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await func(*args, **kwargs)
        except CONNECTION_ERRORS as exc:  # shared.db's table of a lost database or primary
            await expire_stale(exc, getattr(args[0], "pool", None) if args else None)
            raise Unavailable(f"database unavailable: {type(exc).__name__}: {exc}") from exc

    return wrapper


class OutboxRow(NamedTuple):
    """One claimed row, in claim_batch's column order (built from the record without per-field work)."""

    id: int
    event_id: str
    run_id: str
    tenant_id: str
    event_type: str
    payload_json: str
    fencing_token: int
    run_version: int
    traceparent: str | None
    tracestate: str | None
    time_text: str  # RFC 3339, UTC, microseconds
    created_ms: int
    retrying: bool


@dataclass(frozen=True)
class Lag:
    pending: int
    oldest_age_s: float
    parked: int
    parked_total: int


async def connect_pool(dsn: str, *, min_size: int, max_size: int, command_timeout: float) -> asyncpg.Pool:
    # The relay reads and marks every tenant's events: its sessions are in the row-level security
    # work scope (scheduler migration 0016).
    pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=init_connection,
                                     command_timeout=command_timeout, reset=keep_session,
                                     server_settings={"agentrt.scope": "work"})
    assert pool is not None
    return pool


def _deleted(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1]) if status.startswith("DELETE") else 0


class RelayStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    # ------------------------------------------------------------ shards and membership

    @db_call
    async def ensure_shards(self, shard_count: int) -> None:
        existing = await self.pool.fetchval(Q["ensure_config"], shard_count)
        if existing is None:  # another relay's concurrent insert won (see read_config)
            existing = await self.pool.fetchval(Q["read_config"])
        if existing != shard_count:
            raise ShardCountMismatch(
                f"shard_count {shard_count} configured, but this database's relays use {existing}; "
                "every relay must use the same shard count",
                configured=shard_count, database=existing)
        await self.pool.execute(Q["ensure_shards"], shard_count)

    @db_call
    async def primary_reachable(self) -> bool:
        """Whether a session answers from a primary that takes writes; on a standby (or a read-only
        server) the pool drops its sessions, which reconnect through the DSN."""
        if await self.pool.fetchval(Q["primary_probe"]):
            return True
        await self.pool.expire_connections()
        DB_STATS.pools_expired += 1
        return False

    @db_call
    async def heartbeat_member(self, relay_id: str, ttl_ms: int) -> int:
        return int(await self.pool.fetchval(Q["heartbeat_member"], relay_id, ttl_ms))

    @db_call
    async def leave_membership(self, relay_id: str) -> None:
        await self.pool.execute(Q["leave_membership"], relay_id)

    @db_call
    async def set_wants_wakeup(self, relay_id: str, wanted: bool) -> None:
        await self.pool.execute(Q["set_wants_wakeup"], relay_id, wanted)

    @db_call
    async def renew_shards(self, relay_id: str, ttl_ms: int, held: dict[int, int]) -> dict[int, int]:
        if not held:
            return {}
        rows = await self.pool.fetch(Q["renew_shards"], relay_id, ttl_ms, list(held), list(held.values()))
        return {row["shard"]: row["fencing_token"] for row in rows}

    @db_call
    async def acquire_shards(self, relay_id: str, ttl_ms: int, limit: int) -> dict[int, int]:
        if limit <= 0:
            return {}
        rows = await self.pool.fetch(Q["acquire_shards"], relay_id, ttl_ms, limit)
        return {row["shard"]: row["fencing_token"] for row in rows}

    @db_call
    async def release_shards(self, relay_id: str, shards: list[int]) -> list[int]:
        if not shards:
            return []
        rows = await self.pool.fetch(Q["release_shards"], relay_id, shards)
        return [row["shard"] for row in rows]

    # ------------------------------------------------------------ publishing

    @db_call
    async def claim_batch(self, relay_id: str, held: dict[int, int], shard_count: int, limit: int,
                          exclude_ids: list[int] | None = None) -> list[OutboxRow]:
        if not held:
            return []
        async with self.pool.acquire() as conn, conn.transaction(readonly=True):
            await conn.execute(Q["claim_plan"])
            rows = await conn.fetch(Q["claim_batch"], relay_id, list(held), list(held.values()), shard_count,
                                    limit, exclude_ids or [])
        make = OutboxRow._make
        return [make(row) for row in rows]

    @db_call
    async def mark_published(self, ids: list[int], retried: list[int]) -> None:
        await self.pool.execute(Q["mark_published"], ids)
        if retried:
            await self.pool.execute(Q["mark_retries_delivered"], retried)

    @db_call
    async def park(self, outbox_id: int, reason: str, relay_id: str) -> int | None:
        """Parks a row; returns its park count, or None if it was already parked or published."""
        value = await self.pool.fetchval(Q["park_row"], outbox_id, reason[:2000], relay_id)
        return int(value) if value is not None else None

    @db_call
    async def lag(self) -> Lag:
        row = await self.pool.fetchrow(Q["outbox_lag"])
        assert row is not None
        return Lag(pending=row["pending"], oldest_age_s=float(row["oldest_age_s"] or 0.0),
                   parked=row["parked"], parked_total=row["parked_total"])

    # ------------------------------------------------------------ operator

    @db_call
    async def list_parked(self, state: str | None = None, limit: int = 100) -> list[asyncpg.Record]:
        return list(await self.pool.fetch(Q["list_parked"], state, limit))

    @db_call
    async def retry_parked(self, outbox_id: int, operator: str, note: str) -> asyncpg.Record:
        row = await self.pool.fetchrow(Q["retry_parked"], outbox_id, operator, note)
        if row is None:
            raise await self._not_parked(outbox_id)
        return row

    @db_call
    async def skip_parked(self, outbox_id: int, operator: str, note: str) -> asyncpg.Record:
        row = await self.pool.fetchrow(Q["skip_parked"], outbox_id, operator, note)
        if row is None:
            raise await self._not_parked(outbox_id)
        return row

    async def _not_parked(self, outbox_id: int) -> AgentrtError:
        state = await self.pool.fetchval(Q["parked_state"], outbox_id)
        if state is None:
            return NotFound(f"outbox row {outbox_id} is not parked", outbox_id=outbox_id)
        return NotFound(f"outbox row {outbox_id} is {state}, not PARKED", outbox_id=outbox_id, state=state)

    @db_call
    async def shards(self) -> list[asyncpg.Record]:
        return list(await self.pool.fetch(Q["list_shards"]))

    @db_call
    async def members(self) -> list[asyncpg.Record]:
        return list(await self.pool.fetch(Q["list_members"]))

    # ------------------------------------------------------------ retention

    @db_call
    async def retention_cutoff(self, older_than_s: float) -> dt.datetime:
        value: dt.datetime = await self.pool.fetchval(Q["retention_cutoff"], older_than_s)
        return value

    @db_call
    async def outbox_first_row_from(self, outbox_id: int) -> tuple[int, dt.datetime] | None:
        row = await self.pool.fetchrow(Q["outbox_first_row_from"], outbox_id)
        return (row["id"], row["created_at"]) if row is not None else None

    @db_call
    async def outbox_last_id(self) -> int | None:
        value = await self.pool.fetchval(Q["outbox_last_id"])
        return int(value) if value is not None else None

    @db_call
    async def delete_published_outbox(self, from_id: int, to_id: int, published_before: dt.datetime) -> int:
        return _deleted(await self.pool.execute(Q["delete_published_outbox"], from_id, to_id, published_before))

    @db_call
    async def delete_consumed_events(self, older_than_s: float, limit: int) -> int:
        return _deleted(await self.pool.execute(Q["delete_consumed_events"], older_than_s, limit))


def record_dict(row: asyncpg.Record) -> dict[str, Any]:
    return dict(row.items())
