"""Deciders by kind: `scripted` (a deterministic plan), `openai` (Chat Completions or the Responses API,
any OpenAI-compatible endpoint) and `anthropic` (the Messages API) on the providers' SDKs, and `python`
(your own function, executor/sdk.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from executor.agents import (
    AgentDefinition,
    AnthropicDecider,
    DefinitionError,
    ModelDeciderBase,
    OpenAIDecider,
    PythonDecider,
    ScriptedDecider,
)
from executor.config import ModelPrice
from executor.deciders.base import Decider


def api_key(agent: AgentDefinition, config: ModelDeciderBase, default: str | None) -> str | None:
    """The decider's key: its api_key_file's first line, else its api_key_env, else the executor's setting."""
    if config.api_key_file:
        try:
            lines = Path(config.api_key_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise DefinitionError(agent.source, "decider.api_key_file", f"cannot read: {exc.strerror}") from None
        if not lines or not lines[0].strip():
            raise DefinitionError(agent.source, "decider.api_key_file", "the file is empty")
        return lines[0].strip()
    if config.api_key_env:
        return os.environ.get(config.api_key_env) or default
    return default


class DeciderRegistry:
    """One decider per (agent, version); built at start so a bad definition stops the executor early."""

    def __init__(self, agents: list[AgentDefinition], session: aiohttp.ClientSession,
                 default_api_key: str | None = None, tracer: Any = None, *,
                 anthropic_api_key: str | None = None, prices: Mapping[str, ModelPrice] | None = None) -> None:
        """`default_api_key` / `anthropic_api_key`: the executor's keys for definitions that name none;
        `tracer`: the executor's, for the model deciders' GenAI spans (None: the process's)."""
        from executor.deciders.python import PythonDeciderImpl
        from executor.deciders.scripted import ScriptedDeciderImpl

        table = dict(prices or {})
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
                try:
                    # The providers' SDKs are imported by the first agent that uses one: they are
                    # most of an executor's memory (thousands of modules), and an executor of
                    # scripted or Python deciders never needs them.
                    if isinstance(agent.decider, AnthropicDecider):
                        from executor.deciders.anthropic import AnthropicDeciderImpl

                        decider = AnthropicDeciderImpl(
                            agent, agent.decider, api_key(agent, agent.decider, anthropic_api_key), table, tracer)
                    else:
                        assert isinstance(agent.decider, OpenAIDecider)
                        from executor.deciders.openai import OpenAIDeciderImpl

                        decider = OpenAIDeciderImpl(
                            agent, agent.decider, api_key(agent, agent.decider, default_api_key), table, tracer)
                except ValueError as exc:
                    raise DefinitionError(agent.source, "tools", str(exc)) from None
            self._deciders[(agent.name, agent.version)] = decider

    def get(self, agent: AgentDefinition) -> Decider:
        return self._deciders[(agent.name, agent.version)]

    async def close(self) -> None:
        for decider in self._deciders.values():
            await decider.close()
