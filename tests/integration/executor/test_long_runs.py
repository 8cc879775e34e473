"""Long runs at flat cost (issue 12): schema-2 checkpoints stay small, history lives in the journal,
a schema-1 run continues under this executor, and an oversized tool answer is a definite failure."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from executor_support import (
    executor,
    history,
    http_tool,
    latest_state,
    mock_tool,
    scripted_agent,
    wait_for,
    wait_status,
    write_agent,
)
from support import scheduler_stack, submit
from tests_paths import REPO

from shared.gen.agentrt.v1 import common_pb2 as pb

pytestmark = pytest.mark.integration
END = (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED, pb.RUN_STATUS_PAUSED_INDOUBT, pb.RUN_STATUS_PAUSED_HUMAN)
STEPS = 12


def looping_agent(url: str, steps: int = STEPS) -> dict:
    plan = [{"id": "work", "tool": "notes.add", "args": {"n": "${input.n}"}, "repeat": steps},
            {"id": "done", "finish": {"last": "${results.work.response.id}"}}]
    return scripted_agent("looper", plan, [http_tool(url, "notes.add")])


async def test_checkpoints_stay_small_and_the_journal_holds_each_step_once(db_url, tmp_path):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", looping_agent(mock.url))
        run = await submit(stack, agent="looper", payload={"n": 1})
        async with executor(stack, tmp_path / "agents"):
            final = await wait_status(stack, run.run_id, *END)
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
        hist = await history(stack, run.run_id)
        sizes = [len(c.state_json) for c in hist.checkpoints]
        assert {c.schema_version for c in hist.checkpoints} == {2}
        assert max(sizes) - min(sizes) < 400, sizes  # no copy of the history or of any answer
        assert all("history" not in json.loads(c.state_json) for c in hist.checkpoints)
        seqs = [e.seq for e in hist.journal]
        assert seqs == list(range(1, len(seqs) + 1))
        tools = [e for e in hist.journal if e.kind == "tool"]
        results = [e for e in hist.journal if e.kind == "result"]
        assert len(tools) == len(results) == STEPS and len({e.step_key for e in tools}) == STEPS
        assert all("response" not in json.loads(e.detail_json) for e in results)  # answers are the ledger's
        state = latest_state(hist)
        assert len(state["history"]) == STEPS + 1 and len(state["tool_results"]) == STEPS
        assert json.loads(final.result_json)["last"] == state["tool_results"][tools[-1].step_key]["response"]["id"]


def older_executor(stack, agents: Path, log: Path) -> subprocess.Popen:
    """The schema-1 image (devstack.acceptance.older_executor) as its own process."""
    env = {**os.environ, "AGENTRT_SCHEDULER_ADDR": stack.addr, "AGENTRT_AGENTS_PATH": str(agents),
           "AGENTRT_HEALTH_ADDR": "", "AGENTRT_CLAIM_WAIT_MS": "300", "AGENTRT_WORKER_ID": "old-image",
           "AGENTRT_FAULT_POINTS": json.dumps(["before_tool_send@occurrence=5"]), "AGENTRT_FAULT_ACTION": "sigkill"}
    return subprocess.Popen([sys.executable, "-m", "devstack.acceptance.older_executor"], cwd=REPO, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


async def test_a_schema_1_run_taken_over_mid_way_continues_under_schema_2(db_url, tmp_path):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url, lease_duration_ms=1000) as stack:
        write_agent(tmp_path / "agents", looping_agent(mock.url))
        run = await submit(stack, agent="looper", payload={"n": 2})
        old = older_executor(stack, tmp_path / "agents", tmp_path / "old.log")
        try:
            # The old image SIGKILLs itself before sending its 5th call: its intent is recorded (WAITING_TOOL).
            await wait_for(lambda: asyncio.to_thread(old.poll), 60, "the schema-1 executor to die at its fault")
        finally:
            if old.poll() is None:
                os.kill(old.pid, signal.SIGKILL)
                old.wait(10)
        before = await history(stack, run.run_id)
        assert {c.schema_version for c in before.checkpoints} == {1} and not before.journal
        assert len(json.loads(before.checkpoints[-1].state_json)["history"]) == 5
        async with executor(stack, tmp_path / "agents"):
            final = await wait_status(stack, run.run_id, *END)
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
        hist = await history(stack, run.run_id)
        schemas = [c.schema_version for c in hist.checkpoints]
        assert schemas == sorted(schemas) and set(schemas) == {1, 2}
        # The schema-1 history became the journal's first entries, once; then the run went on appending.
        tools = [e.step_key for e in hist.journal if e.kind == "tool"]
        assert tools == [f"work{'' if n == 0 else f'@{n + 1}'}/attempt-1" for n in range(STEPS)]
        assert [e.seq for e in hist.journal] == list(range(1, len(hist.journal) + 1))
        # Every step's call reached the downstream exactly once (the 5th was looked up, not resent).
        calls = mock.calls_by_key("notes.add")
        assert len(calls) == STEPS and set(calls.values()) == {1}, calls
        assert (tmp_path / "old.log").exists() and REPO.exists()


async def test_an_oversized_tool_answer_is_a_definite_failure(db_url, tmp_path):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url, max_tool_response_bytes=2048) as stack:
        plan = [{"id": "big", "tool": "blob.get", "args": {"pad": "${input.pad}"}},
                {"id": "done", "finish": {"ok": True}}]
        write_agent(tmp_path / "agents", scripted_agent("blobs", plan, [http_tool(mock.url, "blob.get")]))
        run = await submit(stack, agent="blobs", payload={"pad": "x" * 5000})  # the mock echoes its request
        async with executor(stack, tmp_path / "agents"):
            final = await wait_status(stack, run.run_id, *END)
        assert final.status == pb.RUN_STATUS_FAILED, final.pause_reason
        hist = await history(stack, run.run_id)
        [row] = hist.tool_executions
        assert row.status == pb.TOOL_EXECUTION_STATUS_FAILED and row.error_code == "response_too_large"
        result = latest_state(hist)["tool_results"][row.step_key]
        assert "2048-byte limit (max_tool_response_bytes)" in result["detail"], result
