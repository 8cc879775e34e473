"""Wakes long-polling ClaimWork calls on NOTIFY agentrt_work, with polling as the fallback.

Waiters read the current epoch before they try to claim, then wait for a
newer one: a notification that lands between their claim and their wait is
not lost. If the listening connection drops, claims keep working by polling
while it reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

import asyncpg

from shared.db import CONNECTION_ERRORS

log = logging.getLogger(__name__)
CHANNEL = "agentrt_work"
NOTIFY_SQL = "SELECT pg_notify('agentrt_work', '')"
SEND_WINDOW_S = 0.005


def _set_event(event: asyncio.Event, *_: Any) -> None:
    event.set()


class WorkNotifier:
    def __init__(self, dsn: str | None) -> None:
        self._dsn = dsn
        self._epoch = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.connected = asyncio.Event()
        self._poked = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None

    def epoch(self) -> int:
        return self._epoch

    def notify_local(self, *_: Any) -> None:
        self._epoch += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, epoch: int, at_most_s: float) -> None:
        """Returns when the epoch moved past `epoch`, or after `at_most_s` seconds."""
        if self._epoch != epoch:
            return
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), at_most_s)

    def poke(self) -> None:
        """New work is due: wake local claimers now, other replicas by one coalesced NOTIFY."""
        self.notify_local()
        self._poked.set()

    async def start(self, pool: Any = None) -> None:
        if self._dsn is not None:
            self._task = asyncio.create_task(self._listen(), name="work-notifier")
        if pool is not None:
            self._sender = asyncio.create_task(self._send(pool), name="work-notify-sender")

    async def _send(self, pool: Any) -> None:
        """At most one NOTIFY per window, outside any run's transaction."""
        while not self._stopping.is_set():
            await self._poked.wait()
            self._poked.clear()
            try:
                await pool.execute(NOTIFY_SQL)
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:  # shared.db's table, e.g. no primary yet
                log.warning("could not send the work wake-up (%s); other replicas poll", exc)
            await asyncio.sleep(SEND_WINDOW_S)

    async def _listen(self) -> None:
        delay = 0.1
        while not self._stopping.is_set():
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self._dsn)
                await conn.add_listener(CHANNEL, self.notify_local)
                self.connected.set()
                delay = 0.1
                self.notify_local()  # anything submitted while we were away
                closed = asyncio.Event()
                conn.add_termination_listener(functools.partial(_set_event, closed))
                stop = asyncio.create_task(self._stopping.wait())
                lost = asyncio.create_task(closed.wait())
                await asyncio.wait({stop, lost}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                lost.cancel()
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:  # shared.db's table, e.g. no primary yet
                log.warning("work notifier disconnected (%s); claims poll until it is back", exc)
            finally:
                self.connected.clear()
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), 2)
            if not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay)
                delay = min(delay * 2, 5.0)

    async def stop(self) -> None:
        self._stopping.set()
        self.notify_local()
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
