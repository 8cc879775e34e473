"""What a decider may propose, and what it is given: decisions, proposals, the decision context.

Deciders only propose; the executor validates and persists a decision before
acting on it (docs/design.md §invariants, rule 6).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from executor.agents import AgentDefinition
from executor.checkpoint import State


@dataclass(frozen=True)
class ToolCall:
    tool: str
    args: dict[str, Any]
    node: str = ""  # the workflow node (default: the tool's name); the step index is appended to it


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


@dataclass(frozen=True)
class WaitForSignal:
    """Park the run until a signal named `name` arrives (RunService.SignalRun), or `timeout_ms` passes.

    The answer is recorded under the wait's step key in `state.inputs`:
    {"name", "payload", "seq", "timed_out"}.
    """

    name: str
    timeout_ms: int


@dataclass(frozen=True)
class Child:
    """One child run to spawn: a registered agent (optionally a version), its input, labels and budget
    ({"max_steps", "max_tokens", "max_cost_usd"}, each optional)."""

    agent: str
    input: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)
    version: str = ""


@dataclass(frozen=True)
class SpawnChildren:
    """Spawn child runs and park until `join` ("all": every child ended; "any": one did) or `timeout_ms`.

    Spawned exactly once per step, across crashes and takeovers. The answer is
    recorded under the wait's step key in `state.inputs`: {"join", "timed_out",
    "children": [{"index", "run_id", "agent", "status", "result", "error"}]}
    (status is the child's RunStatus name; RUNNING, QUEUED... for one that had
    not ended). `detach`: cancelling this run leaves the children running.
    `share_budget`: see below.
    """

    children: tuple[Child, ...]
    join: str = "all"
    timeout_ms: int = 3_600_000
    detach: bool = False
    # Share this run's cost budget: each child's max_cost_usd is capped at what is left of it, and what
    # the children spent is charged to this run when the join ends.
    share_budget: bool = False


InvalidKind = Literal["parse_failure", "refusal", "content_filter", "invalid_arguments", "unknown_tool",
                      "empty", "agent_state_too_large", "decider_error", "invalid_request"]


@dataclass(frozen=True)
class Invalid:
    """The decider's output could not be used. Recorded in the checkpoint; never guessed around."""

    kind: InvalidKind
    detail: str


class DeciderUnavailable(Exception):
    """The model endpoint could not answer (connection, timeout, 429, 5xx): retry the run later."""


class DeciderRateLimited(DeciderUnavailable):
    """The provider said when to come back (a 429 with retry-after): the run sleeps until then, which
    spends no attempt (a durable sleep resets the run's attempt count)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


Decision = ToolCall | Finish | Fail | Sleep | WaitForInput | WaitForSignal | SpawnChildren | Invalid


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
    # Of `tokens`, what the model read and wrote, where the decider knows (the openai decider does).
    input_tokens: int = 0
    output_tokens: int = 0


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
    # Signals consumed with this decision (not the one a signal wait took: that is in state.inputs),
    # oldest first: {"name", "payload", "seq"}. Each is also kept in state.inputs under "signal/<seq>".
    signals: tuple[dict[str, Any], ...] = ()
