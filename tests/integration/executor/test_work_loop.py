"""Priority 1: a multi-step run completes against the real scheduler; each tool request reaches the mock once."""

import asyncio
import json
import urllib.request

import grpc
import pytest
from executor_support import (
    executor,
    history,
    http_tool,
    latest_state,
    mock_tool,
    scripted_agent,
    wait_status,
    write_agent,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import scheduler_stack, submit

from shared.gen.agentrt.v1 import common_pb2 as pb

pytestmark = pytest.mark.integration

SCHEMA = {"type": "object", "required": ["order_id"], "properties": {"order_id": {"type": "integer"}}}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


def order_agent(mock_url: str) -> dict:
    plan = [
        {"id": "read_order", "tool": "orders.get", "args": {"order_id": "${input.order_id}"}},
        {"id": "create_label", "tool": "labels.create",
         "args": {"order": "${results.read_order.response.id}", "address": "${input.address}"}},
        {"id": "audit", "tool": "audit.log", "args": {"label": "${results.create_label.response.id}"}},
        {"id": "done", "finish": {"label": "${results.create_label.response.id}"}},
    ]
    tools = [http_tool(mock_url, "orders.get", schema=SCHEMA), http_tool(mock_url, "labels.create"),
             {"name": "audit.log", "kind": "python", "callable": "executor_support:record_tool"}]
    return scripted_agent("returns", plan, tools)


async def test_multi_step_runs_complete_and_each_request_reaches_the_mock_once(db_url, db, tmp_path):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        agents = tmp_path / "agents"
        write_agent(agents, order_agent(mock.url))
        runs = [await submit(stack, agent="returns", payload={"order_id": i, "address": f"street {i}"})
                for i in range(1, 4)]
        async with executor(stack, agents, slots=2, health_addr="127.0.0.1:0", metrics_addr="127.0.0.1:0") as worker:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{worker.health_port}") as channel:
                health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
                assert health.status == health_pb2.HealthCheckResponse.SERVING
            finished = [await wait_status(stack, r.run_id, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED)
                        for r in runs]
            metrics = await asyncio.to_thread(scrape, worker.metrics_port)
            assert "agentrt_executor_claimed_total 3.0" in metrics and "agentrt_executor_slots 2.0" in metrics
            batcher = worker.services.client.batcher
            # 3 runs x (checkpoint, Tx1, 2 x Tx2+Tx1, last Tx2 with the end) at least, all through WriteBatch.
            assert batcher.items >= 15 and 0 < batcher.batches <= batcher.items
            assert f"agentrt_executor_batched_writes_total {float(batcher.items)}" in metrics
            assert f"agentrt_executor_write_batches_total {float(batcher.batches)}" in metrics
        assert [pb.RunStatus.Name(r.status) for r in finished] == ["RUN_STATUS_COMPLETED"] * 3, \
            [r.terminal_reason for r in finished]
        for run in finished:
            hist = await history(stack, run.run_id)
            assert [e.step_key for e in hist.tool_executions] == [
                "read_order/attempt-1", "create_label/attempt-1", "audit/attempt-1"]
            assert all(e.status == pb.TOOL_EXECUTION_STATUS_SUCCEEDED for e in hist.tool_executions)
            label = json.loads(hist.tool_executions[1].response_json)["id"]
            assert json.loads(run.result_json) == {"label": label}
            state = latest_state(hist)  # the checkpoint, with results from the journal and the ledger
            assert "pending_tool" not in state and state["usage"]["steps"] == 4
            assert set(state["tool_results"]) == {"read_order/attempt-1", "create_label/attempt-1",
                                                  "audit/attempt-1"}
        # Each request reached the mock exactly once (counted in the mock's own SQLite store).
        calls = mock.calls_by_key()
        assert len(calls) == 6 and set(calls.values()) == {1}
        assert mock.executions() == 6
        ledger_keys = {r["idempotency_key"] for r in await db.fetch(
            "SELECT idempotency_key FROM tool_executions WHERE tool_name <> 'audit.log'")}
        assert ledger_keys == set(calls)
        # Requests carried the fence of the lease they were made under.
        fences = mock.rows("SELECT DISTINCT fence FROM requests")
        assert fences == [(1,)]
        leases = await db.fetchval("SELECT count(*) FROM agent_runs WHERE lease_owner IS NOT NULL")
        assert leases == 0
