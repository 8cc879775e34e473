"""Tool rate and concurrency limits shared by every executor, enforced by the scheduler at Tx1.

Over a limit, BeginToolCall (and CompleteAndBeginToolCall) answers RESOURCE_EXHAUSTED
(TOOL_RATE_LIMITED) with google.rpc.RetryInfo and writes nothing; the executor waits
the delay and asks again, spending no attempt and no budget step. Checked from the
ledger's intent times (database clock): no one-second window holds more calls of a
rate-limited tool than its rate, no two calls of a concurrency-1 tool are open at once.
"""

from __future__ import annotations

import json
import uuid

import grpc
import pytest
from executor_support import executor, http_tool, mock_tool, scripted_agent, wait_for, wait_status, write_agent
from support import claim, lease_ref, rpc_error, scheduler_stack, submit, tool_state

from shared.errors import error_info, retry_delay_s
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration
END = (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED, pb.RUN_STATUS_PAUSED_INDOUBT, pb.RUN_STATUS_PAUSED_HUMAN)

# The most intents of one tool in any window (x - 1 s, x], x an intent time.
WORST_SECOND = """
SELECT max((SELECT count(*) FROM tool_executions AS o
            WHERE o.tool_name = t.tool_name AND o.outbound_intent_at > t.outbound_intent_at - interval '1 second'
              AND o.outbound_intent_at <= t.outbound_intent_at))
FROM tool_executions AS t WHERE t.tool_name = $1
"""
# The most calls of one tool open at once (intent recorded, outcome not yet), from the ledger.
WORST_OVERLAP = """
SELECT max((SELECT count(*) FROM tool_executions AS o
            WHERE o.tool_name = t.tool_name AND o.outbound_intent_at <= t.outbound_intent_at
              AND o.completed_at > t.outbound_intent_at))
FROM tool_executions AS t WHERE t.tool_name = $1
"""


def steps_of(tool: str, count: int) -> list[dict]:
    plan = [{"id": f"s{n}", "tool": tool, "args": {"n": n}} for n in range(count)]
    return [*plan, {"id": "done", "finish": "ok"}]


async def test_a_tx1_over_the_rate_is_refused_with_retry_info_and_writes_nothing(db_url, db):
    async with scheduler_stack(db_url, tool_limits={"send": {"rate": "1/min"}}) as stack:
        first, second = await submit(stack), await submit(stack)
        leases = [await claim(stack, f"w{n}") for n in range(2)]
        assert {lease.run.run_id for lease in leases if lease} == {first.run_id, second.run_id}
        for n, lease in enumerate(leases):
            assert lease is not None
            saved = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
                lease=lease_ref(lease), expected_version=0, schema_version=1, event_id=str(uuid.uuid4()),
                state_json=json.dumps(tool_state("s/1", "send", {"n": n}))))
            request = ws.BeginToolCallRequest(
                lease=lease_ref(lease), expected_version=saved.version, step_key="s/1", tool_name="send",
                idempotency_key=f"k-{n}", request_json=json.dumps({"n": n}), execution_id=str(uuid.uuid4()),
                event_id=str(uuid.uuid4()))
            if n == 0:
                began = await stack.work.BeginToolCall(request)
                assert began.execution.status == pb.TOOL_EXECUTION_STATUS_OUTBOUND_INTENT
                continue
            error = await rpc_error(stack.work.BeginToolCall(request))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            info = error_info(error)
            assert info is not None and info.reason == "TOOL_RATE_LIMITED" and info.metadata["limit"] == "rate"
            delay = retry_delay_s(error)
            assert delay is not None and 50 < delay <= 60
            row = await db.fetchrow("SELECT status, version FROM agent_runs WHERE id = $1",
                                    uuid.UUID(lease.run.run_id))
            assert (row["status"], row["version"]) == ("RUNNING", saved.version)
        assert await db.fetchval("SELECT count(*) FROM tool_executions") == 1


async def test_a_rate_limited_tool_never_passes_its_rate_across_two_executors(db_url, db, tmp_path):
    rate, runs, steps = 5, 6, 4
    async with mock_tool(tmp_path) as mock, scheduler_stack(
            db_url, tool_limits={"t.a": {"rate": f"{rate}/s"}}) as stack:
        write_agent(tmp_path / "agents",
                    scripted_agent("limited", steps_of("t.a", steps), [http_tool(mock.url, "t.a")]))
        submitted = [await submit(stack, agent="limited") for _ in range(runs)]
        async with executor(stack, tmp_path / "agents", worker_id="ex-1") as one, \
                executor(stack, tmp_path / "agents", worker_id="ex-2") as two:
            finals = [await wait_status(stack, run.run_id, *END, within=90) for run in submitted]
            delayed = one.services.counts.tool_calls_delayed + two.services.counts.tool_calls_delayed
        assert [f.status for f in finals] == [pb.RUN_STATUS_COMPLETED] * runs, [f.terminal_reason for f in finals]
        assert delayed > 0, "24 calls at 5/s cannot all go through at once"
        assert await db.fetchval("SELECT count(*) FROM tool_executions WHERE tool_name = 't.a'") == runs * steps
        assert await db.fetchval(WORST_SECOND, "t.a") == rate
        # No attempt was spent waiting: every step ran in the run's first attempt, none was retried.
        assert await db.fetchval("SELECT count(*) FROM tool_executions WHERE step_key NOT LIKE '%/attempt-1'") == 0
        assert await db.fetchval("SELECT max(fencing_token) FROM agent_runs") == 1


async def test_a_concurrency_limited_tool_has_one_call_open_at_a_time(db_url, db, tmp_path):
    async with mock_tool(tmp_path, latency_ms=80) as mock, scheduler_stack(
            db_url, tool_limits={"t.slow": {"concurrency": 1}}, tool_concurrency_retry_after_ms=20) as stack:
        write_agent(tmp_path / "agents", scripted_agent("one-at-a-time", steps_of("t.slow", 2),
                                                        [http_tool(mock.url, "t.slow")]))
        submitted = [await submit(stack, agent="one-at-a-time") for _ in range(4)]
        async with executor(stack, tmp_path / "agents", worker_id="ex-1") as one, \
                executor(stack, tmp_path / "agents", worker_id="ex-2") as two:
            for run in submitted:
                final = await wait_status(stack, run.run_id, *END, within=90)
                assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
            await wait_for(lambda: _positive(one.services.counts.tool_calls_delayed
                                             + two.services.counts.tool_calls_delayed), 5, "a delayed call")
        assert await db.fetchval("SELECT count(*) FROM tool_executions WHERE tool_name = 't.slow'") == 8
        assert await db.fetchval(WORST_OVERLAP, "t.slow") == 1


async def _positive(value: int) -> int:
    return value
