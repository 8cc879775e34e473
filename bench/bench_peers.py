"""Peers side by side: agentrt, DBOS and Restate on the same workload, in one run.

    python -m bench.bench_peers [--runs 200] [--steps 20] [--rounds 3] [--only agentrt,dbos,restate]

The workload: N runs started together, each of K steps, each step a durable intent, a no-op tool
call and a durable result. A round ends when the last run has finished; its rate is N*K / its
length; each system gets one unmeasured warm-up round, then `--rounds` measured ones, and its
figure is their median. docs/performance/peers.md says what each system guarantees here.

- agentrt: one scheduler and `--executors` executor processes (`python -m cli ...`, as
  bench.bench_executor starts them) with N slots between them, on a scratch database; a run is
  the bench agent of bench.bench_executor (fenced tool steps: decision, Tx1, no-op python tool,
  Tx2). A round inserts N queued runs and ends at the last one's finished_at (database clock).
- DBOS (bench._peer_dbos, the `peers` extra): a workflow of K `@DBOS.step` no-ops, its system
  database a second scratch database of the same PostgreSQL server.
- Restate (bench._peer_restate, the `peers` extra and the npm package `@restatedev/restate-server`,
  installed on first use under AGENTRT_BENCH_CACHE, default ~/.cache/agentrt-bench): the server, the
  Python SDK service and the load client in a network namespace of their own (`unshare --net`),
  in two shapes, one durable call per step and the intent made durable before the tool call.

A peer that cannot run here (a package missing, no network namespace) is said so in one line and
reported without a figure. CPU per step by process group from /proc/<pid>/stat (PostgreSQL
backends included); fsyncs per step from pg_stat_wal (the whole server) or Restate's RocksDB
metrics; the load average beside each. stdout ends with one JSON line per system.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import asyncpg

from bench._peer_measure import (
    UNAVAILABLE,
    CpuBook,
    backend_pids,
    measure_rounds,
    poll_until,
    process_tree,
    result,
    wal_syncs,
)
from bench._pg import emit, figure, log, migrated_database, scratch_database
from bench.bench_executor import ExecutorProc, SchedulerProc, agent_file, submit_bulk

BENCH = "peers"
ROOT = Path(__file__).resolve().parent.parent
RESTATE_SERVER_VERSION = "1.7.12"
AGENT = "bench-peers"
# The goals, as agentrt steps/s over the peer's, measured in the same run.
GOALS = {"dbos": 4.0, "restate_intent_then_tool": 1.0, "restate_one_call_per_step": 0.5}
PG_FSYNC_SCOPE = "pg_stat_wal.wal_sync of the whole PostgreSQL server (other databases' commits on it count too)"


class Unavailable(Exception):
    """A peer that cannot run on this machine; its message is the one line the bench prints."""


async def agentrt_round(conn: asyncpg.Connection, runs: int) -> float:
    """Inserts `runs` queued runs and waits until all have completed; seconds from insert to the last finish."""
    done0 = await conn.fetchval("SELECT count(*) FROM agent_runs WHERE status = 'COMPLETED'")
    t0 = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())")
    await submit_bulk(conn, AGENT, runs)
    # Wakes the long-polling claims as a submit does (a bulk insert alone leaves them to their poll).
    await conn.execute("SELECT pg_notify('agentrt_work', $1)", AGENT)

    async def finished() -> bool:
        row = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE status = 'COMPLETED') AS ok, count(*) FILTER (WHERE status NOT IN "
            "('COMPLETED', 'QUEUED', 'RUNNING', 'WAITING_TOOL')) AS bad FROM agent_runs")
        if row["bad"]:
            raise RuntimeError(f"{row['bad']} agentrt runs ended other than COMPLETED")
        return bool(row["ok"] >= done0 + runs)

    await poll_until(finished, 600, f"{runs} agentrt runs completed")
    t1 = await conn.fetchval("SELECT extract(epoch FROM max(finished_at)) FROM agent_runs")
    return float(t1 - t0)


async def measure_agentrt(db_url: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    agents = workdir / "agents"
    agents.mkdir()
    agent_file(agents, AGENT, "noop", args.steps, {"n": "${input.n}"})
    slots = math.ceil(args.runs / args.executors)
    conn = await asyncpg.connect(db_url)
    scheduler = SchedulerProc(db_url)
    executors: list[ExecutorProc] = []
    try:
        await scheduler.wait_serving()
        executors = [ExecutorProc(scheduler.addr, agents, slots, f"bench-peers-{i}") for i in range(args.executors)]
        log(f"  agentrt warm-up round ({args.runs} runs x {args.steps} steps, {args.executors} executors x "
            f"{slots} slots) ...")
        await agentrt_round(conn, args.runs)

        async def groups() -> dict[str, list[int]]:
            return {"scheduler": process_tree(scheduler.proc.pid),
                    "executors": [pid for e in executors for pid in process_tree(e.proc.pid)],
                    "postgres_backends": await backend_pids(conn)}

        book = CpuBook()
        syncs0 = await wal_syncs(conn)
        book.begin(await groups())
        rates = await measure_rounds(lambda: agentrt_round(conn, args.runs), args.rounds, args.runs * args.steps,
                                     "agentrt")
        spent = book.spent(await groups())
        await asyncio.sleep(1.1)  # backends report their WAL statistics at most once a second
        syncs1 = await wal_syncs(conn)
        tool_steps = await conn.fetchval("SELECT count(*) FROM tool_executions WHERE status = 'SUCCEEDED'")
        expected = (args.rounds + 1) * args.runs * args.steps
        if tool_steps != expected:
            raise RuntimeError(f"agentrt completed {tool_steps} tool steps, expected {expected}")
        return result(rates, args.rounds * args.runs * args.steps, spent,
                      fsyncs=None if syncs0 is None or syncs1 is None else syncs1 - syncs0,
                      fsync_scope=PG_FSYNC_SCOPE, tool_steps_succeeded=tool_steps,
                      executors=args.executors, slots_per_executor=slots)
    finally:
        for e in executors:
            e.stop()
        scheduler.stop()
        await conn.close()


def run_driver(command: list[str], name: str) -> dict[str, Any]:
    """A peer driver as its own process: its progress passes through, its last stdout line is its result."""
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=1800)
    last = (done.stdout.strip().splitlines() or ["{}"])[-1]
    if done.returncode == UNAVAILABLE:
        raise Unavailable(json.loads(last).get("not_measured") or f"{name}: not measured")
    if done.returncode != 0:
        raise RuntimeError(f"{name} driver exited with {done.returncode}")
    return dict(json.loads(last))


async def measure_dbos(args: argparse.Namespace) -> dict[str, Any]:
    async with scratch_database("agentrt_bench_dbos") as url:
        return await asyncio.to_thread(
            run_driver, [sys.executable, "-m", "bench._peer_dbos", "--url", url, "--runs", str(args.runs),
                         "--steps", str(args.steps), "--rounds", str(args.rounds)], "DBOS")


def restate_server() -> tuple[Path, str]:
    """The restate-server binary of the pinned npm package, installed into the cache on first use."""
    override = os.environ.get("AGENTRT_BENCH_RESTATE_SERVER")
    if override:
        return Path(override), "given by AGENTRT_BENCH_RESTATE_SERVER"
    cache = Path(os.environ.get("AGENTRT_BENCH_CACHE") or Path.home() / ".cache" / "agentrt-bench")
    prefix = cache / f"restate-server-{RESTATE_SERVER_VERSION}"
    binary = prefix / "node_modules" / "@restatedev" / "restate-server-linux-x64" / "bin" / "restate-server"
    if not binary.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise Unavailable("Restate: not measured: npm is not installed (it fetches @restatedev/restate-server)")
        log(f"  installing @restatedev/restate-server@{RESTATE_SERVER_VERSION} into {prefix} ...")
        prefix.mkdir(parents=True, exist_ok=True)
        # --ignore-scripts: the package's postinstall only reports the install to an outside address.
        done = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-save",
                               "--ignore-scripts", f"@restatedev/restate-server@{RESTATE_SERVER_VERSION}"],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not binary.exists():
            tail = (done.stderr.strip().splitlines() or ["no binary for this platform"])[-1]
            raise Unavailable(f"Restate: not measured: npm could not install restate-server ({tail})")
    return binary, RESTATE_SERVER_VERSION


def measure_restate(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    binary, version = restate_server()
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--net", "true"], capture_output=True).returncode != 0:
        raise Unavailable("Restate: not measured: cannot make a network namespace here (`unshare --net` needs "
                          "root or user namespaces); restate-server would call an outside address at start")
    restate_dir = workdir / "restate"
    restate_dir.mkdir()
    return run_driver([unshare, "--net", "--", sys.executable, "-m", "bench._peer_restate", "--server", str(binary),
                       "--server-version", version, "--workdir", str(restate_dir), "--runs", str(args.runs),
                       "--steps", str(args.steps), "--rounds", str(args.rounds),
                       "--workers", str(args.restate_workers)], "Restate")


async def measure_system(name: str, measured: dict[str, dict[str, Any] | str], errors: list[str],
                         measure: Any) -> None:
    """Awaits one system's measurement into `measured`; a failure becomes the one line saying why."""
    try:
        found = await measure
    except Unavailable as exc:
        measured[name] = str(exc)
    except Exception as exc:  # the other systems are still measured and reported
        measured[name] = f"{name}: not measured: {type(exc).__name__}: {exc}"
        errors.append(name)
    else:
        if name == "restate":  # two shapes, two figures
            versions = {"server_version": found["server_version"], "sdk_version": found["sdk_version"]}
            for shape, detail in found["shapes"].items():
                measured[f"restate_{shape}"] = {**detail, **versions}
        else:
            measured[name] = found


async def agentrt_on_scratch(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    async with migrated_database("agentrt_bench_peers") as db_url:
        return await measure_agentrt(db_url, args, workdir)


async def measure_all(args: argparse.Namespace, workdir: Path) -> tuple[dict[str, dict[str, Any] | str], list[str]]:
    """Each system's result or the one line saying why it was not measured; the systems that failed."""
    measured: dict[str, dict[str, Any] | str] = {}
    errors: list[str] = []
    shape = f"{args.runs} runs x {args.steps} steps, {args.rounds} rounds"
    if "agentrt" in args.only:
        log(f"agentrt: {shape} ...")
        await measure_system("agentrt", measured, errors, agentrt_on_scratch(args, workdir))
    if "dbos" in args.only:
        log(f"DBOS: {shape} ...")
        await measure_system("dbos", measured, errors, measure_dbos(args))
    if "restate" in args.only:
        log(f"Restate: {shape} per shape ...")
        await measure_system("restate", measured, errors, asyncio.to_thread(measure_restate, args, workdir))
    return measured, errors


def figures_of(measured: dict[str, dict[str, Any] | str]) -> tuple[list[dict[str, Any]], bool]:
    """One figure per system (agentrt first, then each peer against it); whether every goal measured was met."""
    out: list[dict[str, Any]] = []
    met = True
    base = measured.get("agentrt")
    agentrt_rate = base["steps_per_s"] if isinstance(base, dict) else None
    for name, found in measured.items():
        if isinstance(found, str):
            log(found)
            out.append(figure(BENCH, f"{name}_steps_per_s", float("nan"), "steps/s", agentrt_rate, None,
                              not_measured=found) | {"value": None})
            continue
        rate = found["steps_per_s"]
        if name == "agentrt":
            out.append(figure(BENCH, "agentrt_steps_per_s", rate, "steps/s", None, None, **found))
            continue
        extra: dict[str, Any] = {"baseline_name": "agentrt steps/s in the same run"}
        goal = GOALS.get(name)
        if agentrt_rate and goal is not None:
            over = agentrt_rate / rate
            extra.update(agentrt_over_peer=round(over, 3), goal_agentrt_over_peer=goal, goal_met=over >= goal)
            met = met and over >= goal
            log(f"  agentrt / {name}: x{over:.2f} (goal >= x{goal}): {'met' if over >= goal else 'MISSED'}")
        out.append(figure(BENCH, f"{name}_steps_per_s", rate, "steps/s", agentrt_rate,
                          rate / agentrt_rate if agentrt_rate else None, **extra, **found))
    return out, met


async def run(args: argparse.Namespace) -> int:
    start_load = [round(x, 2) for x in os.getloadavg()]
    log(f"peers side by side on {os.cpu_count()} cores, load average {start_load} at start")
    with tempfile.TemporaryDirectory(prefix="agentrt-bench-peers-") as tmp:
        measured, errors = await measure_all(args, Path(tmp))
    figures, met = figures_of(measured)
    for item in figures:
        item.update(runs=args.runs, steps_per_run=args.steps, rounds=args.rounds, cores=os.cpu_count(),
                    loadavg_at_start=start_load)
    emit(figures)
    # A peer that cannot run here fails nothing; an error or a missed goal does (as the other benches).
    return 0 if met and not errors else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_peers")
    parser.add_argument("--runs", type=int, default=200, help="runs started together in each round (N)")
    parser.add_argument("--steps", type=int, default=20, help="steps per run (K)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per system; the figure is their median")
    parser.add_argument("--executors", type=int, default=2, help="agentrt executor processes (N slots between them)")
    parser.add_argument("--restate-workers", type=int, default=2, help="hypercorn workers of the Restate SDK service")
    parser.add_argument("--only", default="agentrt,dbos,restate", type=lambda v: set(v.split(",")),
                        help="comma-separated systems to measure")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
