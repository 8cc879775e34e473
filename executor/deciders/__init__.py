"""Deciders by kind: `scripted` (a deterministic plan), `openai` (chat completions with tools) and
`python` (your own function, executor/sdk.py)."""

from __future__ import annotations

from typing import Any

import aiohttp

from executor.agents import AgentDefinition, DefinitionError, OpenAIDecider, PythonDecider, ScriptedDecider
from executor.deciders.base import Decider


class DeciderRegistry:
    """One decider per (agent, version); built at start so a bad definition stops the executor early."""

    def __init__(self, agents: list[AgentDefinition], session: aiohttp.ClientSession,
                 default_api_key: str | None = None, tracer: Any = None) -> None:
        """`tracer`: the executor's, for the openai decider's GenAI spans (None: the process's)."""
        from executor.deciders.openai import OpenAIDeciderImpl
        from executor.deciders.python import PythonDeciderImpl
        from executor.deciders.scripted import ScriptedDeciderImpl

        self._deciders: dict[tuple[str, str], Decider] = {}
        for agent in agents:
            decider: Decider
            if isinstance(agent.decider, ScriptedDecider):
                decider = ScriptedDeciderImpl(agent.decider)
            elif isinstance(agent.decider, PythonDecider):
                try:
                    decider = PythonDeciderImpl(agent.decider)
                except (ImportError, AttributeError, ValueError) as exc:
                    raise DefinitionError(agent.source, "decider.callable",
                                          f"cannot import: {type(exc).__name__}: {exc}") from None
                except TypeError as exc:  # not callable, or not with one argument
                    raise DefinitionError(agent.source, "decider.callable", str(exc)) from None
            else:
                assert isinstance(agent.decider, OpenAIDecider)
                try:
                    decider = OpenAIDeciderImpl(agent, agent.decider, session, default_api_key, tracer)
                except ValueError as exc:
                    raise DefinitionError(agent.source, "tools", str(exc)) from None
            self._deciders[(agent.name, agent.version)] = decider

    def get(self, agent: AgentDefinition) -> Decider:
        return self._deciders[(agent.name, agent.version)]

    async def close(self) -> None:
        for decider in self._deciders.values():
            await decider.close()
