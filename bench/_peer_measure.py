"""Bookkeeping shared by bench.bench_peers and its peer drivers (bench._peer_dbos, bench._peer_restate).

Every peer runs the same closed workload: a round starts N runs together, each of K steps, and
ends when the last run has finished; a round's rate is N*K / its length. CPU is read from
/proc/<pid>/stat for each named group of processes (a process and its descendants, or the
PostgreSQL backends of one database) before the first measured round and after the last one.
A driver prints one JSON line (its result) last on stdout; progress goes to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from bench._pg import log

CLK_TCK = os.sysconf("SC_CLK_TCK")
# Exit status of a driver whose peer cannot run on this machine (not installed, no network
# namespace): the bench says so in one line and reports the other peers.
UNAVAILABLE = 3


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime, all threads


def process_tree(root: int) -> list[int]:
    """`root` and every live descendant of it (hypercorn's workers, a server's helpers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def cpu_of(pids: list[int]) -> dict[int, float]:
    seen: dict[int, float] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            seen[pid] = cpu_seconds(pid)
    return seen


async def backend_pids(conn: asyncpg.Connection) -> list[int]:
    """PostgreSQL backends of conn's database, but conn's own (the bench's bookkeeping)."""
    rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid()")
    return [r["pid"] for r in rows]


async def wal_syncs(conn: asyncpg.Connection) -> int | None:
    """pg_stat_wal.wal_sync: WAL fsyncs of the whole server (PostgreSQL 14+), None where unreadable."""
    with contextlib.suppress(asyncpg.PostgresError):
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        value = await conn.fetchval("SELECT wal_sync FROM pg_stat_wal")
        return None if value is None else int(value)
    return None


@dataclass
class CpuBook:
    """CPU seconds per named group at the start of the measured rounds; spent() is the difference.

    A process that appears later (a backend opened mid-round) counts from zero, as it starts near it.
    """

    start: dict[str, dict[int, float]] = field(default_factory=dict)

    def begin(self, groups: dict[str, list[int]]) -> None:
        self.start = {name: cpu_of(pids) for name, pids in groups.items()}

    def spent(self, groups: dict[str, list[int]]) -> dict[str, float]:
        spent = {}
        for name, pids in groups.items():
            before = self.start.get(name, {})
            spent[name] = sum(used - before.get(pid, 0.0) for pid, used in cpu_of(pids).items())
        return spent


async def measure_rounds(one_round: Callable[[], Awaitable[float]], rounds: int, steps_per_round: int,
                         label: str) -> list[float]:
    """Runs `rounds` rounds (each returns its length in seconds); the rate of each, in steps/s."""
    rates = []
    for index in range(rounds):
        elapsed = await one_round()
        rates.append(steps_per_round / elapsed)
        log(f"  {label} round {index + 1}/{rounds}: {steps_per_round} steps in {elapsed:.2f} s "
            f"= {rates[-1]:.0f} steps/s")
    return rates


async def timed(coro: Awaitable[Any]) -> float:
    t0 = time.monotonic()
    await coro
    return time.monotonic() - t0


def result(rates: list[float], steps: int, cpu_s: dict[str, float], *, fsyncs: float | None,
           fsync_scope: str, outside_total: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    """A peer's result: median round rate, every round's, CPU ms per step by group, fsyncs per step.

    `outside_total` names groups reported but not part of the system's own CPU (a load client).
    """
    per_step = {name: round(1000 * used / steps, 3) for name, used in cpu_s.items()}
    total = sum(v for k, v in per_step.items() if k not in outside_total)
    return {"steps_per_s": statistics.median(rates), "round_rates": [round(r, 1) for r in rates],
            "steps": steps, "cpu_ms_per_step": {**per_step, "total": round(total, 3)},
            "fsyncs_per_step": None if fsyncs is None else round(fsyncs / steps, 4),
            "fsync_scope": fsync_scope, "loadavg": [round(x, 2) for x in os.getloadavg()], **extra}


def print_result(value: dict[str, Any]) -> None:
    print(json.dumps(value), flush=True)


def unavailable(reason: str) -> int:
    """The driver's answer when its peer cannot run here: the one line the bench prints, and the exit status."""
    print_result({"not_measured": reason})
    return UNAVAILABLE


async def poll_until(check: Callable[[], Awaitable[bool]], limit_s: float, what: str,
                     interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + limit_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached after {limit_s:.0f} s")
        await asyncio.sleep(interval_s)
