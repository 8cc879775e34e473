"""The executor's Prometheus metrics, read from its Worker at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.metrics import Metrics


class _WorkerCollector(Collector):
    def __init__(self, worker: Any) -> None:
        self._worker = worker

    def collect(self) -> Iterator[Any]:
        w = self._worker
        yield CounterMetricFamily("agentrt_executor_claimed", "Leases claimed", value=w.claimed)
        yield CounterMetricFamily("agentrt_executor_leases_lost", "Leases lost or cancelled while working",
                                  value=w.leases_lost)
        yield CounterMetricFamily("agentrt_executor_run_errors", "Runs abandoned on an executor error",
                                  value=w.run_errors)
        yield GaugeMetricFamily("agentrt_executor_active_runs", "Runs this executor holds a lease on",
                                value=len(w.active))
        yield GaugeMetricFamily("agentrt_executor_slots", "Concurrent run slots", value=w.settings.slots)
        batcher = w.services.client.batcher if w.services is not None else None
        if batcher is not None:  # writes per WriteBatch call = batched_writes / write_batches
            yield CounterMetricFamily("agentrt_executor_write_batches", "WriteBatch calls sent",
                                      value=batcher.batches)
            yield CounterMetricFamily("agentrt_executor_batched_writes", "Scheduler writes sent in WriteBatch calls",
                                      value=batcher.items)


def executor_metrics(worker: Any) -> Metrics:
    exported = Metrics("executor")
    exported.registry.register(_WorkerCollector(worker))
    return exported
