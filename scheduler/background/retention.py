"""Retention of terminal runs: deletes expired runs with their checkpoints, ledger, journal and
published outbox rows, in small batches, in the background (docs/retention.md).

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
position (see scheduler/store/database_roles.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import uuid
from typing import Any

from scheduler.background.periodic import PeriodicTask
from scheduler.config import SchedulerSettings
from scheduler.store import Store

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
        batch = await store.runs.retention_purge(max_runs=batch_runs, dry_run=dry_run, after_finished=after_finished,
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


class RunRetention(PeriodicTask):
    """The background task (run_retention_enabled)."""

    what = "retention"

    def __init__(self, store: Store, settings: SchedulerSettings, observe: Any = None) -> None:
        super().__init__("run-retention", settings.run_retention_interval_s, settings.run_retention_enabled)
        self.store = store
        self.settings = settings
        self.observe = observe

    async def run_once(self) -> None:
        s = self.settings
        counts = await sweep(self.store, batch_runs=s.run_retention_batch_runs, pause_s=s.run_retention_pause_ms / 1000,
                             stopping=self.stopping, observe=self.observe)
        if counts.deleted:
            log.info("retention deleted %s", counts.as_dict())
