"""Ordered shutdown signals shared by the worker and its run drivers.

`stopping` (SIGTERM): stop claiming, start no new step, cancel model calls.
`hard_stop` (the grace period is nearly over): cancel in-flight tool calls too.
Scheduler writes are never interrupted: they end on their own deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class Stopped(Exception):
    """The work was interrupted by shutdown; the lease is left to lapse and be taken over."""


class Shutdown:
    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.hard_stop = asyncio.Event()

    async def race(self, work: Awaitable[T], signal: asyncio.Event) -> T:
        """`work`'s result, or Stopped (and `work` cancelled) if `signal` fires first."""
        if signal.is_set():
            raise Stopped("shutting down")
        task = asyncio.ensure_future(work)
        waiter = asyncio.ensure_future(signal.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # our own cancellation (lease lost): the work goes with it
            task.cancel()
            raise
        finally:
            waiter.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise Stopped("shutting down")
