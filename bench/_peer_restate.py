"""Restate on the peer workload (run by bench.bench_peers inside a network namespace of its own).

    unshare --net -- python -m bench._peer_restate --server BINARY --workdir DIR --runs 200 --steps 20

The Restate server (the binary of the `@restatedev/restate-server` npm package, which asks an
outside address for its latest version at start: this process refuses to run unless the only
network interface it sees is loopback), the Python `restate-sdk` service of bench._peer_restate_app
under hypercorn, and this process as the load client, all on loopback of the namespace. A round
invokes N runs together through the ingress (each request returns when its run has finished) and
waits for all of them, once for each shape (StepOnce, IntentFirst).

CPU groups: the server, the SDK service (hypercorn and its workers), the client (reported, not in
the total). fsyncs: the server's RocksDB WAL syncs (restate_rocksdb_wal_synced_total, every
database of the node). The SDK service takes over SIGTERM on its first request (it then drains
for up to two minutes), so it is stopped with SIGINT. Prints one JSON line on stdout, last.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp

from bench._peer_measure import (
    CpuBook,
    measure_rounds,
    poll_until,
    print_result,
    process_tree,
    result,
    timed,
    unavailable,
)
from bench._pg import log

ROOT = Path(__file__).resolve().parent.parent
INGRESS = "http://127.0.0.1:8080"
ADMIN = "http://127.0.0.1:9070"
NODE_METRICS = "http://127.0.0.1:5122/metrics"
SERVICE_ADDR = "127.0.0.1:9080"
SHAPES = {"one_call_per_step": "StepOnce", "intent_then_tool": "IntentFirst"}
HYPERCORN_CONFIG = """\
bind = ["{bind}"]
workers = {workers}
loglevel = "WARNING"
h2_max_concurrent_streams = 2147483647
keep_alive_max_requests = 2147483647
keep_alive_timeout = 2147483647
"""


def only_loopback() -> bool:
    """The interfaces of this process's network namespace (sysfs may show another one's)."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def stop(proc: subprocess.Popen[bytes], sig: signal.Signals, timeout_s: float = 30) -> None:
    """Sends `sig` to a process this driver started; SIGKILLs it and its descendants after `timeout_s`."""
    if proc.poll() is not None:
        return
    tree = process_tree(proc.pid)
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


async def wait_http(session: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    async def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before answering")
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(url) as reply:
                return reply.status < 500
        return False

    await poll_until(up, 60, f"{what} answering {url}", interval_s=0.1)


async def wal_synced(session: aiohttp.ClientSession) -> float:
    async with session.get(NODE_METRICS) as reply:
        text = await reply.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("restate_rocksdb_wal_synced_total{"))


async def invoke_round(session: aiohttp.ClientSession, service: str, runs: int, steps: int) -> float:
    async def one() -> None:
        async with session.post(f"{INGRESS}/{service}/run", json=steps) as reply:
            body = await reply.text()
            if reply.status != 200 or json.loads(body) != steps:
                raise RuntimeError(f"{service}/run answered {reply.status}: {body[:200]}")

    return await timed(asyncio.gather(*(one() for _ in range(runs))))


async def measure_shape(session: aiohttp.ClientSession, args: argparse.Namespace, shape: str,
                        pids: dict[str, int]) -> dict[str, Any]:
    service = SHAPES[shape]
    log(f"  Restate {shape} warm-up round ({args.runs} runs x {args.steps} steps) ...")
    await invoke_round(session, service, args.runs, args.steps)

    def groups() -> dict[str, list[int]]:
        return {"restate_server": process_tree(pids["server"]), "sdk_service": process_tree(pids["service"]),
                "client": [os.getpid()]}

    book = CpuBook()
    syncs0 = await wal_synced(session)
    book.begin(groups())
    rates = await measure_rounds(lambda: invoke_round(session, service, args.runs, args.steps), args.rounds,
                                 args.runs * args.steps, f"Restate {shape}")
    spent = book.spent(groups())
    syncs1 = await wal_synced(session)
    steps = args.rounds * args.runs * args.steps
    return result(rates, steps, spent, fsyncs=syncs1 - syncs0,
                  fsync_scope="restate_rocksdb_wal_synced_total of the Restate node (all its RocksDB databases)",
                  outside_total=("client",), durable_actions_per_step=2 if shape == "intent_then_tool" else 1)


async def drive(args: argparse.Namespace, pids: dict[str, int], server: subprocess.Popen[bytes],
                service: subprocess.Popen[bytes]) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await wait_http(session, f"{ADMIN}/health", server, "restate-server admin")
        await wait_http(session, f"{INGRESS}/restate/health", server, "restate-server ingress")
        await wait_http(session, f"http://{SERVICE_ADDR}/health", service, "the restate-sdk service")
        async with session.post(f"{ADMIN}/deployments", json={"uri": f"http://{SERVICE_ADDR}"}) as reply:
            if reply.status >= 300:
                raise RuntimeError(f"registering the deployment: {reply.status} {await reply.text()}")
        shapes = {shape: await measure_shape(session, args, shape, pids) for shape in SHAPES}
    return {"shapes": shapes, "server_version": args.server_version, "sdk_version": metadata.version("restate-sdk")}


def start(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    workdir = Path(args.workdir)
    env = {**os.environ, "RESTATE_BASE_DIR": str(workdir / "restate-data"), "RESTATE_LOG_FILTER": "warn",
           "RESTATE_DISABLE_TELEMETRY": "true"}
    with open(workdir / "restate-server.log", "wb") as server_log:
        server = subprocess.Popen([args.server, "--no-logo"], env=env, stdout=server_log, stderr=subprocess.STDOUT)
    config = workdir / "hypercorn.toml"
    config.write_text(HYPERCORN_CONFIG.format(bind=SERVICE_ADDR, workers=args.workers))
    with open(workdir / "restate-sdk-service.log", "wb") as service_log:
        service = subprocess.Popen([sys.executable, "-m", "hypercorn", "--config", str(config),
                                    "bench._peer_restate_app:app"], cwd=ROOT, stdout=service_log,
                                   stderr=subprocess.STDOUT)
    return server, service


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._peer_restate")
    parser.add_argument("--server", required=True, help="the restate-server binary")
    parser.add_argument("--server-version", default="")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="hypercorn worker processes of the SDK service")
    args = parser.parse_args()
    for package in ("restate-sdk", "hypercorn"):
        try:
            metadata.version(package)
        except metadata.PackageNotFoundError:
            return unavailable(f"Restate: not measured: the `{package}` package is not installed "
                               "(pip install -e '.[peers]')")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False, capture_output=True)
    if not only_loopback():
        return unavailable("Restate: not measured: this process sees network interfaces besides loopback (run it "
                           "under `unshare --net`, as the bench does); restate-server calls outside addresses at start")
    server, service = start(args)
    started = time.monotonic()
    try:
        print_result(asyncio.run(drive(args, {"server": server.pid, "service": service.pid}, server, service)))
    except BaseException:
        for name in ("restate-server.log", "restate-sdk-service.log"):  # the work dir goes with the bench
            lines = (Path(args.workdir) / name).read_text(errors="replace").splitlines()
            log(f"--- last lines of {name}:\n" + "\n".join(lines[-20:]))
        raise
    finally:
        stop(service, signal.SIGINT)  # SIGTERM would leave it draining for two minutes
        stop(server, signal.SIGINT)
        log(f"  Restate stack up for {time.monotonic() - started:.0f} s; logs in {args.workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
