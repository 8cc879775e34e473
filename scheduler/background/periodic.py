"""A scheduler background task that repeats one pass, then waits: the checkpoint pruner, retention
and the schedule firer. One loop and one ordered stop for all of them."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from shared.errors import Unavailable

log = logging.getLogger(__name__)


class PeriodicTask:
    """Runs `run_once()` every `interval_s` while `enabled`; a failed pass is logged and retried after the
    interval. `stop()` lets the pass in flight finish (passes are short), cancels it after `grace_s`, and
    is safe to call twice. A pass may watch `self.stopping` to end early."""

    what = "background task"  # for log lines: "<what> skipped: ..."

    def __init__(self, name: str, interval_s: float, enabled: bool) -> None:
        self.name = name
        self.interval_s = interval_s
        self.enabled = enabled
        self.stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def run_once(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                await self.run_once()
            except Unavailable as exc:
                log.warning("%s skipped: %s", self.what, exc)
            except Exception:
                log.exception("%s failed; retrying after the interval", self.what)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.interval_s)

    async def stop(self, grace_s: float = 5.0) -> None:
        self.stopping.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), grace_s)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
