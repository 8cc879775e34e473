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

from shared.canonical import encode_json
from shared.errors import SchemaMismatch

# The schema version this build runs against: the newest migration's number.
SCHEMA_VERSION = 18

# Errors that mean the connection (or the server) is gone: the call may be retried on another
# connection, and services answer them UNAVAILABLE.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
)
# Errors after which the same transaction, run again, may succeed.
RETRYABLE: tuple[type[BaseException], ...] = (asyncpg.SerializationError, asyncpg.DeadlockDetectedError)

# What runs a statement: a connection or a pool.
Executor: TypeAlias = asyncpg.Connection | asyncpg.Pool

_BLOCK = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
# What a rewrite skips over: string literals, quoted identifiers and comments;
# group 1 is a `:name` parameter (`::type` casts are not), group 2 a `{fragment}` inclusion.
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|(?<![:\w]):([A-Za-z_]\w*)|\{(\w+)\}")
_POSITIONAL = re.compile(r"\$\d+")
_CLIENT = SpanKind.CLIENT


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
    """`{fragment}` replaced by that fragment's text (fragments may include fragments)."""
    if depth > 8:
        raise ValueError(f"fragments included too deep in {name!r} (a cycle?)")

    def fill(match: re.Match[str]) -> str:
        included = match.group(2)
        if included is None:
            return match.group(0)
        if included not in fragments:
            raise ValueError(f"{name!r} includes an unknown fragment {included!r}")
        return _include(fragments[included], fragments, included, depth + 1)

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
    """jsonb and json in and out as Python values; what goes in is canonical JSON (CanonicalJson text as is)."""
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
