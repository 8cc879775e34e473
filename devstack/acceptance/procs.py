"""Processes the suite starts: one log file each, signalled and stopped by pid, every command recorded."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import shared

REPO_ROOT = Path(shared.__file__).resolve().parent.parent
PYTHON = sys.executable


class ExperimentError(AssertionError):
    """A condition the experiment waited for did not come, or a step failed."""


class CommandLog:
    """Every command the suite ran (processes, signals, pg_ctl, ip), with its time, for the evidence."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.entries: list[str] = []

    def add(self, text: str) -> None:
        self.entries.append(f"+{time.monotonic() - self.started:7.2f}s {text}")


def clean_env(overrides: dict[str, str]) -> dict[str, str]:
    """The parent's environment without any AGENTRT_* setting, plus `overrides`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
    env.update(overrides)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state (R, S, T for stopped, Z...), None when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path, commands: CommandLog,
                 prefix: list[str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.env = env  # the settings given to it (for the evidence); the rest is the parent's
        self.log_path = log_path
        self.commands = commands
        self.prefix = prefix or []  # e.g. ["ip", "netns", "exec", NAME]
        self.popen: subprocess.Popen[bytes] | None = None
        self.history: list[dict[str, Any]] = []

    def start(self) -> Proc:
        settings = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        argv = [*self.prefix, *self.argv]
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(argv, env=clean_env(self.env), cwd=REPO_ROOT, stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        shown = " ".join(shlex.quote(a) for a in argv).replace(PYTHON, "python")
        self.commands.add(f"{settings} {shown}  # {self.name}, pid {self.popen.pid}".strip())
        self.history.append({"event": "started", "pid": self.popen.pid, "at": time.time()})
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} not started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def exited(self) -> bool:
        return self.popen is not None and self.popen.poll() is not None

    def stopped(self) -> bool:
        """SIGSTOPped (state T)."""
        return self.alive() and process_state(self.pid) in ("T", "t")

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def signal(self, sig: signal.Signals) -> None:
        if not self.alive():
            return
        self.commands.add(f"kill -{sig.name.removeprefix('SIG')} {self.pid}  # {self.name}")
        self.history.append({"event": sig.name, "pid": self.pid, "at": time.time()})
        os.kill(self.pid, sig)

    def kill(self, timeout: float = 10) -> int | None:
        """SIGKILL and reap."""
        if self.alive():
            self.signal(signal.SIGKILL)
            assert self.popen is not None
            self.popen.wait(timeout)
        return self.returncode

    def stop(self, timeout: float = 15) -> int | None:
        """SIGTERM (after SIGCONT if it is paused), then SIGKILL after `timeout`."""
        if not self.alive():
            return self.returncode
        assert self.popen is not None
        if self.stopped():
            self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        return self.returncode

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "pid": self.popen.pid if self.popen else None, "returncode": self.returncode,
                "log": str(self.log_path), "settings": self.env, "history": self.history}


async def wait_until(probe: Callable[[], Any], within: float, what: str, interval: float = 0.05) -> Any:
    """Polls `probe` (sync or async) until it returns something truthy; ExperimentError at the deadline."""
    deadline = time.monotonic() + within
    last: Any = None
    while True:
        value = probe()
        last = await value if asyncio.iscoroutine(value) else value
        if last:
            return last
        if time.monotonic() > deadline:
            raise ExperimentError(f"timed out after {within:g}s waiting for {what} (last: {last!r:.300})")
        await asyncio.sleep(interval)


async def wait_log(proc: Proc, text: str, within: float, start: int = 0) -> int:
    """Waits until `text` appears in the process log after byte offset `start`; returns its offset."""

    def probe() -> int | None:
        found = proc.log().find(text, start)
        if found < 0 and not proc.alive():
            raise ExperimentError(f"{proc.name} exited ({proc.returncode}) before logging {text!r}; "
                                  f"log tail: {proc.log()[-1500:]}")
        return found + 1 if found >= 0 else None

    return await wait_until(probe, within, f"{proc.name} to log {text!r}") - 1
