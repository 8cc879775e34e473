"""A code-first agent (devstack/examples/refund_triage.py, executor.sdk) through the scheduler, an executor and
the mock tool server: loaded by module name, typed tools, the agent's own state, a person's input, and a
python tool that raises (its exception reaches the log and the run's pause reason)."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from pathlib import Path

import pytest
from executor_support import executor, history, mock_tool, wait_status, write_agent
from support import scheduler_stack, submit

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs

pytestmark = pytest.mark.integration
MODULE = "devstack.examples.refund_triage"
END = (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED)
REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch):
    """The example module, pointed at this test's mock tool server (it reads the address at import)."""

    def load(url: str):
        monkeypatch.setenv("AGENTRT_EXAMPLE_TOOLS_URL", url)
        module = importlib.import_module(MODULE)
        return importlib.reload(module)

    yield load
    sys.modules.pop(MODULE, None)


async def test_a_small_refund_runs_through_typed_tools_to_a_typed_summary(db_url, db, tmp_path, example):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        example(mock.url)
        run = await submit(stack, agent="refund_triage", payload={"order_id": 42, "refund_amount": 80})
        async with executor(stack, MODULE):
            done = await wait_status(stack, run.run_id, *END, pb.RUN_STATUS_PAUSED_HUMAN)
        assert done.status == pb.RUN_STATUS_COMPLETED, done.terminal_reason or done.pause_reason
        summary = json.loads(done.result_json)
        assert summary == {"order_id": 42, "label_id": "labels.create-1", "risk": 0.08, "approved_by_person": False}
        hist = await history(stack, run.run_id)
        steps = [(e.tool_name, json.loads(e.request_json)) for e in hist.tool_executions]
        assert steps == [("orders.get", {"order_id": 42}), ("risk.score", {"order_id": 42, "refund_amount": 80.0}),
                         ("labels.create", {"order_id": 42})]
        assert json.loads(hist.tool_executions[1].response_json) == {"score": 0.08, "reasons": []}
        calls = mock.calls_by_key()
        assert len(calls) == 2 and set(calls.values()) == {1}  # the http tools, once each


async def test_a_risky_refund_waits_for_a_person_whose_answer_the_agent_reads(db_url, db, tmp_path, example):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        example(mock.url)
        approved = await submit(stack, agent="refund_triage", payload={"order_id": 7, "refund_amount": 900})
        refused = await submit(stack, agent="refund_triage", payload={"order_id": 8, "refund_amount": 950})
        async with executor(stack, MODULE):
            for run in (approved, refused):
                waiting = await wait_status(stack, run.run_id, pb.RUN_STATUS_PAUSED_HUMAN)
                assert waiting.pause_reason.startswith("waiting for input at approval@2")
                assert "scores 0.9" in waiting.pause_reason
            for run, answer in ((approved, True), (refused, False)):
                await stack.runs.ResumeRun(rs.ResumeRunRequest(
                    run_id=run.run_id, decision=rs.RESUME_DECISION_INPUT, operator="alice",
                    input_json=json.dumps({"approve": answer})), metadata=stack.md())
            ok = await wait_status(stack, approved.run_id, *END)
            no = await wait_status(stack, refused.run_id, *END)
        assert ok.status == pb.RUN_STATUS_COMPLETED and json.loads(ok.result_json)["approved_by_person"] is True
        assert no.status == pb.RUN_STATUS_FAILED and "not approved" in no.terminal_reason
        labels = [key for key, _ in mock.rows("SELECT idempotency_key, 1 FROM requests WHERE tool = 'labels.create'")]
        assert len(labels) == 1  # only the approved refund got a label


async def test_an_executor_process_serves_agents_named_by_module(db_url, db, tmp_path):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        env = {**os.environ, "AGENTRT_SCHEDULER_ADDR": stack.addr, "AGENTRT_HEALTH_ADDR": "127.0.0.1:0",
               "AGENTRT_CLAIM_WAIT_MS": "300", "AGENTRT_EXAMPLE_TOOLS_URL": mock.url}
        run = await submit(stack, agent="refund_triage", payload={"order_id": 5, "refund_amount": 10})
        log_path = tmp_path / "executor.log"
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "cli", "executor", "--agents", MODULE, env=env, stdout=log,
                stderr=log, cwd=REPO_ROOT)
            try:
                done = await wait_status(stack, run.run_id, *END, within=60)
            finally:
                proc.terminate()
                await asyncio.wait_for(proc.wait(), 30)
        assert done.status == pb.RUN_STATUS_COMPLETED, log_path.read_text()[-3000:]
        assert json.loads(done.result_json)["label_id"] == "labels.create-1"


def crashing_tool(arguments, ctx):
    raise KeyError("customer_id")


async def test_a_python_tool_exception_is_in_the_log_and_the_pause_reason(db_url, db, tmp_path, caplog):
    agents = tmp_path / "agents"
    write_agent(agents, {"name": "crashy", "version": "1",
                         "decider": {"kind": "scripted", "plan": [{"id": "go", "tool": "crash"}]},
                         "tools": [{"name": "crash", "kind": "python", "callable": f"{__name__}:crashing_tool"}]})
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack, agent="crashy", payload={})
        async with executor(stack, agents):
            frozen = await wait_status(stack, run.run_id, pb.RUN_STATUS_PAUSED_INDOUBT)
    assert frozen.pause_reason == "tool outcome unknown: tool_crashed: KeyError: 'customer_id'"
    logged = [r for r in caplog.records if r.levelname == "WARNING" and "crash" in r.getMessage()]
    assert any("KeyError: 'customer_id'" in r.getMessage() for r in logged), [r.getMessage() for r in logged]
    assert any(r.exc_info for r in logged)  # with the traceback


async def test_a_tool_with_the_wrong_signature_stops_the_executor_at_start_with_one_line(tmp_path):
    (tmp_path / "wrong_tools.py").write_text("def greet(args):\n    return {'hello': args}\n")
    agents = tmp_path / "agents"
    write_agent(agents, {"name": "greeter", "version": "1",
                         "decider": {"kind": "scripted", "plan": [{"id": "go", "tool": "greet"}]},
                         "tools": [{"name": "greet", "kind": "python", "callable": "wrong_tools:greet"}]})
    env = {**os.environ, "AGENTRT_SCHEDULER_ADDR": "127.0.0.1:1", "AGENTRT_HEALTH_ADDR": "127.0.0.1:0",
           "PYTHONPATH": str(tmp_path)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "executor", "--agents", str(agents), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO_ROOT)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, lines
    assert lines[0] == (f"agentrt executor: error: DefinitionError: {agents / 'greeter-1.yaml'}: tools.0.callable: "
                        "wrong_tools:greet(args) cannot be called as (arguments, ToolCallContext): "
                        "too many positional arguments")


async def test_a_code_first_tool_with_the_wrong_signature_stops_the_executor_at_start_with_one_line(tmp_path):
    # The case: @tool on a function without the context parameter. The executor calls the tool
    # object (whose own signature fits), so the function inside must be checked when it is declared.
    (tmp_path / "bad_code_tools.py").write_text(
        "from __future__ import annotations\nfrom pydantic import BaseModel\n"
        "from executor.sdk import Finish, ToolCall, agent, tool\n"
        "class A(BaseModel):\n    x: int = 0\n"
        "@tool('bad.one', A)\ndef one(args: A):\n    return {'x': args.x}\n"
        "@agent(name='bad', version='1', tools=[one])\ndef bad(ctx):\n    return ToolCall('bad.one', {})\n")
    env = {**os.environ, "AGENTRT_SCHEDULER_ADDR": "127.0.0.1:1", "AGENTRT_HEALTH_ADDR": "127.0.0.1:0",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "executor", "--agents", "bad_code_tools", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO_ROOT)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, lines
    assert lines[0] == ("agentrt executor: error: DefinitionError: bad_code_tools: (module): cannot import: "
                        "TypeError: tool bad.one: bad_code_tools:one(args: 'A') cannot be called as "
                        "(args, ToolCallContext): too many positional arguments")
