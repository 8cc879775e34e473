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
import contextlib
import logging
import uuid

from scheduler.config import SchedulerSettings
from scheduler.store import Store
from shared.errors import Unavailable

log = logging.getLogger(__name__)

PAUSE_BETWEEN_BATCHES_S = 0.01
MAX_VERSIONS_PER_RUN = 256  # per statement: a run with a long backlog is pruned over several statements
_FIRST = uuid.UUID(int=0)


async def prune_once(store: Store, keep_last: int, batch_runs: int, stopping: asyncio.Event | None = None) -> int:
    """One sweep over every run; returns the checkpoints deleted."""
    after, deleted = _FIRST, 0
    while stopping is None or not stopping.is_set():
        last, runs, removed, behind = await store.prune_checkpoints(
            after=after, batch_runs=batch_runs, keep_last=keep_last, max_versions_per_run=MAX_VERSIONS_PER_RUN)
        deleted += removed
        if behind:
            continue  # the same batch again: some run has more superseded versions than one statement takes
        if last is None or runs < batch_runs:
            break
        after = last
        await asyncio.sleep(PAUSE_BETWEEN_BATCHES_S)
    return deleted


class CheckpointPruner:
    """The background task; does nothing when checkpoint_keep_last is 0. `stop()` is safe to call twice."""

    def __init__(self, store: Store, settings: SchedulerSettings) -> None:
        self.store = store
        self.settings = settings
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.settings.checkpoint_keep_last > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(), name="checkpoint-pruner")

    async def _run(self) -> None:
        s = self.settings
        while not self._stopping.is_set():
            try:
                deleted = await prune_once(self.store, s.checkpoint_keep_last, s.checkpoint_prune_batch_runs,
                                           self._stopping)
                if deleted:
                    log.info("checkpoint pruning deleted %d superseded checkpoints", deleted)
            except Unavailable as exc:
                log.warning("checkpoint pruning skipped: %s", exc)
            except Exception:
                log.exception("checkpoint pruning failed; retrying after the interval")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), s.checkpoint_prune_interval_s)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Lets the statement in flight finish (it is short), then ends; cancels after `grace_s`."""
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
