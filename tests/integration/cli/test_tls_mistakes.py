"""The two TLS mistakes (issue 26), said in one line, and gRPC's own log lines kept JSON.

No --tls-ca against a TLS scheduler used to end in `UNAVAILABLE … Socket closed`; --tls-ca against
a plaintext one printed a raw gRPC C-core line (absl's `I1203 … ssl_transport_security.cc…`) before
the error, and the same non-JSON line landed in a `log_format: json` scheduler's log.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import run_agentrt
from support import scheduler_stack

from devstack.certs import make_authority
from devstack.embedded_pg import free_port
from shared.transport import ClientTls, open_channel

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca = make_authority(tmp_path / "ca", "agentrt-ca")
    server = ca.issue(tmp_path / "ca", "localhost", stem="server")
    return {"ca": ca.cert, "cert": server.cert, "key": server.key}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRT_", "GRPC_"))}
    return {**env, **extra}


async def cli(*args: str) -> tuple[int, str, str]:
    return await run_agentrt(*args, env=clean_env())


async def test_each_tls_mistake_is_one_line_that_says_what_to_do(db_url, pki):
    async with scheduler_stack(db_url, tls_cert_file=str(pki["cert"]), tls_key_file=str(pki["key"])) as tls, \
            scheduler_stack(db_url) as plain:
        code, out, err = await cli("runs", "list", "--tenant", "t", "--addr", tls.addr)
        assert (code, out) == (1, "")
        assert err == (f"agentrt runs: error: UNAVAILABLE: {tls.addr} hung up on a plaintext connection: it "
                       "probably serves TLS; pass its CA with --tls-ca FILE (or AGENTRT_TLS_CA)\n")
        code, out, err = await cli("runs", "list", "--tenant", "t", "--addr", plain.addr, "--tls-ca", str(pki["ca"]))
        assert (code, out) == (1, "")
        assert err == (f"agentrt runs: error: UNAVAILABLE: {plain.addr} answered the TLS handshake in plaintext: "
                       "it does not serve TLS; drop --tls-ca (and AGENTRT_TLS_CA), or turn TLS on at the scheduler\n")
        # The sweep: every command that talks to the scheduler shares the translation (one error path).
        for command in (["status"], ["agents", "list"], ["runs", "get", "0190d6a0-0000-7000-8000-000000000000"]):
            code, _, err = await cli(*command, "--tenant", "t", "--addr", tls.addr)
            assert code == 1 and err.count("\n") == 1 and "--tls-ca FILE" in err, (command, err)
        # Right settings still work.
        code, _, err = await cli("runs", "list", "--tenant", "t", "--addr", tls.addr, "--tls-ca", str(pki["ca"]),
                                 "--tls-server-name", "localhost")
        assert (code, err) == (0, "")


async def plaintext_refused(addr: str) -> None:
    async with grpc.aio.insecure_channel(addr) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)


async def plaintext_then_tls(addr: str, ca: Path, proc: asyncio.subprocess.Process) -> None:
    """A TLS client until the server serves, then a plaintext one (refused): both are handshakes the
    server logs. The plaintext one comes last, when the server surely listens: tried only before, it
    could have found the port still closed and never reached the server."""
    deadline = time.monotonic() + 60
    tls = ClientTls(ca_file=str(ca), cert_file=None, key_file=None, server_name="localhost")
    while True:
        assert proc.returncode is None, "the scheduler exited"
        async with open_channel(addr, tls) as channel:
            try:
                reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.aio.AioRpcError:
                pass
        assert time.monotonic() < deadline, "the scheduler never served"
        await asyncio.sleep(0.1)
    await plaintext_refused(addr)


@pytest.mark.parametrize("verbosity", ["INFO", None])
async def test_a_json_scheduler_log_stays_json_with_grpcs_own_lines_inside(db_url, pki, tmp_path, verbosity):
    addr = f"127.0.0.1:{free_port()}"
    env = clean_env(AGENTRT_DATABASE_URL=db_url, AGENTRT_LISTEN_ADDR=addr, AGENTRT_LOG_FORMAT="json",
                    AGENTRT_AUTH_MODE="none", AGENTRT_TLS_CERT_FILE=str(pki["cert"]),
                    AGENTRT_TLS_KEY_FILE=str(pki["key"]), AGENTRT_SHUTDOWN_GRACE_S="1",
                    AGENTRT_METRICS_ADDR=f"127.0.0.1:{free_port()}",
                    **({"GRPC_VERBOSITY": verbosity} if verbosity else {}))
    err_path = tmp_path / "scheduler.stderr"
    with err_path.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "cli", "scheduler", cwd=REPO,
                                                    env=env, stdout=asyncio.subprocess.DEVNULL, stderr=err,
                                                    stdin=asyncio.subprocess.DEVNULL)
    try:
        await plaintext_then_tls(addr, pki["ca"], proc)
        if verbosity == "INFO":  # the C core logs the refused handshake on its own thread: wait for the line
            deadline = time.monotonic() + 15
            while "Handshake failed" not in err_path.read_text():
                assert time.monotonic() < deadline, "no handshake failure logged"
                await asyncio.sleep(0.1)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()
    lines = [line for line in err_path.read_text().splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"a non-JSON line in the json log: {line[:300]}") from None
    assert records and all(r.get("service") and r.get("level") and "message" in r for r in records)
    core = [r for r in records if r["logger"] == "grpc.core"]
    if verbosity == "INFO":  # C core's INFO line about the plaintext client, inside the log as a record
        assert any("Handshake failed" in r["message"] and r["source"].startswith("ssl_transport_security")
                   for r in core), core
    else:  # agentrt's default for the C core is ERROR: a refused plaintext client is not an error
        assert not core, core
