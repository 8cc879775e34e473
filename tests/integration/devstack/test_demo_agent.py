"""The after-sales demo agent (devstack/agents/after_sales_return.yaml) on a real scheduler, executor
and mock tool server: a small refund completes; a large one waits for approval, then completes."""

import pytest
from executor_support import executor, mock_tool
from support import scheduler_stack

from devstack import demo
from shared.client.runs import AgentrtClient

pytestmark = pytest.mark.integration
TENANT = "tenant-a"


async def test_small_refunds_complete_and_large_ones_wait_for_approval(db_url, tmp_path):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        agent = demo.install_agent(tmp_path / "agents", mock.url)
        assert demo.approval_threshold(agent) == 500
        runs = demo.demo_runs(5, "t", demo.approval_threshold(agent))  # the fifth is above the threshold
        assert [r.needs_approval for r in runs] == [False, False, False, False, True]
        async with AgentrtClient(stack.addr, tenant=TENANT) as client, executor(stack, tmp_path / "agents"):
            await demo.submit_all(client, runs, "t")
            small, large = runs[0], runs[4]
            done = await client.wait(small.run_id, until={"COMPLETED", "FAILED", "PAUSED_HUMAN"}, timeout_s=30)
            assert done.status == "COMPLETED", done.terminal_reason
            assert done.result["order_id"] == small.input["order_id"]
            assert done.result["label_id"].startswith("labels.create-")
            paused = await client.wait(large.run_id, until={"COMPLETED", "FAILED", "PAUSED_HUMAN"}, timeout_s=30)
            large.update(paused)
            assert paused.status == "PAUSED_HUMAN" and paused.current_step_key.startswith(demo.APPROVAL_NODE)
            assert f"approve with ResumeRun (run_id {large.run_id}, decision APPROVE" in paused.pause_reason
            assert f"`agentrt runs resume {large.run_id} --approve --tenant " in paused.pause_reason
            assert large.outcome(auto_approve=False) == demo.AWAITING_APPROVAL
            # Nothing after the approval node ran before a person said yes.
            history = await client.history(large.run_id)
            assert [t["tool_name"] for t in history.tool_executions] == ["orders.get", "policy.explain", "risk.check"]

            await client.resume(large.run_id, operator="alice", approve=True)
            approved = await client.wait(large.run_id, until={"COMPLETED", "FAILED"}, timeout_s=30)
            assert approved.status == "COMPLETED", approved.terminal_reason
            history = await client.history(large.run_id)
            assert [t["tool_name"] for t in history.tool_executions] == [
                "orders.get", "policy.explain", "risk.check", "labels.create", "tickets.register", "notify.send"]
        # One request per idempotency key for the label service (and every other tool).
        assert set(mock.calls_by_key("labels.create").values()) == {1}
        assert mock.executions("labels.create") == 5  # four small refunds and the approved one


async def test_queued_mock_faults_can_be_dropped(tmp_path):
    import aiohttp

    async with mock_tool(tmp_path) as mock, aiohttp.ClientSession() as session:
        async with session.post(f"{mock.url}/_faults", json={"tool": "x", "mode": "refuse", "count": 3}) as resp:
            assert resp.status == 200
        async with session.delete(f"{mock.url}/_faults") as resp:
            assert (await resp.json()) == {"cleared": 1}
        async with session.post(f"{mock.url}/tools/x", json={}, headers={"Idempotency-Key": "k"}) as resp:
            assert resp.status == 200  # the refusal queued above is gone
