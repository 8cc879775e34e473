"""What a local client finds of a running `agentrt dev` session, through the real `agentrt` script.

One session (on a fresh test database, so its keys can be checked after it
stopped) with ten demo runs, two of which wait for approval:
- .agentrt/approvals.txt holds the approval commands; run as printed, in that
  directory, one approves (the file names the session's default tenant, so an
  every-tenant admin key needs no --tenant); the other run is cancelled: it
  loses its pause reason, and the closing summary counts it cancelled, not a PROBLEM;
- precedence: an explicit --api-key wins over the file, and a command aimed at
  another scheduler (AGENTRT_ADDR) takes no credential from the file;
- an executor without the session's token (started elsewhere) exits at once
  with one line instead of warning forever;
- `agentrt executor --help` says --agents takes modules;
- at stop the session's admin key is revoked (and it was short-lived), so
  `keys list` does not collect old sessions' keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from devstack.embedded_pg import free_port

pytestmark = [pytest.mark.integration, pytest.mark.kafka]
AGENTRT = str(Path(sys.executable).parent / "agentrt")


def user_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    return env


def agentrt(cwd: Path, *words: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AGENTRT, *words], cwd=cwd, env=env or user_env(), capture_output=True, text=True,
                          timeout=timeout)


def wait_for(check, within_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not within {within_s}s"
        time.sleep(0.3)


def test_executor_help_says_agents_takes_modules() -> None:
    text = " ".join(agentrt(Path.cwd(), "executor", "--help").stdout.split())
    assert "Python modules of code-first agents" in text and "(mypkg.agents" in text


async def test_a_dev_session_as_a_local_client_sees_it(tmp_path: Path, db_url: str) -> None:
    await asyncio.to_thread(a_session, tmp_path, db_url)
    conn = await asyncpg.connect(db_url)
    try:
        keys = await conn.fetch("SELECT name, created_at, expires_at, revoked_at FROM api_keys "
                                "WHERE name LIKE 'agentrt-dev %'")
    finally:
        await conn.close()
    assert len(keys) == 1
    (key,) = keys
    assert key["revoked_at"] is not None
    assert key["expires_at"] - key["created_at"] <= dt.timedelta(hours=12, seconds=5)


def a_session(tmp_path: Path, db_url: str) -> None:
    addr = f"127.0.0.1:{free_port()}"
    log = tmp_path / "dev.log"
    with open(log, "wb") as out:
        dev = subprocess.Popen([AGENTRT, "dev", "--database-url", db_url, "--listen", addr, "--runs", "10",
                                "--plain", "--tool-latency-ms", "20"], cwd=tmp_path, env=user_env(),
                               stdout=out, stderr=subprocess.STDOUT)
    approvals = tmp_path / ".agentrt" / "approvals.txt"
    try:
        def approval_lines() -> list[str]:
            if dev.poll() is not None:
                raise AssertionError(log.read_text()[-3000:])
            text = approvals.read_text() if approvals.exists() else ""
            return [line for line in text.splitlines() if line.startswith("agentrt ")]

        line, other = wait_for(lambda: lines if len(lines := approval_lines()) == 2 else None, 150,
                               "two demo runs waiting for approval")
        run_id = shlex.split(line, comments=True)[3]
        assert shlex.split(line, comments=True) == ["agentrt", "runs", "resume", run_id, "--approve"]
        approved = agentrt(tmp_path, *shlex.split(line, comments=True)[1:])
        assert approved.returncode == 0, approved.stderr
        wait_for(lambda: "COMPLETED" in agentrt(tmp_path, "runs", "get", run_id).stdout, 60, "the approved run")
        # The other one is cancelled: settled, not "in progress", and no PROBLEM in the summary.
        cancelled_id = shlex.split(other, comments=True)[3]
        cancelled = agentrt(tmp_path, "runs", "cancel", cancelled_id, "--reason", "not needed")
        assert cancelled.returncode == 0, cancelled.stderr
        got = agentrt(tmp_path, "runs", "get", cancelled_id)
        assert "CANCELLED" in got.stdout and "pause_reason" not in got.stdout and "runs resume" not in got.stdout, \
            got.stdout
        wait_for(lambda: not approval_lines(), 10, "approvals.txt emptied")

        # Precedence: a flag's credential wins over the file's ...
        bogus = agentrt(tmp_path, "runs", "list", "--api-key", "not-a-key")
        assert bogus.returncode == 1 and "CREDENTIAL_INVALID" in bogus.stderr, bogus.stderr
        # ... and the file's key never goes to another scheduler.
        elsewhere = agentrt(tmp_path, "runs", "list", env={**user_env(), "AGENTRT_ADDR": f"127.0.0.1:{free_port()}"})
        assert elsewhere.returncode == 1 and "give a credential" in elsewhere.stderr, elsewhere.stderr
        listed = agentrt(tmp_path, "keys", "list")
        assert listed.returncode == 0 and "agentrt-dev" in listed.stdout, listed.stderr

        # An executor started where there is no client.json has no token: one line, exit 1, at once.
        elsewhere_dir = tmp_path / "elsewhere"
        elsewhere_dir.mkdir()
        started = time.monotonic()
        refused = agentrt(elsewhere_dir, "executor", "--scheduler", addr, "--agents", "devstack.examples.refund_triage",
                          env={**user_env(), "AGENTRT_HEALTH_ADDR": f"127.0.0.1:{free_port()}"}, timeout=60)
        assert refused.returncode == 1, refused.stderr
        assert time.monotonic() - started < 30
        errors = [x for x in refused.stderr.splitlines() if "agentrt executor: error:" in x]
        assert len(errors) == 1 and "refuses this executor's token" in errors[0], refused.stderr
        assert "trying again" not in refused.stderr
    finally:
        dev.send_signal(signal.SIGINT)
        try:
            dev.wait(timeout=90)
        finally:
            if dev.poll() is None:
                dev.kill()
    output = log.read_text()
    assert dev.returncode == 0, output[-3000:]
    assert "1 cancelled" in output and "PROBLEM" not in output, output[-3000:]
    client = json.loads((tmp_path / ".agentrt" / "client.json").read_text())
    assert client["stopped"] is True and "api_key" not in client


def test_dev_refuses_agents_it_cannot_load_before_starting_anything(tmp_path: Path) -> None:
    started = time.monotonic()
    bad = agentrt(tmp_path, "dev", "--agents", "no_such_agents_module", "--listen", f"127.0.0.1:{free_port()}")
    assert bad.returncode == 1 and time.monotonic() - started < 30
    assert bad.stderr.startswith("agentrt dev: error: --agents: ") and "no_such_agents_module" in bad.stderr, \
        bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and not (tmp_path / ".agentrt").exists()


async def test_a_killed_sessions_key_is_revoked_by_the_next_session(tmp_path: Path, db_url: str) -> None:
    await asyncio.to_thread(killed_then_stopped, tmp_path, db_url)
    conn = await asyncpg.connect(db_url)
    try:
        keys = await conn.fetch("SELECT revoked_at FROM api_keys WHERE name LIKE 'agentrt-dev %'")
    finally:
        await conn.close()
    assert len(keys) == 2 and all(k["revoked_at"] is not None for k in keys)


def killed_then_stopped(tmp_path: Path, db_url: str) -> None:
    def start() -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"dev-{time.monotonic_ns()}.log"
        with open(log, "wb") as out:
            dev = subprocess.Popen([AGENTRT, "dev", "--database-url", db_url, "--listen", f"127.0.0.1:{free_port()}",
                                    "--runs", "0", "--plain", "--executors", "1"], cwd=tmp_path, env=user_env(),
                                   stdout=out, stderr=subprocess.STDOUT)
        def up() -> bool:
            if dev.poll() is not None:
                pytest.fail(log.read_text()[-3000:])
            return "client settings in" in log.read_text()

        wait_for(up, 150, "the stack")
        return dev, log

    first, _ = start()
    first.kill()  # SIGKILL: no chance to revoke its key; then what it had started, by pid
    first.wait()
    state = json.loads((tmp_path / ".agentrt" / "stack.json").read_text())
    for pid in [*state["pids"].values(), state["broker_pid"]]:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    second, log = start()
    second.send_signal(signal.SIGINT)
    assert second.wait(timeout=90) == 0, log.read_text()[-3000:]
