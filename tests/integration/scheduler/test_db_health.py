"""Database health metrics against real PostgreSQL: dead tuples, sizes, freeze ages, vacuum age and
the WAL rate from the scheduler's interval reads; slow statements from pg_stat_statements on a server
that loads it, and a clean absence on one that does not."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest
from support import scheduler_stack, submit

from devstack.embedded_pg import EmbeddedPostgres
from scheduler.store.migrate import migrate

pytestmark = pytest.mark.integration
FAST = {"metrics_addr": "127.0.0.1:0", "db_health_interval_s": 0.2}


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    # Label values may hold spaces (a statement's text).
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^(agentrt_db_[^ {]+(?:\{.*\})?) (\S+)$", text, re.M)}


async def until(probe: Callable[[], Awaitable[dict[str, float] | None]], within_s: float, what: str) -> dict:
    deadline = time.monotonic() + within_s
    while True:
        found = await probe()
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"not within {within_s:g}s: {what}"
        await asyncio.sleep(0.1)


def scraped_when(port: int, condition: Callable[[dict[str, float]], bool]) -> Callable[[], Awaitable[dict | None]]:
    async def probe() -> dict[str, float] | None:
        samples = await asyncio.to_thread(scrape, port)
        return samples if condition(samples) else None
    return probe


async def test_table_bloat_freeze_age_vacuum_and_wal_rate_are_exported(db_url, db):
    async with scheduler_stack(db_url, **FAST) as stack:
        port = stack.server.metrics_port
        runs = [await submit(stack) for _ in range(5)]
        # Dead tuples: deleted rows stay behind until a vacuum (a table the scheduler never reads,
        # so no page is pruned meanwhile; autovacuum off on it in this test's database, or ~300 dead
        # rows of 600 pass its threshold and it may clear them before a health read sees them).
        await db.execute("ALTER TABLE consumed_events SET (autovacuum_enabled = false)")
        await db.execute("INSERT INTO consumed_events (consumer_name, event_id) "
                         "SELECT 'bloat', gen_random_uuid() FROM generate_series(1, 600) g")
        await db.execute("DELETE FROM consumed_events WHERE consumer_name = 'bloat' AND random() < 0.5")
        dead = 'agentrt_db_table_dead_tuples{table="consumed_events"}'
        samples = await until(scraped_when(port, lambda s: s.get(dead, 0) >= 200), 30,
                              "dead tuples of consumed_events counted")
        assert samples['agentrt_db_table_live_tuples{table="consumed_events"}'] >= 200
        assert samples['agentrt_db_table_live_tuples{table="agent_runs"}'] == 5
        assert samples['agentrt_db_table_size_bytes{table="agent_runs"}'] > 0
        assert samples['agentrt_db_table_index_size_bytes{table="agent_runs"}'] > 0
        assert samples['agentrt_db_table_xid_age{table="agent_runs"}'] > 0
        assert samples["agentrt_db_xid_age"] > 0
        assert samples["agentrt_db_wal_bytes_total"] > 0
        # Only the schema's own tables (the consumer library's consumed_events is one of them).
        tables = {m.group(1) for key in samples for m in [re.search(r'\{table="(\w+)"\}', key)] if m}
        assert {"agent_runs", "outbox", "tool_executions", "consumed_events"} <= tables
        assert not {t for t in tables if t.startswith("pg_")}

        # A vacuum clears the dead tuples and starts the vacuum age.
        await db.execute("VACUUM consumed_events")
        vacuum_age = 'agentrt_db_table_last_vacuum_age_seconds{table="consumed_events"}'
        after = await until(scraped_when(port, lambda s: vacuum_age in s and s[dead] == 0), 30,
                            "the vacuum seen")
        assert 0 <= after[vacuum_age] < 60

        # The WAL rate: the position grows with writes, and the rate between two reads is positive.
        before_wal = after["agentrt_db_wal_bytes_total"]
        await db.execute("INSERT INTO runtime_counters (name, value) SELECT 'wal-' || g, g "
                         "FROM generate_series(1, 2000) g")
        grown = await until(scraped_when(port, lambda s: s["agentrt_db_wal_bytes_total"] > before_wal
                                         and s.get("agentrt_db_wal_bytes_per_second", 0) > 0), 30,
                            "the WAL position to grow")
        assert grown["agentrt_db_health_refresh_failures_total"] == 0
        # No pg_stat_statements in this database: no statement figures, no failure.
        assert grown["agentrt_db_pg_stat_statements_available"] == 0
        assert not [key for key in grown if key.startswith(("agentrt_db_slow", "agentrt_db_statement"))]
    assert len(runs) == 5


async def test_pg_stat_statements_installed_but_not_loaded_is_skipped_cleanly(db_url, db, caplog):
    caplog.set_level(logging.INFO, logger="scheduler.background.db_health")
    await db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    async with scheduler_stack(db_url, **FAST) as stack:
        port = stack.server.metrics_port
        samples = await until(scraped_when(port, lambda s: "agentrt_db_xid_age" in s), 30, "a health read")
        health = stack.server.metrics.db_health.health
    assert samples["agentrt_db_pg_stat_statements_available"] == 0
    assert samples["agentrt_db_health_refresh_failures_total"] == 0
    assert health is not None and health.tables and "shared_preload_libraries" in health.statements_problem
    # Said once, not at every refresh.
    assert sum("slow statement metrics off" in r.getMessage() for r in caplog.records) == 1
    assert any("pg_stat_statements" in r.getMessage() and "shared_preload_libraries" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


async def test_slow_statements_come_from_pg_stat_statements_where_it_is_loaded(tmp_path: Path):
    pg = EmbeddedPostgres(tmp_path / "pg", fsync=False, settings={"shared_preload_libraries": "pg_stat_statements"})
    await asyncio.to_thread(pg.start)
    try:
        url = pg.url("postgres")
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn)
            await conn.execute("CREATE EXTENSION pg_stat_statements")
            await conn.execute("SELECT pg_sleep(0.05)")
        finally:
            await conn.close()
        async with scheduler_stack(url, **FAST, db_slow_statement_ms=20, db_slow_statement_top=3) as stack:
            port = stack.server.metrics_port
            samples = await until(scraped_when(port, lambda s: s.get("agentrt_db_slow_statements", 0) >= 1), 30,
                                  "the slow statement counted")
    finally:
        await asyncio.to_thread(pg.stop)
    assert samples["agentrt_db_pg_stat_statements_available"] == 1
    slowest = {key: value for key, value in samples.items() if key.startswith("agentrt_db_statement_mean_seconds")}
    assert 1 <= len(slowest) <= 3
    [(sleep_key, mean)] = [(k, v) for k, v in slowest.items() if "pg_sleep" in k]
    assert re.search(r'queryid="-?\d+"', sleep_key) and mean >= 0.05
    assert samples[sleep_key.replace("mean_seconds", "calls_total")] == 1
