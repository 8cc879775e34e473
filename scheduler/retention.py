"""Retention of terminal runs: deletes expired runs with their checkpoints, ledger, journal and
published outbox rows, in small batches, in the background (README, Security).

What has expired is decided in the database by agentrt_retention_purge
(migration 0012): the run is terminal, finished longer ago than its tenant's
policy (or the default, tenant '*') by the database clock, carries no
`legal_hold` label and has no unpublished outbox row. Each batch is one short
transaction over at most `run_retention_batch_runs` runs, skipping rows
another transaction holds (SKIP LOCKED); a pause of `run_retention_pause_ms`
follows each, so claims and submits never queue behind retention. A sweep
walks the terminal runs in (finished_at, id) order from the start, so runs
skipped this time are looked at again by the next sweep; several scheduler
replicas may sweep at once.

The scheduler role cannot DELETE ledger rows; it can call that function, which
runs with its owner's rights but takes from the caller only a batch size and a
position (see scheduler/db_roles.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import uuid
from typing import Any

from scheduler.config import SchedulerSettings
from scheduler.store import Store
from shared.errors import Unavailable

log = logging.getLogger(__name__)
TABLES = ("runs", "checkpoints", "ledger", "journal", "outbox", "signals")


@dataclasses.dataclass
class RetentionCounts:
    """Rows deleted by one sweep (or, dry, that would be), by table."""

    runs: int = 0
    checkpoints: int = 0
    ledger: int = 0
    journal: int = 0
    outbox: int = 0
    signals: int = 0
    batches: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @property
    def deleted(self) -> int:
        return sum(getattr(self, table) for table in TABLES)


async def sweep(store: Store, *, batch_runs: int, pause_s: float = 0.0, dry_run: bool = False,
                stopping: asyncio.Event | None = None, observe: Any = None) -> RetentionCounts:
    """One pass over every terminal run old enough to be considered."""
    counts = RetentionCounts()
    after_finished: dt.datetime | None = None
    after_id: uuid.UUID | None = None
    while stopping is None or not stopping.is_set():
        batch = await store.retention_purge(max_runs=batch_runs, dry_run=dry_run, after_finished=after_finished,
                                            after_id=after_id)
        counts.batches += 1
        for table in TABLES:
            setattr(counts, table, getattr(counts, table) + getattr(batch, table))
        if observe is not None and not dry_run:
            observe({table: getattr(batch, table) for table in TABLES})
        if batch.scanned < batch_runs:
            break
        after_finished, after_id = batch.last_finished, batch.last_id
        if pause_s:
            await asyncio.sleep(pause_s)
    return counts


class RunRetention:
    """The background task; `stop()` is safe to call twice."""

    def __init__(self, store: Store, settings: SchedulerSettings, observe: Any = None) -> None:
        self.store = store
        self.settings = settings
        self.observe = observe
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.settings.run_retention_enabled and self._task is None:
            self._task = asyncio.create_task(self._run(), name="run-retention")

    async def _run(self) -> None:
        s = self.settings
        while not self._stopping.is_set():
            try:
                counts = await sweep(self.store, batch_runs=s.run_retention_batch_runs,
                                     pause_s=s.run_retention_pause_ms / 1000, stopping=self._stopping,
                                     observe=self.observe)
                if counts.deleted:
                    log.info("retention deleted %s", counts.as_dict())
            except Unavailable as exc:
                log.warning("retention skipped: %s", exc)
            except Exception:
                log.exception("retention failed; retrying after the interval")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), s.run_retention_interval_s)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Lets the batch in flight finish (it is short), then ends; cancels after `grace_s`."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), grace_s)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
