"""Executor benchmark: fenced tool steps per second, beside pgbench -N TPS, and executor RSS at 200 runs.

    python -m bench.bench_executor [--seconds 20] [--windows 3] [--slots 48] [--steps-per-run 10]

Everything runs in one scratch database on AGENTRT_BENCH_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/postgres), dropped at the end:

1. Throughput: one scheduler process and two executor processes (`python -m cli ...`,
   exactly as deployed, log level WARNING). Each run of the bench agent is a scripted plan of
   fenced tool steps: decision (persisted) + Tx1 + a no-op python tool + Tx2. Each window counts
   SUCCEEDED ledger rows completed inside it, by the database clock; the figure is the median of
   three back-to-back windows (this machine's speed drifts), with every window's rate beside it.
2. Memory: one executor process with 200 slots holding 200 concurrent runs (each step a python
   tool that sleeps, so every run holds its lease); peak VmRSS while 200 leases are held.
3. Baseline: `pgbench -i -s 10` into the scratch database, then `pgbench -N -c 8 -j 2 -T 15`.

Progress goes to stderr; stdout ends with one JSON line per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import asyncpg
import yaml

from bench._core_procs import stop_process, wait_serving
from bench._pg import emit, figure, free_port, log, scratch_database
from scheduler.store.migrate import migrate

BENCH = "executor"
ROOT = Path(__file__).resolve().parent.parent
TARGET_STEPS_PER_S = 500
TARGET_RSS_MB = 150
CLK_TCK = os.sysconf("SC_CLK_TCK")
PGBENCH = os.environ.get("AGENTRT_BENCH_PGBENCH", "/usr/bin/pgbench")
_TPS = re.compile(r"^tps = ([0-9.]+) \((?:without initial connection time|excluding connections establishing)\)",
                  re.MULTILINE)


def pgbench_tps(url: str, *, scale: int = 10, clients: int = 8, threads: int = 2, seconds: int = 15) -> float:
    """`pgbench -i -s scale` into the database at url, then `pgbench -N`; TPS without connection time."""
    parts = urlsplit(url)
    args = ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 5432)]
    if parts.username:
        args += ["-U", unquote(parts.username)]
    env = {**os.environ, **({"PGPASSWORD": unquote(parts.password)} if parts.password else {})}
    database = parts.path.lstrip("/")
    for cmd in ([PGBENCH, "-i", "-q", "-s", str(scale), *args, database],
                [PGBENCH, "-N", "-c", str(clients), "-j", str(threads), "-T", str(seconds), *args, database]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 300)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed: {done.stderr.strip()}")
    match = _TPS.search(done.stdout)
    if match is None:
        raise RuntimeError(f"no tps line in pgbench output:\n{done.stdout}")
    return float(match.group(1))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    values = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(values[:8]) - values[3] - values[4], sum(values[:8])


async def backend_pids(conn: asyncpg.Connection) -> list[int]:
    """PostgreSQL backends of the bench database (the scheduler's pool and notifier), but this connection's."""
    rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid()")
    return [r["pid"] for r in rows]


def backends_cpu(pids: list[int]) -> dict[int, float]:
    seen: dict[int, float] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            seen[pid] = cpu_seconds(pid)
    return seen


class SchedulerProc:
    """`python -m cli scheduler` on a free loopback port, default settings, log level WARNING."""

    def __init__(self, db_url: str) -> None:
        self.addr = f"127.0.0.1:{free_port()}"
        env = {**os.environ, "AGENTRT_DATABASE_URL": db_url, "AGENTRT_LISTEN_ADDR": self.addr,
               "AGENTRT_LOG_LEVEL": "WARNING",
               # runs are submitted before the executors start (auth is not under test here)
               "AGENTRT_REQUIRE_REGISTERED_AGENTS": "false", "AGENTRT_AUTH_MODE": "none"}
        env.pop("AGENTRT_CONFIG_FILE", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "cli", "scheduler"], cwd=ROOT, env=env)

    async def wait_serving(self, limit_s: float = 30.0) -> None:
        await wait_serving(self.addr, self.proc, limit_s)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        stop_process(self.proc)


def agent_file(directory: Path, name: str, tool: str, steps: int, args: dict[str, Any]) -> None:
    definition = {
        "name": name, "version": "1",
        "decider": {"kind": "scripted", "plan": [{"id": "step", "tool": "work", "args": args, "repeat": steps},
                                                 {"id": "done", "finish": {"steps": steps}}]},
        "tools": [{"name": "work", "kind": "python", "callable": f"bench.tools:{tool}",
                   "contract": {"idempotent": True}}],
    }
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(definition, sort_keys=False))


async def submit_bulk(conn: asyncpg.Connection, agent: str, count: int) -> None:
    """Queued runs with the columns submit_run writes (bulk, for setup only)."""
    await conn.execute(
        """
        INSERT INTO agent_runs (id, tenant_id, agent_name, agent_version, input, labels, max_attempts,
                                next_attempt_at)
        SELECT gen_random_uuid(), 'tenant-' || (g % 8), $2, '', jsonb_build_object('n', g), '{}'::jsonb, 12,
               clock_timestamp()
        FROM generate_series(1, $1::int) AS g
        """, count, agent)


class ExecutorProc:
    def __init__(self, scheduler_addr: str, agents: Path, slots: int, worker_id: str) -> None:
        env = {**os.environ, "AGENTRT_SCHEDULER_ADDR": scheduler_addr, "AGENTRT_AGENTS_PATH": str(agents),
               "AGENTRT_SLOTS": str(slots), "AGENTRT_CLAIMERS": "4", "AGENTRT_HEALTH_ADDR": "",
               "AGENTRT_LOG_LEVEL": "WARNING", "AGENTRT_WORKER_ID": worker_id, "AGENTRT_CLAIM_WAIT_MS": "1000"}
        env.pop("AGENTRT_CONFIG_FILE", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "cli", "executor"], cwd=ROOT, env=env)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        stop_process(self.proc)


async def succeeded(conn: asyncpg.Connection) -> tuple[int, float]:
    row = await conn.fetchrow("SELECT count(*) AS n, extract(epoch FROM clock_timestamp()) AS now "
                              "FROM tool_executions WHERE status = 'SUCCEEDED'")
    return int(row["n"]), float(row["now"])


async def throughput(db_url: str, args: argparse.Namespace, workdir: Path) -> tuple[float, dict[str, Any]]:
    """Median of `args.windows` back-to-back windows on one stack (this machine's speed drifts)."""
    agents = workdir / "throughput"
    agents.mkdir()
    agent_file(agents, "bench-steps", "noop", args.steps_per_run, {"n": "${input.n}"})
    conn = await asyncpg.connect(db_url)
    scheduler = SchedulerProc(db_url)
    executors: list[ExecutorProc] = []
    try:
        span = args.seconds * args.windows + args.warmup + 10
        needed = int(TARGET_STEPS_PER_S * 4 * span / args.steps_per_run)
        await submit_bulk(conn, "bench-steps", needed)
        await conn.execute("VACUUM ANALYZE agent_runs")
        await scheduler.wait_serving()
        executors = [ExecutorProc(scheduler.addr, agents, args.slots, f"bench-exec-{i}") for i in range(2)]
        await asyncio.sleep(args.warmup)
        count0, t0 = await succeeded(conn)
        cpu0 = [scheduler.cpu_seconds(), *(e.cpu_seconds() for e in executors)]
        pg0, (busy0, total0) = backends_cpu(await backend_pids(conn)), machine_busy()
        rates, mark = [], (count0, t0)
        for _ in range(args.windows):
            await asyncio.sleep(args.seconds)
            now = await succeeded(conn)
            rates.append((now[0] - mark[0]) / (now[1] - mark[1]))
            mark = now
        count1, t1 = mark
        cpu1 = [scheduler.cpu_seconds(), *(e.cpu_seconds() for e in executors)]
        pg1, (busy1, total1) = backends_cpu(await backend_pids(conn)), machine_busy()
        rate = statistics.median(rates)
        mean = (count1 - count0) / (t1 - t0)
        cores = [(b - a) / (t1 - t0) for a, b in zip(cpu0, cpu1, strict=True)]
        # Backends opened during the window count from zero (they start near it).
        pg_cores = sum(used - pg0.get(pid, 0.0) for pid, used in pg1.items()) / (t1 - t0)
        machine = (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1)
        per_step = 1000 / mean if mean else float("nan")
        runs_done = await conn.fetchval("SELECT count(*) FROM agent_runs WHERE status = 'COMPLETED'")
        failed = await conn.fetchval("SELECT count(*) FROM agent_runs WHERE status NOT IN "
                                     "('COMPLETED', 'QUEUED', 'RUNNING', 'WAITING_TOOL')")
        detail = {"steps": count1 - count0, "window_s": round(args.seconds, 2),
                  "window_rates": [round(r, 1) for r in rates], "mean_rate": round(mean, 1),
                  "runs_completed": runs_done,
                  "runs_not_ok": failed, "cpu_cores": {"scheduler": round(cores[0], 2),
                                                       "executors": [round(c, 2) for c in cores[1:]],
                                                       "postgres_backends": round(pg_cores, 2),
                                                       "machine": round(machine, 2)},
                  # CPU per fenced step: what each side spends, less sensitive to the machine's other load.
                  "cpu_ms_per_step": {"scheduler": round(cores[0] * per_step, 2),
                                      "executors": round(sum(cores[1:]) * per_step, 2),
                                      "postgres_backends": round(pg_cores * per_step, 2)}}
        return rate, detail
    finally:
        for e in executors:
            e.stop()
        scheduler.stop()
        await conn.close()


async def memory(db_url: str, args: argparse.Namespace, workdir: Path) -> tuple[float, int]:
    agents = workdir / "memory"
    agents.mkdir()
    agent_file(agents, "bench-hold", "nap", 5, {"seconds": 2.0})
    conn = await asyncpg.connect(db_url)
    scheduler = SchedulerProc(db_url)
    executor: ExecutorProc | None = None
    try:
        await submit_bulk(conn, "bench-hold", args.concurrent)
        await scheduler.wait_serving()
        executor = ExecutorProc(scheduler.addr, agents, args.concurrent, "bench-rss")
        peak, held_peak, deadline = 0.0, 0, time.monotonic() + 60
        while time.monotonic() < deadline:
            held = await conn.fetchval("SELECT count(*) FROM agent_runs WHERE lease_owner = 'bench-rss'")
            held_peak = max(held_peak, held)
            if held >= args.concurrent:
                peak = max(peak, executor.rss_mb())
            done = await conn.fetchval("SELECT count(*) FROM agent_runs WHERE agent_name = 'bench-hold' "
                                       "AND status = 'COMPLETED'")
            if done >= args.concurrent:
                break
            await asyncio.sleep(0.2)
        return peak, held_peak
    finally:
        if executor is not None:
            executor.stop()
        scheduler.stop()
        await conn.close()


async def run(args: argparse.Namespace) -> int:
    figures: list[dict[str, Any]] = []
    async with scratch_database("agentrt_bench_exec") as db_url:
        conn = await asyncpg.connect(db_url)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        with tempfile.TemporaryDirectory(prefix="agentrt-bench-exec-") as tmp:
            workdir = Path(tmp)
            log(f"fenced tool steps: 1 scheduler + 2 executors x {args.slots} slots, "
                f"{args.steps_per_run} steps per run, median of {args.windows} x {args.seconds:.0f} s windows ...")
            rate, detail = await throughput(db_url, args, workdir)
            log(f"  {rate:.0f} fenced tool steps/s ({detail}); target >= {TARGET_STEPS_PER_S}: "
                f"{'met' if rate >= TARGET_STEPS_PER_S else 'MISSED'}")
            log(f"executor RSS with {args.concurrent} concurrent runs ...")
            rss, held = await memory(db_url, args, workdir)
            log(f"  peak VmRSS {rss:.1f} MB with {held} leases held; target <= {TARGET_RSS_MB} MB: "
                f"{'met' if held >= args.concurrent and rss <= TARGET_RSS_MB else 'MISSED'}")
        # The baseline runs last: pgbench's 1M-row load leaves autovacuum work behind that would
        # otherwise land in the steps' window (and the steps' leave theirs to pgbench, not to us).
        log("pgbench -N baseline (scale 10, 8 clients, 15 s) in the same scratch database ...")
        tps = await asyncio.to_thread(pgbench_tps, db_url, scale=10, clients=8, threads=2, seconds=15)
        log(f"  pgbench -N: {tps:.0f} TPS")
    figures.append(figure(BENCH, "fenced_tool_steps_per_s", rate, "steps/s", tps, rate / tps,
                          baseline_name="pgbench -N TPS", target=TARGET_STEPS_PER_S, **detail))
    figures.append(figure(BENCH, f"executor_rss_mb_{args.concurrent}_runs", rss, "MB", TARGET_RSS_MB,
                          rss / TARGET_RSS_MB, baseline_name="target", leases_held=held))
    emit(figures)
    return 0 if rate >= TARGET_STEPS_PER_S and rss <= TARGET_RSS_MB else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_executor")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each measuring window")
    parser.add_argument("--windows", type=int, default=3, help="back-to-back windows; the figure is their median")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--slots", type=int, default=48)
    parser.add_argument("--steps-per-run", type=int, default=10)
    parser.add_argument("--concurrent", type=int, default=200)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
