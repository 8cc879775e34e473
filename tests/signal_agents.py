"""A code-first agent for tests/integration/executor/test_signal_runs.py: it waits for `go`, then
finishes with the wait's answer and the other signals its next decision was shown (ctx.signals)."""

from __future__ import annotations

from typing import Any

from executor.sdk import Context, Finish, Step, WaitForSignal, agent


@agent(name="signal_collector", version="1")
def signal_collector(ctx: Context) -> Any:
    if not ctx.state.get("waited"):
        return Step(WaitForSignal("go", 3_600_000), state={"waited": True}, node="go")
    return Finish({"go": ctx.last_input(),
                   "shown": [{"name": s["name"], "payload": s["payload"]} for s in ctx.signals],
                   "kept": sorted(key for key in ctx.inputs if key.startswith("signal/"))})
