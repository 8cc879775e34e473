"""What every service that talks to PostgreSQL shares: connection setup, the
errors that mean "the database is gone", named-query files (with `:name`
parameters and `{fragment}` inclusion, rewritten once at load) and the schema
version check.

The scheduler owns the schema (scheduler/sql/migrations); the relay and the
consumer library only check that the database is at the version this build
was made for (`SCHEMA_VERSION`, kept equal to the number of migrations by
tests/unit/test_db.py).
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import asyncpg
from opentelemetry.trace import SpanKind
from prometheus_client.core import CounterMetricFamily

from shared.canonical import encode_json
from shared.errors import SchemaMismatch

# The schema version this build runs against: the newest migration's number.
SCHEMA_VERSION = 24

# The one table of "no primary on this connection" errors (docs/ha.md): the connection or the
# server is gone, the server is shutting down or starting (a restart, a switchover), it is a
# standby (`read-only transaction`: the session reached a demoted or not yet promoted node), or
# no host of a multi-host DSN is a primary (`target_session_attrs=read-write`). The call may be
# retried on another connection; services answer them UNAVAILABLE and consumers retry them.
PRIMARY_LOST: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,  # includes ConnectionDoesNotExistError (the socket closed mid-call)
    asyncpg.InterfaceError,
    asyncpg.exceptions.CannotConnectNowError,  # 57P03: starting up, shutting down, in recovery
    asyncpg.exceptions.AdminShutdownError,  # 57P01: terminated by a fast shutdown or pg_terminate_backend
    asyncpg.exceptions.CrashShutdownError,  # 57P02: another backend crashed
    asyncpg.exceptions.ReadOnlySQLTransactionError,  # 25006: a standby, or default_transaction_read_only
    asyncpg.TargetServerAttributeNotMatched,  # no host of the DSN is (yet) a primary
    # asyncpg 0.32, a session ended while idle (pg_terminate_backend, a switchover): the server's
    # FATAL arrives before the next query and the protocol answers "cannot switch to state 11;
    # another operation (2) is in progress" (tests/integration/scheduler/test_primary_loss.py meets it).
    asyncpg.exceptions.InternalClientError,
)
# The same, plus the socket-level errors that mean the server cannot be reached at all.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    *PRIMARY_LOST,
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
)
# After these the pool's other sessions may be just as stale (they point at a server that is no
# longer the primary): the pool drops them all (`expire_stale`) and reconnects on next use.
STALE_SESSIONS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
)


@dataclass
class ConnectionStats:
    """Process-wide: connections opened (a pool's first ones and every reconnect) and the calls that
    failed for a lost primary, by error class; exported by each service's metrics."""

    opened: int = 0
    unavailable: dict[str, int] = field(default_factory=dict)
    pools_expired: int = 0

    def lost(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.unavailable[name] = self.unavailable.get(name, 0) + 1


DB_STATS = ConnectionStats()


async def count_connection(conn: asyncpg.Connection) -> None:
    """A pool's `init` that only counts (for pools that keep asyncpg's own codecs: the consumer's)."""
    DB_STATS.opened += 1


def connection_families() -> list[Any]:
    """The process's DB_STATS as Prometheus families (each service's collector yields them)."""
    opened = CounterMetricFamily("agentrt_db_connections_opened", "Database connections opened (the pools' first "
                                 "ones and every reconnect, e.g. after a failover)", value=DB_STATS.opened)
    lost = CounterMetricFamily("agentrt_db_unavailable_errors", "Database calls that failed because no primary "
                               "was reachable on their connection, by error class", labels=("error",))
    for name, count in sorted(DB_STATS.unavailable.items()):
        lost.add_metric((name,), count)
    expired = CounterMetricFamily("agentrt_db_pool_expirations", "Times a pool dropped all its sessions after an "
                                  "error that leaves them stale (read-only transaction, admin shutdown)",
                                  value=DB_STATS.pools_expired)
    return [opened, lost, expired]


def is_primary_lost(exc: BaseException) -> bool:
    """True for an error of the table above (the call may be retried on another connection)."""
    return isinstance(exc, CONNECTION_ERRORS)


async def expire_stale(exc: BaseException, *pools: asyncpg.Pool | None) -> None:
    """Counts a lost-primary error; after one that leaves live but stale sessions, the pools close
    their connections as they come back and open new ones (through the DSN: to the new primary)."""
    DB_STATS.lost(exc)
    if isinstance(exc, STALE_SESSIONS):
        for pool in {id(p): p for p in pools if p is not None}.values():
            await pool.expire_connections()
            DB_STATS.pools_expired += 1


# Errors after which the same transaction, run again, may succeed.
RETRYABLE: tuple[type[BaseException], ...] = (asyncpg.SerializationError, asyncpg.DeadlockDetectedError)

# What runs a statement: a connection or a pool.
Executor: TypeAlias = asyncpg.Connection | asyncpg.Pool

_BLOCK = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
# What a rewrite skips over: string literals, quoted identifiers and comments;
# group 1 is a `:name` parameter (`::type` casts are not), group 2 a `{fragment}` inclusion and
# group 3 the row alias of a `{fragment@alias}` one.
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|(?<![:\w]):([A-Za-z_]\w*)|\{(\w+)(?:@(\w+))?\}")
_POSITIONAL = re.compile(r"\$\d+")
_CLIENT = SpanKind.CLIENT


async def keep_session(conn: asyncpg.Connection) -> None:
    """Release hook: nothing to undo, so no extra round trip per call.

    asyncpg's default reset sends `SELECT pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL` on every release: one more round trip per RPC. Pool
    connections never take session advisory locks, open cursors outside a
    transaction, LISTEN (the notifier has its own connection) or SET session
    settings, so there is nothing for it to undo. The pool still rolls back a
    transaction left open and drops listeners before calling this hook.
    """


class QueryArgumentError(TypeError):
    """A query was run with a parameter missing or one it does not take."""


@dataclass(frozen=True, slots=True)
class Query:
    """One named statement: `sql` is what PostgreSQL runs (`:name` parameters rewritten to `$1..$n`
    once, at load) and `params` the names in `$n` order. A statement written with positional `$n`
    parameters (or none) keeps its text and takes no names.
    """

    name: str
    sql: str
    params: tuple[str, ...] = ()
    _expected: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_expected", frozenset(self.params))

    def args(self, **values: Any) -> list[Any]:
        """The positional arguments for `values` by name; a missing or unknown name raises."""
        # As many names as parameters and each parameter found means no name is unknown either:
        # the whole check costs one length comparison beside the list it builds.
        if len(values) == len(self.params):
            try:
                return [values[param] for param in self.params]
            except KeyError:
                pass
        if values.keys() != self._expected:
            missing = sorted(self._expected - values.keys())
            unknown = sorted(values.keys() - self._expected)
            raise QueryArgumentError(
                f"query {self.name!r}: " + "; ".join(
                    part for part in (f"missing {', '.join(missing)}" if missing else "",
                                      f"unknown {', '.join(unknown)}" if unknown else "") if part))
        return [values[param] for param in self.params]


class Queries(dict[str, str]):
    """A .sql file's named statements. `Q["x"]` is the statement's SQL text (positional `$n`, as
    PostgreSQL takes it: EXPLAIN, PREPARE, the relay's positional calls); `Q.x` is its `Query`, run
    with keyword arguments through `fetchrow(conn, Q.x, name=...)` and its siblings below.
    """

    def __init__(self, queries: dict[str, Query]) -> None:
        shadowed = sorted(name for name in queries if hasattr(Queries, name))
        if shadowed:
            raise ValueError(f"query names {shadowed} shadow attributes of the query map")
        super().__init__({name: query.sql for name, query in queries.items()})
        self._queries = queries

    def __getattr__(self, name: str) -> Query:
        try:
            return self.__dict__["_queries"][name]  # type: ignore[no-any-return]
        except KeyError:
            raise AttributeError(f"no query named {name!r}") from None

    def query(self, name: str) -> Query:
        return self._queries[name]


def rewrite_named(sql: str, name: str = "") -> Query:
    """`:name` parameters as `$1..$n` in order of first use (a name used twice is one `$n`)."""
    order: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        param = match.group(1)
        if param is None:
            return match.group(0)
        if param not in order:
            order[param] = len(order) + 1
        return f"${order[param]}"

    text = _TOKEN.sub(number, sql)
    if order and _POSITIONAL.search(_TOKEN.sub(lambda m: "" if m.group(1) is None else m.group(0), sql)):
        raise ValueError(f"query {name!r} mixes :name and $n parameters")
    return Query(name, text, tuple(order))


def _include(body: str, fragments: dict[str, str], name: str, depth: int = 0) -> str:
    """`{fragment}` replaced by that fragment's text (fragments may include fragments).

    `{fragment@i}` includes it with each `:name` parameter read from the column `i.name` instead: the
    same predicate, judged for each row `i` of a set (a statement that writes many runs at once)."""
    if depth > 8:
        raise ValueError(f"fragments included too deep in {name!r} (a cycle?)")

    def fill(match: re.Match[str]) -> str:
        included = match.group(2)
        if included is None:
            return match.group(0)
        if included not in fragments:
            raise ValueError(f"{name!r} includes an unknown fragment {included!r}")
        text = _include(fragments[included], fragments, included, depth + 1)
        alias = match.group(3)
        if alias is None:
            return text
        return _TOKEN.sub(lambda m: m.group(0) if m.group(1) is None else f"{alias}.{m.group(1)}", text)

    return _TOKEN.sub(fill, body)


def _statement(body: str) -> str:
    lines = [line for line in body.strip().splitlines() if not line.lstrip().startswith("--")]
    return "\n".join(lines).strip().rstrip(";")


def parse_named_queries(text: str) -> Queries:
    """Blocks of a .sql file, each headed `-- name: X`, as {X: Query} (comment lines dropped).

    Blocks headed `-- fragment: F` are no queries: their text (no trailing `;`)
    is included where a query (or another fragment) says `{F}`, before the
    `:name` parameters are rewritten.
    """
    parts = _BLOCK.split(text)
    fragments: dict[str, str] = {}
    bodies: dict[str, str] = {}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        target = fragments if kind == "fragment" else bodies
        if name in target:
            raise ValueError(f"duplicate {'fragment' if kind == 'fragment' else 'query'} name {name!r}")
        target[name] = _statement(body)
    return Queries({name: rewrite_named(_include(body, fragments, name), name) for name, body in bodies.items()})


def load_queries(path: Path) -> Queries:
    return parse_named_queries(path.read_text(encoding="utf-8"))


# The tracer of the optional SQL spans (the scheduler's `trace_sql`), or None: then the helpers
# below cost one global read each.
_SQL_TRACER: Any = None
_OPERATION = re.compile(r"\s*(?:--[^\n]*\n\s*)*(\w+)")


def trace_queries(tracer: Any) -> None:
    """A CLIENT span per named statement from now on (None: none). Process-wide, like the asyncpg pool."""
    global _SQL_TRACER
    _SQL_TRACER = tracer


def _operation(sql: str) -> str:
    match = _OPERATION.match(sql)
    return match.group(1).upper() if match else "SQL"


async def _traced(method: str, conn: Executor, query: Query, args: list[Any]) -> Any:
    """The statement inside a span named by its query: the database conventions, the SQL text with
    its `$n` placeholders, never the values."""
    operation = _operation(query.sql)
    summary = f"{operation} {query.name}" if query.name else operation
    with _SQL_TRACER.start_as_current_span(summary, kind=_CLIENT, attributes={
            "db.system": "postgresql", "db.system.name": "postgresql", "db.operation": operation,
            "db.operation.name": operation, "db.query.summary": summary, "db.query.text": query.sql,
            "agentrt.query": query.name}):
        return await getattr(conn, method)(query.sql, *args)


async def fetchrow(conn: Executor, query: Query, /, **params: Any) -> asyncpg.Record | None:
    """Runs `query` with its parameters by name (see `Query.args`)."""
    if _SQL_TRACER is not None:
        return await _traced("fetchrow", conn, query, query.args(**params))  # type: ignore[no-any-return]
    return await conn.fetchrow(query.sql, *query.args(**params))


async def fetch(conn: Executor, query: Query, /, **params: Any) -> list[asyncpg.Record]:
    if _SQL_TRACER is not None:
        return await _traced("fetch", conn, query, query.args(**params))  # type: ignore[no-any-return]
    return await conn.fetch(query.sql, *query.args(**params))


async def fetchval(conn: Executor, query: Query, /, **params: Any) -> Any:
    if _SQL_TRACER is not None:
        return await _traced("fetchval", conn, query, query.args(**params))
    return await conn.fetchval(query.sql, *query.args(**params))


async def execute(conn: Executor, query: Query, /, **params: Any) -> str:
    if _SQL_TRACER is not None:
        return await _traced("execute", conn, query, query.args(**params))  # type: ignore[no-any-return]
    return await conn.execute(query.sql, *query.args(**params))


async def init_connection(conn: asyncpg.Connection) -> None:
    """jsonb and json in and out as Python values; what goes in is canonical JSON (CanonicalJson text as is).
    Every pool runs it on each new connection: it counts them (`DB_STATS.opened`)."""
    DB_STATS.opened += 1
    for type_name in ("jsonb", "json"):
        await conn.set_type_codec(type_name, encoder=encode_json, decoder=json.loads, schema="pg_catalog")


async def schema_version(conn: asyncpg.Connection) -> int:
    """The newest migration applied to the database (0 before any)."""
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    if not exists:
        return 0
    return int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_migrations"))


async def require_schema(conn: asyncpg.Connection, known: int = SCHEMA_VERSION) -> None:
    """Services refuse to start on a schema older or newer than this build knows."""
    current = await schema_version(conn)
    if current != known:
        raise SchemaMismatch(
            f"database schema version {current}, this build expects {known}"
            + ("; run `agentrt migrate` first" if current < known else "; upgrade agentrt"),
            database_version=current, known_version=known)
