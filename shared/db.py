"""What every service that talks to PostgreSQL shares: connection setup, the
errors that mean "the database is gone", named-query files and the schema
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
from pathlib import Path

import asyncpg

from shared.canonical import encode_json
from shared.errors import SchemaMismatch

# The schema version this build runs against: the newest migration's number.
SCHEMA_VERSION = 7

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

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse_named_queries(text: str) -> dict[str, str]:
    """Blocks of a .sql file, each headed `-- name: X`, as {X: statement} (comment lines dropped)."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.strip().splitlines() if not line.lstrip().startswith("--")]
        statement = "\n".join(lines).strip().rstrip(";")
        if name in queries:
            raise ValueError(f"duplicate query name {name!r}")
        queries[name] = statement
    return queries


def load_queries(path: Path) -> dict[str, str]:
    return parse_named_queries(path.read_text(encoding="utf-8"))


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
