"""Run priority and anti-starvation: the claim order among due runs.

Highest priority first; among equals, the earliest enqueue. A run coming back
from a wait (durable sleep, retry backoff, approval) keeps its first enqueue
time, so runs submitted while it waited do not overtake it once it is due.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import grpc
import pytest
from support import claim, lease_ref, rpc_error, scheduler_stack, submit

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration


async def claim_order(stack: Any, count: int) -> list[str]:
    """The run ids of `count` claims, in claim order (every one must find a run)."""
    order = []
    for n in range(count):
        lease = await claim(stack, f"w{n}")
        assert lease is not None, f"claim {n} found nothing"
        order.append(lease.run.run_id)
    return order


async def wait_due(db: Any, run_id: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not await db.fetchval("SELECT next_attempt_at <= clock_timestamp() FROM agent_runs WHERE id = $1",
                                uuid.UUID(run_id)):
        assert time.monotonic() < deadline, f"run {run_id} never became due"
        await asyncio.sleep(0.05)


async def test_the_highest_priority_is_claimed_first_then_the_earliest(db_url):
    async with scheduler_stack(db_url) as stack:
        low = await submit(stack, priority=2)
        default = await submit(stack)
        high = await submit(stack, priority=9)
        middle = await submit(stack, priority=5)
        assert (low.priority, default.priority, high.priority, middle.priority) == (2, 5, 9, 5)
        order = await claim_order(stack, 4)
        assert order == [high.run_id, default.run_id, middle.run_id, low.run_id]
        assert await claim(stack, "w-last") is None


async def test_default_priority_comes_from_the_agent_definition_then_the_setting(db_url):
    async with scheduler_stack(db_url, default_priority=3) as stack:
        await stack.work.RegisterAgents(ws.RegisterAgentsRequest(worker_id="ex-1", ttl_ms=60_000, agents=[
            ws.AgentRegistration(name="urgent", version="1", default_priority=8),
            ws.AgentRegistration(name="plain", version="1")]))
        assert (await submit(stack, agent="urgent")).priority == 8
        assert (await submit(stack, agent="urgent", priority=1)).priority == 1
        assert (await submit(stack, agent="plain")).priority == 3
        assert (await submit(stack, agent="nobody-serves-it")).priority == 3
        fetched = await stack.runs.GetRun(rs.GetRunRequest(run_id=(await submit(stack, priority=7)).run_id),
                                          metadata=stack.md())
        assert fetched.priority == 7


async def test_a_retried_submit_must_repeat_its_priority(db_url, db):
    async with scheduler_stack(db_url) as stack:
        first = await submit(stack, client_request_id="req-1", priority=7)
        again = await stack.runs.SubmitRun(rs.SubmitRunRequest(
            agent_name="demo", input_json="{}", client_request_id="req-1", priority=7), metadata=stack.md())
        assert not again.created and again.run.run_id == first.run_id
        error = await rpc_error(stack.runs.SubmitRun(rs.SubmitRunRequest(
            agent_name="demo", input_json="{}", client_request_id="req-1", priority=2), metadata=stack.md()))
        assert error.code() == grpc.StatusCode.ALREADY_EXISTS
        assert await db.fetchval("SELECT count(*) FROM agent_runs") == 1


@pytest.mark.parametrize("wait", ["sleep", "retry"])
async def test_a_run_back_from_a_wait_is_not_overtaken_by_fresh_submissions(db_url, db, wait):
    async with scheduler_stack(db_url) as stack:
        old = await submit(stack)
        lease = await claim(stack, "w-old")
        assert lease is not None and lease.run.run_id == old.run_id
        how = {"outcome": ws.FINISH_OUTCOME_SLEEP, "sleep_ms": 300} if wait == "sleep" \
            else {"outcome": ws.FINISH_OUTCOME_RETRY}  # backoff_base_ms 100 (tests/support.py)
        finished = await stack.work.FinishRun(ws.FinishRunRequest(
            lease=lease_ref(lease), expected_version=0, reason="wait", event_id=str(uuid.uuid4()), **how))
        assert finished.status == pb.RUN_STATUS_QUEUED
        assert await claim(stack, "w-early") is None  # not due yet: nothing else queued either
        fresh = [await submit(stack) for _ in range(3)]
        await wait_due(db, old.run_id)
        # Fresh runs were due before the old one woke; it still goes first: it was enqueued first.
        order = await claim_order(stack, 4)
        assert order == [old.run_id] + [f.run_id for f in fresh]


async def test_a_resumed_run_keeps_its_place(db_url):
    async with scheduler_stack(db_url) as stack:
        old = await submit(stack)
        lease = await claim(stack, "w-old")
        assert lease is not None
        await stack.work.FinishRun(ws.FinishRunRequest(
            lease=lease_ref(lease), expected_version=0, outcome=ws.FINISH_OUTCOME_PAUSED_HUMAN,
            reason="approval needed", event_id=str(uuid.uuid4())))
        fresh = [await submit(stack) for _ in range(2)]
        await stack.runs.ResumeRun(rs.ResumeRunRequest(run_id=old.run_id, decision=rs.RESUME_DECISION_APPROVE,
                                                       operator="alice"), metadata=stack.md())
        assert await claim_order(stack, 3) == [old.run_id] + [f.run_id for f in fresh]


async def test_priority_still_beats_age(db_url, db):
    """Aging orders a woken run among its equals; a higher priority still goes first."""
    async with scheduler_stack(db_url) as stack:
        old = await submit(stack, priority=4)
        lease = await claim(stack, "w-old")
        assert lease is not None
        await stack.work.FinishRun(ws.FinishRunRequest(
            lease=lease_ref(lease), expected_version=0, outcome=ws.FINISH_OUTCOME_SLEEP, sleep_ms=200,
            reason="wait", event_id=str(uuid.uuid4())))
        urgent = await submit(stack, priority=6)
        same = await submit(stack, priority=4)
        await wait_due(db, old.run_id)
        assert await claim_order(stack, 3) == [urgent.run_id, old.run_id, same.run_id]


async def test_due_runs_are_woken_by_the_claim_itself(db_url, db):
    """A woken run is claimable by the very ClaimWork call that finds it due (no background sweep)."""
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack)
        enqueued = await db.fetchval("SELECT enqueued_at FROM agent_runs WHERE id = $1", uuid.UUID(run.run_id))
        lease = await claim(stack, "w-old")
        assert lease is not None
        await stack.work.FinishRun(ws.FinishRunRequest(
            lease=lease_ref(lease), expected_version=0, outcome=ws.FINISH_OUTCOME_SLEEP, sleep_ms=60_000,
            reason="long sleep", event_id=str(uuid.uuid4())))
        row = await db.fetchrow("SELECT claim_ready, enqueued_at FROM agent_runs WHERE id = $1",
                                uuid.UUID(run.run_id))
        assert row["claim_ready"] is False and row["enqueued_at"] == enqueued
        assert await claim(stack, "w-early") is None
        await db.execute("UPDATE agent_runs SET next_attempt_at = clock_timestamp() WHERE id = $1",
                         uuid.UUID(run.run_id))
        woken = await claim(stack, "w-late")
        assert woken is not None and woken.run.run_id == run.run_id
