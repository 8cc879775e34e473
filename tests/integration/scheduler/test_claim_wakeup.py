"""A long-polling ClaimWork wakes on new work at once, also when another scheduler replica took the submit."""

import asyncio
import time

import pytest
from support import claim, scheduler_stack, submit

pytestmark = pytest.mark.integration


async def test_a_submit_on_one_replica_wakes_a_claimer_on_another(db_url):
    # Polling every 20 s: only the NOTIFY can answer the claim within the 5 s asserted below.
    async with scheduler_stack(db_url, claim_poll_interval_ms=20_000) as a, \
            scheduler_stack(db_url, claim_poll_interval_ms=20_000) as b:
        await asyncio.wait_for(b.server._notifier.connected.wait(), 10)
        for stack_submitting, stack_claiming in ((a, b), (b, b)):
            waiter = asyncio.create_task(claim(stack_claiming, wait_ms=20_000))
            await asyncio.sleep(0.3)  # let the claim find nothing and start waiting (not a correctness wait)
            assert not waiter.done()
            started = time.monotonic()
            run = await submit(stack_submitting)
            lease = await asyncio.wait_for(waiter, 10)
            assert lease is not None and lease.run.run_id == run.run_id
            assert time.monotonic() - started < 5
