"""SIGTERM of an executor process mid-run: it finishes the step in flight and exits within its grace;
the run is taken over, resumes from its last checkpoint, and nothing is sent twice."""

import asyncio
import os
import signal
import sys
import time

import pytest
from executor_support import executor, history, http_tool, mock_tool, scripted_agent, wait_for, wait_status, write_agent
from support import scheduler_stack, submit

from shared.gen.agentrt.v1 import common_pb2 as pb

pytestmark = pytest.mark.integration
GRACE_S = 5.0


async def spawn_executor(stack, agents, tmp_path):
    env = {**os.environ, "AGENTRT_SCHEDULER_ADDR": stack.addr, "AGENTRT_AGENTS_PATH": str(agents),
           "AGENTRT_HEALTH_ADDR": "127.0.0.1:0", "AGENTRT_CLAIM_WAIT_MS": "300",
           "AGENTRT_SHUTDOWN_GRACE_S": str(GRACE_S), "AGENTRT_WORKER_ID": "exec-a"}
    log = open(tmp_path / "executor-a.log", "wb")  # noqa: ASYNC230 - closed by the test
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "cli", "executor", env=env,
                                                stdout=log, stderr=log)
    return proc, log


async def test_sigterm_mid_run_then_takeover_resumes_and_nothing_is_sent_twice(db_url, db, tmp_path):
    agents = tmp_path / "agents"
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url, lease_duration_ms=1000) as stack:
        plan = [{"id": "work", "tool": "work.do", "args": {"n": "${input.n}"}, "repeat": 4},
                {"id": "done", "finish": "all done"}]
        write_agent(agents, scripted_agent("worker", plan, [http_tool(mock.url, "work.do")]))
        mock.fault("work.do", "latency", count=100, latency_ms=700)
        run = await submit(stack, agent="worker", payload={"n": 1})
        proc, log = await spawn_executor(stack, agents, tmp_path)
        try:
            async def second_step_in_flight():
                rows = await db.fetch("SELECT status FROM tool_executions ORDER BY outbound_intent_at")
                return len(rows) == 2 and rows[1]["status"] == "OUTBOUND_INTENT"

            await wait_for(second_step_in_flight, 30, "the second tool call to be in flight")
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), GRACE_S + 5)
            took = time.monotonic() - signalled
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            log.close()
        executor_log = (tmp_path / "executor-a.log").read_text()[-3000:]
        assert code == 0 and took < GRACE_S + 1, (code, took, executor_log)
        # The step in flight was finished (Tx2) before exiting; its lease was left to lapse.
        statuses = [r["status"] for r in await db.fetch(
            "SELECT status FROM tool_executions ORDER BY outbound_intent_at")]
        assert statuses == ["SUCCEEDED", "SUCCEEDED"], (statuses, executor_log)
        left = await db.fetchrow("SELECT status, lease_owner, version FROM agent_runs")
        assert left["status"] == "RUNNING" and left["lease_owner"] == "exec-a", (dict(left), executor_log)

        async with executor(stack, agents, worker_id="exec-b"):
            final = await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED, within=30)
        assert final.status == pb.RUN_STATUS_COMPLETED and final.fencing_token == 2
        hist = await history(stack, run.run_id)
        assert [(e.step_key, e.fencing_token) for e in hist.tool_executions] == [
            ("work/attempt-1", 1), ("work@2/attempt-1", 1), ("work@3/attempt-1", 2), ("work@4/attempt-1", 2)]
        # B continued from A's last checkpoint: the first checkpoint B wrote is the next version.
        by_fence = [(c.version, c.fencing_token) for c in hist.checkpoints]
        first_b = next(v for v, fence in by_fence if fence == 2)
        assert first_b == left["version"] + 1
        calls = mock.calls_by_key()
        assert len(calls) == 4 and set(calls.values()) == {1}  # nothing sent twice


async def test_a_tool_call_outlasting_the_grace_is_cancelled_and_the_takeover_looks_it_up(db_url, db, tmp_path):
    agents = tmp_path / "agents"
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url, lease_duration_ms=1000) as stack:
        plan = [{"id": "work", "tool": "work.do", "args": {}}, {"id": "done", "finish": "ok"}]
        write_agent(agents, scripted_agent("worker", plan, [http_tool(mock.url, "work.do", timeout_s=30)]))
        mock.fault("work.do", "latency", latency_ms=10_000)
        run = await submit(stack, agent="worker")
        async with executor(stack, agents, shutdown_grace_s=1.0) as worker:
            async def in_flight():
                return await db.fetchval("SELECT count(*) FROM tool_executions WHERE status = 'OUTBOUND_INTENT'")

            await wait_for(in_flight, 10, "the tool call to be in flight")
            started = time.monotonic()
            await worker.stop()
            assert time.monotonic() - started < 2.0  # exits within its grace, not after the tool's 10 s
        async with executor(stack, agents):
            final = await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_PAUSED_INDOUBT)
        assert final.status == pb.RUN_STATUS_COMPLETED
        first, second = (await history(stack, run.run_id)).tool_executions
        assert first.status == pb.TOOL_EXECUTION_STATUS_NOT_EXECUTED  # the cancelled request never ran
        assert second.status == pb.TOOL_EXECUTION_STATUS_SUCCEEDED
        assert mock.calls_by_key() == {second.idempotency_key: 1}
