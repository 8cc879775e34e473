"""With work_token set, only callers presenting it reach WorkService; RunService is unaffected."""

import grpc
import pytest
from executor_support import executor, scripted_agent, wait_status, write_agent
from support import reason_of, scheduler_stack, submit

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration


async def test_work_service_needs_the_executor_token(db_url, db, tmp_path):
    async with scheduler_stack(db_url, work_token="s3cret") as stack:
        run = await submit(stack)  # RunService: tenant-scoped, no executor token needed
        for metadata in ([], [("authorization", "Bearer wrong")], [("authorization", "s3cret")]):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stack.work.ClaimWork(ws.ClaimWorkRequest(worker_id="intruder", agents=["demo"]),
                                           metadata=metadata, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert reason_of(refused.value) == "EXECUTOR_TOKEN_REQUIRED"
        row = await db.fetchrow("SELECT status, fencing_token FROM agent_runs")
        assert row["status"] == "QUEUED" and row["fencing_token"] == 0  # nothing was claimed

        agents = tmp_path / "agents"
        write_agent(agents, scripted_agent("demo", [{"id": "done", "finish": "ok"}], []))
        async with executor(stack, agents, work_token="s3cret", scheduler_insecure=True):
            finished = await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED)
        assert finished.status == pb.RUN_STATUS_COMPLETED
