"""CANCELLED is a terminal status of its own (issue 19): the migration that moves runs earlier
versions ended FAILED by a cancel, and the operator views (GetStats, metrics) that count it."""

from __future__ import annotations

import asyncio
import datetime as dt
import urllib.request
import uuid

import asyncpg
import pytest
from support import claim, scheduler_stack, submit

from scheduler.store.migrate import available_migrations, migrate
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs

pytestmark = pytest.mark.integration

_INSERT = """
INSERT INTO agent_runs (id, tenant_id, agent_name, status, terminal_reason, cancel_requested_at, cancel_reason,
                        finished_at)
VALUES ($1, 't', 'a', 'FAILED', $2, $3, $4, clock_timestamp())
"""


async def test_migration_moves_cancelled_failed_runs_and_only_them(pg_server_url):
    name = f"agentrt_mig_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_server_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        conn = await asyncpg.connect(f"{pg_server_url.rpartition('/')[0]}/{name}")
        try:
            before = [m for m in available_migrations() if m.version < 10]
            assert await migrate(conn, before) == list(range(1, 10))
            cancelled, flagged_then_failed, failed = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
            await conn.execute(_INSERT, cancelled, "cancelled: customer withdrew", _now(), "customer withdrew")
            # A cancel requested, but the run ended FAILED by its deadline first: not a cancel.
            await conn.execute(_INSERT, flagged_then_failed, "budget exhausted: deadline passed", _now(), "stop")
            await conn.execute(_INSERT, failed, "tool said no", None, None)
            assert await migrate(conn, [m for m in available_migrations() if m.version <= 10]) == [10]
            statuses = dict(await conn.fetch("SELECT id, status FROM agent_runs"))
            assert statuses == {cancelled: "CANCELLED", flagged_then_failed: "FAILED", failed: "FAILED"}
            # The new status is terminal for the table's constraints too.
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute("UPDATE agent_runs SET finished_at = NULL WHERE id = $1", cancelled)
        finally:
            await conn.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)  # a stored fact about the past, never compared: any clock will do


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


async def test_stats_and_metrics_count_cancelled_runs(db_url):
    async with scheduler_stack(db_url, metrics_addr="127.0.0.1:0") as stack:
        kept = await submit(stack)
        for _ in range(2):
            run = await submit(stack)
            reply = await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run.run_id, reason="not needed"),
                                               metadata=stack.md())
            assert reply.status == pb.RUN_STATUS_CANCELLED
        stats = await stack.runs.GetStats(rs.GetStatsRequest(), metadata=stack.md())
        assert dict(stats.runs_by_status) == {"QUEUED": 1, "CANCELLED": 2}
        stack.server.metrics.apply(await stack.server.store.runs.global_stats())
        text = await asyncio.to_thread(_scrape, stack.server.metrics_port)
        assert 'agentrt_runs{status="CANCELLED"} 2.0' in text and 'agentrt_runs{status="FAILED"} 0.0' in text
        lease = await claim(stack)
        assert lease is not None and lease.run.run_id == kept.run_id, "cancelled runs are never claimed"
