"""`agentrt dev` (what `make dev` runs) brings the scheduler up on embedded PostgreSQL."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tests_paths import REPO

from devstack.embedded_pg import free_port, pid_alive

pytestmark = pytest.mark.integration


def _read_until(proc: subprocess.Popen, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if needle in line:
            return "".join(seen)
    raise AssertionError(f"{needle!r} not printed in {timeout}s; output:\n{''.join(seen)}")


def _processes_naming(text: str) -> list[int]:
    """Live processes whose command line holds `text`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_dev_serves_health_and_reflection_then_stops_everything(tmp_path):
    addr = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "AGENTRT_DATABASE_URL"}
    proc = subprocess.Popen([sys.executable, "-m", "cli", "dev", "--data-dir", str(tmp_path / "dev"),
                             "--listen", addr], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        _read_until(proc, "scheduler serving", 120)
        with grpc.insecure_channel(addr) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            replies = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                      timeout=5)
            names = {s.name for reply in replies for s in reply.list_services_response.service}
        assert {"agentrt.v1.RunService", "agentrt.v1.WorkService", "grpc.health.v1.Health"} <= names
        # The operator console comes up beside it, and dev prints where.
        line = _read_until(proc, "console on http://", 120).splitlines()[-1]
        console_url = line.split("console on ", 1)[1].split(";")[0].strip()
        with urllib.request.urlopen(f"{console_url}/signin", timeout=10) as reply:
            assert reply.status == 200 and b"Sign in to the agentrt console" in reply.read()
        pg_pid = int((tmp_path / "dev" / "pg" / "postmaster.pid").read_text().splitlines()[0])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        # Nothing left running: the embedded server it started is gone, and so is the console.
        assert not pid_alive(pg_pid)
        console_pid = json.loads((tmp_path / "dev" / "stack.json").read_text())["pids"]["console"]
        assert console_pid and not pid_alive(console_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("when", ["embedded PostgreSQL on", "embedded Kafka-protocol broker", "schema at version",
                                  "scheduler serving", "mock tool server on"])  # the last: while the console starts
def test_ctrl_c_while_starting_prints_one_clean_line_and_stops_everything(tmp_path, when):
    """A terminal's Ctrl-C goes to the whole foreground process group: agentrt dev and any child
    not in a session of its own (the bug: the migration died of it, `migrate failed: 130`)."""
    addr = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTRT_DATABASE_URL", "AGENTRT_KAFKA_BOOTSTRAP")}
    proc = subprocess.Popen([sys.executable, "-m", "cli", "dev", "--data-dir", str(tmp_path / "dev"),
                             "--listen", addr, "--plain"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        seen = _read_until(proc, when, 120)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal does
        rest, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = seen + rest
    assert "migrate failed" not in output and "error" not in output.replace("interrupted", ""), output
    assert "stopped ," not in output and "Traceback" not in output, output
    interrupted = [line for line in output.splitlines() if "interrupted" in line]
    # One line (or none, when the start had just finished: then it is a normal stop), exit 0 as any stop.
    assert interrupted in ([], ["agentrt dev: interrupted while starting; stopping what had started"]), output
    assert proc.returncode == 0, output
    pidfile = tmp_path / "dev" / "pg" / "postmaster.pid"
    assert not pidfile.exists(), "embedded PostgreSQL left running"
    # Nor the console (started in a session of its own, so the terminal's Ctrl-C does not reach it).
    assert not _processes_naming(f"console --scheduler {addr}")
    state = tmp_path / "dev" / "stack.json"
    if state.exists():
        import json

        pids = [p for p in json.loads(state.read_text())["pids"].values() if p]
        assert not [p for p in pids if pid_alive(p)]
