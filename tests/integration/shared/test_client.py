import asyncio

import pytest
from support import claim, eid, lease_ref, scheduler_stack

from shared.client.runs import AgentrtClient
from shared.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration


async def test_client_submits_idempotently_and_follows_a_run(db_url):
    async with scheduler_stack(db_url) as stack, AgentrtClient(stack.addr, tenant="tenant-a") as client:
        run, created = await client.submit("demo", {"n": 1}, client_request_id="order-1", labels={"k": "v"})
        again, created_again = await client.submit("demo", {"n": 1}, client_request_id="order-1", labels={"k": "v"})
        assert created and not created_again and again.run_id == run.run_id
        assert run.input == {"n": 1} and isinstance(run.input["n"], int)
        with pytest.raises(AlreadyExists):
            await client.submit("demo", {"n": 2}, client_request_id="order-1")
        with pytest.raises(InvalidArgument) as bad:
            await client.submit("", {})
        assert bad.value.field == "agent_name"

        seen = []

        async def follow() -> None:
            async for update in client.watch(run.run_id, poll_s=0.05):
                seen.append(update.status)

        watcher = asyncio.create_task(follow())
        lease = await claim(stack)
        await stack.work.FinishRun(ws.FinishRunRequest(lease=lease_ref(lease), expected_version=0,
                                                       outcome=ws.FINISH_OUTCOME_COMPLETED, result_json='{"ok": 1}',
                                                       event_id=eid()))
        done = await client.wait(run.run_id, timeout_s=10, poll_s=0.05)
        await asyncio.wait_for(watcher, 10)
        assert done.status == "COMPLETED" and done.result == {"ok": 1}
        assert seen[-1] == "COMPLETED" and seen[0] in ("QUEUED", "RUNNING")

        listed = [r.run_id async for r in client.list_all(statuses=["COMPLETED"], page_size=1)]
        assert listed == [run.run_id]
        history = await client.history(run.run_id)
        assert [e["event_type"] for e in history.events][:1] == ["agent.run_submitted"]

        other = AgentrtClient(stack.addr, tenant="tenant-b", channel=stack.channel)
        with pytest.raises(NotFound):
            await other.get(run.run_id)


async def test_client_cancel_is_safe_to_retry(db_url):
    async with scheduler_stack(db_url) as stack, AgentrtClient(stack.addr, tenant="tenant-a") as client:
        run, _ = await client.submit("demo", {})
        first = await client.cancel(run.run_id, "no longer needed")
        second = await client.cancel(run.run_id, "no longer needed")
        assert first.status == second.status == "CANCELLED"
        assert "no longer needed" in second.terminal_reason


async def test_unreachable_service_is_unavailable_after_bounded_retries():
    from devstack.embedded_pg import free_port

    client = AgentrtClient(f"127.0.0.1:{free_port()}", tenant="t", timeout_s=0.5, max_retries=2)
    async with client:
        with pytest.raises(Unavailable):
            await client.get("00000000-0000-0000-0000-000000000000")
