"""`agentrt executor` and `agentrt reconcile`: wiring and lifecycle only.

The executor loads and validates every agent definition first (an invalid one
stops it with one line), then runs the worker (and, when tenants are
configured, the reconciler) until SIGTERM, then shuts down in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator

import aiohttp

from executor.agents import AgentCatalog
from executor.config import ExecutorSettings
from executor.reconciler import Reconciler, SweepReport
from executor.tools import ToolRegistry
from executor.tools.mcp import list_mcp_tools
from executor.worker import Worker, WorkerTaskDied
from shared.tracing import setup_tracing
from shared.transport import open_channel

log = logging.getLogger(__name__)


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


@contextlib.asynccontextmanager
async def reconciler_for(settings: ExecutorSettings, catalog: AgentCatalog) -> AsyncIterator[Reconciler]:
    key = settings.run_api_key.get_secret_value() if settings.run_api_key else None
    await list_mcp_tools(catalog)
    async with aiohttp.ClientSession() as session, \
            open_channel(settings.scheduler_addr, settings.scheduler_tls) as channel:
        yield Reconciler(catalog, ToolRegistry(catalog.all(), session), channel, settings.reconcile_tenants,
                         api_key=key)


async def _stopped_or_died(stop: asyncio.Event, worker: Worker) -> WorkerTaskDied | None:
    """Waits for SIGTERM/SIGINT or for one of the worker's own tasks to end, whichever comes first."""
    stopping = asyncio.create_task(stop.wait())
    dying = asyncio.create_task(worker.until_a_task_dies())
    done, pending = await asyncio.wait({stopping, dying}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return dying.result() if dying in done else None


async def serve(settings: ExecutorSettings) -> None:
    """Serves until SIGTERM; raises WorkerTaskDied (the CLI exits 1) when a claimer or the registration
    refresh ends on its own, after the same ordered shutdown."""
    catalog = AgentCatalog.load(settings.agents_path)  # an invalid definition stops us here
    setup_tracing(settings.tracing())
    stop = _stop_event()
    worker = Worker(settings, catalog)
    await worker.start()
    died: WorkerTaskDied | None = None
    try:
        async with contextlib.AsyncExitStack() as extra:
            if settings.reconcile_tenants:
                reconciler = await extra.enter_async_context(reconciler_for(settings, catalog))
                worker.reconciler = reconciler
                task = asyncio.create_task(reconciler.run_forever(settings.reconcile_interval_s, stop))
                extra.push_async_callback(asyncio.wait_for, task, 30)
            died = await _stopped_or_died(stop, worker)
            stop.set()  # the reconciler ends with the worker
            if died is not None:
                log.critical("%s", died)
            log.info("executor %s: shutting down (grace %.1fs)", worker.worker_id, settings.shutdown_grace_s)
    finally:
        await worker.stop()
    if died is not None:
        raise died


async def reconcile(settings: ExecutorSettings, once: bool) -> SweepReport:
    catalog = AgentCatalog.load(settings.agents_path)
    setup_tracing(settings.tracing())
    async with reconciler_for(settings, catalog) as reconciler:
        if once:
            return await reconciler.sweep()
        await reconciler.run_forever(settings.reconcile_interval_s, _stop_event())
        return reconciler.totals
