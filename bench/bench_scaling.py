"""How agentrt's throughput grows with its processes: 1, 2 and 4 executors, 1 and 2 schedulers.

    python -m bench.bench_scaling [--runs 200] [--steps 20] [--rounds 3] [--shapes 1x1,1x2,1x4,2x2,2x4]

The workload is bench.bench_peers': N runs started together, each the bench agent's K fenced tool
steps (decision, Tx1, an in-process no-op tool, Tx2), a round ending at the last run's
finished_at (database clock). Each shape `SxE` is S scheduler processes and E executor processes
(`python -m cli ...`, as deployed), the executors spread over the schedulers in turn, N slots
between them, on a scratch database of its own; one unmeasured warm-up round, then `--rounds`
measured ones, the figure their median. CPU per step by process group (schedulers, executors,
PostgreSQL backends) from /proc, the load average beside each.

Every shape shares one machine (this one has 2 cores): the figure says how the cost of a step
grows as processes are added, not how a cluster of machines scales. The ratio of each shape is
to the first one measured in the same run (1 scheduler, 1 executor by default). stdout ends with
one JSON line per shape.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import asyncpg

from bench._peer_measure import CpuBook, backend_pids, measure_rounds, process_tree, result
from bench._pg import emit, figure, log, migrated_database
from bench.bench_executor import ExecutorProc, SchedulerProc, agent_file
from bench.bench_peers import agentrt_round

BENCH = "scaling"
AGENT = "bench-peers"  # bench_peers.agentrt_round submits runs of this agent


def shape_of(text: str) -> tuple[int, int]:
    """'2x4' -> (2 schedulers, 4 executors); anything else is refused with the reason."""
    schedulers, sep, executors = text.strip().partition("x")
    if not sep or not schedulers.isdigit() or not executors.isdigit():
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected SCHEDULERSxEXECUTORS, e.g. 1x2")
    s, e = int(schedulers), int(executors)
    if s < 1 or e < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r}: at least one scheduler and one executor")
    return s, e


def shapes_of(text: str) -> list[tuple[int, int]]:
    return [shape_of(part) for part in text.split(",") if part.strip()]


async def measure_shape(db_url: str, schedulers_n: int, executors_n: int, args: argparse.Namespace,
                        workdir: Path) -> dict[str, Any]:
    agents = workdir / f"agents-{schedulers_n}x{executors_n}"
    agents.mkdir()
    agent_file(agents, AGENT, "noop", args.steps, {"n": "${input.n}"})
    slots = math.ceil(args.runs / executors_n)
    conn = await asyncpg.connect(db_url)
    schedulers: list[SchedulerProc] = []
    executors: list[ExecutorProc] = []
    try:
        schedulers = [SchedulerProc(db_url) for _ in range(schedulers_n)]
        for scheduler in schedulers:
            await scheduler.wait_serving()
        executors = [ExecutorProc(schedulers[i % schedulers_n].addr, agents, slots, f"bench-scaling-{i}")
                     for i in range(executors_n)]
        label = f"{schedulers_n} scheduler(s) x {executors_n} executor(s)"
        log(f"  {label}: warm-up round ({args.runs} runs x {args.steps} steps, {slots} slots each) ...")
        await agentrt_round(conn, args.runs)

        async def groups() -> dict[str, list[int]]:
            return {"schedulers": [pid for s in schedulers for pid in process_tree(s.proc.pid)],
                    "executors": [pid for e in executors for pid in process_tree(e.proc.pid)],
                    "postgres_backends": await backend_pids(conn)}

        book = CpuBook()
        book.begin(await groups())
        rates = await measure_rounds(lambda: agentrt_round(conn, args.runs), args.rounds, args.runs * args.steps,
                                     label)
        spent = book.spent(await groups())
        tool_steps = await conn.fetchval("SELECT count(*) FROM tool_executions WHERE status = 'SUCCEEDED'")
        expected = (args.rounds + 1) * args.runs * args.steps
        if tool_steps != expected:
            raise RuntimeError(f"{label}: {tool_steps} tool steps completed, expected {expected}")
        return result(rates, args.rounds * args.runs * args.steps, spent, fsyncs=None, fsync_scope="not measured",
                      schedulers=schedulers_n, executors=executors_n, slots_per_executor=slots)
    finally:
        for e in executors:
            e.stop()
        for s in schedulers:
            s.stop()
        await conn.close()


async def measure_on_scratch(schedulers_n: int, executors_n: int, args: argparse.Namespace,
                             workdir: Path) -> dict[str, Any]:
    async with migrated_database("agentrt_bench_scaling") as db_url:
        return await measure_shape(db_url, schedulers_n, executors_n, args, workdir)


def figures_of(measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One figure per shape, its ratio to the first shape's steps/s."""
    base = measured[0]
    base_name = f"{base['schedulers']} scheduler x {base['executors']} executor steps/s in the same run"
    out = []
    for found in measured:
        rate = found["steps_per_s"]
        name = f"steps_per_s_{found['schedulers']}_schedulers_{found['executors']}_executors"
        out.append(figure(BENCH, name, rate, "steps/s", base["steps_per_s"], rate / base["steps_per_s"],
                          baseline_name=base_name, **found))
    return out


async def run(args: argparse.Namespace) -> int:
    start_load = [round(x, 2) for x in os.getloadavg()]
    log(f"scaling on {os.cpu_count()} cores, load average {start_load} at start: shapes "
        + ", ".join(f"{s}x{e}" for s, e in args.shapes))
    measured = []
    with tempfile.TemporaryDirectory(prefix="agentrt-bench-scaling-") as tmp:
        for schedulers_n, executors_n in args.shapes:
            measured.append(await measure_on_scratch(schedulers_n, executors_n, args, Path(tmp)))
    figures = figures_of(measured)
    for item in figures:
        item.update(runs=args.runs, steps_per_run=args.steps, rounds=args.rounds, cores=os.cpu_count(),
                    loadavg_at_start=start_load)
    emit(figures)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_scaling")
    parser.add_argument("--runs", type=int, default=200, help="runs started together in each round (N)")
    parser.add_argument("--steps", type=int, default=20, help="steps per run (K)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per shape; the figure is their median")
    parser.add_argument("--shapes", type=shapes_of, default=shapes_of("1x1,1x2,1x4,2x2,2x4"),
                        help="comma-separated SCHEDULERSxEXECUTORS shapes, the first the baseline")
    args = parser.parse_args(argv)
    if not args.shapes:
        parser.error("--shapes: name at least one shape")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
