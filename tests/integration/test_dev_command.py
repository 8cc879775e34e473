"""`agentrt dev` (what `make dev` runs) brings the scheduler up on embedded PostgreSQL."""

import os
import signal
import subprocess
import sys
import time

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


def test_dev_serves_health_and_reflection_then_stops_everything(tmp_path):
    addr = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "AGENTRT_DATABASE_URL"}
    proc = subprocess.Popen([sys.executable, "-m", "devstack.cli", "dev", "--data-dir", str(tmp_path / "dev"),
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
        pg_pid = int((tmp_path / "dev" / "pg" / "postmaster.pid").read_text().splitlines()[0])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        # Nothing left running: the embedded server it started is gone.
        assert not pid_alive(pg_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
