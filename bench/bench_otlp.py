"""OTLP export: the collector stopped mid-run, runs go on at the same pace.

One scheduler and two executor processes export their spans over OTLP/gRPC
(OTEL_TRACES_EXPORTER=otlp) to a receiver in this process. Fenced tool steps
per second are measured with the receiver live, then it is stopped and they are
measured again on the same stack (the exporters now fail and retry on their own
thread). The figure is the dead-collector rate; its baseline is the live rate,
and the target is a ratio of at least 0.9.

Progress goes to stderr; stdout ends with one JSON line per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from bench._pg import emit, figure, free_port, log, scratch_database
from bench.bench_executor import ExecutorProc, SchedulerProc, agent_file, submit_bulk, succeeded
from devstack.otlp_receiver import OtlpReceiver
from scheduler.migrate import migrate

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
        span = args.seconds * args.windows * 2 + args.warmup * 2 + 10
        await submit_bulk(conn, "bench-otlp", int(2000 * span / args.steps_per_run))
        await conn.execute("VACUUM ANALYZE agent_runs")
        await scheduler.wait_serving()
        executors = [ExecutorProc(scheduler.addr, agents, args.slots, f"bench-otlp-{i}") for i in range(2)]
        await asyncio.sleep(args.warmup)
        live = await rates(conn, args.windows, args.seconds)
        received = len(receiver.spans)
        live_counts = await span_counts(metrics_port)
        await receiver.stop()
        log(f"  live collector: {[round(r) for r in live]} steps/s, {received} spans received; collector stopped")
        await asyncio.sleep(args.warmup)
        dead = await rates(conn, args.windows, args.seconds)
        dead_counts = await span_counts(metrics_port)
        not_ok = await conn.fetchval("SELECT count(*) FROM agent_runs WHERE status NOT IN "
                                     "('COMPLETED', 'QUEUED', 'RUNNING', 'WAITING_TOOL')")
        return {"live": statistics.median(live), "dead": statistics.median(dead),
                "live_rates": [round(r, 1) for r in live], "dead_rates": [round(r, 1) for r in dead],
                "spans_received": received, "runs_not_ok": not_ok,
                "scheduler_counts_live": live_counts, "scheduler_counts_dead": dead_counts}
    finally:
        for e in executors:
            e.stop()
        scheduler.stop()
        await receiver.stop()
        await conn.close()


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
    live, dead = result.pop("live"), result.pop("dead")
    ratio = dead / live if live else float("nan")
    log(f"  dead collector: {dead:.0f} steps/s against {live:.0f} live (ratio {ratio:.2f}); "
        f"target >= {TARGET_RATIO}: {'met' if ratio >= TARGET_RATIO else 'MISSED'}")
    emit([figure(BENCH, "steps_per_s_collector_stopped", dead, "steps/s", live, ratio,
                 baseline_name="steps/s with the collector live", target=TARGET_RATIO, **result)])
    return 0 if ratio >= TARGET_RATIO and result["runs_not_ok"] == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_otlp")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each measuring window")
    parser.add_argument("--windows", type=int, default=3, help="windows per phase; each figure is their median")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--slots", type=int, default=48)
    parser.add_argument("--steps-per-run", type=int, default=10)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
