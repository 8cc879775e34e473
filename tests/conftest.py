"""Shared fixtures: a real PostgreSQL, a migrated template database, one database per test.

AGENTRT_TEST_DATABASE_URL (any database on the server; tests create their own
databases there) or else an embedded server started for the session.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from devstack.embedded_pg import EmbeddedPostgres

# Tests that are not about authentication run their schedulers (in-process and the processes
# they start, which inherit this) with auth_mode none; the tests about it pass auth_mode
# explicitly (settings given in code win over the environment).
os.environ["AGENTRT_AUTH_MODE"] = "none"
from scheduler.store.migrate import migrate


def _with_database(url: str, database: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{database}"


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    external = os.environ.get("AGENTRT_TEST_DATABASE_URL")
    if external:
        yield external
        return
    # Its own directory, not pytest's tmp_path: pytest prunes old basetemps, which
    # would pull the data out from under a concurrently running session's server.
    home = Path(tempfile.mkdtemp(prefix="agentrt-test-pg-"))
    server = EmbeddedPostgres(home / "data", fsync=False).start()
    try:
        yield server.url("postgres")
    finally:
        server.stop("immediate")
        shutil.rmtree(home, ignore_errors=True)


async def _admin(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def template_db(pg_server_url: str) -> Iterator[str]:
    name = f"agentrt_tpl_{uuid.uuid4().hex[:12]}"

    async def create() -> None:
        await _admin(pg_server_url, f'CREATE DATABASE "{name}"')
        conn = await asyncpg.connect(_with_database(pg_server_url, name))
        try:
            await migrate(conn)
        finally:
            await conn.close()

    asyncio.run(create())
    try:
        yield name
    finally:
        asyncio.run(_admin(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
async def db_url(pg_server_url: str, template_db: str) -> AsyncIterator[str]:
    name = f"agentrt_t_{uuid.uuid4().hex[:12]}"
    await _admin(pg_server_url, f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    try:
        yield _with_database(pg_server_url, name)
    finally:
        await _admin(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection for assertions (jsonb decoded as Python values)."""
    from shared.db import init_connection

    conn = await asyncpg.connect(db_url)
    await init_connection(conn)
    try:
        yield conn
    finally:
        await conn.close()


REPO_ROOT = Path(__file__).resolve().parent.parent
