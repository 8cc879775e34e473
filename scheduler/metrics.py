"""The scheduler's Prometheus metrics: per-RPC counts and latency, and database gauges.

Gauges (runs by status, queue and in-doubt ages, outbox lag, commit-unknown
freezes) come from one read-only query every `refresh_s`, not per scrape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from scheduler.rows import GlobalStats
from shared.metrics import Metrics

log = logging.getLogger(__name__)
STATUSES = ("QUEUED", "RUNNING", "WAITING_TOOL", "PAUSED_INDOUBT", "PAUSED_HUMAN", "COMPLETED", "FAILED")


class SchedulerMetrics:
    def __init__(self) -> None:
        self.metrics = Metrics("scheduler")
        m = self.metrics
        self.rpcs = m.counter("agentrt_rpc_total", "RPCs answered, by method and gRPC code", ("method", "code"))
        self.rpc_seconds = m.histogram("agentrt_rpc_seconds", "RPC handling time", ("method",))
        self.runs = m.gauge("agentrt_runs", "Runs by status (all tenants)", ("status",))
        self.oldest_queued = m.gauge("agentrt_oldest_queued_age_seconds", "Age of the oldest due QUEUED run")
        self.oldest_in_doubt = m.gauge("agentrt_in_doubt_age_seconds", "Age of the oldest PAUSED_INDOUBT run")
        self.outbox_pending = m.gauge("agentrt_outbox_pending", "Outbox events not yet published")
        self.outbox_age = m.gauge("agentrt_outbox_oldest_pending_age_seconds", "Age of the oldest unpublished event")
        self.commit_unknown = m.gauge("agentrt_commit_unknown_inconsistent", "Runs frozen by commit-unknown recovery")
        self._task: asyncio.Task[None] | None = None

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        self.rpcs.labels(method, code).inc()
        self.rpc_seconds.labels(method).observe(seconds)

    def apply(self, row: GlobalStats) -> None:
        by_status = row.by_status
        for status in STATUSES:
            self.runs.labels(status).set(by_status.get(status, 0))
        self.oldest_queued.set(float(row.oldest_queued_s or 0))
        self.oldest_in_doubt.set(float(row.oldest_in_doubt_s or 0))
        self.outbox_pending.set(row.outbox_pending)
        self.outbox_age.set(float(row.outbox_oldest_s or 0))
        self.commit_unknown.set(row.commit_unknown_inconsistent)

    def start(self, addr: str, store: Any, refresh_s: float = 10.0) -> int | None:
        port = self.metrics.serve(addr)
        self._task = asyncio.create_task(self._refresh(store, refresh_s), name="metrics-refresh")
        return port

    async def _refresh(self, store: Any, refresh_s: float) -> None:
        while True:
            try:
                self.apply(await store.global_stats())
            except Exception as exc:  # metrics must never take the scheduler down
                log.warning("metrics refresh failed: %s", exc)
            await asyncio.sleep(refresh_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.metrics.stop()
