"""The class of defect migration 0021 fixed: a LANGUAGE sql function with a SET clause cannot be
inlined, and before PostgreSQL 18 its statement is planned again on every call (agentrt_fair_head
cost each submit about 0.13 ms on PostgreSQL 15). Swept over every function of the schema and every
named query of the scheduler and the relay: such a function is called only where a call now and then
is meant (each allowed below with the reason), never from a per-request statement."""

from __future__ import annotations

import re

import asyncpg
import pytest

from relay.store import Q as RELAY_Q
from scheduler.store.queries import Q as SCHEDULER_Q

pytestmark = pytest.mark.integration

# function -> the named queries allowed to call it, and why they are not per request.
ALLOWED = {
    # Every tenant's runtime limits, read by Database.flow once per limits_refresh_ms (0019).
    "agentrt_flow_limits": {"scheduler:list_flow_limits"},
}


async def test_no_per_request_statement_calls_a_sql_function_that_is_planned_on_every_call(
        db: asyncpg.Connection) -> None:
    rows = await db.fetch(
        """
        SELECT p.proname FROM pg_proc p
        JOIN pg_language l ON l.oid = p.prolang
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public' AND l.lanname = 'sql' AND p.proconfig IS NOT NULL
        """)
    replanned = {row["proname"] for row in rows}
    assert "agentrt_fair_head" not in replanned  # PL/pgSQL since 0021: its plan is kept
    queries = {f"scheduler:{name}": sql for name, sql in SCHEDULER_Q.items()}
    queries |= {f"relay:{name}": sql for name, sql in RELAY_Q.items()}
    calls = {(function, name) for function in replanned for name, sql in queries.items()
             if re.search(rf"\b{function}\s*\(", sql)}
    allowed = {(function, name) for function, names in ALLOWED.items() for name in names}
    assert calls <= allowed, f"statements calling a SQL function planned on every call: {sorted(calls - allowed)}"
    # The allowance names real calls (a renamed query or function would leave it sweeping nothing).
    assert allowed <= calls, sorted(allowed - calls)
