"""The benchmarks' in-process tools, in a module of their own that imports nothing heavy: an
executor imports a tool's module, and a tool living in a bench driver would bring the driver's
imports (asyncpg, the scheduler's migrations, the embedded server) into the executor it measures."""

from __future__ import annotations

import asyncio
from typing import Any


def noop(request: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Does nothing, in-process: a step's cost is then the runtime's alone."""
    return {"ok": True}


async def nap(request: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Sleeps `seconds` (default 1), so every run holds its lease meanwhile."""
    await asyncio.sleep(float(request.get("seconds", 1.0)))
    return {"ok": True}
