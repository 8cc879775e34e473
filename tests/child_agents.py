"""Code-first agents for tests/integration/executor/test_child_runs.py: a parent with a cost budget of
1 USD that spawns three children sharing it, each of which spends 0.4 USD on its one decision."""

from __future__ import annotations

from typing import Any

from executor.sdk import Child, Context, Finish, SpawnChildren, Step, agent


@agent(name="spender", version="1")
def spender(ctx: Context) -> Any:
    return Step(Finish({"spent": 0.4}), cost_usd=0.4)


@agent(name="frugal_parent", version="1", max_cost_usd=1.0)
def frugal_parent(ctx: Context) -> Any:
    if not ctx.state.get("spawned"):
        return Step(SpawnChildren(tuple(Child("spender") for _ in range(3)), share_budget=True, timeout_ms=60_000),
                    state={"spawned": True}, node="fan", cost_usd=0.1)
    return Finish({"after_join": ctx.usage.cost_usd})
