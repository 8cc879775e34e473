"""A claimer or the registration refresh that dies takes the executor process down, non-zero and with
one line naming the task, instead of leaving a live process that claims or registers nothing.

Each case runs `agentrt executor` as its own process against a real scheduler, with a fault point
armed (`raise`) inside the task under test; the process must exit on its own, after its ordered
shutdown. A control executor without the fault keeps serving until it is sent SIGTERM, then exits 0.
"""
import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from executor_support import scripted_agent, write_agent
from support import scheduler_stack

REPO = Path(__file__).resolve().parents[3]


def start_executor(addr: str, agents: Path, log: Path, faults: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "AGENTRT_SCHEDULER_ADDR": addr, "AGENTRT_AGENTS_PATH": str(agents),
           "AGENTRT_HEALTH_ADDR": "", "AGENTRT_CLAIM_WAIT_MS": "200", "AGENTRT_CLAIMERS": "2", "AGENTRT_SLOTS": "2",
           "AGENTRT_REGISTRATION_TTL_MS": "3000", "AGENTRT_SHUTDOWN_GRACE_S": "1", "AGENTRT_WORKER_ID": "sup-1",
           "AGENTRT_FAULT_POINTS": json.dumps(faults), "AGENTRT_FAULT_ACTION": "raise"}
    return subprocess.Popen([sys.executable, "-m", "cli", "executor"], cwd=REPO, env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)


async def exit_code(proc: subprocess.Popen[bytes], within: float) -> int | None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if (code := proc.poll()) is not None:
            return code
        await asyncio.sleep(0.1)
    return None


async def serving(proc: subprocess.Popen[bytes], log: Path, within: float) -> None:
    """Until the executor logs that it serves (its signal handlers are installed by then)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while " serving " not in (text := _read(log)):
        assert proc.poll() is None, text[-3000:]
        assert loop.time() < deadline, f"not serving within {within}s: {text[-3000:]}"
        await asyncio.sleep(0.1)


def _read(log: Path) -> str:
    return log.read_text()


def end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.mark.parametrize(("fault", "task"), [
    ("before_claim@occurrence=3", "claimer-"),
    ("before_registration_refresh", "agent-registration"),
])
async def test_a_dead_task_ends_the_process_with_one_line(db_url, tmp_path, fault, task):
    write_agent(tmp_path / "agents", scripted_agent("idle", [{"id": "done", "finish": {"ok": True}}], []))
    async with scheduler_stack(db_url) as stack:
        log = tmp_path / "executor.log"
        proc = start_executor(stack.addr, tmp_path / "agents", log, [fault])
        try:
            code = await exit_code(proc, within=60)
        finally:
            end(proc)
        text = log.read_text()
        assert code == 1, f"exit {code}\n{text[-3000:]}"
        died = [line for line in text.splitlines() if "stopping (exit 1) so that it is restarted" in line]
        assert died and f"task {task}" in died[0] and "died: InjectedCrash" in died[0], text[-3000:]
        one_line = "agentrt executor: error: WorkerTaskDied: executor sup-1: task "
        assert any(line.startswith(one_line) for line in text.splitlines()), text[-3000:]
        assert "executor sup-1 stopped" in text  # the ordered shutdown ran (agents withdrawn, channel closed)


async def test_without_a_fault_the_executor_serves_until_sigterm(db_url, tmp_path):
    write_agent(tmp_path / "agents", scripted_agent("idle", [{"id": "done", "finish": {"ok": True}}], []))
    async with scheduler_stack(db_url) as stack:
        log = tmp_path / "executor.log"
        proc = start_executor(stack.addr, tmp_path / "agents", log, [])
        try:
            await serving(proc, log, within=60)
            # Several claim rounds (200 ms each) and registration refreshes (every second) go by.
            assert await exit_code(proc, within=4) is None, log.read_text()[-3000:]
            proc.send_signal(signal.SIGTERM)
            code = await exit_code(proc, within=30)
        finally:
            end(proc)
        assert code == 0, log.read_text()[-3000:]
        assert "stopping (exit 1)" not in log.read_text()
