"""Retention: deletes old published outbox rows and old consumed_events, in small batches.

Each batch is one short statement with SKIP LOCKED (see relay/sql/queries.sql),
so retention never holds a long lock and several relays may run it at once.
A zero window turns that table's retention off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from relay.config import RelaySettings
from relay.store import RelayStore
from shared.errors import Unavailable

log = logging.getLogger(__name__)

PAUSE_BETWEEN_BATCHES_S = 0.01


async def purge_once(store: RelayStore, settings: RelaySettings, stopping: asyncio.Event | None = None,
                     max_batches: int = 1_000) -> tuple[int, int]:
    """One pass over both tables; returns (outbox rows, consumed_events rows) deleted."""
    totals = [0, 0]
    jobs = (
        (0, store.delete_published_outbox, settings.published_retention_s),
        (1, store.delete_consumed_events, settings.consumed_retention_s),
    )
    for index, delete, window in jobs:
        if window <= 0:
            continue
        for _ in range(max_batches):
            if stopping is not None and stopping.is_set():
                break
            deleted = await delete(window, settings.retention_batch_size)
            totals[index] += deleted
            if deleted < settings.retention_batch_size:
                break
            await asyncio.sleep(PAUSE_BETWEEN_BATCHES_S)
    return totals[0], totals[1]


async def run_retention(store: RelayStore, settings: RelaySettings, stopping: asyncio.Event) -> None:
    while not stopping.is_set():
        try:
            outbox, consumed = await purge_once(store, settings, stopping)
            if outbox or consumed:
                log.info("retention deleted %d published outbox rows and %d consumed_events rows",
                         outbox, consumed)
        except Unavailable as exc:
            log.warning("retention skipped: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), settings.retention_interval_s)
