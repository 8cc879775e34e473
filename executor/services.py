"""What the executor process lends every run it drives: catalogs, registries, the scheduler client and its switches."""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry import trace

from executor.agents import AgentCatalog
from executor.client import WorkClient
from executor.deciders import DeciderRegistry
from executor.faults import Faults
from executor.shutdown import Shutdown
from executor.tools import ToolRegistry


@dataclass
class RunCounts:
    """What the runs of this process counted, for the metrics (executor/metrics.py reads them at scrape time)."""

    checkpoint_migration_failures: int = 0  # claimed checkpoints no registered migration could read
    budget_exhausted: int = 0  # runs ended FAILED because a budget ran out
    tool_calls_delayed: int = 0  # Tx1s the scheduler refused over a tool limit, waited out and sent again
    # Model usage the deciders reported, by (tenant, agent): [input tokens, output tokens, other tokens, USD].
    usage: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def used(self, tenant: str, agent: str, input_tokens: int, output_tokens: int, tokens: int,
             cost_usd: float) -> None:
        """One decision's usage; `tokens` beyond input + output (a decider that reports a total only) is "other"."""
        if not (tokens or input_tokens or output_tokens or cost_usd):
            return
        totals = self.usage.setdefault((tenant, agent), [0, 0, 0, 0.0])
        totals[0] += input_tokens
        totals[1] += output_tokens
        totals[2] += max(0, tokens - input_tokens - output_tokens)
        totals[3] += cost_usd


@dataclass
class Services:
    catalog: AgentCatalog
    deciders: DeciderRegistry
    tools: ToolRegistry
    client: WorkClient
    worker_id: str
    faults: Faults
    shutdown: Shutdown
    tracer: trace.Tracer
    counts: RunCounts = field(default_factory=RunCounts)
