"""The reconciler resolves what its lookups can decide; the rest stays paused and is counted."""

import asyncio
import json
import sys

import pytest
from executor_support import executor, history, http_tool, mock_tool, scripted_agent, wait_status, write_agent
from support import scheduler_stack, submit

from shared.gen.agentrt.v1 import common_pb2 as pb

pytestmark = pytest.mark.integration


def agent(url, name, tool, **options):
    plan = [{"id": "charge", "tool": tool, "args": {"n": "${input.n}"}},
            {"id": "done", "finish": "${results.charge.response.id}"}]
    return scripted_agent(name, plan, [http_tool(url, tool, timeout_s=0.5, **options)])


async def paused_run(stack, mock, agents, agent_name, tool, mode, n):
    mock.fault(tool, mode, hold_ms=2000)
    run = await submit(stack, agent=agent_name, payload={"n": n})
    async with executor(stack, agents):
        final = await wait_status(stack, run.run_id, pb.RUN_STATUS_PAUSED_INDOUBT)
    return final


async def reconcile_once(stack, agents):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "reconcile", "--once", "--tenants", "tenant-a",
        "--scheduler", stack.addr, "--agents", str(agents),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return json.loads(out.decode().strip().splitlines()[-1])


async def test_the_reconciler_resolves_what_it_can_and_counts_the_rest(db_url, tmp_path):
    agents = tmp_path / "agents"
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(agents, agent(mock.url, "pay", "pay.charge"))
        write_agent(agents, agent(mock.url, "flaky", "pay.flaky"))
        write_agent(agents, agent(mock.url, "legacy", "pay.legacy", lookup=False))
        executed = await paused_run(stack, mock, agents, "pay", "pay.charge", "timeout_after_execute", 1)
        never_ran = await paused_run(stack, mock, agents, "pay", "pay.charge", "error_before", 2)
        unknowable = await paused_run(stack, mock, agents, "flaky", "pay.flaky", "error_before", 3)
        no_lookup = await paused_run(stack, mock, agents, "legacy", "pay.legacy", "error_after", 4)
        mock.fault("pay.flaky", "lookup_unknown")

        report = await reconcile_once(stack, agents)
        assert {k: report[k] for k in ("succeeded", "not_executed", "undecided", "no_lookup", "errors")} == {
            "succeeded": 1, "not_executed": 1, "undecided": 1, "no_lookup": 1, "errors": 0}

        [row] = (await history(stack, executed.run_id)).tool_executions
        assert row.status == pb.TOOL_EXECUTION_STATUS_SUCCEEDED and row.HasField("reconciled_at")
        evidence = json.loads(row.reconciliation_evidence_json)
        assert evidence["lookup"] == "found" and evidence["rule_version"] == "reconciler/1"
        assert evidence["resolved_by"] == "agentrt-reconciler" and evidence["checked_fence"] == 2
        [row] = (await history(stack, never_ran.run_id)).tool_executions
        assert row.status == pb.TOOL_EXECUTION_STATUS_NOT_EXECUTED
        [row] = (await history(stack, unknowable.run_id)).tool_executions
        assert row.status == pb.TOOL_EXECUTION_STATUS_IN_DOUBT
        assert json.loads(row.reconciliation_evidence_json)["lookup"] == "unknown"  # recorded, still paused

        async with executor(stack, agents):
            done = await wait_status(stack, executed.run_id, pb.RUN_STATUS_COMPLETED)
            retried = await wait_status(stack, never_ran.run_id, pb.RUN_STATUS_COMPLETED)
        first_key = (await history(stack, executed.run_id)).tool_executions[0].idempotency_key
        assert json.loads(done.result_json) == "pay.charge-1"
        assert mock.calls_by_key("pay.charge")[first_key] == 1  # found by lookup, never resent
        keys = [r.step_key for r in (await history(stack, retried.run_id)).tool_executions]
        assert keys == ["charge/attempt-1", "charge/attempt-2"]
        for still_paused in (unknowable, no_lookup):
            hist = await history(stack, still_paused.run_id)
            assert hist.run.status == pb.RUN_STATUS_PAUSED_INDOUBT
