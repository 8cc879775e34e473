"""LISTEN agentrt_outbox on a dedicated connection; reconnects with backoff.

A lost listener costs latency, not correctness: the relay then waits at most
`idle_poll_ms` between looks at the outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import asyncpg

from shared.db import CONNECTION_ERRORS

log = logging.getLogger(__name__)
CHANNEL = "agentrt_outbox"


class OutboxListener:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self.woken = asyncio.Event()
        self.connected = asyncio.Event()

    def _on_notify(self, *_: Any) -> None:
        self.woken.set()

    async def run(self, stopping: asyncio.Event) -> None:
        delay = 0.1
        while not stopping.is_set():
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self._dsn, timeout=10)
                await conn.add_listener(CHANNEL, self._on_notify)
                self.connected.set()
                self.woken.set()  # whatever arrived while we were away
                delay = 0.1
                closed = asyncio.Event()
                conn.add_termination_listener(lambda _c, closed=closed: closed.set())  # type: ignore[misc]
                stop = asyncio.create_task(stopping.wait(), name="listener-stop")
                lost = asyncio.create_task(closed.wait(), name="listener-lost")
                await asyncio.wait({stop, lost}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                lost.cancel()
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:  # shared.db's table, e.g. no primary yet
                log.warning("outbox listener disconnected (%s); the relay polls until it is back", exc)
            finally:
                self.connected.clear()
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), 2)
            if not stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), delay)
                delay = min(delay * 2, 5.0)
