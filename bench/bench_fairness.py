"""Fair-share benchmark: a quiet tenant next to a backlog, claims with many tenants, the cost at submit.

    python -m bench.bench_fairness [--backlog 20000] [--seconds 20] [--claimers 8] [--work-ms 40]
                                   [--tenants 1000] [--claims 2000] [--submit-seconds 4] [--submit-blocks 8]

Everything runs in scratch databases on AGENTRT_BENCH_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/postgres), dropped at the end, through
scheduler.store.Store (the submit_run and claim_work statements the service runs).

1. Quiet tenant: `--claimers` executors claim in a loop, each spending
   `--work-ms` (±50 %, seeded) after every claim, hit or miss, so the claim
   cadence is the same with and without a backlog. Tenant B submits
   `--quiet-rate` runs/s for `--seconds`; its submit-to-claim p99 is measured
   (after `--warmup-s`) with tenant A's `--backlog` QUEUED runs present (inserted at once, with the
   passes submit_run gives a backlog submitted into an empty queue: 1, 2, ...)
   and with A absent. Figure quiet_tenant_claim_p99_ratio (target <= 2). With
   --fifo-too the backlog side also runs with fair_share off (B waits for the
   whole backlog: its runs are counted as unclaimed at the end of the window).
2. Claim p50 (Store.claim incl. commit) with `--tenants` tenants each holding
   queued runs vs one tenant holding as many, alternating blocks (target <= 1.2).
3. Submit throughput (Store.submit_run, 16 concurrent submitters over 8
   tenants) with fair_share on vs off, `--submit-blocks` blocks of
   `--submit-seconds` in ABBA BAAB order (target >= 0.9). The
   claim statement is the same either way (fair_share off gives every run pass
   0), so this is where the switch costs anything; `bench core` cycles claim
   pre-inserted runs and do not see it.

Progress goes to stderr; stdout ends with one JSON line per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from bench._pg import emit, figure, log, percentile, scratch_database
from scheduler.config import SchedulerSettings
from scheduler.store import Store, SubmitSpec, connect_pool
from scheduler.store.migrate import migrate

BENCH = "fairness"
AGENT = "bench"
LONG_LEASE_MS = 3_600_000  # claimed runs keep their leases: no expired-lease takeover during the window
QUIET, LOUD = "tenant-b", "tenant-a"


def spec(n: int) -> SubmitSpec:
    return SubmitSpec(agent_name=AGENT, agent_version="", input={"n": n}, client_request_id=None,
                      max_attempts=3, labels={})


def settings(url: str, fair: bool = True) -> SchedulerSettings:
    return SchedulerSettings(database_url=url, fair_share=fair, lease_duration_ms=LONG_LEASE_MS)


async def migrated(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await migrate(conn)
    finally:
        await conn.close()


async def insert_backlog(conn: asyncpg.Connection, tenants: int, count: int, fair: bool = True) -> None:
    """`count` QUEUED runs over `tenants` tenants, each tenant's passes 1, 2, ... as submit_run assigns
    them to a backlog submitted at once (all 0 with fair share off). Setup only."""
    await conn.execute(
        """
        INSERT INTO agent_runs (id, tenant_id, agent_name, agent_version, input, labels, max_attempts,
                                next_attempt_at, fair_pass)
        SELECT gen_random_uuid(), CASE WHEN $2::int = 1 THEN $3 ELSE 'tenant-' || (g % $2::int) END, $4, '',
               jsonb_build_object('n', g), '{}'::jsonb, 3, clock_timestamp(),
               CASE WHEN $5 THEN (g / $2::int) + 1 ELSE 0 END
        FROM generate_series(0, $1::int - 1) AS g
        """,
        count, tenants, LOUD, AGENT, fair)
    await conn.execute("VACUUM ANALYZE agent_runs")


# ------------------------------------------------------------------------------------- 1. quiet tenant


@dataclass
class Quiet:
    submitted: dict[Any, float] = field(default_factory=dict)  # run id -> perf_counter at submit
    claimed: dict[Any, float] = field(default_factory=dict)
    claims: int = 0
    submitting: bool = True
    all_claimed: asyncio.Event = field(default_factory=asyncio.Event)

    warm_until: float = 0.0  # submits before this (perf_counter) warm the connections up: not counted

    def latencies_ms(self) -> list[float]:
        return [(self.claimed[r] - t) * 1000 for r, t in self.submitted.items()
                if r in self.claimed and t >= self.warm_until]

    def counted(self) -> int:
        return sum(1 for t in self.submitted.values() if t >= self.warm_until)


async def claimer(store: Store, name: str, work_s: float, stop: asyncio.Event, seen: Quiet,
                  rng: random.Random) -> None:
    while not stop.is_set():
        got = await store.work.claim(name, [AGENT])
        if got is not None:
            seen.claims += 1
            if got.run.tenant_id == QUIET:
                seen.claimed[got.run.id] = time.perf_counter()
                if not seen.submitting and len(seen.claimed) == len(seen.submitted):
                    seen.all_claimed.set()
        await asyncio.sleep(work_s * rng.uniform(0.5, 1.5))


async def quiet_side(url: str, args: argparse.Namespace, *, backlog: int, fair: bool = True) -> Quiet:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("TRUNCATE agent_runs, outbox CASCADE")
        if backlog:
            await insert_backlog(conn, 1, backlog, fair)
    finally:
        await conn.close()
    seen = Quiet()
    pool = await connect_pool(url, min_size=2, max_size=args.claimers + 2)
    try:
        store = Store(pool, settings(url, fair))
        stop = asyncio.Event()
        rng = random.Random(7)
        tasks = [asyncio.create_task(claimer(store, f"w{n}", args.work_ms / 1000, stop, seen,
                                             random.Random(rng.random()))) for n in range(args.claimers)]
        period = 1 / args.quiet_rate
        start = time.perf_counter()
        seen.warm_until = start + args.warmup_s
        for n in range(int(args.seconds * args.quiet_rate)):
            await asyncio.sleep(max(0.0, start + n * period - time.perf_counter()))
            t0 = time.perf_counter()
            row, _ = await store.runs.submit_run(QUIET, spec(n))
            seen.submitted[row.id] = t0
        seen.submitting = False
        if len(seen.claimed) == len(seen.submitted):
            seen.all_claimed.set()
        with contextlib.suppress(TimeoutError):  # the last ones get a few seconds to be claimed
            await asyncio.wait_for(seen.all_claimed.wait(), 5)
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        await pool.close()
    return seen


async def quiet_part(args: argparse.Namespace, notes: list[str]) -> list[dict[str, Any]]:
    async with scratch_database("agentrt_bench_fair") as url:
        await migrated(url)
        log(f"quiet tenant: {args.quiet_rate}/s for {args.seconds:.0f}s, {args.claimers} claimers at "
            f"{args.work_ms} ms, without then with {args.backlog:,} runs of another tenant ...")
        alone = await quiet_side(url, args, backlog=0)
        loaded = await quiet_side(url, args, backlog=args.backlog)
        fifo = await quiet_side(url, args, backlog=args.backlog, fair=False) if args.fifo_too else None
    p_alone, p_loaded = percentile(alone.latencies_ms(), 99), percentile(loaded.latencies_ms(), 99)
    for name, side in (("alone", alone), ("with backlog", loaded), ("with backlog, fair_share off", fifo)):
        if side is None:
            continue
        lat = side.latencies_ms()
        log(f"  {name}: {len(lat)}/{side.counted()} of B's counted runs claimed, p50 {percentile(lat, 50):.1f} ms, "
            f"p99 {percentile(lat, 99):.1f} ms ({side.claims} claims in all)")
    ratio = p_loaded / p_alone
    unclaimed = loaded.counted() - len(loaded.latencies_ms())
    met = "met" if ratio <= 2 and not unclaimed else "MISSED"
    notes.append(f"quiet tenant B submit-to-claim p99 {p_loaded:.1f} ms with {args.backlog:,} runs of A queued vs "
                 f"{p_alone:.1f} ms alone = {ratio:.2f}x (target <= 2: {met})"
                 + (f"; {unclaimed} of B's runs unclaimed" if unclaimed else ""))
    if fifo is not None:
        notes.append(f"fair_share off: {len(fifo.latencies_ms())} of B's {fifo.counted()} counted runs claimed "
                     f"within the window")
    return [figure(BENCH, "quiet_tenant_claim_p99_ratio", p_loaded, "ms", p_alone, ratio,
                   unclaimed=unclaimed)]


# ------------------------------------------------------------------------------------- 2. many tenants


async def timed_claims(store: Store, count: int, samples: list[float] | None) -> None:
    for n in range(count):
        t0 = time.perf_counter()
        got = await store.work.claim(f"c{n}", [AGENT])
        if got is None:
            raise RuntimeError("the claim-latency queue ran dry: raise --queue-per-tenant")
        if samples is not None:
            samples.append(time.perf_counter() - t0)


async def tenants_part(args: argparse.Namespace, notes: list[str]) -> list[dict[str, Any]]:
    total = args.tenants * args.queue_per_tenant
    log(f"claim latency: {args.claims} claims with {total:,} queued runs over {args.tenants} tenants vs one ...")
    samples: dict[str, list[float]] = {"many": [], "one": []}
    async with contextlib.AsyncExitStack() as stack:
        stores: dict[str, Store] = {}
        for name, tenants in (("many", args.tenants), ("one", 1)):
            url = await stack.enter_async_context(scratch_database("agentrt_bench_fair"))
            await migrated(url)
            conn = await asyncpg.connect(url)
            try:
                await insert_backlog(conn, tenants, total)
            finally:
                await conn.close()
            pool = await connect_pool(url, min_size=1, max_size=1)
            stack.push_async_callback(pool.close)
            stores[name] = Store(pool, settings(url))
        for store in stores.values():
            await timed_claims(store, args.claims // 10, None)  # warm-up
        blocks = 10
        for _ in range(blocks):
            for name, store in stores.items():
                await timed_claims(store, args.claims // blocks, samples[name])
    many, one = (percentile(samples[n], 50) * 1000 for n in ("many", "one"))
    ratio = many / one
    notes.append(f"claim p50 {many:.3f} ms with {args.tenants} tenants vs {one:.3f} ms with one = {ratio:.3f}x "
                 f"(target <= 1.2: {'met' if ratio <= 1.2 else 'MISSED'}); p99 "
                 f"{percentile(samples['many'], 99) * 1000:.2f} vs {percentile(samples['one'], 99) * 1000:.2f} ms")
    return [figure(BENCH, "claim_p50_ratio_many_tenants_vs_one", many, "ms", one, ratio, tenants=args.tenants)]


# ------------------------------------------------------------------------------------- 3. submit cost


async def submit_for(store: Store, seconds: float, submitters: int = 16) -> int:
    done = 0
    end = time.perf_counter() + seconds

    async def one(k: int) -> None:
        nonlocal done
        n = 0
        while time.perf_counter() < end:
            await store.runs.submit_run(f"tenant-{k % 8}", spec(n))
            n += 1
            done += 1

    await asyncio.gather(*(one(k) for k in range(submitters)))
    return done


def submit_order(blocks: int) -> list[bool]:
    """Fair share on (True) and off in ABBA quads (ABBA BAAB ...): each side sees the same growth of the
    table and the same drift of the machine, to first order, whatever the number of quads."""
    quads = max(1, blocks // 4)
    return [fair for n in range(quads) for fair in ((True, False, False, True) if n % 2 == 0
                                                    else (False, True, True, False))]


async def submit_part(args: argparse.Namespace, notes: list[str]) -> list[dict[str, Any]]:
    order = submit_order(args.submit_blocks)
    log(f"submit throughput: fair_share on vs off, 16 submitters, {len(order)} blocks of "
        f"{args.submit_seconds:.0f}s each ...")
    counts = {True: 0, False: 0}
    async with scratch_database("agentrt_bench_fair") as url:
        await migrated(url)
        pool = await connect_pool(url, min_size=4, max_size=16)
        try:
            for fair in order:
                counts[fair] += await submit_for(Store(pool, settings(url, fair)), args.submit_seconds)
        finally:
            await pool.close()
    on, off = (counts[f] / (order.count(f) * args.submit_seconds) for f in (True, False))
    ratio = on / off
    notes.append(f"submit throughput {on:.0f}/s with fair_share on vs {off:.0f}/s off = {ratio:.3f}x "
                 f"(target >= 0.9: {'met' if ratio >= 0.9 else 'MISSED'})")
    return [figure(BENCH, "submit_throughput_fair_on_vs_off", on, "runs/s", off, ratio)]


async def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    notes: list[str] = []
    figures = await quiet_part(args, notes)
    figures += await tenants_part(args, notes)
    figures += await submit_part(args, notes)
    notes.append(f"runtime {time.monotonic() - started:.0f}s")
    for note in notes:
        print(note)
    emit(figures)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_fairness", description=__doc__.split("\n")[0])
    parser.add_argument("--backlog", type=int, default=20_000, help="tenant A's queued runs")
    parser.add_argument("--quiet-rate", type=float, default=2.0, help="tenant B's submits per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long B submits, per side")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="B's first submits not counted (per side)")
    parser.add_argument("--claimers", type=int, default=8)
    parser.add_argument("--work-ms", type=float, default=40.0, help="an executor's time per claim")
    parser.add_argument("--fifo-too", action="store_true", help="also run the backlog side with fair_share off")
    parser.add_argument("--tenants", type=int, default=1_000)
    parser.add_argument("--queue-per-tenant", type=int, default=20)
    parser.add_argument("--claims", type=int, default=2_000, help="timed claims per side")
    parser.add_argument("--submit-seconds", type=float, default=4.0, help="length of one submit block")
    parser.add_argument("--submit-blocks", type=int, default=8,
                        help="submit blocks, on and off alternating in ABBA quads (rounded down to a multiple of 4)")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
