"""The Restate services of the peer workload, as an ASGI app for hypercorn (needs the `peers` extra).

Two shapes of one run of K steps, each a handler `run(steps)`:
- StepOnce: one durable `ctx.run` per step, the tool inside it. Restate journals the tool's result
  after it has run, so a crash while the tool runs runs it again (Restate's usual style).
- IntentFirst: each step journals its intent (`ctx.run("intent")`) before the tool's own
  `ctx.run`, so the intent is durable before the tool is called, as agentrt's contract asks: two
  durable actions per step.
"""

from __future__ import annotations

from typing import Any

import restate

step_once = restate.Service("StepOnce")
intent_first = restate.Service("IntentFirst")


async def tool() -> dict[str, Any]:
    """The workload's tool: does nothing, in-process."""
    return {"ok": True}


async def intent(index: int) -> dict[str, Any]:
    return {"tool": "work", "args": {"n": index}, "step": index}


@step_once.handler(name="run")
async def run_step_once(ctx: restate.Context, steps: int) -> int:
    for _ in range(steps):
        await ctx.run_typed("tool", tool)
    return steps


@intent_first.handler(name="run")
async def run_intent_first(ctx: restate.Context, steps: int) -> int:
    for index in range(steps):
        await ctx.run_typed("intent", intent, index=index)
        await ctx.run_typed("tool", tool)
    return steps


app = restate.app(services=[step_once, intent_first])
