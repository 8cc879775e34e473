"""Every metric name the code exports, collected from the registries and collectors themselves.

The dashboards and alerts may name only these (tests/helm/test_alerts.py). Collectors read
live objects at scrape time, so they are given stand-ins holding a count of every kind.
"""

from __future__ import annotations

import collections
import re
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from executor.metrics import _WorkerCollector
from executor.reconciler import SweepReport
from executor.services import RunCounts
from relay.loop import RelayMetrics
from relay.metrics import _RelayCollector
from relay.store import Lag
from scheduler.api.metrics import SchedulerMetrics, _PoolCollector
from scheduler.background.db_health import DbHealthCollector
from scheduler.store.rows import DbHealth, DbTableHealth
from shared.client.consumer import ConsumerStats
from shared.client.consumer_metrics import ConsumerCollector
from shared.otlp_metrics import MetricExportStats

METRIC_NAME = re.compile(r"\bagentrt_[a-zA-Z0-9_:]*")
_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created")}


def _stand_ins() -> list[Any]:
    pool = SimpleNamespace(get_size=lambda: 3, get_idle_size=lambda: 1, get_max_size=lambda: 20)
    worker = SimpleNamespace(
        claimed=1, leases_lost=1, run_errors=1, active={}, settings=SimpleNamespace(slots=4),
        renewal_failures=collections.Counter({"LEASE_LOST": 1}), reconciler=SimpleNamespace(totals=SweepReport()),
        services=SimpleNamespace(counts=RunCounts(),
                                 client=SimpleNamespace(batcher=SimpleNamespace(batches=1, items=2))))
    relay = RelayMetrics(lag=Lag(pending=1, oldest_age_s=1.0, parked=0, parked_total=0))
    consumer = SimpleNamespace(stats=ConsumerStats(), settings=SimpleNamespace(dedupe_name="orders"))
    db_health = DbHealthCollector()
    table = DbTableHealth("agent_runs", 1, 1, 8192, 8192, 1, 1.0, 1)
    for clock in (1.0, 2.0):  # two reads: the WAL rate exists
        db_health.update(DbHealth(xid_age=1, wal_bytes=int(clock * 100), db_clock_s=clock, tables=[table],
                                  slow_count=1, slowest=[{"queryid": "1", "query": "SELECT 1", "calls": 1,
                                                          "mean_s": 0.2}]))
    return [_PoolCollector(pool), _WorkerCollector(worker), _RelayCollector(relay, SimpleNamespace(held_count=1)),
            ConsumerCollector(consumer), db_health, MetricExportStats()]


def exported_metric_names() -> set[str]:
    """Sample names as Prometheus stores them (counters with _total, histograms with _bucket/_sum/_count)."""
    registries = [SchedulerMetrics().metrics.registry]
    for collector in _stand_ins():
        registry = CollectorRegistry()
        registry.register(collector)
        registries.append(registry)
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


def names_in(expr: str) -> set[str]:
    return set(METRIC_NAME.findall(expr))
