"""A code-first agent: refund triage, written in Python with executor.sdk, no YAML.

    agentrt executor --agents devstack.examples.refund_triage

It reads the order from the mock tool server (an http tool with a lookup and a
fence), scores the refund's risk in process (a python tool with typed
arguments and result), asks a person when the score is high, creates a return
label (the non-idempotent call, settled by lookup after a crash), and finishes
with a typed summary. The mock tool server's address comes from
AGENTRT_EXAMPLE_TOOLS_URL (default http://127.0.0.1:8089, as `agentrt mocktool
--port 8089` serves it). Submit with input {"order_id": 42, "refund_amount": 80}.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field

from executor.sdk import Context, Fail, Finish, Step, ToolCall, ToolCallContext, WaitForInput, agent, http_tool, tool

TOOLS_URL = os.environ.get("AGENTRT_EXAMPLE_TOOLS_URL", "http://127.0.0.1:8089").rstrip("/")
APPROVAL_SCORE = 0.7


class RefundInput(BaseModel):
    """The run's input: the scheduler checks every submit against its JSON Schema."""

    order_id: int = Field(ge=1)
    refund_amount: float = Field(default=0, ge=0)


class OrderRef(BaseModel):
    order_id: int = Field(ge=1)


class RiskQuestion(BaseModel):
    order_id: int
    refund_amount: float = Field(ge=0)


class RiskScore(BaseModel):
    score: float
    reasons: list[str]


class LabelRequest(BaseModel):
    order_id: int
    carrier: str = "dhl"


read_order = http_tool("orders.get", OrderRef, url=f"{TOOLS_URL}/tools/orders.get",
                       lookup_url=f"{TOOLS_URL}/lookup/orders.get", idempotent=True, fenced=True, timeout_s=5)
create_label = http_tool("labels.create", LabelRequest, url=f"{TOOLS_URL}/tools/labels.create",
                         lookup_url=f"{TOOLS_URL}/lookup/labels.create", fenced=True, timeout_s=5)


@tool("risk.score", RiskQuestion, idempotent=True)
def score_risk(question: RiskQuestion, ctx: ToolCallContext) -> RiskScore:
    """Scores a refund's risk in process (no side effect, so it is idempotent)."""
    reasons = ["large refund"] if question.refund_amount > 500 else []
    return RiskScore(score=min(1.0, question.refund_amount / 1000), reasons=reasons)


class Summary(BaseModel):
    order_id: int
    label_id: str
    risk: float
    approved_by_person: bool


@agent(name="refund_triage", version="1", input=RefundInput, tools=[read_order, score_risk, create_label],
       max_steps=20)
def refund_triage(ctx: Context) -> ToolCall | WaitForInput | Finish | Fail | Step:
    """Refund triage: read the order, score the risk, ask a person above the threshold, create a label."""
    order_id = int(ctx.input["order_id"])
    amount = float(ctx.input.get("refund_amount", 0))
    order = ctx.result("read_order")
    if order is None:
        return ToolCall("orders.get", {"order_id": order_id}, node="read_order")
    if not order.ok:
        return Fail(f"order {order_id} could not be read: {order.error_code}")
    risk = ctx.result("score_risk")
    if risk is None:
        return ToolCall("risk.score", {"order_id": order_id, "refund_amount": amount}, node="score_risk")
    score = float(risk.response["score"])
    asked = ctx.state.get("asked", False)
    if score >= APPROVAL_SCORE and not asked:
        # The agent's own state remembers that it asked; the answer arrives as operator input.
        return Step(WaitForInput(f"refund of {amount} for order {order_id} scores {score:.2f}: approve?"),
                    state={"asked": True}, node="approval")
    if asked and not (ctx.last_input() or {}).get("approve", False):
        return Fail(f"refund for order {order_id} not approved")
    label = ctx.result("create_label")
    if label is None:
        return ToolCall("labels.create", {"order_id": order_id}, node="create_label")
    summary = Summary(order_id=order_id, label_id=str(label.response["id"]), risk=score, approved_by_person=asked)
    return Finish(summary.model_dump())
