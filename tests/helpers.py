"""What tests of every kind share: the `agentrt` command as a real process (`python -m cli
ARGS`, started from the repository, answered with its exit status, stdout and stderr), and waiting on a
condition with a deadline."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tests_paths import REPO

T = TypeVar("T")


# A probe run with `python -c` prefixes this: this venv's editable install answers for the checkout's
# packages through a meta path finder ahead of sys.path; dropping it leaves only what PYTHONPATH names
# (an unpacked wheel) to answer.
WITHOUT_CHECKOUT = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path "
                    "if '__editable__' not in getattr(f, '__module__', '')]")


def without_settings(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any AGENTRT_* setting, plus `extra`."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("AGENTRT_")}
    return {**clean, **(extra or {})}


async def run_agentrt(*args: str, env: Mapping[str, str] | None = None, cwd: Path = REPO,
                      within_s: float = 60) -> tuple[int, str, str]:
    """`agentrt ARGS` as a process: `env` is its whole environment (None: this process's). One that
    outlives `within_s` is killed by its pid and the timeout raised."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", *args, cwd=cwd, env=None if env is None else dict(env),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), within_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def wait_until(probe: Callable[[], Awaitable[T | None]], within_s: float, what: str,
                     interval: float = 0.05) -> T:
    """Polls `probe` until it answers something truthy, which is returned; an AssertionError naming
    `what` and the last answer once `within_s` seconds have passed."""
    deadline = time.monotonic() + within_s
    last: Any = None
    while True:
        last = await probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s:g}s waiting for {what} (last: {last!r})")
        await asyncio.sleep(interval)


async def agentrt(*args: str, addr: str | None = None, tenant: str = "tenant-a") -> tuple[int, str, str]:
    """`agentrt ARGS --tenant TENANT [--addr ADDR]` as a process, in this process's environment."""
    extra = ["--tenant", tenant] if tenant else []
    if addr:
        extra += ["--addr", addr]
    return await run_agentrt(*args, *extra)
