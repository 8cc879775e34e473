"""From a checkpoint to the next state to persist and the action to take once it is persisted.

Order of precedence: a recorded end, a durable wait, a persisted tool decision
(executed, never re-sampled: docs/design.md §invariants, rule 6), a transient retry's next attempt,
then — budgets permitting — a new proposal from the decider, validated here.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema

from executor.agents import AgentDefinition
from executor.checkpoint import MAX_AGENT_STATE_BYTES, Finished, State, ToolDecision, Waiting
from executor.deciders.base import (
    Decider,
    DecisionContext,
    Fail,
    Finish,
    Invalid,
    Proposal,
    Sleep,
    SpawnChildren,
    ToolCall,
    WaitForInput,
    WaitForSignal,
)
from executor.errors import ErrorClass, classify
from executor.steps import (
    RunIds,
    decided_finish,
    decided_invalid,
    decided_tool,
    decided_wait,
    finished_without_decision,
    next_attempt,
    paused,
    step_key_for,
    tool_decision,
)
from shared.canonical import canonical_json


@dataclass(frozen=True)
class ExecuteTool:
    decision: ToolDecision
    # Tx1 already committed, in the same transaction as the checkpoint that records the
    # decision (CompleteAndBeginToolCall): the holder goes straight to sending.
    intent_recorded: bool = False


@dataclass(frozen=True)
class EndRun:
    finished: Finished


@dataclass(frozen=True)
class Park:
    waiting: Waiting


@dataclass(frozen=True)
class DecideAgain:
    pass


Action = ExecuteTool | EndRun | Park | DecideAgain


@dataclass(frozen=True)
class Limits:
    """The tighter of the run's budget and the agent's (0 = unlimited)."""

    max_steps: int = 0
    max_tokens: int = 0
    max_cost_usd: float = 0.0
    deadline: dt.datetime | None = None

    def exhausted(self, state: State, now: dt.datetime) -> str | None:
        usage = state.usage
        if self.max_steps and usage.steps >= self.max_steps:
            return f"max_steps {self.max_steps} reached ({usage.steps} steps taken)"
        if self.max_tokens and usage.tokens >= self.max_tokens:
            return f"max_tokens {self.max_tokens} reached ({usage.tokens} used)"
        if self.max_cost_usd and usage.cost_usd >= self.max_cost_usd:
            return f"max_cost_usd {self.max_cost_usd} reached ({usage.cost_usd:.6f} spent)"
        if self.deadline is not None and now >= self.deadline:
            return f"deadline {self.deadline.isoformat()} passed"
        return None


_SIGNAL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")  # the scheduler's name rule
MAX_SIGNAL_WAIT_MS = 366 * 24 * 3600 * 1000


def signal_wait_invalid(wait: WaitForSignal) -> Invalid | None:
    if not _SIGNAL_NAME.match(wait.name or ""):
        return Invalid("invalid_arguments", f"signal name {wait.name!r}: letters, digits and ._/- (up to 200)")
    if not 0 < wait.timeout_ms <= MAX_SIGNAL_WAIT_MS:
        return Invalid("invalid_arguments", f"signal wait timeout_ms {wait.timeout_ms}: 1 to {MAX_SIGNAL_WAIT_MS}")
    return None


MAX_CHILDREN = 100  # the scheduler's SpawnChildren limit
_AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")


def spawn_invalid(spawn: SpawnChildren) -> Invalid | None:
    """What the executor can tell of a spawn before it is recorded (the scheduler checks the agents)."""
    if spawn.join not in ("all", "any"):
        return Invalid("invalid_arguments", f"spawn join {spawn.join!r}: 'all' or 'any'")
    if not 0 < spawn.timeout_ms <= MAX_SIGNAL_WAIT_MS:
        return Invalid("invalid_arguments", f"spawn timeout_ms {spawn.timeout_ms}: 1 to {MAX_SIGNAL_WAIT_MS}")
    if not 1 <= len(spawn.children) <= MAX_CHILDREN:
        return Invalid("invalid_arguments", f"spawn of {len(spawn.children)} children: 1 to {MAX_CHILDREN}")
    for index, child in enumerate(spawn.children):
        if not _AGENT_NAME.match(child.agent or ""):
            return Invalid("invalid_arguments", f"spawn child {index}: agent {child.agent!r} is not an agent name")
        if not isinstance(child.input, dict):
            return Invalid("invalid_arguments", f"spawn child {index}: input must be a JSON object")
    return None


def spawn_record(spawn: SpawnChildren, cost_left: float | None) -> dict[str, Any]:
    """The spawn as the checkpoint keeps it (Waiting.spawn). With a shared budget, each child's
    max_cost_usd is at most `cost_left` (what is left of this run's cost budget; None: no such budget)."""
    def budget(child_budget: dict[str, Any]) -> dict[str, Any]:
        out = dict(child_budget)
        if spawn.share_budget and cost_left is not None:
            own = float(out.get("max_cost_usd") or 0)
            out["max_cost_usd"] = min(own, cost_left) if own else cost_left
        return out

    return {"join": spawn.join, "detach": spawn.detach, "share_budget": spawn.share_budget,
            "children": [{"agent": c.agent, "version": c.version, "input": c.input, "labels": dict(c.labels),
                          "budget": budget(c.budget)} for c in spawn.children]}


def tighter(a: float, b: float) -> float:
    return min(x for x in (a, b) if x) if (a or b) else 0


class Advancer:
    def __init__(self, agent: AgentDefinition, decider: Decider, ids: RunIds, run_input: dict,
                 limits: Limits, max_attempts: int, db_now: Callable[[], dt.datetime],
                 used: Callable[[Proposal], None] | None = None) -> None:
        self.agent = agent
        self.used = used  # told each proposal's model usage (the token and cost metrics)
        self.decider = decider
        self.ids = ids
        self.run_input = run_input
        self.limits = limits
        self.max_attempts = max_attempts
        self.db_now = db_now
        self.validators = {t.name: jsonschema.Draft202012Validator(t.input_schema) for t in agent.tools}
        # Signals taken in for the next decision (executor/signals.py): shown to the decider once.
        self.delivered: tuple[dict[str, Any], ...] = ()

    def end(self, state: State, code: str, reason: str, *, policy_pause: bool) -> tuple[State, Action]:
        """A permanent error: FAILED, or PAUSED_HUMAN when the agent's policy says so."""
        if policy_pause:
            state = paused(state, reason)
            assert state.waiting is not None
            return state, Park(state.waiting)
        finished = Finished(outcome="FAILED", reason=reason, error_class=f"{classify(code).value}:{code}")
        return finished_without_decision(state, finished), EndRun(finished)

    async def advance(self, state: State) -> tuple[State, Action]:
        if state.finished is not None:
            return state, EndRun(state.finished)
        if state.waiting is not None:
            return state, Park(state.waiting)
        if state.pending_tool is not None:
            return state, ExecuteTool(state.pending_tool)
        if state.retry_tool is not None:
            if state.retry_tool.attempt >= self.max_attempts:
                return self.end(state, "attempts_exhausted",
                                f"attempts exhausted: step {state.retry_tool.step_key} failed transiently "
                                f"{state.retry_tool.attempt} times",
                                policy_pause=self.agent.policy.pause_when_attempts_exhausted)
            state, decision = next_attempt(state, state.retry_tool, self.ids)
            return state, ExecuteTool(decision)
        why = self.limits.exhausted(state, self.db_now())
        if why is not None:
            return self.end(state, "budget_exhausted", f"budget exhausted: {why}",
                            policy_pause=self.agent.policy.on_budget_exhausted == "pause")
        ctx = DecisionContext(agent=self.agent, run_id=self.ids.run_id, tenant_id=self.ids.tenant_id,
                              input=self.run_input, state=state, signals=self.delivered)
        self.delivered = ()
        proposal = await self.decider.decide(ctx)
        if self.used is not None:
            self.used(proposal)
        return self.apply(state, proposal)

    def validate(self, call: ToolCall) -> Invalid | None:
        if self.agent.tool(call.tool) is None:
            return Invalid("unknown_tool", f"no tool named {call.tool!r}")
        errors = sorted(self.validators[call.tool].iter_errors(call.args), key=lambda e: list(e.path))
        if errors:
            where = "/".join(str(p) for p in errors[0].path) or "(arguments)"
            return Invalid("invalid_arguments", f"{call.tool}: {where}: {errors[0].message}")
        return None

    def apply(self, state: State, proposal: Proposal) -> tuple[State, Action]:
        if proposal.agent_state is not None:
            size = len(canonical_json(proposal.agent_state).encode("utf-8"))
            if size > MAX_AGENT_STATE_BYTES:
                too_large = Invalid("agent_state_too_large", f"the decider's agent_state is {size} bytes, over the "
                                    f"{MAX_AGENT_STATE_BYTES}-byte limit; keep large data in tool results")
                proposal = Proposal(too_large, proposal.node, proposal.raw, proposal.tokens, proposal.cost_usd,
                                    proposal.model)
            else:
                state = state.model_copy(update={"agent_state": proposal.agent_state})
        decision = proposal.decision
        if isinstance(decision, SpawnChildren):
            refused_spawn = spawn_invalid(decision)
            if refused_spawn is not None:
                proposal = Proposal(refused_spawn, proposal.node, proposal.raw, proposal.tokens, proposal.cost_usd,
                                    proposal.model)
                decision = refused_spawn
        if isinstance(decision, WaitForSignal):
            refused = signal_wait_invalid(decision)
            if refused is not None:
                proposal = Proposal(refused, proposal.node, proposal.raw, proposal.tokens, proposal.cost_usd,
                                    proposal.model)
                decision = refused
        if isinstance(decision, ToolCall):
            invalid = self.validate(decision)
            if invalid is not None:
                proposal = Proposal(invalid, proposal.node, proposal.raw, proposal.tokens, proposal.cost_usd,
                                    proposal.model)
                decision = invalid
        if isinstance(decision, ToolCall):
            tool = self.agent.tool(decision.tool)
            assert tool is not None
            made = tool_decision(state, proposal, decision, self.ids)
            state = decided_tool(state, proposal, made, needs_approval=tool.contract.requires_approval)
            if state.waiting is not None:
                return state, Park(state.waiting)
            return state, ExecuteTool(made)
        if isinstance(decision, Finish | Fail):
            completed = isinstance(decision, Finish)
            finished = Finished(
                outcome="COMPLETED" if completed else "FAILED",
                result=decision.result if isinstance(decision, Finish) else None,
                reason="" if isinstance(decision, Finish) else decision.reason,
                error_class="" if completed else f"{ErrorClass.PERMANENT.value}:plan_failed")
            state = decided_finish(state, proposal, finished)
            return state, EndRun(finished)
        if isinstance(decision, Sleep | WaitForInput | WaitForSignal | SpawnChildren):
            key = step_key_for(proposal.node, 1)
            if isinstance(decision, SpawnChildren):
                cost_left = (max(self.limits.max_cost_usd - state.usage.cost_usd - proposal.cost_usd, 1e-9)
                             if self.limits.max_cost_usd else None)
                waiting = Waiting(kind="children", step_key=key, node=proposal.node, sleep_ms=decision.timeout_ms,
                                  spawn=spawn_record(decision, cost_left))
            elif isinstance(decision, Sleep):
                waiting = Waiting(kind="sleep", step_key=key, node=proposal.node, sleep_ms=decision.ms)
            elif isinstance(decision, WaitForSignal):
                waiting = Waiting(kind="signal", step_key=key, node=proposal.node, signal=decision.name,
                                  sleep_ms=decision.timeout_ms)
            else:
                waiting = Waiting(kind="input", step_key=key, node=proposal.node, prompt=decision.prompt)
            state = decided_wait(state, proposal, waiting)
            return state, Park(waiting)
        assert isinstance(decision, Invalid)
        state = decided_invalid(state, proposal, decision)
        policy = self.agent.policy
        if self.decider.pure or state.invalid_streak > policy.max_decision_retries:
            return self.end(state, "decision_retries_exhausted",
                            f"no valid decision after {state.invalid_streak} attempt(s); last: "
                            f"{decision.kind}: {decision.detail}",
                            policy_pause=policy.on_decision_retries_exhausted == "pause")
        return state, DecideAgain()
