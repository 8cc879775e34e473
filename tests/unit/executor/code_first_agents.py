"""Agents and tools defined in code, for tests/unit/executor/test_sdk.py (importable by module name)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from executor.sdk import Context, Finish, Sleep, Step, ToolCall, ToolCallContext, agent, tool


class Greeting(BaseModel):
    name: str
    times: int = 1


class Greeted(BaseModel):
    text: str


@tool("greet", Greeting, idempotent=True)
def greet(args: Greeting, ctx: ToolCallContext) -> Greeted:
    """Greets someone."""
    return Greeted(text=" ".join([f"hello {args.name}"] * args.times))


@agent(name="greeter", version="2", tools=[greet], max_steps=5)
def greeter(ctx: Context) -> Any:
    """Greets, naps once, then finishes with what the tool said."""
    said = ctx.result("hello")
    if said is None:
        return ToolCall("greet", {"name": ctx.input["name"]}, node="hello")
    if not ctx.state.get("napped"):
        return Step(Sleep(10), state={"napped": True}, node="nap")
    return Finish(said.response)


def broken(ctx: Context) -> Any:
    raise RuntimeError("no idea what to do")


def not_a_decision(ctx: Context) -> Any:
    return {"tool": "greet"}


async def async_finish(ctx: Context) -> Any:
    return Step(Finish({"step": ctx.step}), tokens=12, cost_usd=0.5)


def wrong_signature(args: dict[str, Any]) -> dict[str, Any]:  # a tool must take (arguments, context)
    return args


def takes_nothing() -> Any:  # a decider must take the Context
    return None


def slash_tool(ctx: Context) -> Any:  # tool names may hold '/', as node names by default
    return ToolCall("billing/refund", {"n": 1})


def bad_node(ctx: Context) -> Any:
    return ToolCall("greet", {"name": "x"}, node="not a node")
