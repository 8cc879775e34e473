"""Every row of every table, read as the connecting (super)user: what a refused call must leave as it was."""

from __future__ import annotations

import asyncpg


async def snapshot_all(url: str) -> dict[str, list[str]]:
    """Each table of the schema (found in the catalog, so a new table is covered) as its sorted rows' text.

    Read as the test's superuser, so row-level security hides nothing.
    """
    conn = await asyncpg.connect(url)
    try:
        tables = [row["tablename"] for row in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename")]
        assert tables, "no tables found: is the database migrated?"
        return {table: [row[0] for row in await conn.fetch(f'SELECT t::text FROM "{table}" AS t ORDER BY 1')]
                for table in tables}
    finally:
        await conn.close()
