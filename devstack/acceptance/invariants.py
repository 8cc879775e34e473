"""Invariant queries over the runtime database: each returns the rows that violate it (none = holds).

Used after load experiments and the chaos soak. The schema's CHECK constraints
already refuse many bad states (tests/integration/scheduler/test_db_invariants.py); these
queries cover what spans rows and tables.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from devstack.acceptance.evidence import jsonable

INVARIANTS: dict[str, str] = {
    # A run's checkpoints are exactly versions 1..version (CAS chain without gaps or extras).
    "checkpoint versions 1..version, no gaps": """
        SELECT r.id, r.version, count(c.version) AS checkpoints, min(c.version) AS first, max(c.version) AS last
        FROM agent_runs r LEFT JOIN agent_checkpoints c ON c.run_id = r.id
        GROUP BY r.id, r.version
        HAVING count(c.version) <> r.version OR coalesce(max(c.version), 0) <> r.version
            OR coalesce(min(c.version), 1) <> 1""",
    # Fences only grow: along a run's checkpoint chain, and never above the run's current fence.
    "checkpoint fences never go back": """
        SELECT run_id, version, fencing_token, previous FROM (
          SELECT run_id, version, fencing_token,
                 lag(fencing_token) OVER (PARTITION BY run_id ORDER BY version) AS previous
          FROM agent_checkpoints) chain
        WHERE fencing_token < previous""",
    "checkpoint fence not above the run's": """
        SELECT c.run_id, c.version, c.fencing_token, r.fencing_token AS run_fence
        FROM agent_checkpoints c JOIN agent_runs r ON r.id = c.run_id WHERE c.fencing_token > r.fencing_token""",
    "ledger fence not above the run's": """
        SELECT te.run_id, te.step_key, te.fencing_token, r.fencing_token AS run_fence
        FROM tool_executions te JOIN agent_runs r ON r.id = te.run_id WHERE te.fencing_token > r.fencing_token""",
    # Only RUNNING / WAITING_TOOL hold a lease (also a CHECK constraint).
    "lease only while leased": """
        SELECT id, status, lease_owner FROM agent_runs
        WHERE (status IN ('RUNNING', 'WAITING_TOOL')) <> (lease_owner IS NOT NULL)""",
    "WAITING_TOOL has its open ledger row": """
        SELECT r.id, r.current_step_key FROM agent_runs r
        WHERE r.status = 'WAITING_TOOL' AND NOT EXISTS (
          SELECT 1 FROM tool_executions te WHERE te.run_id = r.id AND te.step_key = r.current_step_key
            AND te.status = 'OUTBOUND_INTENT')""",
    "PAUSED_INDOUBT has its in-doubt ledger row": """
        SELECT r.id, r.current_step_key FROM agent_runs r
        WHERE r.status = 'PAUSED_INDOUBT' AND NOT EXISTS (
          SELECT 1 FROM tool_executions te WHERE te.run_id = r.id AND te.step_key = r.current_step_key
            AND te.status = 'IN_DOUBT')""",
    "at most one open tool call per run": """
        SELECT run_id, count(*) FROM tool_executions WHERE status = 'OUTBOUND_INTENT'
        GROUP BY run_id HAVING count(*) > 1""",
    "ended runs have no open tool call": """
        SELECT r.id, r.status, te.step_key FROM agent_runs r JOIN tool_executions te ON te.run_id = r.id
        WHERE r.status IN ('COMPLETED', 'FAILED') AND te.status = 'OUTBOUND_INTENT'""",
    "NOT_EXECUTED carries its evidence": """
        SELECT run_id, step_key FROM tool_executions
        WHERE status = 'NOT_EXECUTED' AND reconciliation_evidence IS NULL""",
    "events never ahead of their run": """
        SELECT o.id, o.run_version, r.version FROM outbox o JOIN agent_runs r ON r.id = o.run_id
        WHERE o.run_version > r.version""",
    "paused runs carry a reason": """
        SELECT id, status FROM agent_runs
        WHERE status IN ('PAUSED_HUMAN', 'PAUSED_INDOUBT') AND coalesce(pause_reason, '') = ''""",
}

STUCK_SQL = """
SELECT id, status, lease_owner, lease_expires_at, next_attempt_at, current_step_key FROM agent_runs
WHERE status IN ('QUEUED', 'RUNNING', 'WAITING_TOOL')"""


async def violations(conn: asyncpg.Connection) -> dict[str, list[dict[str, Any]]]:
    """Every invariant with the rows that break it (empty lists when all hold)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for name, sql in INVARIANTS.items():
        rows = await conn.fetch(sql)
        found[name] = jsonable([dict(r) for r in rows[:50]])
    return found
