"""Database health metrics for operators: table bloat, freeze age, vacuum, WAL and slow statements.

Read by the scheduler every `db_health_interval_s` in read-only transactions
(scheduler/sql/queries.sql `db_health_*`), never per scrape; a scrape reads the
last refresh. Slow statements come from pg_stat_statements where it is
installed in the database and loaded (`shared_preload_libraries`); elsewhere
`agentrt_db_pg_stat_statements_available` is 0 and no statement figures exist.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from scheduler.store.rows import DbHealth

log = logging.getLogger(__name__)


class DbHealthCollector(Collector):
    """The last refresh as metric families (label sets come and go with the tables and statements)."""

    def __init__(self) -> None:
        self.health: DbHealth | None = None
        self.wal_bytes_per_s: float | None = None
        self.refresh_failures = 0
        self._problem_logged = ""

    def update(self, health: DbHealth) -> None:
        before = self.health
        if (before is not None and before.wal_bytes is not None and health.wal_bytes is not None
                and health.db_clock_s > before.db_clock_s):
            self.wal_bytes_per_s = (health.wal_bytes - before.wal_bytes) / (health.db_clock_s - before.db_clock_s)
        self.health = health
        if health.statements_problem and health.statements_problem != self._problem_logged:
            log.info("slow statement metrics off: %s", health.statements_problem)
        self._problem_logged = health.statements_problem

    def collect(self) -> Iterator[Any]:
        yield CounterMetricFamily("agentrt_db_health_refresh_failures", "Database health reads that failed",
                                  value=self.refresh_failures)
        health = self.health
        if health is None:
            return
        yield from _tables(health)
        yield GaugeMetricFamily("agentrt_db_xid_age", "Age of the database's datfrozenxid, in transactions "
                                "(wraparound at about 2 billion; autovacuum freezes from 200 million)",
                                value=health.xid_age)
        if health.wal_bytes is not None:
            yield CounterMetricFamily("agentrt_db_wal_bytes", "WAL written, as the server's WAL position "
                                      "(pg_current_wal_lsn); its rate is the WAL rate", value=health.wal_bytes)
        if self.wal_bytes_per_s is not None:
            yield GaugeMetricFamily("agentrt_db_wal_bytes_per_second",
                                    "WAL rate between the last two refreshes (database clock)",
                                    value=self.wal_bytes_per_s)
        yield from _statements(health)


def _tables(health: DbHealth) -> Iterator[Any]:
    def family(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=("table",))

    live = family("agentrt_db_table_live_tuples", "Live tuples (pg_stat_user_tables estimate)")
    dead = family("agentrt_db_table_dead_tuples", "Dead tuples not yet vacuumed: the bloat estimate")
    heap = family("agentrt_db_table_size_bytes", "Table size (heap, TOAST and maps)")
    index = family("agentrt_db_table_index_size_bytes", "Size of the table's indexes")
    xid = family("agentrt_db_table_xid_age", "Age of the table's relfrozenxid, in transactions")
    vacuum = family("agentrt_db_table_last_vacuum_age_seconds",
                    "Seconds since the table's last vacuum or autovacuum (absent: none since the stats reset)")
    autovacuums = CounterMetricFamily("agentrt_db_table_autovacuums", "Autovacuum runs on the table "
                                      "since the statistics were reset", labels=("table",))
    for t in health.tables:
        labels = (t.table_name,)
        live.add_metric(labels, t.live_tuples)
        dead.add_metric(labels, t.dead_tuples)
        heap.add_metric(labels, t.table_bytes)
        index.add_metric(labels, t.index_bytes)
        xid.add_metric(labels, t.xid_age)
        if t.vacuum_age_s is not None:
            vacuum.add_metric(labels, t.vacuum_age_s)
        autovacuums.add_metric(labels, t.autovacuum_count)
    yield from (live, dead, heap, index, xid, vacuum, autovacuums)


def _statements(health: DbHealth) -> Iterator[Any]:
    available = health.slow_count is not None
    yield GaugeMetricFamily("agentrt_db_pg_stat_statements_available",
                            "1 when pg_stat_statements is installed and loaded (slow statement figures exist)",
                            value=1 if available else 0)
    if not available:
        return
    yield GaugeMetricFamily("agentrt_db_slow_statements", "Statements of this database whose mean time is "
                            "db_slow_statement_ms or more (pg_stat_statements)", value=health.slow_count)
    mean = GaugeMetricFamily("agentrt_db_statement_mean_seconds", "Mean time of the slowest statements "
                             "(pg_stat_statements; normalised text, cut)", labels=("queryid", "query"))
    calls = CounterMetricFamily("agentrt_db_statement_calls", "Calls of the slowest statements",
                                labels=("queryid", "query"))
    for statement in health.slowest:
        labels = (str(statement["queryid"]), str(statement["query"]))
        mean.add_metric(labels, float(statement["mean_s"]))
        calls.add_metric(labels, float(statement["calls"]))
    yield mean
    yield calls


async def refresh_db_health(collector: DbHealthCollector, store: Any, settings: Any) -> None:
    """Reads the figures every db_health_interval_s until cancelled; a failed read is counted, never raised."""
    while True:
        try:
            collector.update(await store.runs.db_health(slow_ms=settings.db_slow_statement_ms,
                                                        top=settings.db_slow_statement_top))
        except Exception as exc:  # metrics must never take the scheduler down
            collector.refresh_failures += 1
            log.warning("database health refresh failed: %s", exc)
        await asyncio.sleep(settings.db_health_interval_s)
