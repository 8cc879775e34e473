"""Helpers shared by benchmarks: scratch databases, pgbench, free ports, figures.

The server comes from AGENTRT_BENCH_DATABASE_URL (any database on it; benchmarks
create and drop their own) or postgresql://postgres@127.0.0.1:5432/postgres.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

import asyncpg

from devstack.embedded_pg import free_port as free_port  # the one helper, re-exported for the benches

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PGBENCH = os.environ.get("AGENTRT_BENCH_PGBENCH", "/usr/bin/pgbench")


def server_url() -> str:
    return os.environ.get("AGENTRT_BENCH_DATABASE_URL") or DEFAULT_URL


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return parts._replace(path=f"/{database}").geturl()


async def _admin(url: str, statement: str) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@asynccontextmanager
async def scratch_database(prefix: str = "agentrt_bench") -> AsyncIterator[str]:
    """Creates `<prefix>_<random>` on the bench server, yields its URL, drops it (FORCE) at the end."""
    admin = server_url()
    name = f"{prefix}_{secrets.token_hex(6)}"
    await _admin(admin, f'CREATE DATABASE "{name}"')
    try:
        yield with_database(admin, name)
    finally:
        await _admin(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@asynccontextmanager
async def migrated_database(prefix: str = "agentrt_bench") -> AsyncIterator[str]:
    """A scratch database (as scratch_database) with agentrt's schema migrated into it."""
    from scheduler.store.migrate import migrate

    async with scratch_database(prefix) as url:
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        yield url


def _libpq_args(url: str) -> tuple[list[str], dict[str, str]]:
    parts = urlsplit(url)
    args = ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 5432)]
    if parts.username:
        args += ["-U", unquote(parts.username)]
    env = dict(os.environ)
    if parts.password:
        env["PGPASSWORD"] = unquote(parts.password)
    return args, env


_TPS = re.compile(r"^tps = ([0-9.]+) \((?:without initial connection time|excluding connections establishing)\)",
                  re.MULTILINE)


def pgbench_init(url: str, *, scale: int = 10) -> None:
    """`pgbench -i -s scale` on the database at url."""
    args, env = _libpq_args(url)
    database = urlsplit(url).path.lstrip("/")
    init = subprocess.run([PGBENCH, "-i", "-q", "-s", str(scale), *args, database], env=env,
                          capture_output=True, text=True, timeout=300)
    if init.returncode != 0:
        raise RuntimeError(f"pgbench -i failed: {init.stderr.strip()}")


def pgbench_tps(url: str, *, clients: int = 8, threads: int = 2, seconds: int = 15) -> float:
    """`pgbench -N -c clients -j threads -T seconds` on an initialised database; TPS without connection time."""
    args, env = _libpq_args(url)
    database = urlsplit(url).path.lstrip("/")
    run = subprocess.run([PGBENCH, "-N", "-c", str(clients), "-j", str(threads), "-T", str(seconds),
                          *args, database], env=env, capture_output=True, text=True, timeout=seconds + 120)
    if run.returncode != 0:
        raise RuntimeError(f"pgbench failed: {run.stderr.strip()}")
    match = _TPS.search(run.stdout)
    if match is None:
        raise RuntimeError(f"no tps line in pgbench output:\n{run.stdout}")
    return float(match.group(1))


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN when there are no samples."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def figure(bench: str, name: str, value: float, unit: str, baseline: float | None = None,
           ratio: float | None = None, **extra: Any) -> dict[str, Any]:
    """One figure as the runner expects it; printed later with emit()."""
    def clean(x: float | None) -> float | None:
        return None if x is None else round(float(x), 4)

    return {"bench": bench, "figure": name, "value": clean(value), "unit": unit,
            "baseline": clean(baseline), "ratio": clean(ratio), **extra}


def emit(figures: Sequence[dict[str, Any]]) -> None:
    for item in figures:
        print(json.dumps(item), flush=True)
