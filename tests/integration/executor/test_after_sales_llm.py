"""The after-sales example as a model-driven agent, run as shipped: devstack/examples/after_sales_llm.yaml
(an `anthropic` decider, the tools of a real MCP server, devstack/examples/after_sales_mcp.py, and an
approval before every refund) on a real scheduler and executor, with a loopback fake of the Messages API
in place of the provider. Only the two addresses in the file are pointed at loopback."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from executor_support import executor, history, wait_status, write_agent
from helpers import wait_until
from model_fakes import FakeProvider, anthropic_tool_uses
from support import scheduler_stack, submit

from devstack.embedded_pg import free_port
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "devstack" / "examples" / "after_sales_llm.yaml"
ORDER = {"order_id": 42, "refund_amount": 80, "currency": "EUR", "reason": "wrong size"}


def tool_results(body: dict[str, Any]) -> dict[str, Any]:
    """Each tool's latest answer in the conversation the executor sent (by the tool's API name)."""
    names: dict[str, str] = {}
    answers: dict[str, Any] = {}
    for message in body["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block.get("type") == "tool_use":
                names[block["id"]] = block["name"]
            elif block.get("type") == "tool_result":
                answers[names[block["tool_use_id"]]] = json.loads(block["content"])
    return answers


def finish(body: dict[str, Any]) -> dict[str, Any]:
    answers = tool_results(body)
    return anthropic_tool_uses(("agentrt_finish", {"result": {
        "refund_id": answers["issue_refund"]["response"]["refund_id"],
        "ticket_id": answers["create_ticket"]["response"]["ticket_id"]}}))


SCRIPT = [
    anthropic_tool_uses(("get_order", {"order_id": 42}), ("return_policy", {"order_id": 42})),
    anthropic_tool_uses(("check_risk", {"customer_id": "cust-2", "amount": 80})),
    anthropic_tool_uses(("issue_refund", {"order_id": 42, "amount": 80, "currency": "EUR"})),
    anthropic_tool_uses(("create_ticket", {"order_id": 42, "summary": "return: wrong size, refunded 80 EUR"}),
                        ("notify_customer", {"customer_id": "cust-2", "message": "Your refund is on its way."})),
    finish,
]


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(str(db), timeout=10)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


async def test_the_llm_after_sales_agent_runs_as_shipped_with_an_approval(db_url, tmp_path):
    definition = yaml.safe_load(EXAMPLE.read_text())
    assert definition["decider"]["kind"] == "anthropic" and definition["tools"][0]["kind"] == "mcp"
    port, desk = free_port(), tmp_path / "after-sales.sqlite"
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "devstack.examples.after_sales_mcp", "--db", str(desk), "--port", str(port),
        cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)

    async def listening() -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        return True

    try:
        await wait_until(listening, 30, "the after-sales MCP server to listen")
        async with FakeProvider(list(SCRIPT)) as fake, scheduler_stack(db_url) as stack:
            definition["decider"]["base_url"] = fake.url
            definition["tools"][0]["server"]["url"] = f"http://127.0.0.1:{port}/mcp"
            write_agent(tmp_path / "agents", definition)
            run = await submit(stack, agent="after_sales_llm", payload=ORDER)
            async with executor(stack, tmp_path / "agents", anthropic_api_key="sk-ant-test"):
                paused = await wait_status(stack, run.run_id, pb.RUN_STATUS_PAUSED_HUMAN, within=90)
                assert "approve issue_refund" in paused.pause_reason
                assert rows(desk, "SELECT count(*) FROM refunds") == [(0,)]  # nothing sent before the approval
                await stack.runs.ResumeRun(rs.ResumeRunRequest(
                    run_id=run.run_id, decision=rs.RESUME_DECISION_APPROVE, operator="alice", comment="fine"),
                    metadata=stack.md())
                done = await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED,
                                         within=90)
            hist = await history(stack, run.run_id)
    finally:
        if server.returncode is None:
            server.terminate()
            await asyncio.wait_for(server.wait(), 10)
    assert done.status == pb.RUN_STATUS_COMPLETED, done.terminal_reason
    [(refund_id, amount)] = rows(desk, "SELECT id, amount FROM refunds")
    [(ticket_id,)] = rows(desk, "SELECT id FROM tickets")
    assert json.loads(done.result_json) == {"refund_id": refund_id, "ticket_id": ticket_id} and amount == 80
    # Each tool sent once, under the ledger's idempotency key; the refund carried its fence.
    calls = rows(desk, "SELECT tool, idempotency_key, fence FROM calls ORDER BY seq")
    assert sorted(tool for tool, _, _ in calls) == sorted(
        ["get_order", "return_policy", "check_risk", "issue_refund", "create_ticket", "notify_customer"])
    ledger = {row.tool_name: row.idempotency_key for row in hist.tool_executions}
    [(_, key, fence)] = [c for c in calls if c[0] == "issue_refund"]
    assert key == ledger["issue_refund"] and fence is not None and fence >= 1
    assert len(fake.requests) == 5
