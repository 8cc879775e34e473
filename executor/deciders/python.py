"""The `python` decider: your own function of an executor.sdk.Context proposes each step.

The function may be sync or async and need not be deterministic: its decision
is persisted before it acts (docs/design.md §invariants, rule 6). An exception
it raises, or a value that is no decision, is an invalid decision (recorded in
the run's history with the exception's type and message, and retried up to the
policy's max_decision_retries); it has no side effect the runtime knows of.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable
from typing import Any

from executor.agents import PythonDecider
from executor.decisions import (
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
from executor.sdk import Context, Step
from executor.tools.python import import_callable

log = logging.getLogger(__name__)
DECISIONS = (ToolCall, Finish, Fail, Sleep, WaitForInput, WaitForSignal, SpawnChildren)
NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # as a plan node id; tool names may carry dots


class PythonDeciderImpl:
    def __init__(self, config: PythonDecider) -> None:
        target = import_callable(config.callable)
        func: Callable[..., Any] = getattr(target, "func", target)  # an sdk.CodeAgent, or a plain function
        try:
            inspect.signature(func).bind(object())
        except TypeError as exc:
            raise TypeError(f"{config.callable} cannot be called with one argument (the Context): {exc}") from None
        except ValueError:  # no signature to inspect (a builtin): let the first call tell
            pass
        self.func = func
        self.pure = config.pure

    async def decide(self, ctx: DecisionContext) -> Proposal:
        index = ctx.state.step_index
        try:
            returned = self.func(Context.of(ctx))
            if inspect.isawaitable(returned):
                returned = await returned
        except Exception as exc:
            log.warning("run %s: decider %s raised %s: %s", ctx.run_id, ctx.agent.name, type(exc).__name__, exc)
            return Proposal(Invalid("decider_error", f"{type(exc).__name__}: {exc}"[:2000]), f"decide@{index}")
        step = returned if isinstance(returned, Step) else Step(returned)
        decision = step.decision
        if not isinstance(decision, DECISIONS):
            return Proposal(Invalid("parse_failure", f"the decider returned {type(decision).__name__}, not a "
                                                     "ToolCall, Finish, Fail, Sleep, WaitForInput, WaitForSignal or "
                                                     "SpawnChildren"),
                            f"decide@{index}")
        explicit = decision.node if isinstance(decision, ToolCall) else step.node
        if explicit and not NODE.match(explicit):
            return Proposal(Invalid("parse_failure", f"node {explicit!r} must match {NODE.pattern}"),
                            f"decide@{index}")
        # Without a node: the tool's name (which may hold '/', as the openai decider's nodes do) or the kind.
        default = decision.tool if isinstance(decision, ToolCall) else type(decision).__name__.lower()
        node = f"{explicit or default}@{index}"
        return Proposal(decision, node, raw={"decision": type(decision).__name__}, tokens=step.tokens,
                        cost_usd=step.cost_usd, agent_state=step.state)

    async def close(self) -> None:
        return None
