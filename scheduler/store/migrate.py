"""Schema migrations: numbered .sql files applied in order, each in a transaction.

Safe from several replicas at once: a transaction-scoped advisory lock
serialises them, and each applied version is recorded. A database whose schema
is newer than this build knows is refused rather than touched.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from shared.db import require_schema
from shared.errors import SchemaMismatch

MIGRATIONS_DIR = Path(__file__).parents[1] / "sql" / "migrations"
# Arbitrary but fixed: the advisory lock key that serialises migrators.
MIGRATION_LOCK_KEY = 0x61677274_6D696772  # "agrtmigr"
_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def available_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.match(path.name)
        if not match:
            raise ValueError(f"migration file name must look like 0001_name.sql: {path.name}")
        found.append(Migration(int(match.group(1)), match.group(2), path.read_text(encoding="utf-8")))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise ValueError(f"migration versions must be 1..N without gaps, got {versions}")
    return found


async def migrate(conn: asyncpg.Connection, migrations: list[Migration] | None = None) -> list[int]:
    """Apply pending migrations; return the versions applied by this call."""
    migrations = available_migrations() if migrations is None else migrations
    known = max((m.version for m in migrations), default=0)
    applied_now: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
        # Row-level security is FORCEd on the tenant tables (0016): an owner that is not a superuser
        # obeys it too, so a migration's backfill runs in the work scope (every tenant's rows).
        await conn.execute("SELECT set_config('agentrt.scope', 'work', true)")
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                 version integer PRIMARY KEY,
                 name text NOT NULL,
                 checksum text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"""
        )
        rows = await conn.fetch("SELECT version, checksum FROM schema_migrations ORDER BY version")
        applied = {row["version"]: row["checksum"] for row in rows}
        newest = max(applied, default=0)
        if newest > known:
            raise SchemaMismatch(
                f"database schema is at version {newest}, this build knows only up to {known}; "
                "upgrade agentrt before running it against this database",
                database_version=newest,
                known_version=known,
            )
        for migration in migrations:
            if migration.version in applied:
                continue
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                migration.version,
                migration.name,
                migration.checksum,
            )
            applied_now.append(migration.version)
    return applied_now


async def require_current_schema(conn: asyncpg.Connection) -> None:
    """The scheduler refuses to start on a schema older or newer than its migrations."""
    await require_schema(conn, len(available_migrations()))
