"""The after-sales demo: its agent file, the runs `agentrt dev` submits, and what "done" means for each.

A run whose refund is above the agent's approval threshold is expected to wait
PAUSED_HUMAN at the approval node (until `agentrt runs resume RUN --approve`,
or `agentrt dev --auto-approve`); every other run is expected to complete.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executor.agents import AgentDefinition, ScriptedDecider, load_file
from shared.client.runs import AgentrtClient, RunInfo

AGENT_FILE = Path(__file__).parent / "agents" / "after_sales_return.yaml"
AGENT_NAME = "after_sales_return"
# Where the shipped file's tools point (`agentrt mocktool --port 8089`); dev rewrites it to its own mock.
FILE_TOOL_BASE = "http://127.0.0.1:8089"
APPROVAL_NODE = "approve_refund"
NON_IDEMPOTENT_TOOL = "labels.create"
# Every fifth refund is above the threshold (500 in the agent file).
AMOUNTS = (49.9, 129.0, 310.5, 89.0, 780.0)
REASONS = ("wrong size", "damaged in transit", "changed my mind", "arrived late", "not as described")

COMPLETED = "completed"
AWAITING_APPROVAL = "awaiting approval"
IN_PROGRESS = "in progress"
CANCELLED = "cancelled"  # by a person (agentrt runs cancel): settled, and not a problem of the stack
UNEXPECTED = "unexpected"


def install_agent(directory: Path, mock_url: str) -> AgentDefinition:
    """Copies the demo agent into `directory` with its tools pointing at `mock_url`; returns it, validated."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / AGENT_FILE.name
    target.write_text(AGENT_FILE.read_text(encoding="utf-8").replace(FILE_TOOL_BASE, mock_url), encoding="utf-8")
    return load_file(target)


def approval_threshold(agent: AgentDefinition) -> float:
    assert isinstance(agent.decider, ScriptedDecider)
    node = next(n for n in agent.decider.plan if n.id == APPROVAL_NODE)
    assert node.when is not None and node.when.gt is not None
    return node.when.gt


@dataclass
class DemoRun:
    index: int
    request_id: str
    input: dict[str, Any]
    needs_approval: bool
    run_id: str = ""
    status: str = "SUBMITTING"
    step: str = ""
    reason: str = ""
    resumed: bool = False
    announced: bool = False  # "waits for approval" was shown

    def update(self, run: RunInfo) -> None:
        self.run_id, self.status, self.step = run.run_id, run.status, run.current_step_key
        self.reason = run.pause_reason or run.terminal_reason

    def outcome(self, *, auto_approve: bool) -> str:
        if self.status == "COMPLETED":
            return COMPLETED
        if self.status == "CANCELLED":
            return CANCELLED
        at_approval = self.status == "PAUSED_HUMAN" and self.needs_approval and self.step.startswith(APPROVAL_NODE)
        if at_approval:
            return IN_PROGRESS if auto_approve else AWAITING_APPROVAL
        if self.status in ("FAILED", "PAUSED_HUMAN"):
            return UNEXPECTED
        return IN_PROGRESS


def demo_runs(count: int, session: str, threshold: float) -> list[DemoRun]:
    runs = []
    for i in range(count):
        amount = AMOUNTS[i % len(AMOUNTS)]
        payload = {"order_id": 100_000 + i, "customer_id": f"cust-{i % 7:03d}", "refund_amount": amount,
                   "currency": "EUR", "reason": REASONS[i % len(REASONS)]}
        runs.append(DemoRun(i, f"dev-{session}-{i:04d}", payload, amount > threshold))
    return runs


async def submit_all(client: AgentrtClient, runs: list[DemoRun], session: str, batch: int = 20) -> None:
    async def one(run: DemoRun) -> None:
        info, _ = await client.submit(AGENT_NAME, run.input, client_request_id=run.request_id,
                                      labels={"demo_session": session})
        run.update(info)

    for start in range(0, len(runs), batch):
        await asyncio.gather(*(one(run) for run in runs[start:start + batch]))
