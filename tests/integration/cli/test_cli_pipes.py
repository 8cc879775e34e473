"""`agentrt … | head`: a reader that closes the pipe early is no error (issue 26).

Each command runs as a real process whose stdout's reader is gone before it writes a byte, so
its first write (or the flush at exit) meets EPIPE: it must stop without a traceback or an
"Exception ignored … BrokenPipeError" line, exit 141 (as `yes | head` reports) or 0, and write
nothing on stderr. The sweep covers the output paths: argparse (help, version), a one-shot
answer, a table, and the paged history export.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import TENANT, scheduler_stack, submit

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


def _closed_reader(*args: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command starts
    try:
        proc = subprocess.run([sys.executable, "-m", "cli", *args], stdout=write, stderr=subprocess.PIPE,
                              cwd=REPO, env=env, timeout=60, check=False)
    finally:
        os.close(write)
    return proc.returncode, proc.stderr.decode()


def _head(command: str) -> tuple[int, str, str]:
    """The shell pipeline as a user types it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, cwd=REPO, env=env,
                          timeout=60, check=False)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


async def test_every_output_path_stops_quietly_when_the_reader_is_gone(db_url):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack)
        at = ["--addr", stack.addr, "--tenant", TENANT]
        commands = [["--help"], ["--version"], ["runs", "--help"], ["scheduler", "--version"],
                    ["runs", "get", run.run_id, *at], ["runs", "list", *at],
                    ["runs", "export", run.run_id, *at, "--reason", "pipe test"]]
        for command in commands:
            code, err = await asyncio.to_thread(_closed_reader, *command)
            assert (code in (0, 141), err) == (True, ""), command


async def test_runs_export_into_head(db_url):
    async with scheduler_stack(db_url) as stack:
        # Enough history that the export outlasts head's one line and the pipe's buffer.
        run = await submit(stack, payload={"blob": "x" * 200_000})
        cli = f"{sys.executable} -m cli.main"
        command = (f"{cli} runs export {run.run_id} --addr {stack.addr} --tenant {TENANT} --reason pipe "
                   f"| head -c 100")
        code, out, err = await asyncio.to_thread(_head, command)
        assert len(out) == 100
        assert "BrokenPipeError" not in err and "Traceback" not in err and err == ""
        assert code in (0, 141)
