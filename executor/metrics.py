"""The executor's Prometheus metrics, read from its Worker at scrape time.

Nothing here runs on a run's path: the worker, its runs and the in-process
reconciler keep plain counts, and a scrape reads them.
"""

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
        renewals = CounterMetricFamily("agentrt_executor_lease_renewal_failures",
                                       "Heartbeats refused or unanswered until the lease lapsed, by reason",
                                       labels=("reason",))
        for reason, count in sorted(w.renewal_failures.items()):
            renewals.add_metric((reason,), count)
        yield renewals
        counts = w.services.counts if w.services is not None else None
        if counts is not None:
            yield CounterMetricFamily("agentrt_executor_checkpoint_migration_failures",
                                      "Claimed checkpoints no registered migration could read (run paused)",
                                      value=counts.checkpoint_migration_failures)
            yield CounterMetricFamily("agentrt_executor_budget_exhausted", "Runs ended FAILED on an exhausted budget",
                                      value=counts.budget_exhausted)
            yield from _usage(counts.usage)
            yield CounterMetricFamily("agentrt_executor_tool_calls_delayed",
                                      "Tool calls the scheduler held back over a tool's rate or concurrency limit "
                                      "(waited out and sent again)", value=counts.tool_calls_delayed)
        if w.reconciler is not None:
            yield _reconciliations(w.reconciler.totals)
        batcher = w.services.client.batcher if w.services is not None else None
        if batcher is not None:  # writes per WriteBatch call = batched_writes / write_batches
            yield CounterMetricFamily("agentrt_executor_write_batches", "WriteBatch calls sent",
                                      value=batcher.batches)
            yield CounterMetricFamily("agentrt_executor_batched_writes", "Scheduler writes sent in WriteBatch calls",
                                      value=batcher.items)


def _usage(usage: dict[tuple[str, str], list[float]]) -> Iterator[CounterMetricFamily]:
    """Model tokens by type (input, output; other: a total the decider did not split) and cost, per tenant, agent."""
    tokens = CounterMetricFamily("agentrt_model_tokens", "Model tokens the deciders reported, by type",
                                 labels=("tenant", "agent", "type"))
    cost = CounterMetricFamily("agentrt_model_cost_usd", "Model cost the deciders reported, in US dollars",
                               labels=("tenant", "agent"))
    for (tenant, agent), (input_tokens, output_tokens, other, usd) in sorted(usage.items()):
        for kind, count in (("input", input_tokens), ("output", output_tokens), ("other", other)):
            tokens.add_metric((tenant, agent, kind), count)
        cost.add_metric((tenant, agent), usd)
    yield tokens
    yield cost


RECONCILE_OUTCOMES = ("succeeded", "not_executed", "undecided", "no_lookup", "errors")


def _reconciliations(totals: Any) -> CounterMetricFamily:
    """succeeded: the lookup found the result; not_executed: not found, safe to retry; undecided: the lookup
    could not tell (or not found without a retry contract); no_lookup: the tool has none; errors: the call failed."""
    family = CounterMetricFamily("agentrt_executor_reconciliations",
                                 "In-doubt tool rows the reconciler looked up, by outcome", labels=("outcome",))
    for outcome in RECONCILE_OUTCOMES:
        family.add_metric((outcome,), getattr(totals, outcome))
    return family


def executor_metrics(worker: Any) -> Metrics:
    exported = Metrics("executor")
    exported.registry.register(_WorkerCollector(worker))
    return exported
