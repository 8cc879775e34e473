"""Returning a connection to a service's pool costs no round trip.

asyncpg's default release hook sends `SELECT pg_advisory_unlock_all(); CLOSE ALL;
UNLISTEN *; RESET ALL` each time (one round trip per call; the step profile in
docs/performance/step-profile.md counted 0.36 of them per step from the relay alone). The
scheduler's and the relay's pools release with `shared.db.keep_session`, which sends nothing:
a session setting made before a release is still there after it, which RESET ALL would undo.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from relay.store import connect_pool as relay_pool
from scheduler.store.core import connect_pool as scheduler_pool

pytestmark = pytest.mark.integration


async def _scheduler(dsn: str) -> asyncpg.Pool:
    return await scheduler_pool(dsn, min_size=1, max_size=1)


async def _relay(dsn: str) -> asyncpg.Pool:
    return await relay_pool(dsn, min_size=1, max_size=1, command_timeout=10)


@pytest.mark.parametrize("make", [_scheduler, _relay], ids=["scheduler", "relay"])
async def test_release_sends_no_reset(db_url: str, make: Callable[[str], Awaitable[Any]]) -> None:
    pool = await make(db_url)
    try:
        async with pool.acquire() as conn:
            pid = await conn.fetchval("SELECT pg_backend_pid()")
            await conn.execute("SET application_name = 'release-marker'")
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") == pid  # the same session back
            assert await conn.fetchval("SHOW application_name") == "release-marker"
        # A transaction left open is still rolled back by the pool before the hook runs.
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            await conn.execute("SET LOCAL application_name = 'inside'")
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW application_name") == "release-marker"
            assert not conn.is_in_transaction()
    finally:
        await pool.close()
