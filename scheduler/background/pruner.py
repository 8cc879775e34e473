"""Checkpoint pruning: deletes superseded checkpoint versions in the background.

With `checkpoint_keep_last` = K > 0, each run keeps its latest K checkpoint
versions; older ones go. The pruner sweeps agent_runs in primary-key order, a
batch of `checkpoint_prune_batch_runs` runs per statement (one short statement
each, skipping runs whose row a write holds: see `prune_checkpoints` in
sql/queries.sql), then waits `checkpoint_prune_interval_s` before the next
sweep. No index is needed (none on agent_runs.version: it would end HOT
updates), and several scheduler replicas may prune at once.

Commit-unknown recovery keeps working: the statement that deletes records the
run's pruned horizon, and a checkpoint missing at or below it reads as pruned,
not as half a commit (Store._pruned_checkpoint).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from scheduler.background.periodic import PeriodicTask
from scheduler.config import SchedulerSettings
from scheduler.store import Store

log = logging.getLogger(__name__)

PAUSE_BETWEEN_BATCHES_S = 0.01
MAX_VERSIONS_PER_RUN = 256  # per statement: a run with a long backlog is pruned over several statements
_FIRST = uuid.UUID(int=0)


async def prune_once(store: Store, keep_last: int, batch_runs: int, stopping: asyncio.Event | None = None) -> int:
    """One sweep over every run; returns the checkpoints deleted."""
    after, deleted = _FIRST, 0
    while stopping is None or not stopping.is_set():
        last, runs, removed, behind = await store.runs.prune_checkpoints(
            after=after, batch_runs=batch_runs, keep_last=keep_last, max_versions_per_run=MAX_VERSIONS_PER_RUN)
        deleted += removed
        if behind:
            continue  # the same batch again: some run has more superseded versions than one statement takes
        if last is None or runs < batch_runs:
            break
        after = last
        await asyncio.sleep(PAUSE_BETWEEN_BATCHES_S)
    return deleted


class CheckpointPruner(PeriodicTask):
    """The background task; does nothing when checkpoint_keep_last is 0."""

    what = "checkpoint pruning"

    def __init__(self, store: Store, settings: SchedulerSettings) -> None:
        super().__init__("checkpoint-pruner", settings.checkpoint_prune_interval_s, settings.checkpoint_keep_last > 0)
        self.store = store
        self.settings = settings

    async def run_once(self) -> None:
        s = self.settings
        deleted = await prune_once(self.store, s.checkpoint_keep_last, s.checkpoint_prune_batch_runs, self.stopping)
        if deleted:
            log.info("checkpoint pruning deleted %d superseded checkpoints", deleted)
