"""`agentrt executor`: load and validate the agent definitions, then run the worker until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal

from executor.agents import AgentCatalog
from executor.config import ExecutorSettings
from executor.worker import Worker
from shared.tracing import setup_tracing

log = logging.getLogger(__name__)


async def serve(settings: ExecutorSettings) -> None:
    catalog = AgentCatalog.load(settings.agents_path)  # an invalid definition stops us here
    setup_tracing(settings.service_name, settings.otel_exporter)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    worker = Worker(settings, catalog)
    await worker.start()
    try:
        await stop.wait()
        log.info("executor %s: shutting down (grace %.1fs)", worker.worker_id, settings.shutdown_grace_s)
    finally:
        await worker.stop()
