"""Attempts count claims since the run last made progress: a succeeded step starts the count again (issue 12).

A long run is taken over and retried many times over thousands of steps; only
failures without progress in between may exhaust max_attempts.
"""

from __future__ import annotations

import json

import pytest
from support import claim, eid, lease_ref, scheduler_stack, submit, tool_state

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration


async def one_step(stack, ref: ws.LeaseRef, version: int, step: str, *, succeeded: bool) -> int:
    await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=ref, expected_version=version, state_json=json.dumps(tool_state(step, "t", {"s": step})),
        schema_version=2, step_key=step, event_id=eid()))
    await stack.work.BeginToolCall(ws.BeginToolCallRequest(
        lease=ref, expected_version=version + 1, step_key=step, tool_name="t", idempotency_key=f"{ref.run_id}/{step}",
        request_json=json.dumps({"s": step}), execution_id=eid(), event_id=eid()))
    await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
        lease=ref, expected_version=version + 1, step_key=step,
        outcome=ws.TOOL_OUTCOME_SUCCEEDED if succeeded else ws.TOOL_OUTCOME_FAILED,
        state_json=json.dumps({"cursor": step}), schema_version=2, event_id=eid()))
    return version + 2


async def retry(stack, ref: ws.LeaseRef, version: int) -> ws.FinishRunResponse:
    return await stack.work.FinishRun(ws.FinishRunRequest(lease=ref, expected_version=version,
                                                          outcome=ws.FINISH_OUTCOME_RETRY, reason="transient",
                                                          event_id=eid()))


async def test_progress_resets_the_attempt_count(db_url, db):
    async with scheduler_stack(db_url, backoff_base_ms=1, backoff_cap_ms=1, backoff_jitter_ms=0) as stack:
        run = await submit(stack, max_attempts=2)
        version = 0
        for n in range(4):  # each turn: a succeeded step, then a transient failure sends the run back to QUEUED
            lease = None
            for _ in range(200):
                lease = await claim(stack, wait_ms=200)
                if lease is not None:
                    break
            assert lease is not None and lease.run.run_id == run.run_id
            ref = lease_ref(lease)
            version = await one_step(stack, ref, version, f"s{n}", succeeded=True)
            row = await db.fetchrow("SELECT attempt_count FROM agent_runs WHERE id = $1::uuid", run.run_id)
            assert row["attempt_count"] == 1
            reply = await retry(stack, ref, version)
            assert reply.status == pb.RUN_STATUS_QUEUED  # never exhausted: every turn made progress


async def test_failures_without_progress_still_exhaust(db_url, db):
    async with scheduler_stack(db_url, backoff_base_ms=1, backoff_cap_ms=1, backoff_jitter_ms=0) as stack:
        run = await submit(stack, max_attempts=2)
        version, statuses = 0, []
        for n in range(2):
            lease = None
            for _ in range(200):
                lease = await claim(stack, wait_ms=200)
                if lease is not None:
                    break
            assert lease is not None and lease.run.run_id == run.run_id
            ref = lease_ref(lease)
            version = await one_step(stack, ref, version, f"s{n}", succeeded=False)
            statuses.append((await retry(stack, ref, version)).status)
        assert statuses == [pb.RUN_STATUS_QUEUED, pb.RUN_STATUS_FAILED]
