"""pydantic-ai agents served by agentrt in the tests (executor.pydanticai), with pydantic-ai's own test models.

`shop`: a FunctionModel that asks for one `place_order` call, then gives a structured Receipt; every model
call and every order is counted here (the executors run in the test's process). `quiz`: TestModel, which
calls both its tools at once (parallel tool calls) and then answers.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from executor.pydanticai import current_call, durable_agent
from executor.tools.base import LookupOutcome, ToolCallContext

MODEL_CALLS: list[int] = []  # the number of messages each model call saw
ORDERS: dict[str, dict[str, Any]] = {}  # idempotency key -> the order placed under it
FENCES: list[int] = []


class Receipt(BaseModel):
    order_id: str
    qty: int
    note: str


def shop_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    MODEL_CALLS.append(len(messages))
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart("place_order", {"item": "pen", "qty": 2})])
    answered = messages[-1].parts[0].content  # the tool's return
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {
        "order_id": answered["id"], "qty": answered["qty"], "note": f"{len(messages)} messages"})])


shop_agent = Agent(FunctionModel(shop_model), output_type=Receipt)


@shop_agent.tool_plain
def place_order(item: str, qty: int) -> dict[str, Any]:
    """Place an order (its outcome is found again by idempotency key)."""
    call = current_call()
    FENCES.append(call.fencing_token)
    order = ORDERS.setdefault(call.idempotency_key, {"id": f"order-{len(ORDERS) + 1}", "item": item, "qty": qty})
    return order


def find_order(key: str, ctx: ToolCallContext) -> LookupOutcome:
    if key in ORDERS:
        return LookupOutcome("found", ORDERS[key])
    return LookupOutcome("not_found", evidence={"checked": key})


shop = durable_agent(shop_agent, name="pai-shop", version="1", lookups={"place_order": find_order},
                     fenced=["place_order"])

quiz_agent = Agent(TestModel())


@quiz_agent.tool_plain
def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


@quiz_agent.tool_plain
async def shout(text: str) -> str:
    """Says it louder."""
    return text.upper()


quiz = durable_agent(quiz_agent, name="pai-quiz", version="1", idempotent=["add", "shout"])


def greeter_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart("greet", {"name": "Ada"})])
    return ModelResponse(parts=[TextPart(f"done: {messages[-1].parts[0].content}")])


greeter_agent = Agent(FunctionModel(greeter_model), deps_type=dict)


@greeter_agent.tool
def greet(ctx: RunContext[dict[str, str]], name: str) -> str:
    """Greets someone with the run's greeting (from its dependencies)."""
    return f"{ctx.deps['greeting']}, {name} ({ctx.tool_name})"


greeter = durable_agent(greeter_agent, name="pai-greeter", version="1", deps=lambda: {"greeting": "Hello"})
