"""Retention: deletes old published outbox rows and old consumed_events, in small batches.

Outbox: rows published before `now - published_retention_s` go. No index on
published_at (it would cost every mark an index entry): ids grow with
created_at, so a bisection through the primary key finds the first row created
after the cutoff, and the deletes then walk [oldest id, that bound) in ranges of
`retention_batch_size` ids, jumping over gaps. A row created after the cutoff
cannot have been published before it, so nothing deletable lies beyond the bound.

consumed_events: oldest first by consumed_at, in batches.

Each batch is one short statement with SKIP LOCKED (see relay/sql/queries.sql),
so retention never holds a long lock and several relays may run it at once.
A zero window turns that table's retention off.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging

from relay.config import RelaySettings
from relay.store import RelayStore
from shared.errors import Unavailable

log = logging.getLogger(__name__)

PAUSE_BETWEEN_BATCHES_S = 0.01


async def _first_id_created_at_or_after(store: RelayStore, first: int, last: int, cutoff: dt.datetime) -> int:
    """Smallest id whose row was created at or after `cutoff` (last + 1 if none), by bisection."""
    lo, hi = first, last + 1
    while lo < hi:
        mid = (lo + hi) // 2
        row = await store.outbox_first_row_from(mid)
        if row is None:
            hi = mid
            continue
        row_id, created_at = row
        if created_at >= cutoff:
            hi = mid  # no row in [mid, row_id), and row_id on are all newer
        else:
            lo = row_id + 1
    return lo


async def purge_outbox(store: RelayStore, settings: RelaySettings, stopping: asyncio.Event | None = None) -> int:
    cutoff = await store.retention_cutoff(settings.published_retention_s)
    first = await store.outbox_first_row_from(0)
    last = await store.outbox_last_id()
    if first is None or last is None:
        return 0
    bound = await _first_id_created_at_or_after(store, first[0], last, cutoff)
    deleted = 0
    start: int | None = first[0]
    while start is not None and start < bound:
        if stopping is not None and stopping.is_set():
            break
        end = min(start + settings.retention_batch_size, bound)
        deleted += await store.delete_published_outbox(start, end, cutoff)
        following = await store.outbox_first_row_from(end)
        start = following[0] if following is not None else None
        await asyncio.sleep(PAUSE_BETWEEN_BATCHES_S)
    return deleted


async def purge_consumed_events(store: RelayStore, settings: RelaySettings,
                                stopping: asyncio.Event | None = None, max_batches: int = 1_000) -> int:
    deleted = 0
    for _ in range(max_batches):
        if stopping is not None and stopping.is_set():
            break
        batch = await store.delete_consumed_events(settings.consumed_retention_s, settings.retention_batch_size)
        deleted += batch
        if batch < settings.retention_batch_size:
            break
        await asyncio.sleep(PAUSE_BETWEEN_BATCHES_S)
    return deleted


async def purge_once(store: RelayStore, settings: RelaySettings,
                     stopping: asyncio.Event | None = None) -> tuple[int, int]:
    """One pass over both tables; returns (outbox rows, consumed_events rows) deleted."""
    outbox = await purge_outbox(store, settings, stopping) if settings.published_retention_s > 0 else 0
    consumed = await purge_consumed_events(store, settings, stopping) if settings.consumed_retention_s > 0 else 0
    return outbox, consumed


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
