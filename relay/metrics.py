"""The relay's Prometheus metrics, read from its live RelayMetrics and shard leases at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.db import connection_families
from shared.metrics import Metrics


class _RelayCollector(Collector):
    def __init__(self, metrics: Any, leases: Any) -> None:
        self._metrics = metrics
        self._leases = leases

    def collect(self) -> Iterator[Any]:
        m = self._metrics
        yield CounterMetricFamily("agentrt_relay_published", "Outbox events published (acked and marked)",
                                  value=m.published_total)
        yield CounterMetricFamily("agentrt_relay_parked", "Outbox rows parked (refused by the broker for good)",
                                  value=m.parked_total)
        yield CounterMetricFamily("agentrt_relay_producer_recreated", "Kafka producers re-created after errors",
                                  value=m.producer_recreated)
        yield CounterMetricFamily("agentrt_relay_publish_retries",
                                  "Outbox rows a round could not publish (sent again in a later round)",
                                  value=m.held_back_total)
        yield GaugeMetricFamily("agentrt_relay_broker_healthy", "1 while publishing succeeds",
                                value=1 if m.broker_healthy else 0)
        yield GaugeMetricFamily("agentrt_relay_database_healthy", "1 while a primary answers the relay's probe",
                                value=1 if m.database_healthy else 0)
        yield from connection_families()
        if m.lag is not None:
            yield GaugeMetricFamily("agentrt_relay_outbox_pending", "Events not yet published", value=m.lag.pending)
            yield GaugeMetricFamily("agentrt_relay_outbox_oldest_age_seconds", "Age of the oldest unpublished event",
                                    value=m.lag.oldest_age_s)
        if self._leases is not None:
            yield GaugeMetricFamily("agentrt_relay_shards_held", "Outbox shards this relay holds",
                                    value=self._leases.held_count)


def relay_metrics(metrics: Any, leases: Any) -> Metrics:
    exported = Metrics("relay")
    exported.registry.register(_RelayCollector(metrics, leases))
    return exported
