"""OTLP export: the collector stopped mid-run, runs go on at the same pace.

One scheduler and two executor processes export their spans over OTLP/gRPC
(OTEL_TRACES_EXPORTER=otlp) to a receiver in this process. Two figures, each
on a fresh stack and receiver, with a target ratio of at least 0.9:

- steps_per_s_collector_stopped: fenced tool steps per second on a backlog,
  measured with the receiver live, then after it is stopped (the exporters
  fail and pause on their own thread), then with it back on the same ports;
  baseline the median of both live phases' windows.
- cpu_ms_per_step_collector_stopped: the scheduler's and executors' CPU per
  step in the same phases (the ratio is live / stopped): what the dead
  collector costs, whatever else the machine is running.
- runs_per_s_collector_stopped_mid_batch: a batch of N runs with the
  receiver live, then another N runs during which it is stopped once half of
  them completed; each batch's pace is N over the seconds from submit to the
  last completion (database clock). Baseline the live batch's pace.

Progress goes to stderr; stdout ends with one JSON line per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from bench._pg import emit, figure, free_port, log, scratch_database
from bench.bench_executor import ExecutorProc, SchedulerProc, agent_file, submit_bulk, succeeded
from devstack.otlp_receiver import OtlpReceiver
from scheduler.store.migrate import migrate

BENCH = "otlp"
TARGET_RATIO = 0.9


async def rates(conn: asyncpg.Connection, windows: int, seconds: float) -> list[float]:
    out, mark = [], await succeeded(conn)
    for _ in range(windows):
        await asyncio.sleep(seconds)
        now = await succeeded(conn)
        out.append((now[0] - mark[0]) / (now[1] - mark[1]))
        mark = now
    return out


async def span_counts(metrics_port: int) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, \
            session.get(f"http://127.0.0.1:{metrics_port}/metrics") as reply:
        text = await reply.text()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(agentrt_otel_spans_\S+) (\S+)$", text, re.M)}


async def cpu_per_step(conn: asyncpg.Connection, procs: list[Any], cpu_mark: float,
                       steps_mark: int) -> tuple[float, float, int]:
    """CPU seconds of the scheduler and executors per step since the marks; and the new marks."""
    cpu, steps = sum(p.cpu_seconds() for p in procs), (await succeeded(conn))[0]
    return (cpu - cpu_mark) / max(1, steps - steps_mark), cpu, steps


async def measure(db_url: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    agents = workdir / "agents"
    agents.mkdir()
    agent_file(agents, "bench-otlp", "noop", args.steps_per_run, {"n": "${input.n}"})
    conn = await asyncpg.connect(db_url)
    receiver = OtlpReceiver()
    await receiver.start()
    # The children inherit these (this process is the bench's own).
    os.environ.update({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint,
                       "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    metrics_port = free_port()
    os.environ["AGENTRT_METRICS_ADDR"] = f"127.0.0.1:{metrics_port}"
    scheduler = SchedulerProc(db_url)
    del os.environ["AGENTRT_METRICS_ADDR"]
    executors: list[ExecutorProc] = []
    try:
        span = args.seconds * args.windows * 3 + args.warmup * 3 + 10
        await submit_bulk(conn, "bench-otlp", int(2000 * span / args.steps_per_run))
        await conn.execute("VACUUM ANALYZE agent_runs")
        await scheduler.wait_serving()
        executors = [ExecutorProc(scheduler.addr, agents, args.slots, f"bench-otlp-{i}") for i in range(2)]
        procs: list[Any] = [scheduler, *executors]

        async def phase() -> tuple[list[float], float]:
            await asyncio.sleep(args.warmup)
            cpu_mark, steps_mark = sum(p.cpu_seconds() for p in procs), (await succeeded(conn))[0]
            measured = await rates(conn, args.windows, args.seconds)
            cpu, _, _ = await cpu_per_step(conn, procs, cpu_mark, steps_mark)
            return measured, cpu

        # Live, stopped, live again (the collector back on its ports): the two live phases bracket
        # the stopped one, so a drift of the machine or of the growing tables is not its doing.
        before, cpu_before = await phase()
        received = len(receiver.spans)
        live_counts = await span_counts(metrics_port)
        await receiver.stop()
        log(f"  live collector: {[round(r) for r in before]} steps/s, {received} spans received; collector stopped")
        dead, cpu_dead = await phase()
        dead_counts = await span_counts(metrics_port)
        await receiver.start()
        log(f"  collector stopped: {[round(r) for r in dead]} steps/s; collector back")
        after, cpu_after = await phase()
        log(f"  live again: {[round(r) for r in after]} steps/s")
        live, cpu_live = before + after, (cpu_before + cpu_after) / 2
        not_ok = await conn.fetchval("SELECT count(*) FROM agent_runs WHERE status NOT IN "
                                     "('COMPLETED', 'QUEUED', 'RUNNING', 'WAITING_TOOL')")
        return {"live": statistics.median(live), "dead": statistics.median(dead),
                "live_rates": [round(r, 1) for r in live], "dead_rates": [round(r, 1) for r in dead],
                "spans_received_after_return": len(receiver.spans) - received,
                "spans_received": received, "runs_not_ok": not_ok,
                # Less sensitive to what else the machine runs than steps/s.
                "cpu_ms_per_step_live": round(cpu_live * 1000, 3), "cpu_ms_per_step_dead": round(cpu_dead * 1000, 3),
                "scheduler_counts_live": live_counts, "scheduler_counts_dead": dead_counts}
    finally:
        for e in executors:
            e.stop()
        scheduler.stop()
        await receiver.stop()
        await conn.close()


@contextlib.asynccontextmanager
async def exporting_stack(db_url: str, agents: Path, slots: int,
                          receiver: OtlpReceiver) -> AsyncIterator[tuple[SchedulerProc, list[ExecutorProc]]]:
    """A scheduler and two executors exporting to `receiver` (OTEL_* inherited from this process)."""
    os.environ.update({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint,
                       "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    scheduler = SchedulerProc(db_url)
    executors: list[ExecutorProc] = []
    try:
        await scheduler.wait_serving()
        executors = [ExecutorProc(scheduler.addr, agents, slots, f"bench-otlp-runs-{i}") for i in range(2)]
        yield scheduler, executors
    finally:
        for e in executors:
            e.stop()
        scheduler.stop()


async def submit_batch(conn: asyncpg.Connection, agent: str, count: int) -> float:
    """Queues `count` runs of `agent` now; returns the database clock at the submit."""
    await submit_bulk(conn, agent, count)
    return float(await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())"))


async def completed(conn: asyncpg.Connection, agent: str) -> tuple[int, float]:
    row = await conn.fetchrow("SELECT count(*) FILTER (WHERE status = 'COMPLETED') AS n, "
                              "extract(epoch FROM max(updated_at)) AS last FROM agent_runs WHERE agent_name = $1",
                              agent)
    return int(row["n"]), float(row["last"] or 0)


async def batch_seconds(conn: asyncpg.Connection, agent: str, count: int, limit_s: float,
                        halfway: Any = None) -> float:
    """Seconds from the submit to the batch's last completion; `halfway()` is awaited once half are done."""
    started = await submit_batch(conn, agent, count)
    deadline = time.monotonic() + limit_s
    while True:
        done, last = await completed(conn, agent)
        if halfway is not None and done >= count // 2:
            await halfway()
            halfway = None
        if done >= count:
            return last - started
        if time.monotonic() > deadline:
            raise RuntimeError(f"{agent}: {done} of {count} runs completed within {limit_s:.0f}s")
        await asyncio.sleep(0.05)


async def measure_runs(db_url: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    agents = workdir / "runs-agents"
    agents.mkdir()
    for name in ("bench-otlp-warm", "bench-otlp-live", "bench-otlp-stopped"):
        agent_file(agents, name, "noop", args.steps_per_run, {"n": "${input.n}"})
    conn = await asyncpg.connect(db_url)
    receiver = OtlpReceiver()
    await receiver.start()
    stopped_at: list[int] = []

    async def stop_collector() -> None:
        stopped_at.append(len(receiver.spans))
        await receiver.stop()
        log("  collector stopped halfway through the second batch")

    try:
        async with exporting_stack(db_url, agents, args.slots, receiver) as (scheduler, executors):
            procs: list[Any] = [scheduler, *executors]

            def cpu() -> float:
                return sum(p.cpu_seconds() for p in procs)

            await batch_seconds(conn, "bench-otlp-warm", max(20, args.runs // 4), 120)
            mark = cpu()
            live = await batch_seconds(conn, "bench-otlp-live", args.runs, 300)
            cpu_live, mark = cpu() - mark, cpu()
            log(f"  {args.runs} runs with the collector live: {live:.2f} s")
            stopped = await batch_seconds(conn, "bench-otlp-stopped", args.runs, 300, halfway=stop_collector)
            cpu_stopped = cpu() - mark
            log(f"  {args.runs} runs, collector stopped halfway: {stopped:.2f} s")
        not_ok = await conn.fetchval("SELECT count(*) FROM agent_runs WHERE status <> 'COMPLETED'")
    finally:
        await receiver.stop()
        await conn.close()
    return {"live_s": live, "stopped_s": stopped, "runs_not_ok": not_ok,
            "cpu_ms_per_run_live": round(cpu_live * 1000 / args.runs, 2),
            "cpu_ms_per_run_stopped": round(cpu_stopped * 1000 / args.runs, 2),
            "spans_received_before_stop": stopped_at[0] if stopped_at else None}


async def run(args: argparse.Namespace) -> int:
    async with scratch_database("agentrt_bench_otlp") as db_url:
        conn = await asyncpg.connect(db_url)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        with tempfile.TemporaryDirectory(prefix="agentrt-bench-otlp-") as tmp:
            log(f"OTLP export: 1 scheduler + 2 executors x {args.slots} slots, median of {args.windows} x "
                f"{args.seconds:.0f} s windows with the collector live, then as many after stopping it ...")
            result = await measure(db_url, args, Path(tmp))
    async with scratch_database("agentrt_bench_otlp_runs") as db_url:
        conn = await asyncpg.connect(db_url)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        with tempfile.TemporaryDirectory(prefix="agentrt-bench-otlp-runs-") as tmp:
            log(f"Runs: {args.runs} runs of {args.steps_per_run} steps with the collector live, then {args.runs} "
                "more, stopping it halfway ...")
            batches = await measure_runs(db_url, args, Path(tmp))
    live, dead = result.pop("live"), result.pop("dead")
    ratio = dead / live if live else float("nan")
    log(f"  dead collector: {dead:.0f} steps/s against {live:.0f} live (ratio {ratio:.2f}); "
        f"target >= {TARGET_RATIO}: {'met' if ratio >= TARGET_RATIO else 'MISSED'}")
    live_pace, stopped_pace = args.runs / batches.pop("live_s"), args.runs / batches.pop("stopped_s")
    pace_ratio = stopped_pace / live_pace
    log(f"  runs: {stopped_pace:.1f} runs/s with the collector stopped halfway against {live_pace:.1f} live "
        f"(ratio {pace_ratio:.2f}); target >= {TARGET_RATIO}: {'met' if pace_ratio >= TARGET_RATIO else 'MISSED'}")
    cpu_live, cpu_dead = result["cpu_ms_per_step_live"], result["cpu_ms_per_step_dead"]
    cpu_ratio = cpu_live / cpu_dead if cpu_dead else float("nan")
    log(f"  CPU per step (scheduler + executors): {cpu_dead:.3f} ms stopped against {cpu_live:.3f} ms live "
        f"(ratio live/stopped {cpu_ratio:.2f}; less sensitive than steps/s to what else the machine runs)")
    emit([figure(BENCH, "steps_per_s_collector_stopped", dead, "steps/s", live, ratio,
                 baseline_name="steps/s with the collector live", target=TARGET_RATIO, **result),
          figure(BENCH, "cpu_ms_per_step_collector_stopped", cpu_dead, "ms", cpu_live, cpu_ratio,
                 baseline_name="CPU ms per step with the collector live (ratio: live / stopped)",
                 target=TARGET_RATIO),
          figure(BENCH, "runs_per_s_collector_stopped_mid_batch", stopped_pace, "runs/s", live_pace, pace_ratio,
                 baseline_name="runs/s of a batch with the collector live", target=TARGET_RATIO,
                 runs_per_batch=args.runs, steps_per_run=args.steps_per_run, **batches)])
    ok = result["runs_not_ok"] == 0 and batches["runs_not_ok"] == 0
    return 0 if min(ratio, pace_ratio, cpu_ratio) >= TARGET_RATIO and ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_otlp")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each measuring window")
    parser.add_argument("--windows", type=int, default=3, help="windows per phase; each figure is their median")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--slots", type=int, default=48)
    parser.add_argument("--steps-per-run", type=int, default=10)
    parser.add_argument("--runs", type=int, default=200, help="runs per batch of the runs figure")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
