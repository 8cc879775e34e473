"""What the executor process lends every run it drives: catalogs, registries, the scheduler client and its switches."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import trace

from executor.agents import AgentCatalog
from executor.client import WorkClient
from executor.deciders import DeciderRegistry
from executor.faults import Faults
from executor.shutdown import Shutdown
from executor.tools import ToolRegistry


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
