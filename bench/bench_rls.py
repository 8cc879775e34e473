"""Row-level security's cost on `bench core`'s workload: the same throughput run with the policies
in force and with them off, in one scratch database, as the scheduler role.

    python -m bench.bench_rls [--clients 16] [--seconds 10] [--blocks 2]

The schedulers run as their own processes (`python -m cli scheduler`, as deployed, as
many as the Helm chart's default replicas) connected as the runtime scheduler role (created by
`agentrt roles apply` in the scratch database): a superuser or the owner would skip the policies
and measure nothing. C fake executors loop ClaimWork → SaveCheckpoint → FinishRun(COMPLETED)
over pre-submitted runs of 8 tenants (bench core's executor). "Off" is the same database with
`ALTER TABLE ... NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY` on every tenant table;
on and off alternate in blocks (on/off, then off/on, ...) so both see the same background load.

Target (issue 16): RLS costs at most 10% of the throughput (ratio on/off >= 0.9).
Progress goes to stderr; stdout ends with one JSON line per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from bench._pg import emit, figure, log, scratch_database
from bench.bench_core import RPCS, Throughput, documented_replicas, migrated, submit_bulk, throughput
from scheduler.store.database_roles import DatabaseRoleSettings, apply_roles

BENCH = "rls"
ROLES = DatabaseRoleSettings(role_prefix="agentrt_bench_")
# The tables migration 0016 puts under row-level security.
RLS_TABLES = ("agent_runs", "agent_checkpoints", "tool_executions", "run_journal", "outbox", "outbox_parked",
              "run_signals", "agent_schedules", "audit_log")


def role_url(url: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{ROLES.role_name('scheduler')}@{host}"))


async def set_rls(conn: asyncpg.Connection, on: bool) -> None:
    action = "ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY" if on else \
        "NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY"
    for table in RLS_TABLES:
        await conn.execute(f"ALTER TABLE {table} {action}")


async def one_block(owner: asyncpg.Connection, url: str, *, on: bool, procs: int,
                    args: argparse.Namespace) -> Throughput:
    await set_rls(owner, on)
    await submit_bulk(owner, args.runs)
    await owner.execute("VACUUM ANALYZE agent_runs")
    label = f"RLS {'on' if on else 'off'}"
    result = await throughput(role_url(url), label=label, procs=procs, clients=args.clients, seconds=args.seconds)
    if result.window.cycles == 0:
        raise RuntimeError(f"{label}: no cycle completed (errors: {result.window.errors})")
    log(f"  {label}: {result.cycles_per_s:.0f} cycles/s, errors {result.window.errors or 'none'}, "
        + ", ".join(f"{rpc} p50 {result.p(rpc, 50):.2f} ms" for rpc in RPCS))
    return result


async def main(args: argparse.Namespace) -> int:
    procs, source = documented_replicas()
    on: list[Throughput] = []
    off: list[Throughput] = []
    async with scratch_database("agentrt_bench_rls") as url:
        await migrated(url)
        owner = await asyncpg.connect(url)
        try:
            await apply_roles(owner, ROLES)
            for block in range(args.blocks):
                for mode in ((True, False) if block % 2 == 0 else (False, True)):
                    log(f"block {block + 1}/{args.blocks}: RLS {'on' if mode else 'off'}, {procs} scheduler "
                        f"process(es) ({source}), {args.clients} executors, {args.seconds:.0f}s ...")
                    (on if mode else off).append(await one_block(owner, url, on=mode, procs=procs, args=args))
            await set_rls(owner, True)
        finally:
            await owner.close()
    rate_on = statistics.fmean(t.cycles_per_s for t in on)
    rate_off = statistics.fmean(t.cycles_per_s for t in off)
    ratio = rate_on / rate_off
    log(f"RLS on {rate_on:.0f} cycles/s vs off {rate_off:.0f}: ratio {ratio:.3f} "
        f"(target >= 0.9: {'met' if ratio >= 0.9 else 'MISSED'})")
    figures = [figure(BENCH, "cycles_per_s_rls_on", rate_on, "cycles/s", rate_off, ratio,
                      blocks=args.blocks, clients=args.clients, procs=procs)]
    # Load-independent view on a shared machine: CPU (schedulers + executors + their backends) per cycle.
    cpu_on = statistics.fmean(t.cpu_cores / t.cycles_per_s * 1000 for t in on)
    cpu_off = statistics.fmean(t.cpu_cores / t.cycles_per_s * 1000 for t in off)
    log(f"cpu per cycle: RLS on {cpu_on:.2f} ms vs off {cpu_off:.2f} ms (ratio off/on {cpu_off / cpu_on:.3f})")
    figures.append(figure(BENCH, "cpu_ms_per_cycle_rls_on", cpu_on, "cpu ms", cpu_off, cpu_off / cpu_on))
    for rpc in RPCS:
        p50_on = statistics.fmean(t.p(rpc, 50) for t in on)
        p50_off = statistics.fmean(t.p(rpc, 50) for t in off)
        figures.append(figure(BENCH, f"{rpc.lower()}_p50_ms_rls_on", p50_on, "ms", p50_off, p50_on / p50_off))
    emit(figures)
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--blocks", type=int, default=2, help="pairs of on/off runs (alternating order)")
    parser.add_argument("--runs", type=int, default=20_000, help="runs pre-submitted per run (as bench core)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
