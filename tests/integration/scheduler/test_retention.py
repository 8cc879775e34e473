"""Retention of terminal runs (scheduler/background/retention.py, migration 0012), on a real PostgreSQL.

Rows are written with timestamps backdated from the database clock, so every
age below is the database's. An expired run goes with its checkpoints, ledger,
journal and published outbox rows; a run that is not terminal, one under legal
hold, one with an unpublished event, or one its tenant keeps longer, stays.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import uuid
from typing import Any

import asyncpg
import pytest
from executor_support import wait_for
from support import scheduler_stack
from test_db_roles import SETTINGS, as_role

from scheduler.background.retention import sweep
from scheduler.store.database_roles import apply_roles

pytestmark = pytest.mark.integration
CHILD_TABLES = {"agent_checkpoints": "run_id", "tool_executions": "run_id", "run_journal": "run_id",
                "outbox": "run_id", "run_signals": "run_id"}


async def add_run(db: asyncpg.Connection, *, tenant: str = "t1", status: str = "COMPLETED",
                  finished_days_ago: float = 40.0, labels: dict[str, str] | None = None,
                  unpublished: int = 0, published: int = 2) -> uuid.UUID:
    """A run (terminal unless `status` says otherwise) with a checkpoint, a ledger row, a journal row,
    a signal and outbox rows, every time backdated from the database clock."""
    run_id = uuid.uuid4()
    ago = dt.timedelta(days=finished_days_ago)
    terminal = status in ("COMPLETED", "FAILED", "CANCELLED")
    await db.execute(
        """INSERT INTO agent_runs (id, tenant_id, agent_name, status, labels, created_at, updated_at, finished_at)
           VALUES ($1, $2, 'demo', $3, $4::jsonb, clock_timestamp() - $5::interval - interval '1 hour',
                   clock_timestamp() - $5::interval,
                   CASE WHEN $6 THEN clock_timestamp() - $5::interval END)""",
        run_id, tenant, status, labels or {}, ago, terminal)
    await db.execute(
        """INSERT INTO agent_checkpoints (run_id, version, state_json, state_hash, schema_version, fencing_token,
                                          event_id) VALUES ($1, 1, '{}', $2, 1, 1, gen_random_uuid())""",
        run_id, hashlib.sha256(run_id.bytes).digest())
    await db.execute(
        """INSERT INTO tool_executions (id, run_id, step_key, tool_name, idempotency_key, request_json, request_hash,
                                        status, fencing_token, intent_event_id, completed_at)
           VALUES (gen_random_uuid(), $1, 'a/attempt-1', 't.a', $2, '{}', $3, 'SUCCEEDED', 1, gen_random_uuid(),
                   clock_timestamp() - $4::interval)""",
        run_id, str(run_id), hashlib.sha256(run_id.bytes).digest(), ago)
    await db.execute(
        """INSERT INTO run_journal (run_id, seq, kind, detail, fencing_token, run_version)
           VALUES ($1, 1, 'tool', '{}', 1, 1)""", run_id)
    await db.execute(
        """INSERT INTO run_signals (signal_id, run_id, tenant_id, name, payload, request_id, request_hash, received_at)
           VALUES (gen_random_uuid(), $1, $2, 'nudge', '{}', 'r1', $3, clock_timestamp() - $4::interval)""",
        run_id, tenant, hashlib.sha256(run_id.bytes).digest(), ago)
    for index in range(published + unpublished):
        await db.execute(
            """INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, published_at, created_at)
               VALUES (gen_random_uuid(), $1, $2, 'agent.x', '{}',
                       CASE WHEN $3 THEN clock_timestamp() - $4::interval END, clock_timestamp() - $4::interval)""",
            run_id, tenant, index < published, ago)
    return run_id


async def rows_of(db: asyncpg.Connection, run_id: uuid.UUID) -> dict[str, int]:
    counts = {"agent_runs": await db.fetchval("SELECT count(*) FROM agent_runs WHERE id = $1", run_id)}
    for table, column in CHILD_TABLES.items():
        counts[table] = await db.fetchval(f"SELECT count(*) FROM {table} WHERE {column} = $1", run_id)
    return counts


async def everything(db: asyncpg.Connection) -> list[Any]:
    tables = ("agent_runs", *CHILD_TABLES, "retention_policies")
    return [sorted(map(tuple, await db.fetch(f"SELECT * FROM {table}")), key=repr) for table in tables]


async def test_expired_terminal_runs_go_with_their_rows_and_every_other_run_stays(db_url, db):
    completed = await add_run(db)
    failed = await add_run(db, status="FAILED", finished_days_ago=31)
    cancelled = await add_run(db, status="CANCELLED", finished_days_ago=31)
    recent = await add_run(db, finished_days_ago=29)
    queued = await add_run(db, status="QUEUED", finished_days_ago=400)
    paused = await add_run(db, status="PAUSED_HUMAN", finished_days_ago=400)
    held = await add_run(db, labels={"legal_hold": "case-17"})
    waiting_event = await add_run(db, unpublished=1)
    async with scheduler_stack(db_url, run_retention_enabled=False) as stack:
        counts = await sweep(stack.server.store, batch_runs=50)
    assert counts.as_dict() == {"runs": 3, "checkpoints": 3, "ledger": 3, "journal": 3, "outbox": 6, "signals": 3,
                                "batches": 1}
    gone = {"agent_runs": 0, "agent_checkpoints": 0, "tool_executions": 0, "run_journal": 0, "outbox": 0,
            "run_signals": 0}
    for run_id in (completed, failed, cancelled):
        assert await rows_of(db, run_id) == gone
    kept = {"agent_runs": 1, "agent_checkpoints": 1, "tool_executions": 1, "run_journal": 1, "outbox": 2,
            "run_signals": 1}
    for run_id in (recent, queued, paused, held):
        assert await rows_of(db, run_id) == kept
    # An unpublished event keeps its run, and it and its published siblings too.
    assert await rows_of(db, waiting_event) == {**kept, "outbox": 3}


async def test_a_tenant_policy_overrides_the_default_and_no_policy_keeps_everything(db_url, db):
    await db.execute("INSERT INTO retention_policies (tenant_id, keep_days) VALUES ('short', 5), ('long', 90)")
    short = await add_run(db, tenant="short", finished_days_ago=6)
    long_kept = await add_run(db, tenant="long", finished_days_ago=60)
    long_gone = await add_run(db, tenant="long", finished_days_ago=91)
    default_kept = await add_run(db, tenant="other", finished_days_ago=6)
    default_gone = await add_run(db, tenant="other", finished_days_ago=31)
    async with scheduler_stack(db_url, run_retention_enabled=False) as stack:
        counts = await sweep(stack.server.store, batch_runs=2)  # several batches, one sweep
        assert counts.runs == 3 and counts.batches >= 2
        assert [r for r in (short, long_kept, long_gone, default_kept, default_gone)
                if (await rows_of(db, r))["agent_runs"]] == [long_kept, default_kept]
        # Without a default, a tenant with no policy of its own keeps its runs.
        await db.execute("DELETE FROM retention_policies")
        old = await add_run(db, tenant="other", finished_days_ago=3_000)
        assert (await sweep(stack.server.store, batch_runs=10)).runs == 0
        assert (await rows_of(db, old))["agent_runs"] == 1


async def test_a_dry_run_counts_what_would_go_and_changes_nothing(db_url, db):
    for days in (31, 45, 10):
        await add_run(db, finished_days_ago=days)
    await add_run(db, labels={"legal_hold": "x"})
    before = await everything(db)
    async with scheduler_stack(db_url, run_retention_enabled=False) as stack:
        dry = await sweep(stack.server.store, batch_runs=1, dry_run=True)
        assert await everything(db) == before
        real = await sweep(stack.server.store, batch_runs=1)
    assert {k: v for k, v in dry.as_dict().items() if k != "batches"} == {
        k: v for k, v in real.as_dict().items() if k != "batches"} == {
        "runs": 2, "checkpoints": 2, "ledger": 2, "journal": 2, "outbox": 4, "signals": 2}


async def test_the_boundary_is_the_database_clock(db_url, db):
    inside = await add_run(db, finished_days_ago=29.99)
    outside = await add_run(db, finished_days_ago=30.01)
    async with scheduler_stack(db_url, run_retention_enabled=False) as stack:
        assert (await sweep(stack.server.store, batch_runs=10)).runs == 1
    assert (await rows_of(db, inside))["agent_runs"] == 1 and (await rows_of(db, outside))["agent_runs"] == 0


async def test_a_run_held_by_another_transaction_is_skipped_not_waited_for(db_url, db):
    held = await add_run(db)
    free = await add_run(db)
    other = await asyncpg.connect(db_url)
    try:
        locker = other.transaction()
        await locker.start()
        await other.execute("SELECT 1 FROM agent_runs WHERE id = $1 FOR UPDATE", held)
        async with scheduler_stack(db_url, run_retention_enabled=False) as stack:
            counts = await asyncio.wait_for(sweep(stack.server.store, batch_runs=10), 10)
            assert counts.runs == 1 and (await rows_of(db, free))["agent_runs"] == 0
            await locker.rollback()
            assert (await sweep(stack.server.store, batch_runs=10)).runs == 1  # the next sweep takes it
    finally:
        await other.close()
    assert (await rows_of(db, held))["agent_runs"] == 0


async def test_the_scheduler_role_deletes_ledger_rows_only_through_the_retention_function(db_url, db):
    await apply_roles(db, SETTINGS)
    expired = await add_run(db)
    scheduler = await asyncpg.connect(as_role(db_url, "scheduler"))
    relay = await asyncpg.connect(as_role(db_url, "relay"))
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await scheduler.execute("DELETE FROM tool_executions WHERE run_id = $1", expired)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await scheduler.execute("UPDATE retention_policies SET keep_days = 1")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await relay.fetch("SELECT * FROM agentrt_retention_purge(10, false, NULL, NULL)")
        # Through the function, what has expired goes (and nothing else could be asked of it).
        row = await scheduler.fetchrow("SELECT * FROM agentrt_retention_purge(10, false, NULL, NULL)")
        assert (row["runs"], row["ledger"]) == (1, 1)
    finally:
        await scheduler.close()
        await relay.close()
    fn = await db.fetchrow("""SELECT prosecdef, proconfig, proacl::text[] AS acl FROM pg_proc
                              WHERE proname = 'agentrt_retention_purge'""")
    assert fn["prosecdef"] and "search_path=pg_catalog, public, pg_temp" in fn["proconfig"]
    assert not [entry for entry in fn["acl"] if entry.startswith("=")]  # PUBLIC may not execute it


async def test_the_background_task_deletes_expired_runs_and_counts_them(db_url, db):
    expired = await add_run(db)
    async with scheduler_stack(db_url, run_retention_interval_s=0.2, metrics_addr="127.0.0.1:0") as stack:
        async def gone() -> bool | None:
            return (await rows_of(db, expired))["agent_runs"] == 0 or None

        await wait_for(gone, within=20, what="the expired run deleted")
        registry = stack.server.metrics.metrics.registry  # type: ignore[union-attr]

        async def counted() -> float | None:
            value = registry.get_sample_value("agentrt_retention_deleted_rows_total", {"table": "ledger"})
            return value or None

        assert await wait_for(counted, within=10, what="the metric") == 1.0
        assert registry.get_sample_value("agentrt_retention_deleted_rows_total", {"table": "outbox"}) == 2.0


def test_cli_retention_policies_and_a_dry_run(db_url, monkeypatch, capsys):
    from cli.main import main

    assert main(["retention", "set", "--tenant", "acme", "--keep-days", "7", "--database-url", db_url]) == 0
    assert "tenant acme: terminal runs kept 7 days" in capsys.readouterr().out
    assert main(["retention", "list", "--database-url", db_url]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(p["tenant"], p["keep_days"]) for p in listed] == [("*", 30), ("acme", 7)]
    assert main(["retention", "run", "--dry-run", "--database-url", db_url]) == 0
    assert json.loads(capsys.readouterr().out) == {"dry_run": True, "runs": 0, "checkpoints": 0, "ledger": 0,
                                                   "journal": 0, "outbox": 0, "signals": 0, "batches": 1}
    assert main(["retention", "set", "--tenant", "acme", "--keep-days", "0", "--database-url", db_url]) == 1
    assert capsys.readouterr().err.strip() == "agentrt retention: error: --keep-days: must be between 1 and 36500"
    assert main(["retention", "clear", "--tenant", "acme", "--database-url", db_url]) == 0
    assert main(["retention", "clear", "--tenant", "acme", "--database-url", db_url]) == 1
    assert "no retention policy for tenant acme" in capsys.readouterr().err


async def test_pending_events_piling_up_do_not_make_each_batch_scan_them(db_url, db):
    """Each run's unpublished events are probed through outbox_run_idx, never by a walk of every
    pending row (the pending partial index, which stale statistics would make look cheapest)."""
    for _ in range(3):
        await add_run(db)
    await db.execute("ANALYZE outbox")  # statistics from before the pile-up: no pending row
    live = await add_run(db, status="QUEUED", published=0)
    await db.execute(
        """INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload)
           SELECT gen_random_uuid(), $1, 't1', 'agent.x', '{}' FROM generate_series(1, 3000)""", live)
    plans: list[str] = []
    db.add_log_listener(lambda _conn, message: plans.append(message.message))
    await db.execute("LOAD 'auto_explain'")
    await db.execute("SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on; "
                     "SET auto_explain.log_level = notice; SET client_min_messages = notice")
    row = await db.fetchrow("SELECT * FROM agentrt_retention_purge(10, true, NULL, NULL)")
    await db.execute("RESET client_min_messages")
    assert row["runs"] == 3
    page = [plan for plan in plans if "WITH page AS" in plan]
    assert page and "outbox_run_idx" in page[0] and "outbox_pending_idx" not in page[0], page
