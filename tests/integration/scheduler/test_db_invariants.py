"""The schema itself refuses the reference design's bad states (sections 3.2 and 4).

These tests bypass the scheduler and write SQL directly: whatever code has a
bug, PostgreSQL must still refuse a lease on a QUEUED run, a RUNNING run
without a lease, a terminal run without a finish time, a closed ledger row
without a completion time, and so on. They also cover the migrator: re-running
is a no-op, a newer schema is refused untouched, and concurrent migrators
apply each version exactly once.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from scheduler.store.migrate import MIGRATION_LOCK_KEY, Migration, available_migrations, migrate
from shared.db import load_queries
from shared.errors import SchemaMismatch

pytestmark = pytest.mark.integration

HASH = hashlib.sha256(b"x").digest()
NOW = "clock_timestamp()"  # marker: use the database clock for this column
SQL_DIR = Path(__file__).resolve().parents[3] / "scheduler" / "sql"


async def insert(db: asyncpg.Connection, table: str, **values: Any) -> None:
    """INSERT one row; values equal to NOW become clock_timestamp() in the SQL."""
    columns, params, args = [], [], []
    for column, value in values.items():
        columns.append(column)
        if value == NOW:
            params.append(NOW)
        else:
            args.append(value)
            params.append(f"${len(args)}")
    await db.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(params)})", *args)


def run_row(run_id: uuid.UUID, **overrides: Any) -> dict[str, Any]:
    """A valid QUEUED run, with overrides."""
    return {"id": run_id, "tenant_id": "t", "agent_name": "demo", **overrides}


LEASE = {"lease_owner": "w1", "lease_expires_at": NOW}


def execution_row(run_id: uuid.UUID, **overrides: Any) -> dict[str, Any]:
    """A valid OUTBOUND_INTENT ledger row, with overrides."""
    return {"id": uuid.uuid4(), "run_id": run_id, "step_key": "s1", "tool_name": "tool", "idempotency_key": "k1",
            "request_json": {"a": 1}, "request_hash": HASH, "status": "OUTBOUND_INTENT", "fencing_token": 1,
            "intent_event_id": uuid.uuid4(), **overrides}


def checkpoint_row(run_id: uuid.UUID, **overrides: Any) -> dict[str, Any]:
    """A valid checkpoint, with overrides."""
    return {"run_id": run_id, "version": 1, "state_json": {"cursor": 1}, "state_hash": HASH, "schema_version": 1,
            "fencing_token": 1, "event_id": uuid.uuid4(), **overrides}


@pytest.fixture
async def run_id(db: asyncpg.Connection) -> uuid.UUID:
    """One valid run to hang checkpoints and ledger rows on."""
    rid = uuid.uuid4()
    await insert(db, "agent_runs", **run_row(rid, status="RUNNING", **LEASE))
    return rid


# (case id, agent_runs overrides, constraint that must refuse it)
BAD_RUNS = [
    ("lease on QUEUED", {"status": "QUEUED", **LEASE}, "lease_only_when_leased_status"),
    ("RUNNING without lease", {"status": "RUNNING"}, "lease_only_when_leased_status"),
    ("WAITING_TOOL without lease", {"status": "WAITING_TOOL"}, "lease_only_when_leased_status"),
    ("lease on PAUSED_INDOUBT", {"status": "PAUSED_INDOUBT", **LEASE}, "lease_only_when_leased_status"),
    ("lease on PAUSED_HUMAN", {"status": "PAUSED_HUMAN", **LEASE}, "lease_only_when_leased_status"),
    ("lease on COMPLETED", {"status": "COMPLETED", "finished_at": NOW, **LEASE}, "lease_only_when_leased_status"),
    ("lease_owner without expiry", {"status": "RUNNING", "lease_owner": "w1"}, "lease_owner_with_expiry"),
    ("lease expiry without owner", {"status": "QUEUED", "lease_expires_at": NOW}, "lease_owner_with_expiry"),
    ("COMPLETED without finished_at", {"status": "COMPLETED"}, "finished_only_when_terminal"),
    ("FAILED without finished_at", {"status": "FAILED"}, "finished_only_when_terminal"),
    ("finished_at on QUEUED", {"finished_at": NOW}, "finished_only_when_terminal"),
    ("finished_at on RUNNING", {"status": "RUNNING", "finished_at": NOW, **LEASE}, "finished_only_when_terminal"),
    ("finished_at on PAUSED_HUMAN", {"status": "PAUSED_HUMAN", "finished_at": NOW}, "finished_only_when_terminal"),
    ("unknown status", {"status": "DONE"}, "agent_runs_status_check"),
    ("negative version", {"version": -1}, "agent_runs_version_check"),
    ("negative fencing token", {"fencing_token": -1}, "agent_runs_fencing_token_check"),
    ("max_attempts 0", {"max_attempts": 0}, "agent_runs_max_attempts_check"),
    ("input not an object", {"input": [1, 2]}, "agent_runs_input_check"),
    ("client_request_id without hash", {"client_request_id": "c1"}, "client_request_id_with_hash"),
    ("negative attempt count", {"attempt_count": -1}, "agent_runs_attempt_count_check"),
    ("negative spawn depth", {"spawn_depth": -1}, "agent_runs_spawn_depth_check"),
    ("unknown join mode", {"join_mode": "SOME"}, "agent_runs_join_mode_check"),
    ("unknown wait reason", {"waiting_on": "moon"}, "agent_runs_waiting_on_check"),
    ("a root run with a spawn depth", {"spawn_depth": 1}, "root_only_for_children"),
    ("a root with a root", {"root_run_id": uuid.UUID(int=1)}, "root_only_for_children"),
    # Two checks fail: the first by constraint name is reported, as PostgreSQL orders CHECKs.
    ("unknown status and negative fencing token", {"status": "DONE", "fencing_token": -1},
     "agent_runs_fencing_token_check"),
    # A CHECK left in place (its column is set by every step) is tested before the trigger's checks.
    ("negative version and unknown status", {"version": -1, "status": "DONE"}, "agent_runs_version_check"),
]


@pytest.mark.parametrize(("overrides", "constraint"), [c[1:] for c in BAD_RUNS], ids=[c[0] for c in BAD_RUNS])
async def test_bad_run_rows_are_refused(db, overrides, constraint):
    with pytest.raises(asyncpg.CheckViolationError) as refused:
        await insert(db, "agent_runs", **run_row(uuid.uuid4(), **overrides))
    assert refused.value.constraint_name == constraint
    assert await db.fetchval("SELECT count(*) FROM agent_runs") == 0


# (case id, UPDATE ... SET of a valid leased RUNNING run, constraint that must refuse it)
BAD_RUN_UPDATES = [
    ("back to QUEUED keeping the lease", "status = 'QUEUED'", "lease_only_when_leased_status"),
    ("pause keeping the lease", "status = 'PAUSED_INDOUBT'", "lease_only_when_leased_status"),
    ("drop the lease while RUNNING", "lease_owner = NULL, lease_expires_at = NULL", "lease_only_when_leased_status"),
    ("drop only the expiry", "lease_expires_at = NULL", "lease_owner_with_expiry"),
    ("complete without finish time", "status = 'COMPLETED', lease_owner = NULL, lease_expires_at = NULL",
     "finished_only_when_terminal"),
    ("a version below zero", "version = -1", "agent_runs_version_check"),
    ("an unknown status", "status = 'DONE'", "agent_runs_status_check"),
    ("an unknown wait reason", "waiting_on = 'moon'", "agent_runs_waiting_on_check"),
]


@pytest.mark.parametrize(("assignment", "constraint"), [c[1:] for c in BAD_RUN_UPDATES],
                         ids=[c[0] for c in BAD_RUN_UPDATES])
async def test_bad_run_updates_are_refused(db, run_id, assignment, constraint):
    before = await db.fetchrow("SELECT * FROM agent_runs WHERE id = $1", run_id)
    with pytest.raises(asyncpg.CheckViolationError) as refused:
        await db.execute(f"UPDATE agent_runs SET {assignment} WHERE id = $1", run_id)
    assert refused.value.constraint_name == constraint
    assert await db.fetchrow("SELECT * FROM agent_runs WHERE id = $1", run_id) == before


# The checks on the fields a submit fixes (migration 0022): one AFTER trigger that fires on INSERT and on an
# UPDATE setting one of them, refusing as the CHECK constraints it replaced did (SQLSTATE 23514, same name).
# (case id, the bad value(s), constraint that must refuse it)
FIXED_FIELD_CHECKS = [
    ("empty agent name", {"agent_name": ""}, "agent_runs_agent_name_check"),
    ("agent name of 201 characters", {"agent_name": "a" * 201}, "agent_runs_agent_name_check"),
    ("negative cost budget", {"budget_max_cost_usd": -0.5}, "agent_runs_budget_max_cost_usd_check"),
    ("negative step budget", {"budget_max_steps": -1}, "agent_runs_budget_max_steps_check"),
    ("negative token budget", {"budget_max_tokens": -1}, "agent_runs_budget_max_tokens_check"),
    ("concurrency key of 501 characters", {"concurrency_key": "k" * 501, "concurrency_max": 1},
     "agent_runs_concurrency_key_check"),
    ("concurrency max 0", {"concurrency_key": "k", "concurrency_max": 0}, "agent_runs_concurrency_max_check"),
    ("input not an object", {"input": [1, 2]}, "agent_runs_input_check"),
    ("labels not an object", {"labels": "x"}, "agent_runs_labels_check"),
    ("priority 0", {"priority": 0}, "agent_runs_priority_check"),
    ("priority 10", {"priority": 10}, "agent_runs_priority_check"),
    ("empty tenant", {"tenant_id": ""}, "agent_runs_tenant_id_check"),
    ("tenant of 129 characters", {"tenant_id": "t" * 129}, "agent_runs_tenant_id_check"),
    ("spawn key without parent", {"spawn_key": "c1"}, "child_fields_together"),
    ("spawn index without parent", {"spawn_index": 0}, "child_fields_together"),
    ("client_request_id without hash", {"client_request_id": "c1"}, "client_request_id_with_hash"),
    ("hash without client_request_id", {"submit_hash": HASH}, "client_request_id_with_hash"),
    ("concurrency key without max", {"concurrency_key": "k"}, "concurrency_key_with_max"),
    ("concurrency max without key", {"concurrency_max": 2}, "concurrency_key_with_max"),
]


@pytest.mark.parametrize(("bad", "constraint"), [c[1:] for c in FIXED_FIELD_CHECKS],
                         ids=[c[0] for c in FIXED_FIELD_CHECKS])
async def test_a_bad_fixed_field_is_refused_on_insert_and_on_update(db, run_id, bad, constraint):
    with pytest.raises(asyncpg.CheckViolationError) as refused:
        await insert(db, "agent_runs", **run_row(uuid.uuid4(), **bad))
    assert refused.value.constraint_name == constraint
    assert await db.fetchval("SELECT count(*) FROM agent_runs") == 1  # the fixture's run only
    before = await db.fetchrow("SELECT * FROM agent_runs WHERE id = $1", run_id)
    assignment = ", ".join(f"{column} = ${n}" for n, column in enumerate(bad, start=2))
    with pytest.raises(asyncpg.CheckViolationError) as refused:
        await db.execute(f"UPDATE agent_runs SET {assignment} WHERE id = $1", run_id, *bad.values())
    assert refused.value.constraint_name == constraint
    assert await db.fetchrow("SELECT * FROM agent_runs WHERE id = $1", run_id) == before


_UPDATES = re.compile(r"UPDATE\s+(\w+)\b(?:\s+(?:AS\s+)?\w+)?\s+SET\s+(.*?)(?:\bFROM\b|\bWHERE\b|\bRETURNING\b)",
                      re.S | re.I)


def columns_set(sql: str, table: str) -> set[str]:
    """The columns of `table` that the UPDATE statements in `sql` set."""
    return {column for target, assignments in _UPDATES.findall(sql) if target == table
            for column in re.findall(r"(?:^|,)\s*(\w+)\s*=", assignments)}


def columns_updated_by_statements() -> set[str]:
    """Every agent_runs column an UPDATE statement of the scheduler's SQL (queries, maintenance, functions) sets."""
    return {column for path in [*SQL_DIR.glob("*.sql"), *SQL_DIR.glob("migrations/*.sql")]
            for column in columns_set(path.read_text(), "agent_runs")}


# Tx2 of one call and Tx1 of the next in one statement: nearly every step of a busy run.
CHAINED_STEP = "complete_and_begin_tool_call"
# CHECKs a step's UPDATE pays for without setting their columns, each with the reason it stays.
CHECKS_KEPT = {
    "tool_executions_request_hash_check": "the chained step inserts a ledger row too, where a trigger costs more",
}
# The checks of agent_runs that live in triggers (migrations 0022 and 0023): trigger name -> its refusal cases.
CHECK_TRIGGERS = {"agent_runs_check_fixed_fields": "FIXED_FIELD_CHECKS", "agent_runs_check_current_state": "BAD_RUNS"}


async def check_trigger(db: asyncpg.Connection, name: str) -> tuple[list[str], set[str], set[str], bool]:
    """(constraint names in test order, columns the function reads, columns the trigger fires on, fires on INSERT)."""
    row = await db.fetchrow(
        """SELECT p.prosrc, (t.tgtype & 4) <> 0 AS on_insert,
                  ARRAY(SELECT a.attname::text FROM pg_attribute a
                         WHERE a.attrelid = t.tgrelid AND a.attnum = ANY (t.tgattr)) AS fires_on
             FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid WHERE t.tgname = $1""", name)
    return (re.findall(r"THEN '(\w+)'", row["prosrc"]), set(re.findall(r"NEW\.(\w+)", row["prosrc"])),
            set(row["fires_on"]), row["on_insert"])


async def test_each_check_trigger_fires_where_its_checks_could_fail_and_names_every_refusal(db):
    """Migrations 0022 and 0023 moved checks of agent_runs into AFTER triggers. Each fires on INSERT and on an
    UPDATE of every column its checks read, tests in constraint-name order (PostgreSQL's order for CHECKs, so
    a row failing two is refused as before), and every name it refuses with has a refusal case above. The
    fixed fields are set by no statement after the submit; the state checks fire on no column the chained
    step sets, which is what they were moved for."""
    updated = columns_updated_by_statements()
    assert {"status", "version", "lease_owner", "fencing_token"} <= updated  # the parse found the work path
    chained = columns_set(str(load_queries(SQL_DIR / "queries.sql")[CHAINED_STEP]), "agent_runs")
    assert {"version", "journal_length"} <= chained
    cases = {"FIXED_FIELD_CHECKS": FIXED_FIELD_CHECKS, "BAD_RUNS": [*BAD_RUNS, *BAD_RUN_UPDATES]}
    for trigger, refusals in CHECK_TRIGGERS.items():
        named, read, fires_on, on_insert = await check_trigger(db, trigger)
        assert on_insert, trigger
        assert read == fires_on, f"{trigger} must fire on an UPDATE of every column its checks read"
        assert named == sorted(named), f"{trigger} must test in constraint-name order"
        assert not set(named) - {case[-1] for case in cases[refusals]}, f"{trigger}: a check without a case"
        assert not fires_on & chained, f"{trigger} fires on the chained step: {sorted(fires_on & chained)}"
        if trigger == "agent_runs_check_fixed_fields":
            assert set(named) == {case[2] for case in FIXED_FIELD_CHECKS}
            assert not read & updated, f"fixed fields that a statement updates: {sorted(read & updated)}"


async def test_every_check_the_chained_step_pays_for_reads_a_column_it_sets(db):
    """The class behind migrations 0022 and 0023: PostgreSQL reads back, prepares and evaluates every CHECK of a
    table on every UPDATE, whichever columns it sets. Every CHECK left on a table that the chained step (Tx2 of
    one call and Tx1 of the next, nearly every step of a busy run) updates reads a column it sets, or is kept
    with its reason in CHECKS_KEPT."""
    sql = str(load_queries(SQL_DIR / "queries.sql")[CHAINED_STEP])
    tables = set(re.findall(r"\bUPDATE\s+(\w+)", sql, re.I))
    assert {"agent_runs", "tool_executions"} <= tables
    checks = await db.fetch(
        """SELECT c.conrelid::regclass::text AS relation, c.conname,
                  ARRAY(SELECT a.attname::text FROM pg_attribute a
                         WHERE a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)) AS columns
             FROM pg_constraint c WHERE c.contype = 'c' AND c.conrelid::regclass::text = ANY ($1::text[])""",
        sorted(tables))
    assert {"agent_runs_version_check", "completed_when_closed"} <= {check["conname"] for check in checks}
    for check in checks:
        if check["conname"] in CHECKS_KEPT:
            continue
        assert columns_set(sql, check["relation"]) & set(check["columns"]), (
            f"{check['conname']} reads {check['columns']}, which the chained step does not set: every step's "
            f"UPDATE of {check['relation']} pays for it; move it into a trigger that fires on those columns")
    assert set(CHECKS_KEPT) <= {check["conname"] for check in checks}, "a reason kept for a check that is gone"


async def test_no_check_the_chained_step_pays_for_spells_its_values_one_constant_each(db):
    """Migration 0024: each statement reads a CHECK back from its node text and prepares it again, and
    `x IN ('a', 'b')` is stored as an ARRAY of one Const per value (built again at each evaluation). The checks
    of every table the chained step writes list their values as one array constant instead."""
    sql = str(load_queries(SQL_DIR / "queries.sql")[CHAINED_STEP])
    tables = set(re.findall(r"\b(?:INSERT\s+INTO|UPDATE)\s+(\w+)", sql, re.I))
    assert {"agent_runs", "tool_executions", "run_journal", "agent_checkpoints", "outbox"} <= tables
    checks = await db.fetch(
        """SELECT conname, pg_get_constraintdef(oid) AS definition FROM pg_constraint
            WHERE contype = 'c' AND conrelid::regclass::text = ANY ($1::text[])""", sorted(tables))
    assert {"run_journal_kind_check", "tool_executions_status_check"} <= {check["conname"] for check in checks}
    spelled = [check["conname"] for check in checks if "ARRAY[" in check["definition"]]
    assert not spelled, f"write these lists as one constant, '{{a,b}}'::text[]: {spelled}"


async def test_valid_rows_are_accepted(db, run_id):
    """The helpers' rows are valid, so every refusal above is due to its one bad column."""
    await insert(db, "agent_runs", **run_row(uuid.uuid4()))
    await insert(db, "agent_runs", **run_row(uuid.uuid4(), status="WAITING_TOOL", **LEASE))
    await insert(db, "agent_runs", **run_row(uuid.uuid4(), status="COMPLETED", finished_at=NOW))
    await insert(db, "agent_runs", **run_row(uuid.uuid4(), status="PAUSED_INDOUBT"))
    await insert(db, "tool_executions", **execution_row(run_id))
    await insert(db, "tool_executions", **execution_row(run_id, step_key="s2", idempotency_key="k2",
                                                        status="SUCCEEDED", completed_at=NOW))
    await insert(db, "tool_executions", **execution_row(run_id, step_key="s3", idempotency_key="k3",
                                                        status="NOT_EXECUTED", completed_at=NOW,
                                                        reconciliation_evidence={"lookup": "absent"}))
    await insert(db, "agent_checkpoints", **checkpoint_row(run_id))
    assert await db.fetchval("SELECT count(*) FROM agent_runs") == 5


# (case id, tool_executions overrides, constraint that must refuse it)
BAD_EXECUTIONS = [
    ("SUCCEEDED without completed_at", {"status": "SUCCEEDED"}, "completed_when_closed"),
    ("FAILED without completed_at", {"status": "FAILED"}, "completed_when_closed"),
    ("NOT_EXECUTED without completed_at", {"status": "NOT_EXECUTED", "reconciliation_evidence": {"e": 1}},
     "completed_when_closed"),
    ("OUTBOUND_INTENT with completed_at", {"completed_at": NOW}, "completed_when_closed"),
    ("IN_DOUBT with completed_at", {"status": "IN_DOUBT", "completed_at": NOW}, "completed_when_closed"),
    ("NOT_EXECUTED without evidence", {"status": "NOT_EXECUTED", "completed_at": NOW}, "not_executed_has_evidence"),
    ("unknown status", {"status": "DONE"}, "tool_executions_status_check"),
    ("short request hash", {"request_hash": b"\x00" * 8}, "tool_executions_request_hash_check"),
]


@pytest.mark.parametrize(("overrides", "constraint"), [c[1:] for c in BAD_EXECUTIONS],
                         ids=[c[0] for c in BAD_EXECUTIONS])
async def test_bad_ledger_rows_are_refused(db, run_id, overrides, constraint):
    with pytest.raises(asyncpg.CheckViolationError) as refused:
        await insert(db, "tool_executions", **execution_row(run_id, **overrides))
    assert refused.value.constraint_name == constraint
    assert await db.fetchval("SELECT count(*) FROM tool_executions") == 0


@pytest.mark.parametrize(("duplicate", "constraint"), [
    ({"idempotency_key": "other"}, "tool_executions_run_id_step_key_key"),
    ({"step_key": "other"}, "tool_executions_tool_name_idempotency_key_key"),
], ids=["same (run_id, step_key)", "same (tool_name, idempotency_key)"])
async def test_duplicate_ledger_keys_are_refused(db, run_id, duplicate, constraint):
    await insert(db, "tool_executions", **execution_row(run_id))
    with pytest.raises(asyncpg.UniqueViolationError) as refused:
        await insert(db, "tool_executions", **execution_row(run_id, **duplicate))
    assert refused.value.constraint_name == constraint
    assert await db.fetchval("SELECT count(*) FROM tool_executions") == 1


async def test_closing_a_ledger_row_without_completion_time_is_refused(db, run_id):
    await insert(db, "tool_executions", **execution_row(run_id))
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute("UPDATE tool_executions SET status = 'SUCCEEDED' WHERE run_id = $1", run_id)
    assert await db.fetchval("SELECT status FROM tool_executions") == "OUTBOUND_INTENT"


BAD_CHECKPOINTS = [
    ("version 0", {"version": 0}, "agent_checkpoints_version_check"),
    ("negative version", {"version": -3}, "agent_checkpoints_version_check"),
    ("state is an array", {"state_json": [1, 2]}, "agent_checkpoints_state_json_check"),
    ("state is a string", {"state_json": "state"}, "agent_checkpoints_state_json_check"),
    ("state is a number", {"state_json": 7}, "agent_checkpoints_state_json_check"),
    ("state hash not SHA-256", {"state_hash": b"\x01"}, "agent_checkpoints_state_hash_check"),
    ("schema_version 0", {"schema_version": 0}, "agent_checkpoints_schema_version_check"),
]


@pytest.mark.parametrize(("overrides", "constraint"), [c[1:] for c in BAD_CHECKPOINTS],
                         ids=[c[0] for c in BAD_CHECKPOINTS])
async def test_bad_checkpoints_are_refused(db, run_id, overrides, constraint):
    with pytest.raises(asyncpg.CheckViolationError) as refused:
        await insert(db, "agent_checkpoints", **checkpoint_row(run_id, **overrides))
    assert refused.value.constraint_name == constraint
    assert await db.fetchval("SELECT count(*) FROM agent_checkpoints") == 0


def journal_row(run_id: uuid.UUID, **overrides: Any) -> dict[str, Any]:
    """A valid journal entry, with overrides."""
    return {"run_id": run_id, "seq": 1, "kind": "tool", "detail": {"ok": True}, "fencing_token": 1, "run_version": 1,
            **overrides}


BAD_JOURNAL = [
    ("detail is an array", {"detail": [1]}, "run_journal_detail_check"),
    ("unknown kind", {"kind": "dream"}, "run_journal_kind_check"),
    ("seq 0", {"seq": 0}, "run_journal_seq_check"),
    ("unknown kind and seq 0", {"kind": "dream", "seq": 0}, "run_journal_kind_check"),
]


@pytest.mark.parametrize(("overrides", "constraint"), [c[1:] for c in BAD_JOURNAL], ids=[c[0] for c in BAD_JOURNAL])
async def test_bad_journal_entries_are_refused_on_insert_and_on_update(db, run_id, overrides, constraint):
    with pytest.raises(asyncpg.CheckViolationError) as refused:
        await insert(db, "run_journal", **journal_row(run_id, **overrides))
    assert refused.value.constraint_name == constraint
    assert await db.fetchval("SELECT count(*) FROM run_journal") == 0
    await insert(db, "run_journal", **journal_row(run_id))
    assignment = ", ".join(f"{column} = ${n}" for n, column in enumerate(overrides, start=2))
    with pytest.raises(asyncpg.CheckViolationError) as refused:
        await db.execute(f"UPDATE run_journal SET {assignment} WHERE run_id = $1", run_id, *overrides.values())
    assert refused.value.constraint_name == constraint
    assert await db.fetchval("SELECT kind FROM run_journal WHERE run_id = $1 AND seq = 1", run_id) == "tool"


async def test_duplicate_checkpoint_version_is_refused(db, run_id):
    await insert(db, "agent_checkpoints", **checkpoint_row(run_id))
    with pytest.raises(asyncpg.UniqueViolationError):
        await insert(db, "agent_checkpoints", **checkpoint_row(run_id))


# ---------------------------------------------------------------------- migrations


async def catalog(conn: asyncpg.Connection) -> list[tuple[Any, ...]]:
    """Every table, column, constraint and index in the public schema."""
    rows = await conn.fetch(
        """SELECT 'column', table_name::text, column_name::text, data_type::text FROM information_schema.columns
             WHERE table_schema = 'public'
           UNION ALL
           SELECT 'constraint', conrelid::regclass::text, conname::text, pg_get_constraintdef(oid)
             FROM pg_constraint WHERE connamespace = 'public'::regnamespace
           UNION ALL
           SELECT 'index', tablename::text, indexname::text, indexdef FROM pg_indexes WHERE schemaname = 'public'
           ORDER BY 1, 2, 3""")
    return [tuple(row) for row in rows]


async def applied(conn: asyncpg.Connection) -> list[tuple[Any, ...]]:
    rows = await conn.fetch("SELECT version, name, checksum, applied_at FROM schema_migrations ORDER BY version")
    return [tuple(row) for row in rows]


async def test_migrate_is_idempotent(db):
    before_catalog, before_applied = await catalog(db), await applied(db)
    assert [row[0] for row in before_applied] == [m.version for m in available_migrations()]
    assert await migrate(db) == []
    assert await migrate(db) == []
    assert await catalog(db) == before_catalog
    assert await applied(db) == before_applied


async def test_migrate_refuses_a_newer_schema_and_changes_nothing(db):
    await db.execute("INSERT INTO schema_migrations (version, name, checksum) VALUES (999, 'future', 'x')")
    before_catalog, before_applied = await catalog(db), await applied(db)
    # A pending migration this build would apply, were the database not newer than it.
    pending = Migration(len(available_migrations()) + 1, "pending", "CREATE TABLE must_not_exist (id int)")
    with pytest.raises(SchemaMismatch) as refused:
        await migrate(db, [*available_migrations(), pending])
    assert refused.value.metadata["database_version"] == "999"
    assert await catalog(db) == before_catalog
    assert await applied(db) == before_applied
    assert await db.fetchval("SELECT to_regclass('must_not_exist')") is None


async def _wait_for(predicate, what: str, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_concurrent_migrators_apply_each_version_once(pg_server_url):
    base = pg_server_url.rpartition("/")[0]
    name = f"agentrt_mig_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_server_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    conns: list[asyncpg.Connection] = []
    try:
        conns = [await asyncpg.connect(f"{base}/{name}") for _ in range(3)]
        gate, first, second = conns
        migrations = [*available_migrations(),
                      Migration(len(available_migrations()) + 1, "extra", "CREATE TABLE extra (id int)")]
        # Hold the migration lock so both migrators are provably waiting at the same time.
        await gate.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        tasks = [asyncio.create_task(migrate(conn, migrations)) for conn in (first, second)]

        async def both_waiting() -> bool:
            return await gate.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())") == 2

        await _wait_for(both_waiting, "both migrators to wait on the advisory lock")
        await gate.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
        results = await asyncio.gather(*tasks)
        assert sorted(results, key=len) == [[], [m.version for m in migrations]]
        rows = await first.fetch("SELECT version, name FROM schema_migrations ORDER BY version")
        assert [(r["version"], r["name"]) for r in rows] == [(m.version, m.name) for m in migrations]
        assert await first.fetchval("SELECT to_regclass('agent_runs') IS NOT NULL")
    finally:
        for conn in conns:
            await conn.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
