"""Which asyncio event loop a long-running component runs on (the `event_loop` setting).

uvloop (libuv) runs the same asyncio code with a cheaper loop and socket layer:
on the executor benchmark it takes a few percent off every process's CPU per
step (the scheduler's many small PostgreSQL round trips gain most). `auto`
uses it when it is installed (it is a dependency on Linux), `asyncio` never
does, and `uvloop` insists (and fails at start when it is missing).
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")
EventLoop = Literal["auto", "asyncio", "uvloop"]


def uses_uvloop(choice: EventLoop) -> bool:
    if choice == "asyncio":
        return False
    available = importlib.util.find_spec("uvloop") is not None
    if choice == "uvloop" and not available:
        raise RuntimeError("event_loop is uvloop but the uvloop package is not installed")
    return available


def run(main: Coroutine[Any, Any, T], choice: EventLoop = "auto") -> T:
    """asyncio.run on the chosen loop."""
    if uses_uvloop(choice):
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)


# A service allocates small objects on every call. With CPython's defaults the youngest generation
# is collected every 700 allocations, and each collection of the oldest walks the whole heap, most of
# it modules, classes and functions that live as long as the process (py-spy put the collector at
# about 3% of the scheduler's CPU on the executor benchmark).
GEN0_THRESHOLD = 20_000


def run_service(main: Coroutine[Any, Any, T], choice: EventLoop = "auto") -> T:
    """`run` for a long-running service: what was loaded before it serves moves out of the cyclic
    collector's sight (gc.freeze), and the youngest generation is collected every GEN0_THRESHOLD
    allocations. Cycles are still collected; only how often the collector looks changes."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, older, oldest)
    return run(main, choice)
