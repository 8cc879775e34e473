"""The least-privilege runtime roles (scheduler/store/database_roles.py), on a real PostgreSQL.

For each role, the statements it must not run fail (DDL, other services' tables,
deletes of ledger rows, updates and deletes of audit rows) and the work it
exists for succeeds: a whole run through the scheduler (and a real executor)
connected as the scheduler role, the relay's store as the relay role, the
consumer's dedupe insert as the consumer role.

Roles are cluster-wide and other databases share the cluster: the tests use
their own prefix, apply is safe to run concurrently, and privileges are set
per database (only in the test's own).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from executor_support import executor, http_tool, mock_tool, scripted_agent, wait_status, write_agent
from support import scheduler_stack, submit

from relay.store import RelayStore
from relay.store import connect_pool as relay_pool
from scheduler.background.pruner import prune_once
from scheduler.store.database_roles import (
    RETENTION_FUNCTION,
    SERVICES,
    DatabaseRoleSettings,
    apply_roles,
    check_roles,
    scram_verifier,
)
from shared.client.consumer import SQL_CLAIM_EVENT
from shared.db import init_connection
from shared.gen.agentrt.v1 import common_pb2 as pb

pytestmark = pytest.mark.integration
PREFIX = "agentrt_t_"
SETTINGS = DatabaseRoleSettings(role_prefix=PREFIX)
DENIED = (asyncpg.InsufficientPrivilegeError,)


def as_role(db_url: str, service: str, settings: DatabaseRoleSettings = SETTINGS) -> str:
    parts = urlsplit(db_url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{settings.role_name(service)}@{host}"))


@pytest.fixture
async def roles(db_url: str, db: asyncpg.Connection) -> str:
    await apply_roles(db, SETTINGS)
    return db_url


async def connect(db_url: str, service: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(as_role(db_url, service), timeout=10)
    await init_connection(conn)
    return conn


@pytest.fixture
async def role_conns(roles: str) -> AsyncIterator[dict[str, asyncpg.Connection]]:
    conns = {service: await connect(roles, service) for service in SERVICES}
    try:
        yield conns
    finally:
        for conn in conns.values():
            await conn.close()


async def refused(conn: asyncpg.Connection, statement: str, *args: object) -> None:
    with pytest.raises(DENIED):
        await conn.execute(statement, *args)


DDL = ("CREATE TABLE evil (id int)", "DROP TABLE agent_runs", "ALTER TABLE agent_runs ADD COLUMN x int",
       "CREATE INDEX evil_idx ON outbox (tenant_id)", "TRUNCATE consumed_events",
       "CREATE FUNCTION evil() RETURNS int LANGUAGE sql AS 'SELECT 1'", "CREATE SCHEMA evil")


async def test_apply_then_check_reports_nothing_and_a_stray_grant_is_found_and_removed(roles, db):
    assert await check_roles(db, SETTINGS) == []
    await db.execute(f"GRANT DELETE ON tool_executions TO {PREFIX}scheduler")
    await db.execute(f"GRANT SELECT ON api_keys TO {PREFIX}relay")
    assert await check_roles(db, SETTINGS) == [f"{PREFIX}scheduler: must not have DELETE on tool_executions",
                                               f"{PREFIX}relay: must not have SELECT on api_keys"]
    await apply_roles(db, SETTINGS)  # idempotent, and converges
    assert await check_roles(db, SETTINGS) == []
    await db.execute(f"REVOKE INSERT ON outbox FROM {PREFIX}scheduler")
    await db.execute(f"GRANT EXECUTE ON FUNCTION {RETENTION_FUNCTION} TO {PREFIX}relay")
    assert await check_roles(db, SETTINGS) == [
        f"{PREFIX}scheduler: lacks INSERT on outbox", f"{PREFIX}relay: must not have EXECUTE on {RETENTION_FUNCTION}"]
    await apply_roles(db, SETTINGS)
    assert await check_roles(db, SETTINGS) == []


async def test_check_names_a_missing_role(db):
    absent = DatabaseRoleSettings(role_prefix=f"agentrt_absent_{uuid.uuid4().hex[:8]}_")
    problems = await check_roles(db, absent)
    assert problems == [f"{absent.role_name(s)}: no such role" for s in SERVICES]


async def test_concurrent_apply_creates_each_role_once(db_url, db):
    settings = DatabaseRoleSettings(role_prefix=f"agentrt_race_{uuid.uuid4().hex[:8]}_",
                                    scheduler_role_password="s3cret")
    conns = [await asyncpg.connect(db_url) for _ in range(3)]
    try:
        reports = await asyncio.gather(*(apply_roles(conn, settings) for conn in conns))
        created = [r.role for rs in reports for r in rs if r.created]
        assert sorted(created) == sorted(settings.role_name(s) for s in SERVICES)
        assert await check_roles(db, settings) == []
        verifier = await db.fetchval("SELECT rolpassword FROM pg_authid WHERE rolname = $1",
                                     settings.role_name("scheduler"))
        assert verifier.startswith("SCRAM-SHA-256$4096:")
    finally:
        for conn in conns:
            await conn.close()
        names = ", ".join(settings.role_name(s) for s in SERVICES)
        await db.execute(f"DROP OWNED BY {names}")  # their privileges exist in this database only
        await db.execute(f"DROP ROLE {names}")


def test_scram_verifier_matches_postgres_format():
    salt = bytes(range(16))
    verifier = scram_verifier("pencil", salt)
    head, keys = verifier.split("$", 1)[1].split("$")
    assert head == "4096:AAECAwQFBgcICQoLDA0ODw==" and len(keys.split(":")) == 2
    assert verifier == scram_verifier("pencil", salt) != scram_verifier("pencil2", salt)


@pytest.mark.parametrize("service", SERVICES)
async def test_no_role_runs_ddl(role_conns, service):
    for statement in DDL:
        await refused(role_conns[service], statement)


async def test_scheduler_role_cannot_delete_ledger_or_touch_audit_or_relay_tables(role_conns):
    conn = role_conns["scheduler"]
    await refused(conn, "DELETE FROM tool_executions")
    await refused(conn, "DELETE FROM run_journal")
    await refused(conn, "DELETE FROM agent_runs")
    await refused(conn, "DELETE FROM outbox")
    await refused(conn, "UPDATE outbox SET published_at = clock_timestamp()")
    await refused(conn, "UPDATE audit_log SET reason = 'x'")
    await refused(conn, "DELETE FROM audit_log")
    await refused(conn, "TRUNCATE tool_executions")
    await refused(conn, "SELECT * FROM consumed_events")
    await refused(conn, "SELECT * FROM outbox_parked")
    await refused(conn, "UPDATE relay_shards SET owner = NULL")
    await refused(conn, "INSERT INTO retention_policies (tenant_id, keep_days) VALUES ('t', 1)")


async def test_relay_role_reaches_only_the_outbox_and_its_shard_tables(role_conns):
    conn = role_conns["relay"]
    for table in ("agent_runs", "agent_checkpoints", "tool_executions", "run_journal", "api_keys",
                  "agent_registry", "audit_log"):
        await refused(conn, f"SELECT * FROM {table}")
    await refused(conn, "INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload) "
                        "VALUES (gen_random_uuid(), gen_random_uuid(), 't', 'x', '{}')")
    await refused(conn, "INSERT INTO consumed_events (consumer_name, event_id) VALUES ('c', gen_random_uuid())")
    await refused(conn, "UPDATE audit_log SET reason = 'x'")


async def test_consumer_role_reaches_consumed_events_only(role_conns):
    conn = role_conns["consumer"]
    event = uuid.uuid4()
    assert await conn.fetchval(SQL_CLAIM_EVENT, "billing", event) is True
    assert await conn.fetchval(SQL_CLAIM_EVENT, "billing", event) is None  # the dedupe still works
    for table in ("outbox", "agent_runs", "tool_executions", "schema_migrations", "relay_shards"):
        await refused(conn, f"SELECT * FROM {table}")
    await refused(conn, "DELETE FROM consumed_events")
    await refused(conn, "UPDATE consumed_events SET consumer_name = 'x'")


async def test_readonly_role_reads_and_changes_nothing(role_conns):
    conn = role_conns["readonly"]
    for table in ("agent_runs", "tool_executions", "outbox", "audit_log", "consumed_events"):
        await conn.fetch(f"SELECT * FROM {table} LIMIT 1")
    await refused(conn, "SELECT * FROM api_keys")
    await refused(conn, "INSERT INTO runtime_counters (name) VALUES ('x')")
    await refused(conn, "UPDATE agent_runs SET status = 'FAILED'")
    await refused(conn, "DELETE FROM outbox")
    await refused(conn, "DELETE FROM consumed_events")


async def test_a_run_goes_through_a_scheduler_connected_as_the_scheduler_role(roles, db, tmp_path):
    scheduler_url = as_role(roles, "scheduler")
    plan = [{"id": "a", "tool": "t.a", "args": {"n": 1}}, {"id": "done", "finish": "ok"}]
    async with mock_tool(tmp_path) as mock, scheduler_stack(scheduler_url, checkpoint_keep_last=1) as stack:
        write_agent(tmp_path / "agents", scripted_agent("chain", plan, [http_tool(mock.url, "t.a")]))
        run = await submit(stack, agent="chain")
        async with executor(stack, tmp_path / "agents"):
            final = await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED,
                                      pb.RUN_STATUS_PAUSED_INDOUBT)
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason
        assert await stack.server.store.pool.fetchval("SELECT current_user") == f"{PREFIX}scheduler"
        # Checkpoint pruning deletes superseded versions with the scheduler's own rights.
        assert await prune_once(stack.server.store, keep_last=1, batch_runs=10) > 0
    assert await db.fetchval("SELECT count(*) FROM tool_executions WHERE status = 'SUCCEEDED'") == 1


async def test_the_relay_store_works_as_the_relay_role(roles, db):
    run_id = uuid.uuid4()
    await db.execute("INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload) "
                     "VALUES (gen_random_uuid(), $1, 't', 'agent.run_submitted', '{}')", run_id)
    # The relay's own pool: its sessions are in the row-level security work scope.
    pool = await relay_pool(as_role(roles, "relay"), min_size=1, max_size=2, command_timeout=10)
    try:
        store = RelayStore(pool)
        await store.ensure_shards(1)
        await store.heartbeat_member("r1", 10_000)
        held = await store.acquire_shards("r1", 10_000, 1)
        [row] = await store.claim_batch("r1", held, 1, 10)
        await store.mark_published([row.id], [])
        assert (await store.lag()).pending == 0
        await db.execute("INSERT INTO consumed_events (consumer_name, event_id, consumed_at) "
                         "VALUES ('c', gen_random_uuid(), clock_timestamp() - interval '2 days')")
        assert await store.delete_consumed_events(86_400.0, 10) == 1
        assert await store.delete_published_outbox(row.id, row.id + 1, await store.retention_cutoff(-60.0)) == 1
        await store.leave_membership("r1")
    finally:
        await pool.close()
    assert await db.fetchval("SELECT count(*) FROM outbox") == 0


def test_cli_roles_apply_then_check(db_url, monkeypatch, capsys):
    from cli.main import main

    monkeypatch.setenv("AGENTRT_ROLE_PREFIX", PREFIX)
    assert main(["roles", "apply", "--database-url", db_url]) == 0
    assert f"role {PREFIX}scheduler:" in capsys.readouterr().out
    assert main(["roles", "check", "--database-url", db_url]) == 0
    assert "roles as they should be" in capsys.readouterr().out
    monkeypatch.setenv("AGENTRT_ROLE_PREFIX", "Bad-Prefix")
    assert main(["roles", "check", "--database-url", db_url]) == 1
    assert "invalid setting role_prefix" in capsys.readouterr().err
