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
from executor.worker import Worker
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
    async with aiohttp.ClientSession() as session, \
            open_channel(settings.scheduler_addr, settings.scheduler_tls) as channel:
        yield Reconciler(catalog, ToolRegistry(catalog.all(), session), channel, settings.reconcile_tenants,
                         api_key=key)


async def serve(settings: ExecutorSettings) -> None:
    catalog = AgentCatalog.load(settings.agents_path)  # an invalid definition stops us here
    setup_tracing(settings.tracing())
    stop = _stop_event()
    worker = Worker(settings, catalog)
    await worker.start()
    try:
        async with contextlib.AsyncExitStack() as extra:
            if settings.reconcile_tenants:
                reconciler = await extra.enter_async_context(reconciler_for(settings, catalog))
                worker.reconciler = reconciler
                task = asyncio.create_task(reconciler.run_forever(settings.reconcile_interval_s, stop))
                extra.push_async_callback(asyncio.wait_for, task, 30)
            await stop.wait()
            log.info("executor %s: shutting down (grace %.1fs)", worker.worker_id, settings.shutdown_grace_s)
    finally:
        await worker.stop()


async def reconcile(settings: ExecutorSettings, once: bool) -> SweepReport:
    catalog = AgentCatalog.load(settings.agents_path)
    setup_tracing(settings.tracing())
    async with reconciler_for(settings, catalog) as reconciler:
        if once:
            return await reconciler.sweep()
        await reconciler.run_forever(settings.reconcile_interval_s, _stop_event())
        return reconciler.totals
