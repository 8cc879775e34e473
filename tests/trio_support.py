"""The real trio's processes for tests that need them as separate processes: schedulers and executors
started with `python -m cli`, each logging to its own file, SIGKILLed, restarted on the same
port and stopped by pid (devstack/acceptance/procs.py's Proc). Authentication is not under test here:
every scheduler runs with auth_mode none."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import grpc

from devstack.acceptance.procs import PYTHON, CommandLog, Proc, wait_log
from devstack.embedded_pg import free_port
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc

TENANT = "tenant-a"


class TrioProc:
    """One scheduler or executor slot: the same settings (and port) at every (re)start."""

    def __init__(self, trio: Trio, name: str, argv: list[str], env: dict[str, str], ready: str) -> None:
        self.trio, self.name, self.argv, self.env, self.ready = trio, name, argv, env, ready
        self.generation = 0
        self.kills = 0
        self.proc: Proc | None = None

    async def start(self, wait: bool = True) -> TrioProc:
        self.generation += 1
        log = self.trio.dir / f"{self.name}.log"
        offset = log.stat().st_size if log.exists() else 0
        env = dict(self.env)
        if "AGENTRT_WORKER_ID" in env:
            env["AGENTRT_WORKER_ID"] = f"{self.name}-g{self.generation}-{uuid.uuid4().hex[:4]}"
        self.proc = Proc(self.name, self.argv, env, log, self.trio.commands).start()
        if wait:
            await wait_log(self.proc, self.ready, 60, start=offset)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def kill(self) -> None:
        """SIGKILL, by pid (no shutdown path runs)."""
        if self.proc is not None and self.proc.alive():
            self.proc.kill()
            self.kills += 1

    async def stop(self) -> None:
        """SIGTERM, SIGKILL after a grace."""
        if self.proc is not None:
            await asyncio.to_thread(self.proc.stop, 15)


class Trio:
    def __init__(self, db_url: str, directory: Path) -> None:
        self.db_url = db_url
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.commands = CommandLog()
        self.slots: list[TrioProc] = []
        self.channels: list[grpc.aio.Channel] = []

    async def scheduler(self, name: str, **settings: Any) -> tuple[TrioProc, str]:
        port = free_port()
        env = {"AGENTRT_DATABASE_URL": self.db_url, "AGENTRT_LISTEN_ADDR": f"127.0.0.1:{port}",
               "AGENTRT_LEASE_DURATION_MS": "3000", "AGENTRT_CLAIM_POLL_INTERVAL_MS": "100",
               "AGENTRT_BACKOFF_BASE_MS": "200", "AGENTRT_BACKOFF_CAP_MS": "1000", "AGENTRT_BACKOFF_JITTER_MS": "50",
               "AGENTRT_SHUTDOWN_GRACE_S": "1", "AGENTRT_DB_POOL_MAX": "8", "AGENTRT_LOG_LEVEL": "INFO",
               "AGENTRT_REQUIRE_REGISTERED_AGENTS": "false", "AGENTRT_AUTH_MODE": "none",
               "AGENTRT_SCHEDULE_POLL_INTERVAL_MS": "100"}
        env.update({f"AGENTRT_{k.upper()}": str(v) for k, v in settings.items()})
        slot = TrioProc(self, name, [PYTHON, "-m", "cli", "scheduler"], env, "scheduler listening on")
        self.slots.append(slot)
        await slot.start()
        return slot, f"127.0.0.1:{port}"

    async def executor(self, name: str, scheduler_addr: str, agents: Path, **settings: Any) -> TrioProc:
        env = {"AGENTRT_SCHEDULER_ADDR": scheduler_addr, "AGENTRT_AGENTS_PATH": str(agents),
               "AGENTRT_WORKER_ID": name, "AGENTRT_HEALTH_ADDR": "", "AGENTRT_SLOTS": "8",
               "AGENTRT_CLAIM_WAIT_MS": "1000", "AGENTRT_RPC_TIMEOUT_S": "5", "AGENTRT_SHUTDOWN_GRACE_S": "2"}
        env.update({f"AGENTRT_{k.upper()}": str(v) for k, v in settings.items()})
        slot = TrioProc(self, name, [PYTHON, "-m", "cli", "executor"], env, "serving")
        self.slots.append(slot)
        await slot.start()
        return slot

    def runs(self, addr: str) -> rs_grpc.RunServiceStub:
        channel = grpc.aio.insecure_channel(addr)
        self.channels.append(channel)
        return rs_grpc.RunServiceStub(channel)

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()
        for slot in reversed(self.slots):
            await slot.stop()

    def logs(self, chars: int = 1500) -> str:
        parts = []
        for slot in self.slots:
            if slot.proc is not None:
                parts.append(f"--- {slot.name}: {slot.proc.log()[-chars:]}")
        return "\n".join(parts)


def md(tenant: str = TENANT) -> list[tuple[str, str]]:
    return [("x-tenant-id", tenant)]
