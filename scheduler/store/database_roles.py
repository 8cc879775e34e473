"""The runtime database roles: least privilege for each service (docs/database-roles.md).

`agentrt roles apply` (or `agentrt migrate --apply-roles`), run as the owner
of the schema, creates the four login roles when missing and sets their
privileges in the current database to exactly the table below: every
privilege on the schema's tables is revoked from them first, then granted
back as listed. `agentrt roles check` reports every difference (a missing
role, a missing or an extra privilege, a role allowed to create objects).

Roles are cluster-wide, privileges per database. Several databases of one
cluster (and several migrators) may apply at once: a role created
concurrently by another session counts as created, an ALTER ROLE that lost a
race is retried, and the grants of one database are serialised by the
migrations' advisory lock.

Nothing here can delete a ledger or audit row: the scheduler role deletes
expired runs only through agentrt_retention_purge (migration 0012), a
SECURITY DEFINER function that decides itself what has expired.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import asyncpg
from pydantic import Field, SecretStr, field_validator

from scheduler.store.migrate import MIGRATION_LOCK_KEY
from shared.config import ComponentSettings
from shared.db import load_queries

log = logging.getLogger(__name__)
R = load_queries(Path(__file__).parents[1] / "sql" / "roles.sql")

SERVICES = ("scheduler", "relay", "consumer", "readonly")
PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
# The function through which expired runs (ledger rows included) are deleted, and who may call it.
RETENTION_FUNCTION = "agentrt_retention_purge(integer,boolean,timestamptz,uuid)"
# Every tenant's runtime limits, read in the work scope from any transaction (migration 0019).
FLOW_LIMITS_FUNCTION = "agentrt_flow_limits()"
FUNCTIONS: dict[str, tuple[str, ...]] = {"scheduler": (RETENTION_FUNCTION, FLOW_LIMITS_FUNCTION)}

# Row-level security (migrations 0016, 0017, 0019; docs/database-roles.md): every table with a column that
# names a tenant or a run (tenant_id, tenants, run_id, *_run_id) has forced row-level security and a
# policy, except these, each with the reason it holds no tenant's rows to hide. The test
# tests/integration/scheduler/test_rls.py finds such tables in the catalog and reads this list.
RLS_EXEMPT_TABLES: dict[str, str] = {
    "api_keys": "looked up by the hash of a key's secret before a call has a tenant; no runtime role but "
                "the scheduler's may read it (its `tenants` names what the key may act for)",
}

_S, _SI, _SIU, _ALL = ("SELECT",), ("SELECT", "INSERT"), ("SELECT", "INSERT", "UPDATE"), (
    "SELECT", "INSERT", "UPDATE", "DELETE")
# Table → privileges, per role. A table not listed: no privilege at all. No role gets TRUNCATE,
# REFERENCES or TRIGGER, and only the owner runs DDL.
TABLE_PRIVILEGES: dict[str, dict[str, tuple[str, ...]]] = {
    "scheduler": {
        "schema_migrations": _S,
        "agent_runs": _SIU,
        # DELETE: superseded checkpoint versions are pruned (checkpoint_keep_last).
        "agent_checkpoints": ("SELECT", "INSERT", "DELETE"),
        # The ledger: never DELETE (retention goes through agentrt_retention_purge).
        "tool_executions": _SIU,
        "run_journal": _SI,
        "outbox": _SI,
        "runtime_counters": _SIU,
        "agent_registry": _ALL,
        "api_keys": _SIU,
        # Append-only: its triggers refuse UPDATE and DELETE for every role anyway.
        "audit_log": _SI,
        # Read by the outbox insert trigger (wake an idle relay).
        "relay_members": _S,
        "retention_policies": _S,
        # Queued by SignalRun, marked consumed by the checkpoint that takes them; never deleted by it.
        "run_signals": _SIU,
        # Schedules: created, changed, fired and deleted through RunService.
        "agent_schedules": _ALL,
        # Wrapped data keys: written at submit, re-wrapped by `agentrt encryption rotate`; never deleted
        # by it (a run's key goes with the run, inside agentrt_retention_purge).
        "run_data_keys": _SIU,
        # Runtime limits: set and cleared through RunService (admin), read by every replica.
        "flow_limits": _ALL,
    },
    "relay": {
        "schema_migrations": _S,
        "outbox": ("SELECT", "UPDATE", "DELETE"),
        "outbox_parked": _SIU,
        "relay_config": _SI,
        "relay_shards": _SIU,
        "relay_members": _ALL,
        "runtime_counters": _SIU,
        # The relay's retention expires consumer dedupe rows; it never writes them (its delete locks
        # the rows first, FOR UPDATE SKIP LOCKED, which wants an UPDATE right: on one column only).
        "consumed_events": ("SELECT", "DELETE", "UPDATE (consumed_at)"),
        # `agentrt outbox retry|skip` record the operator's act.
        "audit_log": ("INSERT",),
    },
    "consumer": {
        "consumed_events": _SI,
    },
    "readonly": {
        name: _S for name in (
            "schema_migrations", "agent_runs", "agent_checkpoints", "tool_executions", "run_journal", "outbox",
            "outbox_parked", "consumed_events", "runtime_counters", "relay_config", "relay_shards",
            "relay_members", "agent_registry", "audit_log", "retention_policies", "run_signals",
            "agent_schedules", "flow_limits")
        # Not api_keys (hashes of key secrets) nor run_data_keys (wrapped data keys): the scheduler's alone.
    },
}

_PREFIX = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
_RACE_RETRIES = 5


class DatabaseRoleSettings(ComponentSettings):
    """Names and passwords of the runtime roles (env AGENTRT_*, or the config file's `roles:` section).

    A password comes from `<service>_role_password` or the file `<service>_role_password_file`
    (the file wins); a role with neither keeps the password it has (or none: certificate or
    peer authentication).
    """

    section: ClassVar[str] = "roles"
    service_name: str = "agentrt-migrate"
    role_prefix: str = "agentrt_"
    scheduler_role_password: SecretStr | None = None
    scheduler_role_password_file: str | None = None
    relay_role_password: SecretStr | None = None
    relay_role_password_file: str | None = None
    consumer_role_password: SecretStr | None = None
    consumer_role_password_file: str | None = None
    readonly_role_password: SecretStr | None = None
    readonly_role_password_file: str | None = None
    role_apply_retries: int = Field(_RACE_RETRIES, ge=1, le=50)

    @field_validator("role_prefix")
    @classmethod
    def _plain_prefix(cls, value: str) -> str:
        if not _PREFIX.match(value):
            raise ValueError("role_prefix: lower-case letters, digits and _, starting with a letter or _ "
                             "(at most 41 characters)")
        return value

    def role_name(self, service: str) -> str:
        return f"{self.role_prefix}{service}"

    def password(self, service: str) -> str | None:
        path = getattr(self, f"{service}_role_password_file")
        if path:
            text = Path(path).read_text(encoding="utf-8").strip()
            if not text:
                raise ValueError(f"{service}_role_password_file {path}: the file is empty")
            return text
        secret: SecretStr | None = getattr(self, f"{service}_role_password")
        return secret.get_secret_value() if secret is not None else None


def scram_verifier(password: str, salt: bytes | None = None, iterations: int = 4096) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores (RFC 5802/7677), so no plain password is sent."""
    salt = salt or secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


@dataclass(frozen=True)
class RoleReport:
    role: str
    created: bool
    password_set: bool


async def _run_built(conn: asyncpg.Connection, builder: str, *args: object) -> None:
    """Builds a statement server-side (sql/roles.sql) and runs it."""
    await conn.execute(await conn.fetchval(R[builder], *args))


async def _alter_with_retry(conn: asyncpg.Connection, builder: str, retries: int, *args: object) -> None:
    """ALTER ROLE touches a cluster-wide catalog row: a concurrent ALTER of the same role fails
    with "tuple concurrently updated"; it is retried."""
    for attempt in range(retries):
        try:
            async with conn.transaction():
                await _run_built(conn, builder, *args)
            return
        except asyncpg.InternalServerError:
            if attempt == retries - 1:
                raise
            await asyncio.sleep(0.05 * (attempt + 1))


def _attributes_right(row: asyncpg.Record) -> bool:
    return bool(row["rolcanlogin"] and not (row["rolsuper"] or row["rolcreatedb"] or row["rolcreaterole"]
                                           or row["rolreplication"] or row["rolbypassrls"] or row["rolinherit"]))


async def ensure_role(conn: asyncpg.Connection, name: str, password: str | None, retries: int) -> RoleReport:
    """Creates the role if missing (a role another session creates meanwhile counts as created)."""
    created = False
    row = await conn.fetchrow(R["role_attributes"], name)
    if row is None:
        try:
            async with conn.transaction():
                await _run_built(conn, "create_role_sql", name)
            created = True
        except (asyncpg.DuplicateObjectError, asyncpg.UniqueViolationError):
            pass  # created by a concurrent `roles apply` (another database of the cluster)
        row = await conn.fetchrow(R["role_attributes"], name)
    if row is None or not _attributes_right(row):
        await _alter_with_retry(conn, "alter_role_sql", retries, name)
    if password is not None:
        await _alter_with_retry(conn, "set_password_sql", retries, name, scram_verifier(password))
    return RoleReport(name, created, password is not None)


async def _existing_tables(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    return {row["tablename"] for row in rows}


async def grant_privileges(conn: asyncpg.Connection, service: str, role: str) -> None:
    """Exactly the listed privileges on this database's tables (in one transaction)."""
    tables = await _existing_tables(conn)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
        await _run_built(conn, "grant_connect_sql", role)
        await _run_built(conn, "grant_schema_usage_sql", role)
        await _run_built(conn, "revoke_tables_sql", role)
        for table, privileges in TABLE_PRIVILEGES[service].items():
            if not {_base(p) for p in privileges} <= set(PRIVILEGES):
                raise ValueError(f"unknown privilege in {privileges}")
            if table in tables:
                await _run_built(conn, "grant_table_sql", ", ".join(privileges), table, role)
        if service in ("scheduler", "relay"):
            await _run_built(conn, "grant_sequences_sql", role)
        for function in {f for granted in FUNCTIONS.values() for f in granted}:
            if await _function_exists(conn, function):
                allowed = function in FUNCTIONS.get(service, ())
                await _run_built(conn, "grant_function_sql" if allowed else "revoke_function_sql", function, role)


_COLUMN_PRIVILEGE = re.compile(r"^(\w+) \((\w+)\)$")


def _base(privilege: str) -> str:
    """`UPDATE (consumed_at)` → UPDATE: a privilege on one column only."""
    match = _COLUMN_PRIVILEGE.match(privilege)
    return match.group(1) if match else privilege


async def _function_exists(conn: asyncpg.Connection, signature: str) -> bool:
    return bool(await conn.fetchval("SELECT to_regprocedure($1) IS NOT NULL", signature))


async def apply_roles(conn: asyncpg.Connection, settings: DatabaseRoleSettings) -> list[RoleReport]:
    """Creates (or updates) the four roles and their privileges in the connected database."""
    reports = []
    for service in SERVICES:
        role = settings.role_name(service)
        reports.append(await ensure_role(conn, role, settings.password(service), settings.role_apply_retries))
        await grant_privileges(conn, service, role)
    return reports


async def check_roles(conn: asyncpg.Connection, settings: DatabaseRoleSettings) -> list[str]:
    """Every way the database differs from the table above; empty = as it should be."""
    problems: list[str] = []
    tables = await _existing_tables(conn)
    for service in SERVICES:
        role = settings.role_name(service)
        row = await conn.fetchrow(R["role_attributes"], role)
        if row is None:
            problems.append(f"{role}: no such role")
            continue
        if not _attributes_right(row):
            problems.append(f"{role}: must be LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
                            "NOBYPASSRLS NOINHERIT")
        problems += await _privilege_problems(conn, service, role, tables)
    return problems


async def _privilege_problems(conn: asyncpg.Connection, service: str, role: str, tables: set[str]) -> list[str]:
    held = {(r["table_name"], r["privilege"]) for r in await conn.fetch(R["table_privileges"], role)}
    listed = [(table, privilege) for table, privileges in TABLE_PRIVILEGES[service].items() if table in tables
              for privilege in privileges]
    wanted = {(table, privilege) for table, privilege in listed if privilege in PRIVILEGES}
    problems = [f"{role}: lacks {p} on {t}" for t, p in sorted(wanted - held)]
    for table, privilege in listed:
        match = _COLUMN_PRIVILEGE.match(privilege)
        if match and not await conn.fetchval("SELECT has_column_privilege($1, $2::regclass, $3, $4)",
                                             role, table, match.group(2), match.group(1)):
            problems.append(f"{role}: lacks {privilege} on {table}")
    problems += [f"{role}: must not have {p} on {t}" for t, p in sorted(held - wanted)]
    rights = await conn.fetchrow(R["creation_rights"], role)
    if rights["schema_create"] or rights["database_create"]:
        problems.append(f"{role}: may create objects (CREATE on the schema or the database)")
    if not rights["database_connect"]:
        problems.append(f"{role}: cannot connect to the database")
    for function in {f for granted in FUNCTIONS.values() for f in granted}:
        if not await _function_exists(conn, function):
            continue
        allowed = function in FUNCTIONS.get(service, ())
        held_execute = bool(await conn.fetchval(R["function_privilege"], role, function))
        if allowed and not held_execute:
            problems.append(f"{role}: lacks EXECUTE on {function}")
        elif held_execute and not allowed:
            problems.append(f"{role}: must not have EXECUTE on {function}")
    return problems
