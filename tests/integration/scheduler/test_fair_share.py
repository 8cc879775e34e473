"""Fair share between tenants: the claim order interleaves tenants by weight within a priority.

Property (hypothesis, real PostgreSQL through scheduler.store.Store): tenants with
weights submit backlogs of runs at a few priorities in any order; claiming them
all, each claim has the highest priority still queued, and within a priority,
while two tenants both still have queued runs there, their weighted shares of
the claims made so far (served / weight) never drift apart by more than a small
bound. First-come first-served (fair_share off) breaks that bound at once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import claim, scheduler_stack, submit

from scheduler.config import SchedulerSettings, TenantLimits
from scheduler.store import Store, SubmitSpec, connect_pool

pytestmark = pytest.mark.integration

AGENT = "fair-agent"
WEIGHTS = (1.0, 2.0, 3.0)
PRIORITIES = (3, 7)
# served/weight of two tenants with due work at one priority stay within this much of each other:
# a pass step of each (1/weight <= 1), and a tenant joining at the head may start up to one step apart.
SHARE_BOUND = 3.0


@st.composite
def workloads(draw: Any) -> tuple[dict[str, float], list[tuple[str, int]]]:
    """Tenant weights, and the runs (tenant, priority) in submit order."""
    count = draw(st.integers(2, 4))
    weights = {f"t{n}": draw(st.sampled_from(WEIGHTS)) for n in range(count)}
    runs = [(tenant, draw(st.sampled_from(PRIORITIES)))
            for tenant in weights for _ in range(draw(st.integers(1, 25)))]
    return weights, draw(st.permutations(runs))


def fair_settings(db_url: str, weights: dict[str, float], fair: bool = True) -> SchedulerSettings:
    return SchedulerSettings(database_url=db_url, fair_share=fair,
                             tenant_limits={t: TenantLimits(weight=w) for t, w in weights.items()})


async def claimed_sequence(store: Store, runs: list[tuple[str, int]]) -> list[tuple[str, int]]:
    for n, (tenant, priority) in enumerate(runs):
        spec = SubmitSpec(agent_name=AGENT, agent_version="", input={"n": n}, client_request_id=None,
                          max_attempts=3, labels={}, priority=priority)
        await store.runs.submit_run(tenant, spec)
    order = []
    for n in range(len(runs)):
        got = await store.work.claim(f"w{n}", [AGENT])
        assert got is not None, f"claim {n} of {len(runs)} found nothing"
        order.append((got.run.tenant_id, got.run.priority))
    assert await store.work.claim("w-last", [AGENT]) is None
    return order


def unfairness(weights: dict[str, float], runs: list[tuple[str, int]], order: list[tuple[str, int]]) -> float:
    """The largest gap in served/weight between two tenants that both still had queued runs at the
    priority of the claim; asserts priority order on the way."""
    left = Counter(runs)
    served: Counter[tuple[str, int]] = Counter()
    worst = 0.0
    for tenant, priority in order:
        assert priority == max(p for (_, p), n in left.items() if n > 0), "a lower priority went first"
        due = [t for t in weights if left[(t, priority)] > 0]  # before this claim
        left[(tenant, priority)] -= 1
        served[(tenant, priority)] += 1
        shares = [served[(t, priority)] / weights[t] for t in due]
        worst = max(worst, max(shares) - min(shares))
    return worst


@pytest.fixture
def store_loop(db_url: str) -> Any:
    loop = asyncio.new_event_loop()
    pool = loop.run_until_complete(connect_pool(db_url, min_size=1, max_size=2))
    try:
        yield loop, pool
    finally:
        loop.run_until_complete(pool.close())
        loop.close()


def run_workload(loop: Any, pool: asyncpg.Pool, db_url: str, weights: dict[str, float],
                 runs: list[tuple[str, int]], fair: bool = True) -> list[tuple[str, int]]:
    loop.run_until_complete(pool.execute("TRUNCATE agent_runs, outbox CASCADE"))
    store = Store(pool, fair_settings(db_url, weights, fair))
    return loop.run_until_complete(claimed_sequence(store, runs))


def test_each_tenant_with_due_work_gets_its_weighted_share(db_url, store_loop):
    loop, pool = store_loop

    @settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(workloads())
    def check(workload: tuple[dict[str, float], list[tuple[str, int]]]) -> None:
        weights, runs = workload
        order = run_workload(loop, pool, db_url, weights, runs)
        assert sorted(order) == sorted(runs)
        gap = unfairness(weights, runs, order)
        assert gap <= SHARE_BOUND, (gap, weights, order)

    check()


def test_first_come_first_served_is_not_fair(db_url, store_loop):
    """The property's bound is one first-come first-served breaks: fair_share off serves a backlog whole."""
    loop, pool = store_loop
    weights = {"big": 1.0, "small": 1.0}
    runs = [("big", 5)] * 20 + [("small", 5)] * 3
    fifo = run_workload(loop, pool, db_url, weights, runs, fair=False)
    assert fifo == runs
    assert unfairness(weights, runs, fifo) > SHARE_BOUND
    fair = run_workload(loop, pool, db_url, weights, runs)
    assert unfairness(weights, runs, fair) <= SHARE_BOUND
    assert [t for t, _ in fair[:8]].count("small") == 3  # the quiet tenant is served within its first steps


def test_weights_split_two_backlogs_in_proportion(db_url, store_loop):
    loop, pool = store_loop
    weights = {"gold": 3.0, "basic": 1.0}
    runs = [("gold", 5)] * 30 + [("basic", 5)] * 30
    order = run_workload(loop, pool, db_url, weights, runs)
    first = Counter(t for t, _ in order[:20])
    assert first["gold"] in (14, 15, 16) and first["basic"] == 20 - first["gold"], first


async def test_a_quiet_tenant_is_not_queued_behind_a_backlog_through_the_service(db_url):
    """Through SubmitRun/ClaimWork: tenant A's backlog is queued; B's run, submitted later, is claimed
    within the next two claims, and A's runs keep their order."""
    async with scheduler_stack(db_url) as stack:
        backlog = [await submit(stack, tenant="tenant-a") for _ in range(12)]
        for n in range(3):
            lease = await claim(stack, f"w-a{n}")
            assert lease is not None and lease.run.run_id == backlog[n].run_id
        quiet = await submit(stack, tenant="tenant-b")
        next_two = [(await claim(stack, f"w-b{n}")) for n in range(2)]
        assert quiet.run_id in [lease.run.run_id for lease in next_two if lease is not None]
        rest = []
        while (lease := await claim(stack, f"w-r{len(rest)}")) is not None:
            rest.append(lease.run.run_id)
            assert len(rest) <= 12
        served_a = [r for r in [lease.run.run_id for lease in next_two if lease] + rest if r != quiet.run_id]
        assert served_a == [r.run_id for r in backlog[3:]]


@st.composite
def queue_states(draw: Any) -> tuple[list[tuple[str, int, float, bool, str]], str, int, float]:
    """Rows already there (tenant, priority, pass, claim_ready, status), and the submit: tenant, priority, step."""
    tenants, priorities = ("a", "b", "c"), (3, 7)
    rows = draw(st.lists(st.tuples(st.sampled_from(tenants), st.sampled_from(priorities),
                                   st.integers(0, 40).map(lambda n: n / 4), st.booleans(),
                                   st.sampled_from(("QUEUED", "QUEUED", "COMPLETED", "CANCELLED"))), max_size=12))
    return rows, draw(st.sampled_from(tenants)), draw(st.sampled_from(priorities)), draw(
        st.sampled_from((1.0, 0.5, 1 / 3)))


def expected_pass(rows: list[tuple[str, int, float, bool, str]], tenant: str, priority: int, step: float) -> float:
    """The rule as docs/flow-control.md states it, from the rows alone: the tenant's newest queued pass at
    the priority plus the step, or the priority's ready head (every tenant's) when that is further on."""
    own = [p for t, pr, p, _, status in rows if t == tenant and pr == priority and status == "QUEUED"]
    ready = [p for _, pr, p, ok, status in rows if pr == priority and status == "QUEUED" and ok]
    newest = (max(own) if own else 0.0) + step
    return max(newest, min(ready)) if ready else newest


def test_a_submit_takes_the_pass_the_rule_gives_whatever_the_queue_holds(db_url, store_loop):
    """The sweep of the submit's pass: the statement skips the head read when the tenant's newest queued run
    is ready (the head cannot be further on then); every shape of queue gets the pass the whole rule gives."""
    loop, pool = store_loop

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(queue_states())
    def check(state: tuple[list[tuple[str, int, float, bool, str]], str, int, float]) -> None:
        rows, tenant, priority, step = state

        async def submit_into() -> float:
            await pool.execute("TRUNCATE agent_runs, outbox CASCADE")
            await pool.executemany(
                "INSERT INTO agent_runs (id, tenant_id, agent_name, status, priority, fair_pass, claim_ready, "
                "finished_at) VALUES (gen_random_uuid(), $1, $2, $3, $4, $5, $6, "
                "CASE WHEN $3 = 'QUEUED' THEN NULL ELSE clock_timestamp() END)",
                [(t, AGENT, status, pr, p, ok) for t, pr, p, ok, status in rows])
            store = Store(pool, fair_settings(db_url, {tenant: 1 / step}))
            spec = SubmitSpec(agent_name=AGENT, agent_version="", input={}, client_request_id=None,
                              max_attempts=3, labels={}, priority=priority)
            row, created = await store.runs.submit_run(tenant, spec)
            assert created
            return float(await pool.fetchval("SELECT fair_pass FROM agent_runs WHERE id = $1", row.id))

        got = loop.run_until_complete(submit_into())
        assert got == pytest.approx(expected_pass(rows, tenant, priority, step)), (rows, tenant, priority, step)

    check()
