"""What PostgreSQL does per fenced tool step, beside what it does per `pgbench -N` transaction.

    python -m bench.bench_step_profile [--seconds 15] [--slots 32] [--steps-per-run 10] [--markdown FILE]

Counts, not timings, so the machine's other load barely moves them. The bench starts its own
PostgreSQL (the embedded server, fsync on) with pg_stat_statements preloaded and
track_functions=all, so nothing else writes WAL or statements into the figures:

1. One scheduler, one executor and one relay (publishing to a Tansu broker, as deployed: marking
   each outbox row published is part of what a step costs) run the bench agent of bench_executor (a scripted plan of
   fenced tool steps with a no-op python tool). After a warm-up, one window is measured between
   two snapshots of pg_stat_database, pg_stat_user_tables, pg_stat_user_functions,
   pg_stat_statements and the WAL position. A step is one SUCCEEDED ledger row completed in it.
2. `pgbench -i -s 10` then `pgbench -N` in a second database of the same server, measured the
   same way per transaction.

Per step: commits, statements (top-level and nested, the nested ones run by triggers and
functions), rows inserted/updated (HOT or not) per table, index entries written (an insert or a
non-HOT update writes one entry into each of the table's indexes), trigger-function calls, WAL
bytes, and PostgreSQL backend CPU. stdout ends with one JSON line per figure; --markdown writes the
tables for docs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench._core_procs import stop_process
from bench._pg import emit, figure, log
from bench.bench_executor import (
    ROOT,
    ExecutorProc,
    SchedulerProc,
    agent_file,
    backend_pids,
    backends_cpu,
    submit_bulk,
    succeeded,
)
from scheduler.store.migrate import migrate

BENCH = "step_profile"
SNAPSHOT_SQL = {
    "database": "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, tup_fetched "
                "FROM pg_stat_database WHERE datname = current_database()",
    "tables": "SELECT t.relname, t.n_tup_ins, t.n_tup_upd, t.n_tup_hot_upd, t.n_tup_del, "
              "(SELECT count(*) FROM pg_index i WHERE i.indrelid = t.relid) AS indexes "
              "FROM pg_stat_user_tables t",
    "functions": "SELECT funcname, calls FROM pg_stat_user_functions",
    "statements": "SELECT queryid, toplevel, calls, rows, wal_bytes, total_exec_time, total_plan_time, "
                  "left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query FROM pg_stat_statements "
                  "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
    "wal": "SELECT pg_current_wal_lsn() AS lsn",
}


async def snapshot(conn: asyncpg.Connection) -> dict[str, Any]:
    # Statistics are cached per transaction; each statement here is its own transaction.
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    await asyncio.sleep(0.6)  # the cumulative statistics are flushed by backends at most once a second
    return {name: await conn.fetch(sql) for name, sql in SNAPSHOT_SQL.items()}


def diff(before: dict[str, Any], after: dict[str, Any], units: float, wal_bytes: int) -> dict[str, Any]:
    """Per-unit deltas between two snapshots (units = steps or pgbench transactions)."""
    d0, d1 = before["database"][0], after["database"][0]
    database = {k: (d1[k] - d0[k]) / units for k in d1.keys()}
    t0 = {r["relname"]: r for r in before["tables"]}
    tables: dict[str, dict[str, float]] = {}
    index_entries = 0.0
    for row in after["tables"]:
        old = t0.get(row["relname"])
        ins = row["n_tup_ins"] - (old["n_tup_ins"] if old else 0)
        upd = row["n_tup_upd"] - (old["n_tup_upd"] if old else 0)
        hot = row["n_tup_hot_upd"] - (old["n_tup_hot_upd"] if old else 0)
        dele = row["n_tup_del"] - (old["n_tup_del"] if old else 0)
        if ins or upd or dele:
            entries = (ins + upd - hot) * row["indexes"]
            index_entries += entries
            tables[row["relname"]] = {"inserted": ins / units, "updated": upd / units, "hot_updated": hot / units,
                                      "deleted": dele / units, "indexes": row["indexes"],
                                      "index_entries": entries / units}
    f0 = {r["funcname"]: r["calls"] for r in before["functions"]}
    functions = {r["funcname"]: (r["calls"] - f0.get(r["funcname"], 0)) / units for r in after["functions"]
                 if r["calls"] - f0.get(r["funcname"], 0)}
    s0 = {(r["queryid"], r["toplevel"]): r for r in before["statements"]}
    statements = []
    for row in after["statements"]:
        old = s0.get((row["queryid"], row["toplevel"]))
        calls = row["calls"] - (old["calls"] if old else 0)
        if calls:
            statements.append({"query": row["query"], "toplevel": row["toplevel"], "calls": calls / units,
                               "rows": (row["rows"] - (old["rows"] if old else 0)) / units,
                               "wal_bytes": float(row["wal_bytes"] - (old["wal_bytes"] if old else 0)) / units,
                               "exec_ms": (row["total_exec_time"] - (old["total_exec_time"] if old else 0)) / units,
                               "plan_ms": (row["total_plan_time"] - (old["total_plan_time"] if old else 0)) / units})
    statements.sort(key=lambda s: -(s["exec_ms"] + s["plan_ms"]))
    return {"database": database, "tables": tables, "functions": functions, "statements": statements,
            "index_entries": index_entries / units, "wal_bytes": wal_bytes / units,
            "statements_toplevel": sum(s["calls"] for s in statements if s["toplevel"]),
            "statements_nested": sum(s["calls"] for s in statements if not s["toplevel"]),
            # A top-level statement's time holds its nested ones'; the rest of the backend's CPU is parsing,
            # the protocol, transaction start and commit, and the statistics themselves.
            "exec_ms": sum(s["exec_ms"] for s in statements if s["toplevel"]),
            "plan_ms": sum(s["plan_ms"] for s in statements if s["toplevel"])}


async def wal_between(conn: asyncpg.Connection, before: dict[str, Any], after: dict[str, Any]) -> int:
    """WAL bytes between the snapshots (asyncpg reads pg_lsn as an integer byte position)."""
    return int(after["wal"][0]["lsn"]) - int(before["wal"][0]["lsn"])


def start_relay(db_url: str, bootstrap: str) -> subprocess.Popen[bytes]:
    """`agentrt relay` publishing the outbox to a topic of its own, as deployed (log level WARNING)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
    env.update(AGENTRT_DATABASE_URL=db_url, AGENTRT_KAFKA_BOOTSTRAP=bootstrap, AGENTRT_TOPIC="bench.profile",
               AGENTRT_HEALTH_ADDR="127.0.0.1:0", AGENTRT_LOG_LEVEL="WARNING",
               AGENTRT_LAG_REPORT_INTERVAL_S="3600", AGENTRT_RETENTION_INTERVAL_S="3600")
    return subprocess.Popen([sys.executable, "-m", "cli", "relay"], cwd=ROOT, env=env)


async def profile_steps(db_url: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from devstack.kafka_testing import TansuBroker

    agents = workdir / "agents"
    agents.mkdir()
    agent_file(agents, "bench-steps", "noop", args.steps_per_run, {"n": "${input.n}"})
    conn = await asyncpg.connect(db_url)
    scheduler = SchedulerProc(db_url)
    executor: ExecutorProc | None = None
    broker = relay = None
    if not args.no_relay:
        broker = await asyncio.to_thread(TansuBroker().start)
        relay = start_relay(db_url, broker.bootstrap)
    try:
        await submit_bulk(conn, "bench-steps", int(800 * (args.seconds + args.warmup + 10) / args.steps_per_run))
        await conn.execute("VACUUM ANALYZE")
        await scheduler.wait_serving()
        executor = ExecutorProc(scheduler.addr, agents, args.slots, "bench-profile")
        await asyncio.sleep(args.warmup)
        before = await snapshot(conn)
        steps0, t0 = await succeeded(conn)
        pg0 = backends_cpu(await backend_pids(conn))
        await asyncio.sleep(args.seconds)
        steps1, t1 = await succeeded(conn)
        pg1 = backends_cpu(await backend_pids(conn))
        after = await snapshot(conn)
        steps = steps1 - steps0
        if steps <= 0:
            raise RuntimeError("no step completed in the window")
        # The snapshots' own statements add a handful of calls; over thousands of steps they vanish.
        result = diff(before, after, steps, await wal_between(conn, before, after))
        backend_cpu = sum(used - pg0.get(pid, 0.0) for pid, used in pg1.items())
        result.update(steps=steps, steps_per_s=steps / (t1 - t0), backend_cpu_ms=1000 * backend_cpu / steps)
        return result
    finally:
        if executor is not None:
            executor.stop()
        scheduler.stop()
        if relay is not None:
            stop_process(relay)
        if broker is not None:
            await asyncio.to_thread(broker.stop)
        await conn.close()


async def profile_pgbench(url: str, pgbench: str, seconds: int) -> dict[str, Any]:
    args = ["-h", "127.0.0.1", "-p", str(int(url.rsplit(":", 1)[1].split("/")[0])), "-U", "postgres"]
    database = url.rsplit("/", 1)[1]
    await asyncio.to_thread(subprocess.run, [pgbench, "-i", "-q", "-s", "10", *args, database], check=True,
                            capture_output=True, timeout=600)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("VACUUM ANALYZE")
        before = await snapshot(conn)
        pg0 = time.monotonic()
        command = [pgbench, "-N", "-c", "8", "-j", "2", "-T", str(seconds), *args, database]
        done = await asyncio.to_thread(subprocess.run, command,
                                       check=True, capture_output=True, text=True, timeout=seconds + 120)
        elapsed = time.monotonic() - pg0
        after = await snapshot(conn)
        tx = int(next(line.split(":")[1] for line in done.stdout.splitlines()
                      if line.startswith("number of transactions actually processed")).split("/")[0])
        result = diff(before, after, tx, await wal_between(conn, before, after))
        result.update(transactions=tx, tps=tx / elapsed)
        return result
    finally:
        await conn.close()


def markdown(steps: dict[str, Any], pgb: dict[str, Any]) -> str:
    lines = ["| per unit | fenced tool step | pgbench -N transaction | ratio |", "|---|---:|---:|---:|"]

    def row(name: str, a: float, b: float) -> None:
        lines.append(f"| {name} | {a:.2f} | {b:.2f} | {a / b if b else float('nan'):.1f}× |")

    row("commits", steps["database"]["xact_commit"], pgb["database"]["xact_commit"])
    row("statements (top level)", steps["statements_toplevel"], pgb["statements_toplevel"])
    row("statements (nested: triggers, functions)", steps["statements_nested"], pgb["statements_nested"])
    row("rows inserted", steps["database"]["tup_inserted"], pgb["database"]["tup_inserted"])
    row("rows updated", steps["database"]["tup_updated"], pgb["database"]["tup_updated"])
    row("index entries written", steps["index_entries"], pgb["index_entries"])
    row("WAL bytes", steps["wal_bytes"], pgb["wal_bytes"])
    lines += ["", "| table | inserted | updated | of them HOT | deleted | indexes | index entries |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, t in sorted(steps["tables"].items(), key=lambda kv: -kv[1]["index_entries"]):
        lines.append(f"| {name} | {t['inserted']:.2f} | {t['updated']:.2f} | {t['hot_updated']:.2f} | "
                     f"{t['deleted']:.2f} | {t['indexes']} | {t['index_entries']:.2f} |")
    lines += ["", "| trigger / function | calls per step |", "|---|---:|"]
    functions = sorted(steps["functions"].items(), key=lambda kv: -kv[1])
    lines += [f"| {name} | {calls:.2f} |" for name, calls in functions]
    lines += ["", f"Time inside statements per step: executing {steps['exec_ms']:.3f} ms, planning "
              f"{steps['plan_ms']:.3f} ms (top level, pg_stat_statements), of {steps['backend_cpu_ms']:.3f} ms of "
              "backend CPU.", "",
              "| statement (first 160 characters) | level | calls per step | rows | WAL bytes | exec µs | plan µs |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for s in steps["statements"][:25]:
        query = s["query"].replace("|", "\\|")
        lines.append(f"| `{query}` | {'top' if s['toplevel'] else 'nested'} | {s['calls']:.2f} | {s['rows']:.2f} | "
                     f"{s['wal_bytes']:.0f} | {1000 * s['exec_ms']:.0f} | {1000 * s['plan_ms']:.0f} |")
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace) -> int:
    from devstack.embedded_pg import EmbeddedPostgres

    with tempfile.TemporaryDirectory(prefix="agentrt-bench-profile-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pg", settings={
            "shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all",
            "pg_stat_statements.track_planning": "on",
            "track_functions": "all", "autovacuum_naptime": "60s"})
        log("starting a private PostgreSQL (fsync on, pg_stat_statements) ...")
        await asyncio.to_thread(server.start)
        try:
            admin = await asyncpg.connect(server.url())
            try:
                await admin.execute("CREATE DATABASE steps")
                await admin.execute("CREATE DATABASE pgb")
            finally:
                await admin.close()
            for database in ("steps", "pgb"):
                conn = await asyncpg.connect(server.url(database))
                try:
                    await conn.execute("CREATE EXTENSION pg_stat_statements")
                    if database == "steps":
                        await migrate(conn)
                finally:
                    await conn.close()
            log(f"fenced tool steps: 1 scheduler + 1 executor x {args.slots} slots, {args.seconds:.0f} s window ...")
            steps = await profile_steps(server.url("steps"), args, Path(tmp))
            log(f"  {steps['steps']} steps ({steps['steps_per_s']:.0f}/s)")
            pgbench = str(server.bin_dir / "pgbench")
            log("pgbench -N (scale 10, 8 clients) in another database of the same server ...")
            pgb = await profile_pgbench(server.url("pgb"), pgbench, int(args.seconds))
            log(f"  {pgb['transactions']} transactions ({pgb['tps']:.0f}/s)")
        finally:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(server.stop, "immediate")
    table = markdown(steps, pgb)
    print(table, file=sys.stderr)
    if args.markdown:
        await asyncio.to_thread(Path(args.markdown).write_text, table)
    figures = []
    per_tx = "pgbench -N per transaction"
    for name, column, unit in (("commits_per_step", "xact_commit", "commits"),
                               ("rows_inserted_per_step", "tup_inserted", "rows"),
                               ("rows_updated_per_step", "tup_updated", "rows")):
        a, b = steps["database"][column], pgb["database"][column]
        figures.append(figure(BENCH, name, a, unit, b, a / b if b else None, baseline_name=per_tx))
    for name, key, unit in (("statements_per_step", "statements_toplevel", "statements"),
                            ("nested_statements_per_step", "statements_nested", "statements"),
                            ("index_entries_per_step", "index_entries", "entries"),
                            ("wal_bytes_per_step", "wal_bytes", "bytes")):
        a, b = steps[key], pgb[key]
        figures.append(figure(BENCH, name, a, unit, b, a / b if b else None, baseline_name=per_tx))
    figures.append(figure(BENCH, "postgres_backend_cpu_ms_per_step", steps["backend_cpu_ms"], "ms", 0.6,
                          steps["backend_cpu_ms"] / 0.6, baseline_name="target (issue: <= 0.6 ms)",
                          steps_per_s=round(steps["steps_per_s"], 1), pgbench_tps=round(pgb["tps"], 1),
                          load_average=os.getloadavg()[0]))
    figures.append(figure(BENCH, "statement_time_ms_per_step", steps["exec_ms"] + steps["plan_ms"], "ms",
                          steps["backend_cpu_ms"], (steps["exec_ms"] + steps["plan_ms"]) / steps["backend_cpu_ms"],
                          baseline_name="backend CPU per step in the same window",
                          exec_ms=round(steps["exec_ms"], 4), plan_ms=round(steps["plan_ms"], 4)))
    emit(figures)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_step_profile")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the measured window")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--steps-per-run", type=int, default=10)
    parser.add_argument("--no-relay", action="store_true",
                        help="leave the relay out (the outbox rows then stay unpublished)")
    parser.add_argument("--markdown", default="", help="also write the tables to this file")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
