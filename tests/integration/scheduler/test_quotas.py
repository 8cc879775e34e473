"""Tenant quotas on SubmitRun: queued runs at once and submits per second, by database time.

Over a quota: RESOURCE_EXHAUSTED (QUOTA_EXCEEDED) with google.rpc.RetryInfo, and
nothing is written: no run, no event. A retried submit whose run exists is
answered with it whatever the quota.
"""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest
from support import claim, rpc_error, scheduler_stack, submit

from shared.errors import error_info, retry_delay_s
from shared.gen.agentrt.v1 import run_service_pb2 as rs

pytestmark = pytest.mark.integration


async def counts(db, tenant: str) -> tuple[int, int]:
    runs = await db.fetchval("SELECT count(*) FROM agent_runs WHERE tenant_id = $1", tenant)
    events = await db.fetchval("SELECT count(*) FROM outbox WHERE tenant_id = $1", tenant)
    return runs, events


async def test_a_full_queue_refuses_a_submit_with_retry_info_and_writes_nothing(db_url, db):
    async with scheduler_stack(db_url, max_queued_runs_per_tenant=3, queue_full_retry_after_ms=1500,
                               tenant_limits={"tenant-big": {"max_queued_runs": 0}}) as stack:
        first = await submit(stack, client_request_id="r-0")
        for n in range(1, 3):
            await submit(stack, client_request_id=f"r-{n}")
        before = await counts(db, "tenant-a")
        error = await rpc_error(submit(stack, client_request_id="r-3"))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        info = error_info(error)
        assert info is not None and info.reason == "QUOTA_EXCEEDED" and info.metadata["limit"] == "max_queued_runs"
        assert retry_delay_s(error) == 1.5
        assert await counts(db, "tenant-a") == before
        # A retry of a submit whose run exists is answered with it: it creates nothing.
        again = await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json=json.dumps({}),
                                                               client_request_id="r-0"), metadata=stack.md())
        assert not again.created and again.run.run_id == first.run_id
        # Other tenants have their own queue; an override lifts the limit for one.
        await submit(stack, tenant="tenant-b")
        for _ in range(5):
            await submit(stack, tenant="tenant-big")
        # A claim makes room: QUEUED runs are what counts.
        assert await claim(stack) is not None
        await submit(stack, client_request_id="r-3")
        assert (await counts(db, "tenant-a"))[0] == 4


async def test_submits_per_second_never_pass_the_limit_in_any_window(db_url, db):
    limit = 5
    async with scheduler_stack(db_url, max_submits_per_s_per_tenant=limit,
                               tenant_limits={"tenant-b": {"max_submits_per_s": 0}}) as stack:
        outcomes = await asyncio.gather(*(submit(stack) for _ in range(20)), return_exceptions=True)
        refused = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
        assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in refused), refused
        assert len(refused) >= 20 - 2 * limit, "20 concurrent submits fit in far less than two seconds"
        delays = [retry_delay_s(e) for e in refused]
        assert all(d is not None and 0 < d <= 1.0 for d in delays), delays
        assert all(error_info(e).metadata["limit"] == "max_submits_per_s" for e in refused)
        # Waiting the advised delay is enough.
        started = time.monotonic()
        await asyncio.sleep(max(d for d in delays if d is not None))
        await submit(stack)
        assert time.monotonic() - started < 5
        # tenant-b is exempt (override 0).
        await asyncio.gather(*(submit(stack, tenant="tenant-b") for _ in range(3 * limit)))
        # The invariant, from the runs' database-clock creation times: no one-second window holds more.
        worst = await db.fetchval(
            """
            SELECT max((SELECT count(*) FROM agent_runs AS o
                        WHERE o.tenant_id = r.tenant_id AND o.created_at > r.created_at - interval '1 second'
                          AND o.created_at <= r.created_at))
            FROM agent_runs AS r WHERE r.tenant_id = 'tenant-a'
            """)
        assert worst == limit
        assert await db.fetchval("SELECT count(*) FROM agent_runs WHERE tenant_id = 'tenant-b'") == 3 * limit
        runs, events = await counts(db, "tenant-a")
        assert runs == events == 20 - len(refused) + 1
