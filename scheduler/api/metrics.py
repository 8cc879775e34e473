"""The scheduler's Prometheus metrics: per-RPC counts and latency, refused fenced writes, in-doubt
marks, the connection pool, and database gauges.

Gauges (runs by status, queue and in-doubt ages, outbox lag, commit-unknown
freezes, database size and connections) come from one read-only query every
`refresh_s`, not per scrape; the pool is read at scrape time (no I/O).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from scheduler.background.db_health import DbHealthCollector, refresh_db_health
from scheduler.states import RunStatus
from scheduler.store.rows import GlobalStats
from shared.db import connection_families
from shared.metrics import Metrics, trace_exemplar

log = logging.getLogger(__name__)
STATUSES = tuple(status.value for status in RunStatus)
OTHER_TENANTS = "_other"  # the claim-wait label of tenants past the labelled ones


class SchedulerMetrics:
    def __init__(self, tenant_labels: int = 20) -> None:
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
        # LEASE_LOST here is a stale fence refused: a write from a holder whose lease was taken over.
        self.refusals = m.counter("agentrt_work_refusals_total", "WorkService calls and WriteBatch items refused, "
                                  "by method and error reason", ("method", "reason"))
        self.in_doubt_marks = m.counter("agentrt_tool_in_doubt_marks_total",
                                        "Tool calls marked IN_DOUBT (unknown outcome; the run pauses)")
        # A sealed value that does not open under its run's (or schedule's) key: copied or altered at rest.
        self.sealed_value_failures = m.counter("agentrt_sealed_value_failures_total",
                                               "Sealed values that failed their integrity check when opened, "
                                               "by field", ("field",))
        self.database_bytes = m.gauge("agentrt_db_size_bytes", "Size of the scheduler's database")
        self.client_connections = m.gauge("agentrt_db_client_connections", "Client connections to the server")
        self.max_connections = m.gauge("agentrt_db_max_connections", "The server's max_connections")
        self.waiting_on_limit = m.gauge("agentrt_runs_waiting_on_limit",
                                        "QUEUED runs a claim found blocked by a full concurrency limit, by limit",
                                        ("limit",))
        self.retention_deleted = m.counter("agentrt_retention_deleted_rows_total",
                                           "Rows deleted by the retention of terminal runs, by table",
                                           ("table",))
        # Per tenant: the first claim_wait_tenant_labels tenants this process claims for get their own
        # label, later ones share OTHER_TENANTS, so the label's values stay bounded.
        self.claim_wait = m.histogram("agentrt_claim_wait_seconds",
                                      "How long a QUEUED run waited, from when it was last due to its claim, "
                                      "by tenant", ("tenant",),
                                      buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800))
        self.tenant_labels = tenant_labels
        self._labelled: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self.db_health = DbHealthCollector()
        self.metrics.registry.register(self.db_health)
        self._health_task: asyncio.Task[None] | None = None

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        """Called inside the call's span: a sampled trace becomes the observation's exemplar
        (OpenMetrics exposition), so a slow SaveCheckpoint or ClaimWork leads to its trace."""
        self.rpcs.labels(method, code).inc()
        self.rpc_seconds.labels(method).observe(seconds, trace_exemplar())

    def claimed(self, tenant: str, wait_s: float) -> None:
        """One run taken from the queue after waiting `wait_s` (database time) since it was due."""
        if tenant not in self._labelled and len(self._labelled) < self.tenant_labels:
            self._labelled.add(tenant)
        self.claim_wait.labels(tenant if tenant in self._labelled else OTHER_TENANTS).observe(max(wait_s, 0.0))

    def retention_batch(self, deleted: dict[str, int]) -> None:
        for table, rows in deleted.items():
            self.retention_deleted.labels(table).inc(rows)

    def sealed_value_failed(self, field: str) -> None:
        # The field's name without list indexes: the label's values stay bounded.
        self.sealed_value_failures.labels(re.sub(r"\[\d+\]", "", field)).inc()

    def refused(self, method: str, reason: str) -> None:
        self.refusals.labels(method, reason).inc()

    def apply(self, row: GlobalStats) -> None:
        by_status = row.by_status
        for status in STATUSES:
            self.runs.labels(status).set(by_status.get(status, 0))
        self.oldest_queued.set(float(row.oldest_queued_s or 0))
        self.oldest_in_doubt.set(float(row.oldest_in_doubt_s or 0))
        self.outbox_pending.set(row.outbox_pending)
        self.outbox_age.set(float(row.outbox_oldest_s or 0))
        self.commit_unknown.set(row.commit_unknown_inconsistent)
        self.database_bytes.set(row.database_bytes)
        self.client_connections.set(row.client_connections)
        self.max_connections.set(row.max_connections)
        for limit in ("tenant", "agent", "key"):
            self.waiting_on_limit.labels(limit).set(row.waiting_on_limit.get(limit, 0))

    def start(self, addr: str, store: Any, refresh_s: float = 10.0, settings: Any = None) -> int | None:
        """`settings`: the scheduler's, for the database health figures (db_health_interval_s; 0 = off)."""
        self.metrics.registry.register(_PoolCollector(store.pool))
        port = self.metrics.serve(addr)
        if settings is not None:
            self.metrics.start_export(settings)
        self._task = asyncio.create_task(self._refresh(store, refresh_s), name="metrics-refresh")
        if settings is not None and settings.db_health_interval_s > 0:
            self._health_task = asyncio.create_task(refresh_db_health(self.db_health, store, settings),
                                                    name="db-health-refresh")
        return port

    async def _refresh(self, store: Any, refresh_s: float) -> None:
        while True:
            try:
                self.apply(await store.runs.global_stats())
            except Exception as exc:  # metrics must never take the scheduler down
                log.warning("metrics refresh failed: %s", exc)
            await asyncio.sleep(refresh_s)

    async def stop(self) -> None:
        for task in (self._task, self._health_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.metrics.stop()


class _PoolCollector(Collector):
    """The scheduler's asyncpg pool: connections open, in use, and the pool's ceiling."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def collect(self) -> Iterator[Any]:
        size, idle = self._pool.get_size(), self._pool.get_idle_size()
        connections = GaugeMetricFamily("agentrt_db_pool_connections", "Pool connections, by state",
                                        labels=("state",))
        connections.add_metric(("in_use",), size - idle)
        connections.add_metric(("idle",), idle)
        yield connections
        yield GaugeMetricFamily("agentrt_db_pool_max_connections", "The pool's max_size",
                                value=self._pool.get_max_size())
        yield from connection_families()
