"""The hot writes find their rows through the indexes that name them, whatever the planner's statistics.

A ledger-row update reached only through a join with the run CTE lets the
planner pick the partial index of open and in-doubt rows and filter all of
them by step key: every tool step would then cost more as the number of open
or frozen ledger rows (of every run) grows.
"""

import json
import re
import uuid

import asyncpg
import pytest

from scheduler.store.queries import Q
from shared.db import init_connection

pytestmark = pytest.mark.integration
LEDGER_WRITES = ("complete_tool_call", "complete_tool_call_and_end", "complete_and_begin_tool_call",
                 "tool_not_executed", "mark_tool_in_doubt")


def scans(plan: object) -> list[tuple[str, str, str]]:
    """(node type, relation, index) of every scan node in an EXPLAIN (FORMAT JSON) plan."""
    found: list[tuple[str, str, str]] = []

    def walk(node: dict) -> None:
        if "Relation Name" in node:
            found.append((node["Node Type"], node["Relation Name"], node.get("Index Name", "")))
        for child in node.get("Plans", []):
            walk(child)

    for entry in plan if isinstance(plan, list) else [plan]:
        walk(entry["Plan"])
    return found


@pytest.mark.parametrize("name", LEDGER_WRITES)
async def test_ledger_writes_use_the_run_and_step_key_index(db_url, name):
    db = await asyncpg.connect(db_url)
    try:
        await check_plan(db, name)
    finally:
        await db.close()


async def check_plan(db: asyncpg.Connection, name: str) -> None:
    await db.execute("SET plan_cache_mode = force_generic_plan")  # the plan a long-lived pool connection keeps
    # A young database (not analyzed yet) with a few open ledger rows among closed ones: the partial index
    # of open and in-doubt rows looks cheapest, and a generic plan made then is kept by the connection.
    await db.execute(
        """
        INSERT INTO agent_runs (id, tenant_id, agent_name, status, lease_owner, lease_expires_at, fencing_token,
                                current_step_key)
        SELECT gen_random_uuid(), 't', 'a', 'WAITING_TOOL', 'w', clock_timestamp() + interval '1 hour', 1, 's/1'
        FROM generate_series(1, 50)
        """)
    await db.execute(
        """
        INSERT INTO tool_executions (id, run_id, step_key, tool_name, idempotency_key, request_json, request_hash,
                                     status, fencing_token, intent_event_id)
        SELECT gen_random_uuid(), id, 's/1', 'tool', 'k-' || id, '{}'::jsonb, sha256(id::text::bytea),
               'OUTBOUND_INTENT', 1, gen_random_uuid()
        FROM agent_runs""")
    await db.execute(
        """
        UPDATE tool_executions SET status = 'SUCCEEDED', completed_at = clock_timestamp(), response_json = '{}'
        WHERE run_id NOT IN (SELECT id FROM agent_runs ORDER BY id LIMIT 3)
        """)
    statement = await db.prepare(Q[name])
    await db.execute(f"PREPARE ledger_write AS {Q[name]}")
    nulls = ", ".join(["NULL"] * len(statement.get_parameters()))
    plan = json.loads(await db.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE ledger_write({nulls})"))
    ledger = [scan for scan in scans(plan) if scan[1] == "tool_executions" and scan[0] != "ModifyTable"]
    assert ledger, json.dumps(plan)[:2000]
    for node_type, _, index in ledger:
        assert node_type in ("Index Scan", "Index Only Scan"), (name, ledger)
        assert index == "tool_executions_run_id_step_key_key", (name, ledger)


async def test_history_pages_of_the_ledger_use_the_intent_order_index(db_url):
    """A page of a long run's ledger is read in index order, never by sorting every row of the run."""
    db = await asyncpg.connect(db_url)
    try:
        await db.execute("SET plan_cache_mode = force_generic_plan")
        await db.execute(
            """
            INSERT INTO agent_runs (id, tenant_id, agent_name, status) VALUES (gen_random_uuid(), 't', 'a', 'QUEUED')
            """)
        await db.execute(
            """
            INSERT INTO tool_executions (id, run_id, step_key, tool_name, idempotency_key, request_json, request_hash,
                                         status, fencing_token, intent_event_id, completed_at, response_json)
            SELECT gen_random_uuid(), r.id, 's/' || n, 'tool', 'k-' || n, '{}'::jsonb, sha256(n::text::bytea),
                   'SUCCEEDED', 1, gen_random_uuid(), clock_timestamp(), '{}'
            FROM agent_runs AS r, generate_series(1, 2000) AS n""")
        await db.execute("ANALYZE tool_executions")
        await db.execute(f"PREPARE history_page AS {Q['history_tool_executions']}")
        run_id = await db.fetchval("SELECT id FROM agent_runs")
        plan = json.loads(await db.fetchval(
            f"EXPLAIN (FORMAT JSON) EXECUTE history_page('{run_id}', NULL, NULL, 50)"))
        ledger = [scan for scan in scans(plan) if scan[1] == "tool_executions"]
        assert ledger == [("Index Scan", "tool_executions", "tool_executions_run_intent_idx")], ledger
        assert "Sort" not in json.dumps(plan), json.dumps(plan)[:2000]
    finally:
        await db.close()


@pytest.mark.parametrize("name", ["claim_work", "claim_work_plain"])
async def test_the_claim_reads_only_its_partial_indexes_in_claim_order(db_url, name):
    """claim_work walks the ready index in claim order (priority, first enqueue) and the waking and expired
    indexes by time, each under a LIMIT (only the few looked-at runs are ever sorted), and counts concurrency
    slots through the leased-run indexes: no scan of every queued row, whatever the mix of runs."""
    db = await asyncpg.connect(db_url)
    try:
        await db.execute("SET plan_cache_mode = force_generic_plan")
        await db.execute(
            """
            INSERT INTO agent_runs (id, tenant_id, agent_name, status, priority, claim_ready, next_attempt_at,
                                    lease_owner, lease_expires_at, finished_at)
            SELECT gen_random_uuid(), 't' || (n % 50), CASE WHEN s.status = 'QUEUED' THEN 'a' ELSE 'b' || (n % 40) END,
                   s.status, 1 + n % 9, s.ready,
                   CASE WHEN s.ready THEN clock_timestamp() ELSE clock_timestamp() + interval '1 hour' END,
                   CASE WHEN s.status = 'RUNNING' THEN 'w' END,
                   CASE WHEN s.status = 'RUNNING' THEN clock_timestamp() + interval '1 hour' END,
                   CASE WHEN s.status = 'COMPLETED' THEN clock_timestamp() END
            FROM generate_series(1, 4000) AS n,
                 (VALUES ('QUEUED', true), ('QUEUED', false), ('RUNNING', true), ('COMPLETED', true))
                   AS s(status, ready)
            """)
        await db.execute("ANALYZE agent_runs")
        statement = await db.prepare(Q[name])
        await db.execute(f"PREPARE claim AS {Q[name]}")
        values = dict(worker_id="w-plan", lease_ms=30_000, agents=["a"], wake_batch=64)
        if name == "claim_work":
            values.update(lookahead=16, recheck_ms=500, tenant_max_default=10, limit_tenants=["t1"],
                          limit_tenant_max=[3], limit_agents=["a"], limit_agent_max=[100])
        args = getattr(Q, name).args(**values)
        assert len(args) == len(statement.get_parameters())
        literals = ", ".join(_literal(a) for a in args)
        plan = json.loads(await db.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE claim({literals})"))
        nodes = [child for _, child in edges(plan)] + [entry["Plan"] for entry in plan]
        # The claimed run's pending signals are read by run id (its few rows): not a claim path.
        signal_indexes = {"run_signals_pending_idx", "run_signals_run_id_request_id_key"}
        runs = [(n["Node Type"], n.get("Index Name", "")) for n in nodes
                if n.get("Relation Name") == "agent_runs"
                or (n["Node Type"] == "Bitmap Index Scan" and n.get("Index Name") not in signal_indexes)]
        runs = [(kind, index) for kind, index in runs if kind != "ModifyTable"]
        indexes = {index for _, index in runs}
        claim_paths = {"agent_claim_ready_idx", "agent_claim_waking_idx", "agent_claim_expired_idx"}
        slot_counts = {"agent_leased_tenant_idx", "agent_leased_agent_idx", "agent_leased_key_idx"}
        expected = claim_paths | slot_counts if name == "claim_work" else claim_paths
        assert expected <= indexes, " ".join(sorted(indexes))
        for node_type, index in runs:
            # A slot count may collect its group's few leased rows through a bitmap of its index.
            assert node_type in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Bitmap Index Scan"), runs
            assert index in claim_paths | slot_counts | {"agent_runs_pkey", ""}, runs
            if index in claim_paths:
                assert node_type == "Index Scan", runs
        for parent, child in edges(plan):
            if child.get("Index Name") in claim_paths:
                assert parent["Node Type"] in ("Limit", "LockRows", "Result"), \
                    (parent["Node Type"], child["Index Name"])
    finally:
        await db.close()


def edges(plan: object) -> list[tuple[dict, dict]]:
    """(parent, child) of every node pair of an EXPLAIN (FORMAT JSON) plan."""
    found: list[tuple[dict, dict]] = []

    def walk(node: dict) -> None:
        for child in node.get("Plans", []):
            found.append((node, child))
            walk(child)

    for entry in plan if isinstance(plan, list) else [plan]:
        walk(entry["Plan"])
    return found


def _literal(value: object) -> str:
    if isinstance(value, list):
        kind = "int[]" if value and isinstance(value[0], int) else "text[]"
        return "ARRAY[" + ", ".join(_literal(v) for v in value) + "]::" + kind
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


async def test_a_submits_fair_share_pass_is_two_index_probes(db_url):
    """submit_run reads its tenant's newest queued pass (agent_queued_pass_idx) and its priority's ready head
    (agent_claim_ready_idx), each an index scan under a LIMIT: no scan of a tenant's or the queue's rows."""
    db = await asyncpg.connect(db_url)
    try:
        await init_connection(db)
        await db.execute(
            """
            INSERT INTO agent_runs (id, tenant_id, agent_name, status, priority, fair_pass, claim_ready)
            SELECT gen_random_uuid(), 't' || (n % 1000), 'a', 'QUEUED', 1 + n % 9, n, n % 3 > 0
            FROM generate_series(1, 20000) AS n
            """)
        await db.execute("ANALYZE agent_runs")
        values = dict(run_id=uuid.uuid4(), tenant_id="t7", agent_name="a", agent_version="", input={},
                      labels={}, max_attempts=3, max_steps=0, max_tokens=0, max_cost_usd=0.0, deadline_at=None,
                      client_request_id=None, submit_hash=None, event_id=uuid.uuid4(), priority=5,
                      concurrency_key=None, concurrency_max=None, fair_step=1.0, traceparent=None,
                      tracestate=None, key_id=None, wrapped_key=None, sensitive=None, retry_of_run_id=None)
        plan = await db.fetchval("EXPLAIN (FORMAT JSON) " + Q["submit_run"], *Q.submit_run.args(**values))
        plan = json.loads(plan) if isinstance(plan, str) else plan  # (the connection's json codec decodes it)
        probes = {(child["Node Type"], child.get("Index Name")): parent["Node Type"] for parent, child in edges(plan)
                  if child.get("Relation Name") == "agent_runs" and child["Node Type"] != "ModifyTable"}
        # The priority's ready head is every tenant's: read by agentrt_fair_head in the row-level
        # security work scope (migration 0016); its statement is planned on its own.
        # (PL/pgSQL since 0021: its one statement is the RETURN's subquery.)
        body = await db.fetchval("SELECT prosrc FROM pg_proc WHERE proname = 'agentrt_fair_head'")
        found = re.search(r"RETURN \((SELECT .*)\);\s*END", body, re.S)
        assert found is not None, body
        head = await db.fetchval("EXPLAIN (FORMAT JSON) " + found.group(1).replace("at_priority", "$1::integer"), 5)
        head = json.loads(head) if isinstance(head, str) else head
        probes.update({(child["Node Type"], child.get("Index Name")): parent["Node Type"]
                       for parent, child in edges(head) if child.get("Relation Name") == "agent_runs"})
        assert {index for _, index in probes} == {"agent_queued_pass_idx", "agent_claim_ready_idx"}, probes
        assert {kind for kind, _ in probes} <= {"Index Scan", "Index Only Scan"}, probes
        assert set(probes.values()) == {"Limit"}, probes
        assert "agentrt_fair_head($" in Q["submit_run"]
    finally:
        await db.close()
