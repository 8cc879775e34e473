"""The processes the core benchmark runs and the CPU they spend (bench.bench_core).

A scheduler as its own process (as deployed, or without the OpenTelemetry gRPC
interceptor for --otel-compare), CPU seconds per process from /proc, the
machine's busy share, the bench database's PostgreSQL backends, and pgbench -N
with the CPU it costs (client and backends).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench._pg import free_port, pgbench_tps, server_url
from shared.transport import ClientTls, open_channel

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Evaluation only (--otel-compare): a scheduler process without the OpenTelemetry gRPC
# server interceptor, everything else identical.
_NO_OTEL_BOOT = """
import grpc.aio, sys
_server = grpc.aio.server
def _no_interceptors(*args, **kwargs):
    kwargs.pop("interceptors", None)
    return _server(*args, **kwargs)
grpc.aio.server = _no_interceptors
from cli.main import main
sys.exit(main(["scheduler"]))
"""


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """SIGTERM a process this bench started, then SIGKILL it if it has not exited within `timeout_s`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def wait_serving(addr: str, proc: subprocess.Popen[bytes], limit_s: float,
                       tls: ClientTls | None = None) -> None:
    """Until the scheduler process on `addr` answers gRPC health SERVING, over TLS when `tls` is
    given (it must not exit first)."""
    deadline = time.monotonic() + limit_s
    async with open_channel(addr, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"scheduler exited with {proc.returncode} before serving")
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"scheduler on {addr} not SERVING after {limit_s}s")
            await asyncio.sleep(0.1)


@dataclass
class SchedulerProc:
    db_url: str
    otel: bool = True
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.port = free_port()
        env = {**os.environ, "AGENTRT_DATABASE_URL": self.db_url,
               "AGENTRT_LISTEN_ADDR": f"127.0.0.1:{self.port}", "AGENTRT_LOG_LEVEL": "WARNING",
               # the bench claims as its own executor (auth is not under test here)
               "AGENTRT_REQUIRE_REGISTERED_AGENTS": "false", "AGENTRT_AUTH_MODE": "none"}
        env.pop("AGENTRT_CONFIG_FILE", None)
        if self.otel:
            cmd = [sys.executable, "-m", "cli", "scheduler"]
        else:
            cmd = [sys.executable, "-c", _NO_OTEL_BOOT]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def wait_serving(self, limit_s: float = 30.0) -> None:
        assert self.proc is not None
        await wait_serving(self.addr, self.proc, limit_s)

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return _proc_cpu(self.proc.pid)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    values = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    total = sum(values[:8])
    return total - idle, total


async def backend_pids(conn: asyncpg.Connection) -> list[int]:
    """PostgreSQL backends serving the bench database (the schedulers' pools and notifiers)."""
    rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid()")
    return [r["pid"] for r in rows]


def backends_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += _proc_cpu(pid)
    return total


@dataclass
class Pgbench:
    tps: float
    cpu_ms_per_txn: float  # pgbench client + its PostgreSQL backends


async def measured_pgbench(pg_url: str, seconds: int) -> Pgbench:
    """pgbench -N, and the CPU it costs: its own (rusage of children) and its backends' (/proc, sampled)."""
    name = urlsplit(pg_url).path.lstrip("/")
    seen: dict[int, float] = {}  # backend pid -> last cpu seconds seen (backends start near zero)
    watcher = await asyncpg.connect(server_url())
    client0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    job = asyncio.create_task(asyncio.to_thread(pgbench_tps, pg_url, seconds=seconds))
    try:
        while not job.done():
            rows = await watcher.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", name)
            for row in rows:
                with contextlib.suppress(OSError):
                    seen[row["pid"]] = _proc_cpu(row["pid"])
            await asyncio.wait({job}, timeout=0.25)
        tps = await job
    finally:
        await watcher.close()
    client1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = (client1.ru_utime + client1.ru_stime) - (client0.ru_utime + client0.ru_stime)
    backends = sum(seen.values())
    return Pgbench(tps, (client + backends) / (tps * seconds) * 1000)
