"""DBOS Transact on the peer workload (run by bench.bench_peers; needs the `peers` extra).

    python -m bench._peer_dbos --url URL --runs 200 --steps 20 --rounds 3

A DBOS workflow of K steps, each step a `@DBOS.step` that does nothing, with its system database
at URL (a scratch database of the bench's PostgreSQL server). A round starts N workflows directly
(in this process, as an application would) and waits for all of them. DBOS writes the workflow's
status when it starts and each step's output after the step has run: it keeps no record that a
step is about to run, so a crash inside a step runs that step again on recovery.

CPU groups: this process (the DBOS library and the workflows, with the load that starts them) and
the PostgreSQL backends of the system database. Prints one JSON line on stdout, last.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import Any

import asyncpg

from bench._peer_measure import (
    CpuBook,
    backend_pids,
    measure_rounds,
    print_result,
    process_tree,
    result,
    timed,
    unavailable,
    wal_syncs,
)
from bench._pg import log


def launch(url: str) -> Callable[[int], Awaitable[int]]:
    """Configures and launches DBOS on the system database at url; the workflow to run."""
    from dbos import DBOS  # the optional `peers` extra

    DBOS(config={"name": "agentrt-bench-peers", "system_database_url": url, "log_level": "WARNING"})

    @DBOS.step()
    async def tool(index: int) -> dict[str, Any]:
        return {"ok": True}

    @DBOS.workflow()
    async def run_steps(steps: int) -> int:
        for index in range(steps):
            await tool(index)
        return steps

    DBOS.launch()
    return run_steps


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    workflow = launch(args.url)
    conn = await asyncpg.connect(args.url)
    try:
        async def one_round() -> float:
            return await timed(asyncio.gather(*(workflow(args.steps) for _ in range(args.runs))))

        log(f"  DBOS warm-up round ({args.runs} workflows x {args.steps} steps) ...")
        await one_round()
        book = CpuBook()

        async def groups() -> dict[str, list[int]]:
            return {"dbos_process": process_tree(os.getpid()), "postgres_backends": await backend_pids(conn)}

        syncs0 = await wal_syncs(conn)
        book.begin(await groups())
        rates = await measure_rounds(one_round, args.rounds, args.runs * args.steps, "DBOS")
        spent = book.spent(await groups())
        await asyncio.sleep(1.1)  # backends report their WAL statistics at most once a second
        syncs1 = await wal_syncs(conn)
        recorded = await conn.fetchval("SELECT count(*) FROM dbos.operation_outputs")
        steps = args.rounds * args.runs * args.steps
        expected = (args.rounds + 1) * args.runs * args.steps
        if recorded != expected:
            raise RuntimeError(f"DBOS recorded {recorded} step outputs, expected {expected}")
        return result(rates, steps, spent,
                      fsyncs=None if syncs0 is None or syncs1 is None else syncs1 - syncs0,
                      fsync_scope="pg_stat_wal.wal_sync of the whole PostgreSQL server (other databases' "
                                  "commits on it count too)",
                      version=metadata.version("dbos"), step_outputs_recorded=recorded)
    finally:
        await conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._peer_dbos")
    parser.add_argument("--url", required=True, help="the system database (a scratch database)")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    try:
        metadata.version("dbos")
    except metadata.PackageNotFoundError:
        return unavailable("DBOS: not measured: the `dbos` package is not installed (pip install -e '.[peers]')")
    try:
        print_result(asyncio.run(measure(args)))
    finally:
        from dbos import DBOS

        DBOS.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
