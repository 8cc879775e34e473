"""TLS on the scheduler's port: plaintext and foreign CAs are refused, mutual TLS identifies
executors, and a rotated certificate takes effect without a restart."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import pytest
from executor_support import executor, scripted_agent, wait_for, write_agent
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import TENANT, scheduler_stack

from devstack.certs import make_authority
from shared.errors import error_info
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.gen.agentrt.v1 import work_service_pb2_grpc as ws_grpc
from shared.transport import ClientTls, open_channel

pytestmark = pytest.mark.integration


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca, other = make_authority(tmp_path / "ca", "agentrt-ca"), make_authority(tmp_path / "other", "other-ca")
    server = ca.issue(tmp_path / "ca", "localhost", stem="server")
    executor_cert = ca.issue(tmp_path / "ca", "executor", client=True, dns=("executor",), ips=())
    intruder = ca.issue(tmp_path / "ca", "intruder", client=True, dns=("intruder",), ips=())
    foreign = other.issue(tmp_path / "other", "executor", client=True, dns=("executor",), ips=(), stem="foreign")
    other_server = other.issue(tmp_path / "other", "localhost", stem="server")
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(server.cert, live / "tls.crt")
    shutil.copy(server.key, live / "tls.key")
    return {"ca": ca.cert, "other_ca": other.cert, "cert": live / "tls.crt", "key": live / "tls.key",
            "executor_cert": executor_cert.cert, "executor_key": executor_cert.key,
            "intruder_cert": intruder.cert, "intruder_key": intruder.key,
            "foreign_cert": foreign.cert, "foreign_key": foreign.key,
            "other_server_cert": other_server.cert, "other_server_key": other_server.key}


def tls_settings(pki: dict[str, Path], mutual: bool = False, **extra: object) -> dict[str, object]:
    values: dict[str, object] = {"tls_cert_file": str(pki["cert"]), "tls_key_file": str(pki["key"]), **extra}
    if mutual:
        values["tls_client_ca_file"] = str(pki["ca"])
    return values


async def health(addr: str, tls: ClientTls | None) -> grpc.StatusCode:
    async with open_channel(addr, tls) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def client(pki: dict[str, Path], ca: str = "ca", cert: str | None = None) -> ClientTls:
    return ClientTls(ca_file=str(pki[ca]), cert_file=str(pki[f"{cert}_cert"]) if cert else None,
                     key_file=str(pki[f"{cert}_key"]) if cert else None, server_name="localhost")


async def test_plaintext_and_a_foreign_ca_are_refused(db_url, pki):
    async with scheduler_stack(db_url, **tls_settings(pki)) as stack:
        assert await health(stack.addr, client(pki)) == grpc.StatusCode.OK
        assert await health(stack.addr, None) == grpc.StatusCode.UNAVAILABLE  # plaintext to a TLS port
        assert await health(stack.addr, client(pki, ca="other_ca")) == grpc.StatusCode.UNAVAILABLE
        async with open_channel(stack.addr, client(pki)) as channel:
            runs = stack.runs.__class__(channel)
            reply = await runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo"), metadata=stack.md(TENANT))
            assert reply.created


async def test_mutual_tls_needs_a_client_certificate_of_the_ca(db_url, pki):
    async with scheduler_stack(db_url, **tls_settings(pki, mutual=True)) as stack:
        assert await health(stack.addr, client(pki, cert="executor")) == grpc.StatusCode.OK
        assert await health(stack.addr, client(pki)) == grpc.StatusCode.UNAVAILABLE  # no client certificate
        assert await health(stack.addr, client(pki, cert="foreign")) == grpc.StatusCode.UNAVAILABLE


async def claim_as(addr: str, tls: ClientTls) -> tuple[grpc.StatusCode, str | None]:
    async with open_channel(addr, tls) as channel:
        try:
            await ws_grpc.WorkServiceStub(channel).ClaimWork(
                ws.ClaimWorkRequest(worker_id="w-tls", agents=["demo"], wait_ms=0), timeout=10)
        except grpc.aio.AioRpcError as error:
            info = error_info(error)
            return error.code(), info.reason if info else None
    return grpc.StatusCode.OK, None


async def test_work_service_takes_the_allowed_identity_only(db_url, pki):
    settings = tls_settings(pki, mutual=True, work_client_identities=["executor"], work_token="s3cret")
    async with scheduler_stack(db_url, **settings) as stack:
        assert await claim_as(stack.addr, client(pki, cert="executor")) == (grpc.StatusCode.OK, None)
        assert await claim_as(stack.addr, client(pki, cert="intruder")) == (
            grpc.StatusCode.UNAUTHENTICATED, "EXECUTOR_TOKEN_REQUIRED")


async def test_an_executor_runs_a_run_over_mutual_tls(db_url, pki, tmp_path):
    settings = tls_settings(pki, mutual=True, work_client_identities=["executor"])
    agents = tmp_path / "agents"
    write_agent(agents, scripted_agent("tls-agent", [{"id": "done", "finish": {"ok": True}}], []))
    async with scheduler_stack(db_url, **settings) as stack:
        async with open_channel(stack.addr, client(pki, cert="executor")) as channel:
            runs = stack.runs.__class__(channel)
            run = (await runs.SubmitRun(rs.SubmitRunRequest(agent_name="tls-agent"),
                                        metadata=stack.md(TENANT))).run
            async with executor(stack, agents, scheduler_tls_ca_file=str(pki["ca"]),
                                scheduler_tls_cert_file=str(pki["executor_cert"]),
                                scheduler_tls_key_file=str(pki["executor_key"]),
                                scheduler_tls_server_name="localhost"):
                async def done() -> bool:
                    got = await runs.GetRun(rs.GetRunRequest(run_id=run.run_id), metadata=stack.md(TENANT))
                    return json.loads(got.result_json or "null") == {"ok": True}

                await wait_for(done, within=30, what="the run to complete over mutual TLS")


async def test_a_rotated_certificate_is_served_without_a_restart(db_url, pki):
    async with scheduler_stack(db_url, **tls_settings(pki)) as stack:
        assert await health(stack.addr, client(pki)) == grpc.StatusCode.OK
        # Rotate to a certificate of another CA: new connections need that CA, the old one fails.
        shutil.copy(pki["other_server_key"], pki["key"])
        shutil.copy(pki["other_server_cert"], pki["cert"])

        async def rotated() -> bool:
            return await health(stack.addr, client(pki, ca="other_ca")) == grpc.StatusCode.OK

        await wait_for(rotated, within=10, what="the new certificate to be served")
        assert await health(stack.addr, client(pki)) == grpc.StatusCode.UNAVAILABLE


async def test_only_the_common_name_and_dns_names_identify_an_executor(db_url, pki, tmp_path):
    """An IP address in a certificate is no identity, even one equal to an allowed name."""
    ca = make_authority(tmp_path / "ip", "ip-ca")
    by_ip = ca.issue(tmp_path / "ip", "someone", client=True, dns=(), ips=("127.0.0.1",))
    by_dns = ca.issue(tmp_path / "ip", "someone-else", client=True, dns=("127.0.0.1",), ips=(), stem="dns")
    server = ca.issue(tmp_path / "ip", "localhost", stem="server")
    settings = {"tls_cert_file": str(server.cert), "tls_key_file": str(server.key),
                "tls_client_ca_file": str(ca.cert), "work_client_identities": ["127.0.0.1"]}
    async with scheduler_stack(db_url, **settings) as stack:
        ip_client = ClientTls(str(ca.cert), str(by_ip.cert), str(by_ip.key), "localhost")
        dns_client = ClientTls(str(ca.cert), str(by_dns.cert), str(by_dns.key), "localhost")
        assert await claim_as(stack.addr, ip_client) == (grpc.StatusCode.UNAUTHENTICATED, "EXECUTOR_TOKEN_REQUIRED")
        assert await claim_as(stack.addr, dns_client) == (grpc.StatusCode.OK, None)
