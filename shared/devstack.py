"""`agentrt dev`: embedded PostgreSQL + migrations + the scheduler, as separate processes.

Everything it starts it stops again, in order, by pid, on Ctrl-C / SIGTERM or
after --exit-after seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.embedded_pg import EmbeddedPostgres


def _wait_healthy(addr: str, timeout: float) -> None:
    async def probe() -> None:
        deadline = time.monotonic() + timeout
        async with grpc.aio.insecure_channel(addr) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"scheduler at {addr} did not become healthy in {timeout:.0f}s")
                await asyncio.sleep(0.2)

    asyncio.run(probe())


def run_dev(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    pg: EmbeddedPostgres | None = None
    children: list[subprocess.Popen[bytes]] = []
    stop = {"now": False}

    def on_signal(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    try:
        if args.database_url:
            database_url = args.database_url
        else:
            port_file = data_dir / "pg.port"
            port = int(port_file.read_text()) if port_file.exists() else None
            pg = EmbeddedPostgres(data_dir / "pg", port=port)
            pg.start()
            port_file.write_text(str(pg.port))
            admin = pg.url("postgres")
            exists = subprocess.run([str(pg.bin_dir / "psql"), admin, "-tAc",
                                     "SELECT 1 FROM pg_database WHERE datname = 'agentrt'"],
                                    capture_output=True, text=True, check=True).stdout.strip()
            if exists != "1":
                subprocess.run([str(pg.bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(pg.port),
                                "-U", "postgres", "agentrt"], check=True)
            database_url = pg.url("agentrt")
            print(f"embedded PostgreSQL on {database_url} (data in {pg.data_dir})", flush=True)
        env = {**os.environ, "AGENTRT_DATABASE_URL": database_url, "AGENTRT_LISTEN_ADDR": args.listen}
        subprocess.run([sys.executable, "-m", "shared.cli", "migrate"], env=env, check=True)
        log_dir = data_dir / "logs"
        log_dir.mkdir(exist_ok=True)
        with open(log_dir / "scheduler.log", "ab") as log_file:
            children.append(subprocess.Popen([sys.executable, "-m", "shared.cli", "scheduler"], env=env,
                                             stdout=log_file, stderr=subprocess.STDOUT))
        _wait_healthy(args.listen, 30)
        print(f"scheduler serving on {args.listen} (health + reflection on); logs in {log_dir}", flush=True)
        print("try: grpcurl -plaintext " + args.listen + " list", flush=True)
        deadline = time.monotonic() + args.exit_after if args.exit_after else None
        while not stop["now"]:
            if deadline is not None and time.monotonic() >= deadline:
                break
            if any(child.poll() is not None for child in children):
                raise RuntimeError("a service exited; see the logs in " + str(log_dir))
            time.sleep(0.2)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        for child in reversed(children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in reversed(children):
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if pg is not None:
            pg.stop()
            print("stopped the scheduler and embedded PostgreSQL", flush=True)
