"""Concurrency limits per tenant, per agent and per concurrency key, counted over live leases.

A run holds a slot of each of its groups while it is leased and its lease is live
by database time (an executor that dies keeps its slots until its lease lapses).
Claims skip runs whose limit is full; concurrent claimers on two scheduler replicas
never pass a limit (an invariant query sampled throughout), and every run completes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import time
import uuid
from typing import Any

import asyncpg
import grpc
import pytest
from support import claim, lease_ref, rpc_error, scheduler_stack, submit

from scheduler.api.metrics import SchedulerMetrics
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration

# The most live leased runs in any one group, by database time.
WORST = """
SELECT coalesce(max(n), 0) FROM (
  SELECT count(*) AS n FROM agent_runs
  WHERE status IN ('RUNNING', 'WAITING_TOOL') AND lease_expires_at > clock_timestamp() AND {group}
  GROUP BY {by}) AS g
"""


async def worst(db: Any, by: str, group: str = "true") -> int:
    return await db.fetchval(WORST.format(by=by, group=group))  # type: ignore[no-any-return]


async def finish(stack: Any, lease: ws.Lease) -> None:
    done = await stack.work.FinishRun(ws.FinishRunRequest(
        lease=lease_ref(lease), expected_version=lease.run.version, outcome=ws.FINISH_OUTCOME_COMPLETED,
        result_json="{}", event_id=str(uuid.uuid4())))
    assert done.status == pb.RUN_STATUS_COMPLETED


async def claim_soon(stack: Any, worker: str, within: float = 10.0) -> ws.Lease:
    deadline = time.monotonic() + within
    while True:
        lease = await claim(stack, worker, wait_ms=200)
        if lease is not None:
            return lease
        assert time.monotonic() < deadline, f"{worker} found nothing to claim"


async def register_keyed_agent(stack: Any, name: str = "demo", max_per_key: int = 1) -> None:
    await stack.work.RegisterAgents(ws.RegisterAgentsRequest(worker_id="ex-keys", ttl_ms=600_000, agents=[
        ws.AgentRegistration(name=name, version="1", concurrency_key="${input.customer_id}",
                             concurrency_max=max_per_key)]))


async def test_a_full_tenant_is_skipped_and_its_slot_returns_when_a_run_ends(db_url, db):
    async with scheduler_stack(db_url, max_running_per_tenant=2, concurrency_recheck_ms=50) as stack:
        busy = [await submit(stack, tenant="tenant-a") for _ in range(4)]
        quiet = [await submit(stack, tenant="tenant-b") for _ in range(2)]
        leases = [await claim(stack, f"w{n}") for n in range(4)]
        assert all(lease is not None for lease in leases)
        by_tenant = sorted(lease.run.tenant_id for lease in leases if lease is not None)
        assert by_tenant == ["tenant-a", "tenant-a", "tenant-b", "tenant-b"]
        assert await claim(stack, "w-more") is None  # tenant-a is full, tenant-b has nothing left
        parked = await db.fetch("SELECT waiting_on FROM agent_runs WHERE status = 'QUEUED'")
        assert [row["waiting_on"] for row in parked] == ["tenant", "tenant"]
        metrics = SchedulerMetrics()
        metrics.apply(await stack.server.store.runs.global_stats())
        assert metrics.waiting_on_limit.labels("tenant")._value.get() == 2
        assert metrics.waiting_on_limit.labels("key")._value.get() == 0
        first_a = next(lease for lease in leases if lease is not None and lease.run.tenant_id == "tenant-a")
        await finish(stack, first_a)
        third = await claim_soon(stack, "w-after")
        assert third.run.tenant_id == "tenant-a" and third.run.run_id == busy[2].run_id  # in its place
        assert await claim(stack, "w-more") is None
        assert {q.run_id for q in quiet} <= {lease.run.run_id for lease in leases if lease is not None}


async def test_an_agent_limit_counts_every_tenant(db_url):
    async with scheduler_stack(db_url, agent_limits={"demo": {"max_running": 1}},
                               concurrency_recheck_ms=50) as stack:
        await submit(stack, tenant="tenant-a")
        await submit(stack, tenant="tenant-b")
        await submit(stack, agent="other")
        held = await claim(stack, "w1")
        assert held is not None and held.run.agent_name == "demo"
        assert await claim(stack, "w2") is None
        other = await claim(stack, "w3", agents=("demo", "other"))
        assert other is not None and other.run.agent_name == "other"
        await finish(stack, held)
        assert (await claim_soon(stack, "w4")).run.agent_name == "demo"


async def test_a_concurrency_key_from_the_input_runs_one_per_customer(db_url, db):
    async with scheduler_stack(db_url, concurrency_recheck_ms=50) as stack:
        await register_keyed_agent(stack)
        c1 = [await submit(stack, payload={"customer_id": "c1", "n": n}) for n in range(2)]
        c2 = await submit(stack, payload={"customer_id": 2})
        other_tenant = await submit(stack, payload={"customer_id": "c1"}, tenant="tenant-b")
        keys = dict(await db.fetch("SELECT id::text, concurrency_key FROM agent_runs"))
        assert keys[c1[0].run_id] == "c1" and keys[c2.run_id] == "2"
        got = {(await claim(stack, f"w{n}")).run.run_id for n in range(3)}
        assert got == {c1[0].run_id, c2.run_id, other_tenant.run_id}  # keys are per tenant
        assert await claim(stack, "w-more") is None
        error = await rpc_error(submit(stack, payload={"order": 1}))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "customer_id" in error.details()
        assert await db.fetchval("SELECT count(*) FROM agent_runs") == 4


async def test_a_dead_holder_keeps_its_slot_until_its_lease_lapses(db_url, db):
    async with scheduler_stack(db_url, max_running_per_tenant=1, lease_duration_ms=1_000,
                               concurrency_recheck_ms=50) as stack:
        first = await submit(stack)
        second = await submit(stack)
        held = await claim(stack, "w-dies")  # and never heartbeats again
        assert held is not None and held.run.run_id == first.run_id
        # Until the lease lapses nothing else is claimable; the first claim that finds anything takes the
        # lapsed run itself over (its slot is free, and expired runs go first), never the second run.
        deadline = time.monotonic() + 20
        while (taken := await claim(stack, "w-waits")) is None:
            assert time.monotonic() < deadline, "the lapsed run was never taken over"
            await asyncio.sleep(0.05)
        assert taken.run.run_id == first.run_id and taken.run.fencing_token == 2
        assert await db.fetchval("SELECT clock_timestamp() >= $1::timestamptz",
                                 held.lease_expires_at.ToDatetime(tzinfo=dt.UTC))
        assert await claim(stack, "w-waits") is None
        await finish(stack, taken)
        assert (await claim_soon(stack, "w-next")).run.run_id == second.run_id


async def test_concurrent_claimers_never_pass_a_limit(db_url, db):
    """8 claimers on two replicas; some claims are abandoned (a killed executor) and taken over after
    their lease lapses. An invariant query sampled every few ms never sees a group over its limit."""
    limits = {"tenant_limits": {"tenant-a": {"max_running": 3}}, "max_running_per_tenant": 2,
              "lease_duration_ms": 1_000, "concurrency_recheck_ms": 30, "claim_poll_interval_ms": 30}
    async with scheduler_stack(db_url, **limits) as one, scheduler_stack(db_url, **limits) as two:
        await register_keyed_agent(one)
        runs = [await submit(one, tenant=tenant, payload={"customer_id": f"c{n % 3}"})
                for n in range(24) for tenant in ("tenant-a", "tenant-b")]
        seen = {"tenant": 0, "key": 0, "samples": 0}
        stop = asyncio.Event()

        async def sampler() -> None:
            own = await asyncpg.connect(db_url)  # the test's `db` polls for the end meanwhile
            try:
                while not stop.is_set():
                    seen["tenant"] = max(seen["tenant"], await worst(own, "tenant_id", "tenant_id = 'tenant-a'"))
                    tenant_b = await worst(own, "tenant_id", "tenant_id = 'tenant-b'")
                    assert tenant_b <= 2, tenant_b
                    seen["key"] = max(seen["key"], await worst(own, "tenant_id, agent_name, concurrency_key"))
                    seen["samples"] += 1
                    await asyncio.sleep(0.005)
            finally:
                await own.close()

        async def claimer(n: int) -> None:
            stack = (one, two)[n % 2]
            rng = random.Random(n)
            while not stop.is_set():
                lease = await claim(stack, f"w{n}", wait_ms=100)
                if lease is None:
                    continue
                if lease.run.fencing_token == 1 and rng.random() < 0.1:
                    continue  # killed: no heartbeat, no finish; the run comes back once the lease lapses
                await asyncio.sleep(rng.uniform(0.005, 0.05))
                await finish(stack, lease)

        watch = asyncio.create_task(sampler())
        workers = [asyncio.create_task(claimer(n)) for n in range(8)]
        deadline = time.monotonic() + 90
        try:
            while await db.fetchval("SELECT count(*) FROM agent_runs WHERE status <> 'COMPLETED'"):
                assert time.monotonic() < deadline, "runs left unfinished"
                assert not watch.done(), watch.exception()
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            failures = [r for r in await asyncio.gather(*workers, watch, return_exceptions=True)
                        if isinstance(r, BaseException)]
        assert not failures, failures
        assert seen["samples"] > 20
        assert seen["tenant"] <= 3 and seen["key"] <= 1, seen
        assert seen["tenant"] == 3, "the sampler saw tenant-a use its whole limit at least once"
        assert len(runs) == await db.fetchval("SELECT count(*) FROM agent_runs WHERE status = 'COMPLETED'")
        takeovers = await db.fetchval("SELECT count(*) FROM agent_runs WHERE fencing_token > 1")
        assert takeovers > 0, json.dumps(seen)
