"""Row-level security (migration 0016), exercised as the runtime scheduler role: never the owner,
never a superuser (both would bypass or own the policies).

Tenant B's rows are made through a scheduler connected as the scheduler role. Then every
statement of RunService's side of the store (every named query store/runs.py, store/schedules.py,
store/recovery.py and store/core.py use, less the background tasks' and the key tables') is run with
tenant A's setting, and with no setting at all, but with B's ids and B's tenant as its
parameters: what an application bug would pass. Reads return nothing of B's, writes are refused by
a policy or change nothing, and a superuser's snapshot of the database is the same afterwards.
"""

from __future__ import annotations

import io
import json
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from support import Stack, claim, eid, lease_ref, scheduler_stack, submit, tool_state
from test_db_roles import PREFIX, SETTINGS, as_role, connect

from scheduler.config import SchedulerSettings
from scheduler.server import SchedulerServer
from scheduler.store import RunFilter, connect_pool
from scheduler.store.core import WORK_SCOPE
from scheduler.store.database_roles import apply_roles
from scheduler.store.queries import Q
from scheduler.store.schedules import ScheduleSpec
from scheduler.store.types import AuditEntry
from shared.db import Query
from shared.errors import NotFound
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
A, B = "tenant-a", "tenant-b"
STEP, TOOL, REQUEST = "label.create/attempt-1", "shipping.create_label", {"order": 17}
RLS_TABLES = {"agent_runs", "agent_checkpoints", "tool_executions", "run_journal", "outbox", "outbox_parked",
              "run_signals", "agent_schedules", "audit_log", "run_data_keys",
              # operator settings, some of them one tenant's (0019)
              "flow_limits", "retention_policies"}
# Tables without a tenant's rows: the schema's, the relay's shard bookkeeping, counters, the
# registry (every tenant's agents), consumer dedupe ids and API keys (looked up before a call has
# a tenant; their hashes are the scheduler's alone: db_roles.RLS_EXEMPT_TABLES says why).
NOT_TENANT_TABLES = {"schema_migrations", "relay_config", "relay_shards", "relay_members", "runtime_counters",
                     "agent_registry", "consumed_events", "api_keys"}
# Policies for the admin scope alone (0019: operator settings are written there only).
ADMIN_ONLY_POLICIES = {"flow_limits_admin", "retention_policies_admin"}
# SECURITY DEFINER functions, each read and checked: it decides by itself what it may touch.
CHECKED_SECURITY_DEFINER = {
    # 0012: deletes expired terminal runs with their children; the caller picks only batch size and
    # position; search_path pinned; EXECUTE for the scheduler role alone; work scope (0016).
    "agentrt_retention_purge",
}
# Functions that enter the work scope for their own statements (SET agentrt.scope in their definition).
CHECKED_WORK_SCOPE = {
    "agentrt_retention_purge",
    # 0019: every tenant's runtime limits (a handful of operator settings), for each replica's overlay;
    # EXECUTE revoked from PUBLIC, granted to the scheduler role alone.
    "agentrt_flow_limits",
    # 0016: one number, the fair-share ready head over every tenant, for a submit's pass.
    "agentrt_fair_head",
}
# Queries of RunService's modules that are not RunService's: background tasks (work pool), the
# registry, the key table, the tenant setting itself, and statements with no table of tenant rows.
NOT_RUN_SERVICE = {
    "global_stats", "db_health_server", "db_health_tables", "db_slow_statements", "prune_checkpoints",
    "retention_purge", "list_retention_policies", "set_retention_policy", "clear_retention_policy",
    "get_counter", "bump_counter", "lock_due_schedule", "record_fire", "live_versions", "notify_work",
    "server_now", "primary_probe", "database_epoch", "set_scope", "set_tenant", "lock_tenant_submits", "api_key_by_id",
    "api_key_for_auth", "insert_api_key", "list_api_keys", "revoke_api_key",
    # WorkService.SpawnChildren (work pool, fenced by the parent's lease)
    "lock_spawning_parent", "spawn_child", "record_join", "spawn_group", "lock_spawn_tree", "tree_descendants",
    # runtime limits (flow_limits: operator settings, no tenant's rows)
    "list_flow_limits", "lock_flow_limit", "set_flow_limit", "clear_flow_limit",
}
STORE_MODULES = ("store/runs.py", "store/schedules.py", "store/recovery.py", "store/core.py", "store/auth.py",
                 "store/children.py", "store/limits.py")


def run_service_queries() -> list[str]:
    names: set[str] = set()
    for module in STORE_MODULES:
        names |= set(re.findall(r"\bQ\.(\w+)", (ROOT / "scheduler" / module).read_text()))
    return sorted(name for name in names - NOT_RUN_SERVICE if hasattr(Q, name))  # not a docstring's `Q.x`


@pytest.fixture
async def stack(db_url: str, db: asyncpg.Connection) -> AsyncIterator[Stack]:
    await apply_roles(db, SETTINGS)
    async with scheduler_stack(as_role(db_url, "scheduler")) as running:
        yield running


@pytest.fixture
async def role_pool(db_url: str, stack: Stack) -> AsyncIterator[asyncpg.Pool]:
    """RunService's kind of pool as the scheduler role: no scope."""
    pool = await connect_pool(as_role(db_url, "scheduler"), min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()


async def tenant_b_rows(stack: Stack, db: asyncpg.Connection) -> dict[str, Any]:
    """A run of tenant B with a checkpoint, a ledger row, events, a journal entry, a signal, a
    schedule and an audit row; and a run of tenant A (A must still see its own)."""
    mine = await submit(stack, tenant=A, client_request_id="a-1")
    run = await submit(stack, tenant=B, client_request_id="b-1")
    lease = await claim(stack)
    assert lease is not None and lease.run.run_id == mine.run_id  # A's was first
    await stack.work.FinishRun(ws.FinishRunRequest(lease=lease_ref(lease), expected_version=0,
                                                   outcome=ws.FINISH_OUTCOME_COMPLETED, event_id=eid()))
    lease = await claim(stack)
    assert lease is not None and lease.run.run_id == run.run_id
    ref = lease_ref(lease)
    saved = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=ref, expected_version=0, state_json=json.dumps(tool_state(STEP, TOOL, REQUEST)), schema_version=1,
        step_key=STEP, event_id=eid()))
    await stack.work.BeginToolCall(ws.BeginToolCallRequest(
        lease=ref, expected_version=saved.version, step_key=STEP, tool_name=TOOL, idempotency_key="idem-b",
        request_json=json.dumps(REQUEST), execution_id=eid(), event_id=eid()))
    await stack.runs.SignalRun(rs.SignalRunRequest(run_id=run.run_id, name="go", payload_json="{}",
                                                   request_id="sig-b"), metadata=stack.md(B))
    store = stack.server.store
    schedule, _ = await store.schedules.create_schedule(B, "nightly", ScheduleSpec(
        agent_name="demo", agent_version="", input={}, labels={}, interval_ms=3_600_000, cron=None,
        time_zone="UTC", overlap="SKIP", catch_up_window_ms=0, jitter_ms=0),
        AuditEntry(principal="ops", principal_kind="local"))
    run_id = uuid.UUID(run.run_id)
    await db.execute(Q["append_journal_entry"], run_id, 1, "result", STEP, "", TOOL, {}, lease.run.fencing_token,
                     saved.version)
    await store.runs.record_export(B, run_id, parts=frozenset({"checkpoints"}),
                                   audit=AuditEntry(principal="ops", principal_kind="local"))
    event_id = await db.fetchval("SELECT event_id FROM outbox WHERE run_id = $1 ORDER BY id DESC LIMIT 1", run_id)
    return {"run_id": run_id, "a_run_id": uuid.UUID(mine.run_id), "schedule_id": schedule["id"],
            "event_id": event_id, "fencing_token": lease.run.fencing_token}


def b_params(b: dict[str, Any], query: Query) -> dict[str, Any]:
    """Parameters naming tenant B's rows (fresh ids where a statement inserts)."""
    zero = b"\0" * 32
    values: dict[str, Any] = {
        "run_id": b["run_id"], "tenant_id": B, "event_id": b["event_id"], "id": b["schedule_id"],
        "step_key": STEP, "request_id": "sig-b", "client_request_id": "b-1", "name": "nightly",
        "seq": 2, "kind": "result", "node": "", "tool": TOOL, "detail": {}, "fencing_token": b["fencing_token"],
        "run_version": 9, "status": "CANCELLED", "reason": "x", "cancel": True, "cancel_reason": "x",
        "response": {}, "remote_resource_id": None, "error_code": None, "evidence": {}, "resolved_by": "x",
        "version": 9, "journal_added": 0, "human_input": {}, "after_version": 0, "after_seq": 0, "limit": 100,
        "after_at": None, "after_id": None, "statuses": None, "agent_name": "demo", "after_created_at": None,
        "paused": True, "next_fire_at": None, "due_at": None, "state": {}, "state_hash": zero,
        "schema_version": 1, "signal_id": uuid.uuid4(), "payload": {}, "request_hash": zero, "seqs": [1, 2],
        "max_rate": 10, "max_queued": 10, "agent_version": "", "input": {}, "labels": {}, "max_attempts": 3,
        "max_steps": 0, "max_tokens": 0, "max_cost_usd": 0.0, "deadline_at": None, "submit_hash": zero,
        "priority": 0, "concurrency_key": None, "concurrency_max": None, "fair_step": 1.0, "traceparent": None,
        "tracestate": None, "event_type": "agent.evil", "write_op": None, "write_hash": None,
        "interval_ms": 1000, "cron": None, "time_zone": "UTC", "overlap": "SKIP", "catch_up_window_ms": 0,
        "jitter_ms": 0, "spec_hash": zero, "audit_id": uuid.uuid4(), "principal": "x",
        "principal_kind": "local", "key_id": None, "wrapped_key": None, "sensitive": None, "action": "run.cancel",
        "comment": None, "ticket_id": None,
        "state_before": None, "state_after": None, "since": None, "until": None, "before_id": None,
        "after_depth": None, "after_parent": None, "after_spawn_key": None, "after_spawn_index": None,
        "min_priority": None, "max_priority": None, "created_after": None, "created_before": None,
        "retry_of_run_id": None, "worker_id": "worker-b",
    }
    if query.name == "history_events":
        values["after_id"] = 0
    if query.name in ("insert_event", "submit_run", "checkpoint_by_event", "tool_execution_by_intent_event"):
        values["event_id"] = uuid.uuid4() if query.name in ("insert_event", "submit_run") else b["event_id"]
    if query.name == "submit_run":
        values["run_id"], values["client_request_id"] = uuid.uuid4(), "b-2"
    if query.name == "insert_schedule":
        values["id"], values["name"] = uuid.uuid4(), "other"
        values["next_fire_at"] = values["due_at"] = None
    return {name: values[name] for name in query.params}


IDS = ("run_id", "a_run_id", "schedule_id", "event_id")


def leaked(value: Any, b: dict[str, Any]) -> bool:
    """Whether an answer carries one of B's rows (its ids, its tenant, or a count of them)."""
    text = json.dumps(value, default=str)
    return B in text or any(str(b[key]) in text for key in ("run_id", "schedule_id", "event_id"))


def aggregate_is_empty(row: asyncpg.Record) -> bool:
    """tenant_stats / submit_quota over no rows: zero counts, no ages, no statuses."""
    return all(v in (None, 0, {}, False) or k == "db_now" for k, v in row.items())


async def probe(conn: asyncpg.Connection, name: str, b: dict[str, Any]) -> str:
    """Runs query `name` with B's parameters in a savepoint: 'refused' (a policy's WITH CHECK),
    'empty' (no row of B's read or written) or what leaked."""
    query: Query = getattr(Q, name)
    try:
        async with conn.transaction():
            statement = await conn.prepare(query.sql)
            rows = await statement.fetch(*query.args(**b_params(b, query)))
            status = statement.get_statusmsg()
            raise _Rollback(rows, status)
    except _Rollback as done:
        rows, status = done.rows, done.status
    except asyncpg.InsufficientPrivilegeError as exc:
        assert "row-level security" in str(exc), (name, exc)
        return "refused"
    if name in ("tenant_stats", "submit_quota"):
        return "empty" if all(aggregate_is_empty(r) for r in rows) else f"{name}: {rows}"
    touched = re.search(r"(\d+)$", status or "")
    if rows and any(leaked(dict(r), b) for r in rows):
        return f"{name}: read {rows}"
    if status and status.split()[0] in ("INSERT", "UPDATE", "DELETE") and touched and int(touched.group(1)):
        return f"{name}: {status}"
    return "empty"


class _Rollback(Exception):
    def __init__(self, rows: list[asyncpg.Record], status: str | None) -> None:
        super().__init__()
        self.rows, self.status = rows, status


async def database_snapshot(db: asyncpg.Connection) -> dict[str, list[str]]:
    return {table: sorted(json.dumps(dict(r), default=str) for r in await db.fetch(f"SELECT * FROM {table}"))
            for table in sorted(RLS_TABLES)}


async def test_every_run_service_query_with_another_tenant_or_none_sees_and_changes_nothing(
        stack: Stack, db: asyncpg.Connection, role_pool: asyncpg.Pool) -> None:
    b = await tenant_b_rows(stack, db)
    before = await database_snapshot(db)
    names = run_service_queries()
    assert {"get_run", "list_runs", "lock_run", "submit_run", "insert_checkpoint", "insert_audit", "list_audit",
            "history_journal", "update_schedule", "insert_signal"} <= set(names)
    outcomes: dict[str, dict[str, str]] = {}
    async with role_pool.acquire() as conn:
        assert await conn.fetchval("SELECT current_user") == f"{PREFIX}scheduler"
        for setting in (A, None):
            async with conn.transaction():
                if setting is not None:
                    await conn.execute("SELECT set_config('agentrt.tenant', $1, true)", setting)
                outcomes[str(setting)] = {name: await probe(conn, name, b) for name in names}
        # The harness is not vacuous: with B's own setting, B's run, ledger and journal are there.
        async with conn.transaction():
            await conn.execute("SELECT set_config('agentrt.tenant', $1, true)", B)
            for name in ("get_run", "lock_run", "history_tool_executions", "history_journal", "list_schedules",
                         "signal_by_request", "event_by_id"):
                query: Query = getattr(Q, name)
                assert await conn.fetch(query.sql, *query.args(**b_params(b, query))), name
    for setting, by_query in outcomes.items():
        bad = {name: outcome for name, outcome in by_query.items() if outcome not in ("empty", "refused")}
        assert not bad, (setting, bad)
        # Every insert of a B row is refused by a policy, not merely unmatched.
        for name in ("submit_run", "insert_checkpoint", "insert_event", "insert_signal", "insert_schedule",
                     "insert_audit", "append_journal_entry"):
            assert by_query[name] == "refused", (setting, name)
    assert await database_snapshot(db) == before


async def test_the_store_for_tenant_a_finds_none_of_tenant_b(stack: Stack, db: asyncpg.Connection) -> None:
    b = await tenant_b_rows(stack, db)
    store, run_id = stack.server.store, b["run_id"]
    before = await database_snapshot(db)
    assert [r.id for r in await store.runs.list_runs(A, RunFilter(), after=None, limit=10)] == [
        b["a_run_id"]]
    assert await store.runs.run_for_request(A, "b-1") is None
    assert (await store.runs.tenant_stats(A)).by_status == {"COMPLETED": 1}
    assert await store.schedules.list_schedules(A) == []
    for call in (store.runs.get_run(A, run_id), store.runs.cancel_run(A, run_id, reason="x"),
                 store.runs.signal_run(A, run_id, name="go", payload={}, request_id="sig-b"),
                 store.runs.resume_run(A, run_id, human_input={}),
                 store.runs.history(A, run_id),
                 store.runs.record_export(A, run_id, parts=frozenset(), audit=AuditEntry("x", "local")),
                 store.schedules.delete_schedule(A, b["schedule_id"], AuditEntry("x", "local")),
                 store.schedules.pause_schedule(A, b["schedule_id"], True, AuditEntry("x", "local"))):
        with pytest.raises(NotFound):
            await call
    assert await database_snapshot(db) == before


async def test_without_a_setting_the_runtime_role_reads_and_writes_nothing(
        stack: Stack, db: asyncpg.Connection, role_pool: asyncpg.Pool) -> None:
    await tenant_b_rows(stack, db)
    before = await database_snapshot(db)
    async with role_pool.acquire() as conn:
        for table in sorted(RLS_TABLES - {"outbox_parked"}):  # the relay's alone
            assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0, table
        assert await conn.execute("UPDATE agent_runs SET labels = '{}'") == "UPDATE 0"
        assert await conn.execute("UPDATE tool_executions SET status = status") == "UPDATE 0"
        assert await conn.execute("DELETE FROM agent_checkpoints") == "DELETE 0"
        assert await conn.execute("DELETE FROM agent_schedules") == "DELETE 0"
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
            await conn.execute("INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload) "
                               "VALUES (gen_random_uuid(), gen_random_uuid(), $1, 'x', '{}')", A)
        # A's setting: A's rows only, table by table.
        async with conn.transaction():
            await conn.execute("SELECT set_config('agentrt.tenant', $1, true)", A)
            assert await conn.fetchval("SELECT count(*) FROM agent_runs") == 1
            assert await conn.fetchval("SELECT count(*) FROM tool_executions") == 0
            assert await conn.fetchval("SELECT count(DISTINCT tenant_id) FROM outbox") == 1
        # The setting ends with its transaction: the pooled session is back to nothing.
        assert await conn.fetchval("SELECT count(*) FROM agent_runs") == 0
    assert await database_snapshot(db) == before


async def test_copy_as_the_runtime_role_sees_only_the_tenants_rows(
        stack: Stack, db: asyncpg.Connection, role_pool: asyncpg.Pool) -> None:
    b = await tenant_b_rows(stack, db)
    async with role_pool.acquire() as conn:
        async with conn.transaction():
            await conn.execute("SELECT set_config('agentrt.tenant', $1, true)", A)
            for table in ("agent_runs", "outbox", "tool_executions", "agent_checkpoints", "run_journal",
                          "audit_log", "run_signals", "agent_schedules"):
                out = io.BytesIO()
                await conn.copy_from_table(table, output=out, format="csv")
                text = out.getvalue().decode()
                assert B not in text and str(b["run_id"]) not in text, table
            out = io.BytesIO()
            await conn.copy_from_query("SELECT id, tenant_id FROM agent_runs", output=out, format="csv")
            assert out.getvalue().decode().strip() == f"{b['a_run_id']},{A}"
        with pytest.raises(asyncpg.FeatureNotSupportedError):  # COPY FROM: refused under row-level security
            await conn.copy_to_table("run_signals", source=io.BytesIO(b""), format="csv")


async def test_rls_is_forced_on_every_tenant_table_and_functions_are_checked(db: asyncpg.Connection) -> None:
    rows = await db.fetch("SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity FROM pg_class c "
                          "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')")
    tables = {r["relname"]: (r["relrowsecurity"], r["relforcerowsecurity"]) for r in rows}
    assert set(tables) == RLS_TABLES | NOT_TENANT_TABLES, "a new table: is it a tenant's? (RLS_TABLES)"
    assert {name for name, flags in tables.items() if flags == (True, True)} == RLS_TABLES
    # Views would run with their owner's rights: none (or each security_invoker).
    views = await db.fetch("SELECT c.relname, c.reloptions FROM pg_class c WHERE c.relkind IN ('v', 'm') "
                           "AND c.relnamespace = current_schema()::regnamespace")
    assert all("security_invoker=true" in (v["reloptions"] or []) for v in views), views
    functions = await db.fetch("SELECT p.proname, p.prosecdef, p.proconfig FROM pg_proc p "
                               "WHERE p.pronamespace = current_schema()::regnamespace")
    assert {f["proname"] for f in functions if f["prosecdef"]} == CHECKED_SECURITY_DEFINER
    assert {f["proname"] for f in functions
            if any(c.startswith("agentrt.scope=") for c in f["proconfig"] or [])} == CHECKED_WORK_SCOPE
    # Policies: one per tenant table, each naming the tenant setting (nothing always-true).
    policies = await db.fetch("SELECT tablename, policyname, cmd, qual, with_check FROM pg_policies "
                              "WHERE schemaname = current_schema()")
    assert {p["tablename"] for p in policies} == RLS_TABLES
    for policy in policies:
        if policy["policyname"] == "outbox_admin_audit":  # INSERT only: the admin scope's audit events
            assert policy["qual"] is None and "'agent.audit.%'" in policy["with_check"], policy
            continue
        if policy["policyname"] in ADMIN_ONLY_POLICIES:  # the admin scope, nothing else
            for expression in (policy["qual"], policy["with_check"]):
                assert re.fullmatch(r"\(current_setting\('agentrt\.scope'::text, true\) = 'admin'::text\)",
                                    expression), policy
            continue
        # A SELECT policy has no WITH CHECK (0019: the operator settings' reads; their writes are admin's).
        for expression in (policy["qual"], policy["with_check"] if policy["cmd"] != "SELECT" else policy["qual"]):
            assert "current_setting('agentrt.tenant'" in expression or "agentrt_tenant_run(run_id)" in expression, \
                policy
    # The child tables' test: their run is the tenant's, the caller's rights (not SECURITY DEFINER).
    body = await db.fetchval("SELECT prosrc FROM pg_proc WHERE proname = 'agentrt_tenant_run'")
    assert "current_setting('agentrt.tenant', true)" in body


async def test_the_deployed_scheduler_connects_as_the_runtime_role_with_rls_in_force(
        stack: Stack, db: asyncpg.Connection, db_url: str) -> None:
    """Its pools are the role's, never the owner's, and row security is active on both; RunService
    and the work path (a whole claim, checkpoint and finish) still work; the pools differ in scope."""
    store = stack.server.store
    assert store.work_pool is not store.pool
    owner = await db.fetchval("SELECT tableowner FROM pg_tables WHERE tablename = 'agent_runs'")
    for pool, scope in ((store.pool, ""), (store.work_pool, WORK_SCOPE)):
        row = await pool.fetchrow("SELECT current_user AS who, row_security_active('agent_runs') AS active, "
                                  "current_setting('agentrt.scope', true) AS scope, "
                                  "(SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user) "
                                  "AS bypass")
        assert row["who"] == f"{PREFIX}scheduler" != owner and row["active"] and not row["bypass"]
        assert (row["scope"] or "") == scope
    b = await tenant_b_rows(stack, db)  # submit, claim, checkpoint, tool call, signal through gRPC
    got = await stack.runs.GetRun(rs.GetRunRequest(run_id=str(b["run_id"])), metadata=stack.md(B))
    assert got.status == pb.RUN_STATUS_WAITING_TOOL
    history = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=str(b["run_id"])),
                                             metadata=stack.md(B))
    assert len(history.tool_executions) == 1 and len(history.checkpoints) == 1
    listed = await stack.runs.ListRuns(rs.ListRunsRequest(), metadata=stack.md(A))
    assert [r.run_id for r in listed.runs] == [str(b["a_run_id"])]
    fresh = await submit(stack, tenant=A)
    assert fresh.status == pb.RUN_STATUS_QUEUED


async def test_require_row_security_refuses_a_role_that_escapes_it(db_url: str, stack: Stack) -> None:
    """As deployed (the chart sets require_row_security with its roles), the owner or a superuser is
    refused at start; the scheduler role (the `stack` fixture starts one) is not."""
    settings = {"database_url": db_url, "listen_addr": "127.0.0.1:0", "auth_mode": "none",
                "require_row_security": True}
    server = SchedulerServer(SchedulerSettings(**settings))
    with pytest.raises(ValueError, match="bypasses row-level security"):
        await server.start()
    await server.stop(0.1)
    async with scheduler_stack(as_role(db_url, "scheduler"), require_row_security=True) as strict:
        assert await strict.server.store.pool.fetchval("SELECT current_user") == f"{PREFIX}scheduler"


async def test_the_smoke_run_passes_as_the_scheduler_role(db_url: str, db: asyncpg.Connection, stack: Stack) -> None:
    """test_smoke's claim → checkpoint → tool → finish, against a scheduler connected as the role
    (the `stack` fixture applied the roles)."""
    import test_smoke

    await test_smoke.test_claim_checkpoint_tool_finish(as_role(db_url, "scheduler"), db)


async def test_forced_rls_binds_the_tables_owner_when_it_is_not_a_superuser(
        stack: Stack, db: asyncpg.Connection) -> None:
    """FORCE: the owner (not a superuser, as on a managed server) sees nothing without a setting too."""
    await tenant_b_rows(stack, db)
    owner = f"{PREFIX}owner"
    try:
        await db.execute(f"CREATE ROLE {owner} NOLOGIN")
    except asyncpg.DuplicateObjectError:
        pass  # another database of the cluster made it first
    await db.execute(f"ALTER TABLE agent_runs OWNER TO {owner}")
    async with db.transaction():
        await db.execute(f"SET LOCAL ROLE {owner}")
        assert await db.fetchval("SELECT count(*) FROM agent_runs") == 0
        await db.execute("SELECT set_config('agentrt.tenant', $1, true)", B)
        assert await db.fetchval("SELECT count(*) FROM agent_runs") == 1
    await db.execute("ALTER TABLE agent_runs OWNER TO CURRENT_USER")


async def test_admin_changes_write_their_audit_rows_and_events_as_the_runtime_role(
        stack: Stack, db: asyncpg.Connection) -> None:
    """Key management and runtime limits run in the admin scope: their audit rows and events are
    written (a key of two tenants, a limit of every tenant), and that scope reads no run or event."""
    from scheduler.flow_limits import LimitKey

    store = stack.server.store
    who = AuditEntry(principal="ops", principal_kind="local")
    key_id = uuid.uuid4()
    await store.auth.create_api_key(key_id=key_id, name="k", tenants=[A, B], role="admin", secret_hash=b"\1" * 32,
                                    expires_in_s=0, audit=who)
    await store.limits.set_limit(LimitKey("tenant", "*", "", "max_running"), "5", audit=who)
    await store.limits.clear_limit(LimitKey("tenant", "*", "", "max_running"), audit=who)
    events = await db.fetch("SELECT event_type, tenant_id FROM outbox WHERE event_type LIKE 'agent.audit.%' "
                            "ORDER BY id")
    assert [e["event_type"] for e in events] == ["agent.audit.key.create", "agent.audit.limit.set",
                                                "agent.audit.limit.clear"]
    assert await db.fetchval("SELECT count(*) FROM audit_log WHERE action IN ('key.create', 'limit.set', "
                             "'limit.clear')") == 3
    await submit(stack, tenant=B, client_request_id="b-admin")
    async with store.db.admin_tx("test") as conn:
        assert await conn.fetchval("SELECT count(*) FROM agent_runs") == 0
        assert await conn.fetchval("SELECT count(*) FROM outbox") == 0


# A column that names a tenant or a run: tenant_id, tenants (a key's), run_id, parent_run_id, root_run_id...
TENANT_OR_RUN_COLUMN = r"^(tenant_id|tenants|run_id|[a-z_]+_run_id)$"


async def test_every_table_naming_a_tenant_or_a_run_is_under_forced_rls_or_a_documented_exemption(
        db: asyncpg.Connection) -> None:
    """The sweep of issue 24's defect 5: the tables are found from the catalog, not from a list, so a
    new table with a tenant or a run column fails here until it has forced RLS and a policy, or an entry
    in db_roles.RLS_EXEMPT_TABLES (with its reason, named in docs/database-roles.md, Row-level security)."""
    from scheduler.store.database_roles import RLS_EXEMPT_TABLES

    rows = await db.fetch(
        "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity, "
        "       (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid) AS policies, "
        "       array_agg(a.attname::text ORDER BY a.attname) AS columns "
        "FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
        "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') AND a.attname ~ $1 "
        "GROUP BY c.oid, c.relname, c.relrowsecurity, c.relforcerowsecurity", TENANT_OR_RUN_COLUMN)
    found = {row["relname"]: row for row in rows}
    assert {"agent_runs", "flow_limits", "retention_policies", "api_keys"} <= set(found)  # the walk sees them
    unguarded = {name: list(row["columns"]) for name, row in found.items()
                 if name not in RLS_EXEMPT_TABLES
                 and not (row["relrowsecurity"] and row["relforcerowsecurity"] and row["policies"] > 0)}
    assert unguarded == {}, "tables naming a tenant or a run without forced RLS and a policy"
    stale = set(RLS_EXEMPT_TABLES) - set(found)
    assert not stale, f"exempt tables that name no tenant or run (or are gone): {stale}"
    page = (ROOT / "docs" / "database-roles.md").read_text()
    security = page.split("\n## Row-level security\n", 1)[1].split("\n## ", 1)[0]
    for table, reason in RLS_EXEMPT_TABLES.items():
        assert reason and f"`{table}`" in security, f"{table}: exempt, but not in the docs' RLS section"


async def test_runtime_limits_and_retention_policies_are_each_tenants_own(
        stack: Stack, db: asyncpg.Connection, db_url: str) -> None:
    """Issue 24, defect 5: flow_limits and retention_policies were outside row-level security (the
    readonly role read every tenant's limits with no setting). Now: nothing without a setting, a
    tenant's own rows in its setting (never another's nor the every-tenant rows), writes in the admin
    scope only; the scheduler still overlays every row on its settings."""
    from scheduler.flow_limits import LimitKey

    store = stack.server.store
    who = AuditEntry(principal="ops", principal_kind="local")
    await store.limits.set_limit(LimitKey("tenant", A, "", "max_queued_runs"), "7", audit=who)
    await store.limits.set_limit(LimitKey("tenant", B, "", "max_queued_runs"), "9", audit=who)
    await store.limits.set_limit(LimitKey("tenant", "*", "", "max_running"), "5", audit=who)
    await store.limits.set_limit(LimitKey("tool", "", "charge", "concurrency"), "2", audit=who)
    await db.execute("INSERT INTO retention_policies (tenant_id, keep_days) VALUES ($1, 3), ($2, 4)", A, B)
    before = await database_snapshot(db)
    for service in ("readonly", "scheduler"):
        conn = await connect(db_url, service)
        try:
            assert await conn.fetchval("SELECT count(*) FROM flow_limits") == 0, service
            assert await conn.fetchval("SELECT count(*) FROM retention_policies") == 0, service
            async with conn.transaction():
                await conn.execute("SELECT set_config('agentrt.tenant', $1, true)", A)
                assert [tuple(r) for r in await conn.fetch("SELECT tenant_id, value FROM flow_limits")] == [(A, "7")]
                assert [tuple(r) for r in await conn.fetch("SELECT tenant_id, keep_days FROM retention_policies")] \
                    == [(A, 3)]
            if service == "readonly":  # the work-scope read is the scheduler's alone
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.fetch("SELECT * FROM agentrt_flow_limits()")
                continue
            for setting in (("agentrt.tenant", A), ("agentrt.scope", "work")):  # neither writes a limit
                async with conn.transaction():
                    await conn.execute("SELECT set_config($1, $2, true)", *setting)
                    assert await conn.execute("DELETE FROM flow_limits") == "DELETE 0", setting
                    assert await conn.execute("UPDATE flow_limits SET value = '1'") == "UPDATE 0", setting
                    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
                        await conn.execute("INSERT INTO flow_limits (scope, tenant_id, limit_name, value, updated_by) "
                                           "VALUES ('tenant', $1, 'max_running', '1', 'x')", A)
        finally:
            await conn.close()
    assert await database_snapshot(db) == before
    # The scheduler (as its role) still sees every tenant's limits, and the every-tenant ones.
    store.db.forget_flow()
    flow = await store.db.current_flow()
    assert flow.submit_quota(A).max_queued_runs == 7 and flow.submit_quota(B).max_queued_runs == 9
    assert flow.max_running_per_tenant == 5 and flow.tool_limits["charge"].concurrency == 2
    assert {(r.key.tenant_id, r.key.name) for r in await store.limits.list_limits()} == {
        (A, "max_queued_runs"), (B, "max_queued_runs"), ("*", "max_running"), ("", "concurrency")}
