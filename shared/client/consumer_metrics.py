"""Prometheus metrics of an EventConsumer, read from its ConsumerStats at scrape time.

The consumer runs in the application's process, so it serves no endpoint of its
own: register the collector with the application's registry,
`registry.register(ConsumerCollector(consumer))` (prometheus_client.REGISTRY by default).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

# (metric suffix, ConsumerStats field, help)
_COUNTS = (
    ("applied", "applied", "Events whose handler committed"),
    ("dedupe_conflicts", "duplicates", "Redelivered events skipped: their dedupe row was already there"),
    ("dead_lettered", "dead_lettered", "Events sent to the dead-letter topic"),
    ("handler_failures", "handler_failures", "Handler attempts that raised (each is retried or dead-lettered)"),
    ("commit_failures", "commit_failures", "Kafka offset commits that failed (redelivery is deduped)"),
)


class ConsumerCollector(Collector):
    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer

    def collect(self) -> Iterator[Any]:
        stats = self._consumer.stats
        name = self._consumer.settings.dedupe_name
        for suffix, attribute, doc in _COUNTS:
            family = CounterMetricFamily(f"agentrt_consumer_{suffix}", doc, labels=("consumer",))
            family.add_metric((name,), getattr(stats, attribute))
            yield family
