"""Tool rate limit benchmark: a tool limited to 50 calls/s across two executors, measured from the ledger.

    python -m bench.bench_tool_limits [--rate 50] [--seconds 12] [--runs 300] [--slots 16]

One scratch database on AGENTRT_BENCH_DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/postgres),
dropped at the end. One scheduler process and two executor processes (`python -m cli ...`,
as deployed). The limit is set at run time, `SetLimit tool work rate 50/s` (migration 0015), after
the runs are queued and before the executors start. Each run is a scripted plan of fenced no-op
tool steps, so the executors ask for many times the rate.

After `--seconds` the executors stop and the ledger is read: for every intent time x, the calls of
the tool with intent times in (x - 1 s, x], the window the scheduler judges by. Figures:
max_calls_in_any_second (baseline the rate; ratio <= 1 is the limit held) and limited_calls_per_s
(calls over the whole span between the first and last intent; baseline the rate: how close to the
limit the two executors get).

Progress goes to stderr; stdout ends with one JSON line per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

import asyncpg
import grpc

from bench._pg import emit, figure, log, scratch_database
from bench.bench_executor import ExecutorProc, SchedulerProc, agent_file, submit_bulk
from scheduler.store.migrate import migrate
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc

BENCH = "tool_limits"
TOOL = "work"  # the tool name of bench_executor.agent_file's definitions

# Per intent x: the tool's intents in (x - 1 s, x] (microsecond timestamps: 999,999 µs preceding).
WORST_SECOND = """
SELECT coalesce(max(n), 0) AS worst, count(*) AS calls,
       extract(epoch FROM max(at) - min(at))::float8 AS span_s
FROM (SELECT outbound_intent_at AS at,
             count(*) OVER (ORDER BY outbound_intent_at
                            RANGE BETWEEN interval '999999 microseconds' PRECEDING AND CURRENT ROW) AS n
      FROM tool_executions WHERE tool_name = $1) AS w
"""


async def set_rate(addr: str, rate: int) -> None:
    async with grpc.aio.insecure_channel(addr) as channel:
        await rs_grpc.RunServiceStub(channel).SetLimit(
            rs.SetLimitRequest(scope="tool", subject=TOOL, name="rate", value=f"{rate}/s",
                               note=rs.AuditNote(reason="bench tool_limits")),
            metadata=[("x-tenant-id", "bench")], timeout=10)


async def measure(db_url: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    agent_file(workdir, "bench-limited", "noop", args.steps_per_run, {"n": "${input.n}"})
    conn = await asyncpg.connect(db_url)
    scheduler = SchedulerProc(db_url)
    executors: list[ExecutorProc] = []
    try:
        await submit_bulk(conn, "bench-limited", args.runs)
        await scheduler.wait_serving()
        await set_rate(scheduler.addr, args.rate)
        executors = [ExecutorProc(scheduler.addr, workdir, args.slots, f"bench-limited-{i}") for i in range(2)]
        log(f"{args.runs} runs x {args.steps_per_run} steps, tool {TOOL!r} at {args.rate}/s, "
            f"2 executors x {args.slots} slots, {args.seconds:.0f} s")
        await asyncio.sleep(args.seconds)
        for executor in executors:
            executor.stop()
        executors = []
        row = await conn.fetchrow(WORST_SECOND, TOOL)
        assert row is not None
        return {"worst": int(row["worst"]), "calls": int(row["calls"]), "span_s": float(row["span_s"] or 0.0)}
    finally:
        for executor in executors:
            executor.stop()
        scheduler.stop()
        await conn.close()


async def run(args: argparse.Namespace) -> int:
    async with scratch_database("agentrt_bench_tool_limits") as db_url:
        conn = await asyncpg.connect(db_url)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        with tempfile.TemporaryDirectory(prefix="agentrt-bench-limits-") as tmp:
            seen = await measure(db_url, args, Path(tmp))
    rate = seen["calls"] / seen["span_s"] if seen["span_s"] > 0 else 0.0
    log(f"{seen['calls']} calls over {seen['span_s']:.1f} s ({rate:.1f}/s); most in any one second: {seen['worst']}")
    if seen["calls"] < args.rate * 2:
        log("too few calls to judge the limit: the executors did not keep up")
        return 1
    emit([figure(BENCH, "max_calls_in_any_second", seen["worst"], "calls", args.rate, seen["worst"] / args.rate,
                 calls=seen["calls"], executors=2),
          figure(BENCH, "limited_calls_per_s", rate, "calls/s", args.rate, rate / args.rate, span_s=seen["span_s"])])
    return 0 if seen["worst"] <= args.rate else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--steps-per-run", type=int, default=20)
    parser.add_argument("--slots", type=int, default=16)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
