"""Ordered shutdown signals shared by the worker and its run drivers.

`stopping` (SIGTERM): stop claiming, start no new step, cancel model calls.
`hard_stop` (the grace period is nearly over): cancel in-flight tool calls too.
Scheduler writes are never interrupted: they end on their own deadlines.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class Stopped(Exception):
    """The work was interrupted by shutdown; the lease is left to lapse and be taken over."""


class Shutdown:
    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.hard_stop = asyncio.Event()
        # Tasks currently inside race(), by the signal that interrupts them.
        self._racing: dict[int, set[asyncio.Task[object]]] = {id(self.stopping): set(), id(self.hard_stop): set()}

    def begin_stopping(self) -> None:
        self._fire(self.stopping)

    def begin_hard_stop(self) -> None:
        self._fire(self.hard_stop)

    def _fire(self, signal: asyncio.Event) -> None:
        signal.set()
        for task in list(self._racing[id(signal)]):
            task.cancel(msg="shutdown")

    async def race(self, work: Awaitable[T], signal: asyncio.Event) -> T:
        """`work`'s result, or Stopped (and `work` cancelled) once `signal` fires.

        No extra task: the calling task is registered and cancelled when the
        signal fires, and that cancellation is turned into Stopped here.
        """
        if signal.is_set():
            if inspect.iscoroutine(work):
                work.close()
            raise Stopped("shutting down")
        task = asyncio.current_task()
        assert task is not None
        racing = self._racing[id(signal)]
        racing.add(task)  # type: ignore[arg-type]
        try:
            return await work
        except asyncio.CancelledError:
            if signal.is_set() and task.cancelling() == 1:
                task.uncancel()
                raise Stopped("shutting down") from None
            raise
        finally:
            racing.discard(task)  # type: ignore[arg-type]
