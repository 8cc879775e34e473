"""Runtime flow limits (migration 0015): SetLimit / ClearLimit / ListLimits override the scheduler's
settings for every replica, and a change holds from the next claim, submit or Tx1.

Two replicas share one database: one serves the admin calls, the other claims with
limits_refresh_ms 0 (it reads flow_limits in every claim), so "the next claim" is the
very next one, with no waiting.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import grpc
import pytest
from helpers import agentrt
from support import claim, lease_ref, rpc_error, scheduler_stack, submit, tool_state

from shared.errors import error_info
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration


async def set_limit(stack: Any, scope: str, name: str, value: str, **where: str) -> rs.FlowLimit:
    return await stack.runs.SetLimit(rs.SetLimitRequest(scope=scope, name=name, value=value, **where,
                                                        note=rs.AuditNote(reason="test")), metadata=stack.md())


async def clear_limit(stack: Any, scope: str, name: str, **where: str) -> rs.ClearLimitResponse:
    return await stack.runs.ClearLimit(rs.ClearLimitRequest(scope=scope, name=name, **where), metadata=stack.md())


async def test_a_tenant_limit_set_at_run_time_holds_the_next_claim_on_another_replica(db_url, db):
    async with scheduler_stack(db_url) as admin, \
            scheduler_stack(db_url, limits_refresh_ms=0, concurrency_recheck_ms=50) as worker:
        for _ in range(3):
            await submit(admin, tenant="tenant-a")
        assert await claim(worker, "w1") is not None
        limit = await set_limit(admin, "tenant", "max_running", "1", tenant_id="tenant-a")
        assert (limit.scope, limit.tenant_id, limit.name, limit.value, limit.updated_by) == (
            "tenant", "tenant-a", "max_running", "1", "anonymous")
        assert await claim(worker, "w2") is None  # the very next claim: tenant-a holds its one slot
        assert await db.fetchval("SELECT count(*) FROM agent_runs WHERE waiting_on = 'tenant'") >= 1

        stats = await admin.runs.GetStats(rs.GetStatsRequest(), metadata=admin.md("tenant-a"))
        assert (stats.queued, stats.running) == (2, 1)
        assert stats.waiting_on_limit["tenant"] >= 1
        assert stats.limits["max_running"] == "1"

        await set_limit(admin, "tenant", "max_running", "2", tenant_id="tenant-a")
        assert await claim(worker, "w3", wait_ms=2_000) is not None  # raised: one more fits
        assert await claim(worker, "w4") is None
        cleared = await clear_limit(admin, "tenant", "max_running", tenant_id="tenant-a")
        assert cleared.cleared and cleared.limit.value == "2"
        assert await claim(worker, "w5", wait_ms=2_000) is not None  # the settings' "no limit" again
        again = await clear_limit(admin, "tenant", "max_running", tenant_id="tenant-a")
        assert not again.cleared

        listed = await admin.runs.ListLimits(rs.ListLimitsRequest(), metadata=admin.md())
        assert list(listed.limits) == []
        audit = await admin.runs.ListAuditEvents(rs.ListAuditEventsRequest(), metadata=admin.md("tenant-a"))
        actions = [(e.action, json.loads(e.state_before_json or "null"), json.loads(e.state_after_json or "null"))
                   for e in audit.events]
        assert [a for a, _, _ in actions] == ["limit.clear", "limit.set", "limit.set"]
        assert actions[1][1]["value"] == "1" and actions[1][2]["value"] == "2"
        assert actions[2][1] is None and actions[0][2] is None


async def test_an_agent_limit_set_at_run_time_holds_on_this_replica_at_once(db_url):
    async with scheduler_stack(db_url, concurrency_recheck_ms=50) as stack:
        for tenant in ("t1", "t2", "t3"):
            await submit(stack, tenant=tenant)
        assert await claim(stack, "w1") is not None
        await set_limit(stack, "agent", "max_running", "1", subject="demo")
        assert await claim(stack, "w2") is None  # the replica that served SetLimit reads it again at once
        listed = await stack.runs.ListLimits(rs.ListLimitsRequest(), metadata=stack.md())
        assert [(x.scope, x.subject, x.name, x.value) for x in listed.limits] == [
            ("agent", "demo", "max_running", "1")]


async def test_a_tool_rate_set_at_run_time_holds_the_next_tx1(db_url, db):
    async with scheduler_stack(db_url) as admin, scheduler_stack(db_url, limits_refresh_ms=0) as worker:
        runs = [await submit(admin) for _ in range(3)]
        leases = [await claim(worker, f"w{n}") for n in range(3)]
        assert {lease.run.run_id for lease in leases if lease} == {run.run_id for run in runs}

        async def begin(n: int) -> Any:
            lease = leases[n]
            assert lease is not None
            saved = await worker.work.SaveCheckpoint(ws.SaveCheckpointRequest(
                lease=lease_ref(lease), expected_version=0, schema_version=1, event_id=str(uuid.uuid4()),
                state_json=json.dumps(tool_state("s/1", "send", {"n": n}))))
            return worker.work.BeginToolCall(ws.BeginToolCallRequest(
                lease=lease_ref(lease), expected_version=saved.version, step_key="s/1", tool_name="send",
                idempotency_key=f"k-{n}", request_json=json.dumps({"n": n}), execution_id=str(uuid.uuid4()),
                event_id=str(uuid.uuid4())))

        await set_limit(admin, "tool", "rate", "1/min", subject="send")
        began = await (await begin(0))
        assert began.execution.status == pb.TOOL_EXECUTION_STATUS_OUTBOUND_INTENT
        error = await rpc_error(await begin(1))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        info = error_info(error)
        assert info is not None and info.reason == "TOOL_RATE_LIMITED" and info.metadata["limit"] == "rate"
        await set_limit(admin, "tool", "rate", "0", subject="send")  # 0: no rate limit, over the config's
        began = await (await begin(2))
        assert began.execution.status == pb.TOOL_EXECUTION_STATUS_OUTBOUND_INTENT
        assert await db.fetchval("SELECT count(*) FROM tool_executions") == 2


async def test_quota_and_weight_set_at_run_time_hold_the_next_submit(db_url, db):
    async with scheduler_stack(db_url) as stack:
        await set_limit(stack, "tenant", "max_queued_runs", "1", tenant_id="tenant-q")
        await submit(stack, tenant="tenant-q")
        error = await rpc_error(submit(stack, tenant="tenant-q"))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        await submit(stack, tenant="tenant-other")  # another tenant: the settings' "no quota"

        await set_limit(stack, "tenant", "weight", "4")  # tenant_id empty: the call's tenant
        first, second = await submit(stack), await submit(stack)
        passes = await db.fetch("SELECT fair_pass FROM agent_runs WHERE id = ANY($1::uuid[]) ORDER BY fair_pass",
                                [uuid.UUID(first.run_id), uuid.UUID(second.run_id)])
        assert passes[1]["fair_pass"] - passes[0]["fair_pass"] == pytest.approx(0.25)


@pytest.mark.parametrize(("request_fields", "field"), [
    ({"scope": "tenants", "name": "max_running", "value": "1"}, "scope"),
    ({"scope": "tenant", "name": "rate", "value": "1/s"}, "name"),
    ({"scope": "tenant", "name": "max_running", "value": "-1"}, "value"),
    ({"scope": "tenant", "name": "max_running", "value": "many"}, "value"),
    ({"scope": "tenant", "name": "weight", "value": "0"}, "value"),
    ({"scope": "tenant", "name": "weight", "value": "2", "tenant_id": "*"}, "tenant_id"),
    ({"scope": "tenant", "name": "max_running", "value": "1", "subject": "x"}, "subject"),
    ({"scope": "agent", "name": "max_running", "value": "1"}, "subject"),
    ({"scope": "agent", "name": "max_running", "value": "1", "subject": "a", "tenant_id": "t"}, "tenant_id"),
    ({"scope": "tool", "name": "rate", "value": "100 per minute", "subject": "send"}, "value"),
    ({"scope": "tool", "name": "concurrency", "value": "1.5", "subject": "send"}, "value"),
    ({"scope": "tool", "name": "rate", "value": "1/s", "subject": "has space"}, "subject"),
])
async def test_a_bad_limit_is_invalid_argument_naming_its_field_and_changes_nothing(db_url, db, request_fields,
                                                                                      field):
    async with scheduler_stack(db_url) as stack:
        error = await rpc_error(stack.runs.SetLimit(rs.SetLimitRequest(**request_fields), metadata=stack.md()))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        info = error_info(error)
        assert info is not None and info.metadata["field"] == field, error.details()
        assert await db.fetchval("SELECT count(*) FROM flow_limits") == 0
        assert await db.fetchval("SELECT count(*) FROM audit_log") == 0


async def test_agentrt_limits_set_list_clear_and_status(db_url):
    async with scheduler_stack(db_url) as stack:
        await submit(stack)
        code, out, err = await agentrt("limits", "set", "tool", "rate", "50/s", "--subject", "openai.chat",
                                       "--reason", "provider quota", addr=stack.addr)
        assert code == 0, err
        assert "tool openai.chat" in out and "50/s" in out
        code, out, err = await agentrt("limits", "set", "tenant", "max_running", "40", "--json", addr=stack.addr)
        assert code == 0, err
        assert json.loads(out)["tenant_id"] == "tenant-a"
        code, out, err = await agentrt("limits", "list", "--json", addr=stack.addr)
        assert code == 0, err
        assert {(x["scope"], x["name"], x["value"]) for x in json.loads(out)["limits"]} == {
            ("tool", "rate", "50/s"), ("tenant", "max_running", "40")}
        code, out, err = await agentrt("status", addr=stack.addr)
        assert code == 0, err
        assert "flow:       1 queued, 0 running" in out
        assert "max_running 40" in out and "tool openai.chat rate 50/s" in out
        code, out, err = await agentrt("limits", "clear", "tool", "rate", "--subject", "openai.chat",
                                       addr=stack.addr)
        assert code == 0 and out.startswith("cleared: "), err
        code, out, err = await agentrt("limits", "set", "tool", "rate", "fast", "--subject", "openai.chat",
                                       addr=stack.addr)
        assert code != 0 and out == ""
        assert err.strip().splitlines() == [
            "agentrt limits: error: value: rate 'fast': 1 to 1000000000 calls per window (s, min or h), "
            "e.g. 100/min, 5/s or 1000/h (or 0: no rate limit)"]
