"""What a decider proposes. Deciders only propose; the executor validates and persists before acting."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from executor.agents import AgentDefinition
from executor.checkpoint import State


@dataclass(frozen=True)
class ToolCall:
    tool: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Finish:
    result: Any = None


@dataclass(frozen=True)
class Fail:
    reason: str


@dataclass(frozen=True)
class Sleep:
    ms: int


@dataclass(frozen=True)
class WaitForInput:
    prompt: str


InvalidKind = Literal["parse_failure", "refusal", "content_filter", "invalid_arguments", "unknown_tool",
                      "empty", "agent_state_too_large"]


@dataclass(frozen=True)
class Invalid:
    """The decider's output could not be used. Recorded in the checkpoint; never guessed around."""

    kind: InvalidKind
    detail: str


class DeciderUnavailable(Exception):
    """The model endpoint could not answer (connection, timeout, 429, 5xx): retry the run later."""


Decision = ToolCall | Finish | Fail | Sleep | WaitForInput | Invalid


@dataclass(frozen=True)
class Proposal:
    decision: Decision
    # Workflow node id plus logical iteration (e.g. `return_label.create`, `poll@2`).
    node: str
    raw: Any = None
    tokens: int = 0
    cost_usd: float = 0.0
    model: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # The decider's own small state, kept in the checkpoint (at most MAX_AGENT_STATE_BYTES of JSON);
    # None leaves it as it was. Persisted with the decision, so it is never ahead of the run.
    agent_state: dict[str, Any] | None = None


@dataclass(frozen=True)
class DecisionContext:
    """What a decider sees: the run's input and its state, whose history (tool steps, sleeps, inputs,
    approvals, exceptions), tool results (each node's latest and the last 64) and operator inputs are
    rebuilt from the run's journal; `state.agent_state` is the decider's own small state."""

    agent: AgentDefinition
    run_id: str
    tenant_id: str
    input: dict[str, Any]
    state: State


class Decider(Protocol):
    # Pure deciders are deterministic and instant (no I/O): the executor may
    # decide the next step before Tx2 and persist it in the same checkpoint.
    pure: bool

    async def decide(self, ctx: DecisionContext) -> Proposal: ...

    async def close(self) -> None: ...
