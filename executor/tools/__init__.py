"""Tool adapters by kind: `http`, `python` and `mcp`."""

from __future__ import annotations

from typing import Any

import aiohttp

from executor.agents import AgentDefinition, DefinitionError, HttpTool, McpTool
from executor.tools.base import LookupOutcome, ToolAdapter, ToolCallContext, ToolOutcome
from executor.tools.http import HttpToolAdapter
from executor.tools.mcp import McpToolAdapter
from executor.tools.python import CallableImportError, PythonToolAdapter


class ToolRegistry:
    """One adapter per (agent, version, tool); http adapters share one client session."""

    def __init__(self, agents: list[AgentDefinition], session: aiohttp.ClientSession, tracer: Any = None) -> None:
        """`tracer`: the executor's, for the http adapters' CLIENT spans (None: the process's)."""
        self.session = session
        self._adapters: dict[tuple[str, str, str], ToolAdapter] = {}
        for agent in agents:
            for index, tool in enumerate(agent.tools):
                adapter: ToolAdapter
                if isinstance(tool, HttpTool):
                    adapter = HttpToolAdapter(tool, session, tracer)
                elif isinstance(tool, McpTool):  # listed from its server at start (executor.tools.mcp)
                    adapter = McpToolAdapter(tool)
                else:
                    try:
                        adapter = PythonToolAdapter(tool)
                    except CallableImportError as exc:
                        raise DefinitionError(agent.source, f"tools.{index}.{exc.field}", str(exc)) from None
                self._adapters[(agent.name, agent.version, tool.name)] = adapter

    def get(self, agent: AgentDefinition, tool_name: str) -> ToolAdapter | None:
        return self._adapters.get((agent.name, agent.version, tool_name))

    async def close(self) -> None:
        for adapter in self._adapters.values():
            await adapter.close()


__all__ = ["LookupOutcome", "ToolAdapter", "ToolCallContext", "ToolOutcome", "ToolRegistry"]
