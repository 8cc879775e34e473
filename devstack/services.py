"""Child processes of `agentrt dev`: each in its own session (so a terminal's Ctrl-C reaches only
`agentrt dev`, which then stops them in order), logging to its own file, stopped by its pid."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


class ServiceFailed(Exception):
    """A service exited or did not become healthy; the message names it and its log."""


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


class Service:
    """One `agentrt <command>` process. `start()` again after it exited starts a new incarnation."""

    def __init__(self, name: str, args: list[str], env: Mapping[str, str], log_dir: Path, *,
                 health_addr: str | None = None, health_url: str | None = None, stop_timeout_s: float = 15.0,
                 ) -> None:
        self.name = name
        self.args = args
        self.env = dict(env)
        self.log_path = log_dir / f"{name}.log"
        self.health_addr = health_addr
        self.health_url = health_url
        self.stop_timeout_s = stop_timeout_s
        self.incarnation = 0
        self.url = ""  # an HTTP service's address (the console's)
        self.kills = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def exited_with(self) -> int | None:
        return self._process.poll() if self._process is not None else None

    def start(self, extra_env: Mapping[str, str] | None = None) -> None:
        self.incarnation += 1
        env = {**self.env, **(extra_env or {})}
        with open(self.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} start #{self.incarnation}: agentrt "
                      f"{' '.join(self.args)}\n".encode())
            log.flush()
            self._process = subprocess.Popen([sys.executable, "-m", "cli", *self.args], env=env,
                                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)

    async def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive:
                raise ServiceFailed(f"{self.name} exited with {self.exited_with} while starting; "
                                    f"{self.log_path}: {log_tail(self.log_path)}")
            if await self._healthy():
                return
            if time.monotonic() > deadline:
                raise ServiceFailed(f"{self.name} did not become healthy within {timeout_s:g}s; "
                                    f"{self.log_path}: {log_tail(self.log_path)}")
            await asyncio.sleep(0.1)

    async def _healthy(self) -> bool:
        if self.health_addr:
            return await grpc_serving(self.health_addr)
        if self.health_url:
            try:
                async with aiohttp.ClientSession() as session, session.get(
                        self.health_url, timeout=aiohttp.ClientTimeout(total=1)) as resp:
                    return resp.status == 200
            except (aiohttp.ClientError, OSError, TimeoutError):
                return False
        return True

    def kill(self) -> int | None:
        """SIGKILL (chaos): no shutdown, no goodbye. Returns the pid it killed."""
        process = self._process
        if process is None or process.poll() is not None:
            return None
        process.send_signal(signal.SIGKILL)
        process.wait()
        self.kills += 1
        return process.pid

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if it outlives stop_timeout_s."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def grpc_serving(addr: str) -> bool:
    try:
        async with grpc.aio.insecure_channel(addr) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
    except grpc.aio.AioRpcError:
        return False



async def start_console(stack: Any) -> None:
    """`agentrt dev`'s operator console, on --console's address or a free loopback port (--console none:
    none), once it answers; its URL printed. `stack` is devstack/stack.py's: it holds the service from
    the moment it starts, so a Ctrl-C while it starts stops it too."""
    from devstack.embedded_pg import free_port

    if stack.args.console == "none":
        return
    listen = stack.args.console or f"127.0.0.1:{free_port()}"
    url = f"http://{listen.replace('127.0.0.1', 'localhost')}"
    service = Service("console", ["console", "--scheduler", stack.args.listen, "--listen", listen],
                      stack.child_env(), stack.log_dir, health_url=f"{url}/healthz")
    service.url = url
    service.start()
    stack.console_service = service
    stack.services.append(service)
    await stack.unless_stopped(service.wait_healthy(60.0))
    key = f"; sign in with the key in {stack.data_dir / 'api_key'}" if stack.api_key else ""
    print(f"console on {url}{key}", flush=True)
