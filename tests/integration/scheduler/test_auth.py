"""RunService authentication and authorization: every credential kind × role × RPC, tenants taken
from the credential, revocation across replicas, and the audit trail (docs/keys-and-tls.md)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import asyncpg
import grpc
import pytest
from auth_support import ROLES, Issuer, expire_key, make_key
from executor_support import wait_for
from support import TENANT, scheduler_stack, submit
from test_bad_input import RUN_RPCS, World, base_request, build_world, snapshot

from scheduler.security.rbac import ROLES as ROLE_VERBS
from scheduler.security.rbac import RPC_VERBS
from shared.errors import error_info
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration
REFUSED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
EVERY_TENANT_RPCS = ("SetLimit", "ClearLimit")  # limits.manage with a credential for every tenant ('*') only


def bearer(credential: str | None, tenant: str | None = None) -> list[tuple[str, str]]:
    metadata = [("authorization", f"Bearer {credential}")] if credential else []
    return metadata + ([("x-tenant-id", tenant)] if tenant else [])


async def call(stack: Any, rpc: str, request: Any, metadata: list[tuple[str, str]]) -> grpc.StatusCode:
    try:
        await getattr(stack.runs, rpc)(request, metadata=metadata, timeout=20)
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


async def refusal(stack: Any, rpc: str, request: Any, metadata: list[tuple[str, str]]) -> tuple[Any, str | None]:
    try:
        await getattr(stack.runs, rpc)(request, metadata=metadata, timeout=20)
    except grpc.aio.AioRpcError as error:
        info = error_info(error)
        return error.code(), info.reason if info else None
    return grpc.StatusCode.OK, None


@pytest.fixture
def issuer(tmp_path):
    return Issuer(tmp_path)


async def world_of(db_url: str) -> World:
    """The runs every request refers to, built before authentication is on."""
    async with scheduler_stack(db_url) as open_stack:
        return await build_world(open_stack)


def auth_settings(issuer: Issuer, **extra: Any) -> dict[str, Any]:
    return {"auth_mode": "api_key,jwt", **issuer.settings(), "api_key_cache_ttl_ms": 300, "work_token": "w-secret",
            **extra}


async def bad_credentials(db_url: str, issuer: Issuer) -> dict[str, str | None]:
    revoked_id, revoked = await make_key(db_url, role="admin", tenants=[TENANT])
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("UPDATE api_keys SET revoked_at = clock_timestamp(), revoked_by = 'tests' WHERE id = $1",
                           uuid.UUID(revoked_id))
    finally:
        await conn.close()
    expired_id, expired = await make_key(db_url, role="admin", tenants=[TENANT])
    await expire_key(db_url, expired_id)
    other = Issuer(issuer.directory / "other")
    return {
        "no credential": None,
        "unknown API key": "agrt_" + uuid.uuid4().hex + "_" + "0" * 64,
        "wrong API key secret": expired.rsplit("_", 1)[0] + "_" + "f" * 64,
        "revoked API key": revoked,
        "expired API key": expired,
        "malformed": "not-a-credential",
        "expired JWT": issuer.token(tenant=TENANT, roles=["admin"], exp_in_s=-120),
        "JWT wrong issuer": issuer.token(tenant=TENANT, roles=["admin"], issuer="https://evil.invalid"),
        "JWT wrong audience": issuer.token(tenant=TENANT, roles=["admin"], audience="someone-else"),
        "JWT bad signature": issuer.token(tenant=TENANT, roles=["admin"], key=other.key),
        "JWT alg none": issuer.unsigned(tenant=TENANT),
        "JWT unknown kid": issuer.token(tenant=TENANT, roles=["admin"], kid="k-unknown"),
    }


async def test_every_bad_credential_is_unauthenticated_on_every_rpc_and_changes_nothing(db_url, issuer):
    world = await world_of(db_url)
    bad = await bad_credentials(db_url, issuer)
    async with scheduler_stack(db_url, **auth_settings(issuer)) as stack:
        before = await snapshot(db_url)
        outcomes = {(kind, rpc): await refusal(stack, rpc, base_request(rpc, world), bearer(credential, TENANT))
                    for kind, credential in bad.items() for rpc in RUN_RPCS}
        assert await snapshot(db_url) == before
    wrong = {key: value for key, value in outcomes.items() if value[0] != grpc.StatusCode.UNAUTHENTICATED}
    assert not wrong
    reasons = {kind: {reason for (k, _), (_, reason) in outcomes.items() if k == kind} for kind in bad}
    assert reasons["no credential"] == {"CREDENTIAL_REQUIRED"}
    assert reasons["expired API key"] == {"CREDENTIAL_EXPIRED"}
    assert reasons["expired JWT"] == {"CREDENTIAL_EXPIRED"}
    assert reasons["revoked API key"] == reasons["JWT alg none"] == {"CREDENTIAL_INVALID"}


async def test_each_role_reaches_exactly_its_verbs_with_keys_and_tokens(db_url, issuer):
    """API key and JWT × the four roles × every RPC: a verb the role lacks answers PERMISSION_DENIED
    (ROLE_FORBIDS) and changes nothing; a verb it has is never refused by authentication."""
    world = await world_of(db_url)
    credentials: dict[tuple[str, str], str] = {}
    for role in ROLES:
        credentials[("api_key", role)] = (await make_key(db_url, role=role, tenants=[TENANT]))[1]
        credentials[("jwt", role)] = issuer.token(tenant=TENANT, roles=[role], sub=f"{role}-user")
    async with scheduler_stack(db_url, **auth_settings(issuer)) as stack:
        for (kind, role), credential in credentials.items():
            granted = ROLE_VERBS[role]
            denied = [rpc for rpc in RUN_RPCS if RPC_VERBS[rpc] not in granted]
            before = await snapshot(db_url)
            for rpc in denied:
                assert await refusal(stack, rpc, base_request(rpc, world), bearer(credential)) == (
                    grpc.StatusCode.PERMISSION_DENIED, "ROLE_FORBIDS"), (kind, role, rpc)
            assert await snapshot(db_url) == before, (kind, role)
            for rpc in RUN_RPCS:
                if rpc in EVERY_TENANT_RPCS and rpc not in denied:  # the verb, but one tenant's credential
                    assert await refusal(stack, rpc, base_request(rpc, world), bearer(credential)) == (
                        grpc.StatusCode.PERMISSION_DENIED, "TENANT_NOT_ALLOWED"), (kind, role, rpc)
                elif rpc not in denied:
                    code = await call(stack, rpc, base_request(rpc, world), bearer(credential))
                    assert code not in REFUSED, (kind, role, rpc, code)
    assert sum(RPC_VERBS[r] not in ROLE_VERBS["viewer"] for r in RUN_RPCS) == 16  # the matrix has refusals


async def test_changing_flow_limits_takes_an_admin_of_every_tenant(db_url, issuer):
    """Limits keep tenants from one another: a tenant's own admin may read them, not change them."""
    world = await world_of(db_url)
    _, every = await make_key(db_url, role="admin", tenants=["*"])
    _, viewer = await make_key(db_url, role="viewer", tenants=[TENANT])
    async with scheduler_stack(db_url, **auth_settings(issuer)) as stack:
        assert await call(stack, "SetLimit", base_request("SetLimit", world), bearer(every)) == grpc.StatusCode.OK
        assert await call(stack, "ListLimits", base_request("ListLimits", world), bearer(viewer)) == \
            grpc.StatusCode.OK
        assert await call(stack, "ClearLimit", base_request("ClearLimit", world), bearer(every)) == \
            grpc.StatusCode.OK


async def test_the_tenant_comes_from_the_credential(db_url, issuer):
    async with scheduler_stack(db_url) as open_stack:
        theirs = await submit(open_stack, tenant="globex")
        ours = await submit(open_stack, tenant=TENANT)
    _, key = await make_key(db_url, role="operator", tenants=[TENANT])
    _, admin_all = await make_key(db_url, role="admin", tenants=["*"])
    _, admin_two = await make_key(db_url, role="admin", tenants=[TENANT, "globex"])
    async with scheduler_stack(db_url, **auth_settings(issuer)) as stack:
        get = rs.GetRunRequest
        # Without x-tenant-id the key's own tenant; naming another one is refused, naming its own is fine.
        assert await call(stack, "GetRun", get(run_id=ours.run_id), bearer(key)) == grpc.StatusCode.OK
        assert await call(stack, "GetRun", get(run_id=ours.run_id), bearer(key, TENANT)) == grpc.StatusCode.OK
        assert await refusal(stack, "GetRun", get(run_id=theirs.run_id), bearer(key, "globex")) == (
            grpc.StatusCode.PERMISSION_DENIED, "TENANT_NOT_ALLOWED")
        assert await call(stack, "GetRun", get(run_id=theirs.run_id), bearer(key)) == grpc.StatusCode.NOT_FOUND
        # A credential of several tenants chooses with the header, and must choose.
        for several in (admin_all, admin_two):
            assert await call(stack, "GetRun", get(run_id=theirs.run_id), bearer(several, "globex")) == \
                grpc.StatusCode.OK
            assert await call(stack, "GetRun", get(run_id=theirs.run_id), bearer(several)) == \
                grpc.StatusCode.INVALID_ARGUMENT
        assert await refusal(stack, "GetRun", get(run_id=theirs.run_id), bearer(admin_two, "initech")) == (
            grpc.StatusCode.PERMISSION_DENIED, "TENANT_NOT_ALLOWED")
        # A token of several tenants that is not an admin's is refused outright.
        token = issuer.token(tenant=[TENANT, "globex"], roles=["operator"])
        assert await refusal(stack, "GetRun", get(run_id=ours.run_id), bearer(token, TENANT)) == (
            grpc.StatusCode.PERMISSION_DENIED, "ROLE_FORBIDS")
        for claim in ("*", [TENANT, "*"], "bad tenant!"):  # a token never holds every tenant, nor a non-id
            forged = issuer.token(tenant=claim, roles=["admin"])
            assert await refusal(stack, "GetRun", get(run_id=ours.run_id), bearer(forged, TENANT)) == (
                grpc.StatusCode.UNAUTHENTICATED, "CREDENTIAL_INVALID")
        admin_token = issuer.token(tenant=[TENANT, "globex"], roles=["admin"])
        assert await call(stack, "GetRun", get(run_id=theirs.run_id), bearer(admin_token, "globex")) == \
            grpc.StatusCode.OK
        # SubmitRun lands in the credential's tenant.
        reply = await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo"), metadata=bearer(key))
        assert reply.run.tenant_id == TENANT


async def test_a_revoked_key_stops_on_every_replica_within_the_cache_ttl(db_url, issuer):
    _, admin = await make_key(db_url, role="admin", tenants=[TENANT])
    settings = auth_settings(issuer, api_key_cache_ttl_ms=1000)
    async with scheduler_stack(db_url, **settings) as one, scheduler_stack(db_url, **settings) as two:
        created = await one.runs.CreateApiKey(rs.CreateApiKeyRequest(name="ci", role=rs.API_KEY_ROLE_VIEWER),
                                              metadata=bearer(admin))
        for stack in (one, two):
            assert await call(stack, "GetStats", rs.GetStatsRequest(), bearer(created.secret)) == grpc.StatusCode.OK
        await one.runs.RevokeApiKey(rs.RevokeApiKeyRequest(key_id=created.key.key_id), metadata=bearer(admin))
        revoked_at = time.monotonic()
        assert await call(one, "GetStats", rs.GetStatsRequest(), bearer(created.secret)) == \
            grpc.StatusCode.UNAUTHENTICATED  # the replica that revoked it: at once

        async def refused_by_two() -> bool | None:
            code = await call(two, "GetStats", rs.GetStatsRequest(), bearer(created.secret))
            return True if code == grpc.StatusCode.UNAUTHENTICATED else None

        await wait_for(refused_by_two, within=5, what="the other replica to refuse the revoked key", interval=0.05)
        assert time.monotonic() - revoked_at < 1.0 + 0.5  # the other replica: within the ttl


async def test_an_expiring_key_expires_by_database_time(db_url, issuer):
    key_id, key = await make_key(db_url, role="viewer", tenants=[TENANT], expires_in_s=3600)
    async with scheduler_stack(db_url, **auth_settings(issuer, api_key_cache_ttl_ms=0)) as stack:
        assert await call(stack, "GetStats", rs.GetStatsRequest(), bearer(key)) == grpc.StatusCode.OK
        await expire_key(db_url, key_id)
        assert await refusal(stack, "GetStats", rs.GetStatsRequest(), bearer(key)) == (
            grpc.StatusCode.UNAUTHENTICATED, "CREDENTIAL_EXPIRED")


async def test_auth_mode_none_is_reported_and_api_key_mode_refuses_tokens(db_url, issuer):
    async with scheduler_stack(db_url) as stack:
        stats = await stack.runs.GetStats(rs.GetStatsRequest(), metadata=stack.md())
        assert (stats.auth_mode, stats.principal) == ("none", "anonymous")
    _, key = await make_key(db_url, role="viewer", tenants=[TENANT])
    async with scheduler_stack(db_url, auth_mode="api_key", work_token="w-secret") as stack:
        stats = await stack.runs.GetStats(rs.GetStatsRequest(), metadata=bearer(key))
        assert stats.auth_mode == "api_key" and stats.principal.startswith("key:") and stats.role == "viewer"
        token = issuer.token(tenant=TENANT, roles=["admin"])
        assert await refusal(stack, "GetStats", rs.GetStatsRequest(), bearer(token)) == (
            grpc.StatusCode.UNAUTHENTICATED, "CREDENTIAL_INVALID")


async def test_a_scheduler_with_authentication_will_not_leave_work_service_open(db_url, issuer):
    with pytest.raises(ValueError, match="WorkService would be open"):
        async with scheduler_stack(db_url, auth_mode="api_key"):
            pass
    async with scheduler_stack(db_url, auth_mode="api_key", work_service_open=True) as stack:  # said on purpose
        reply = await stack.work.ClaimWork(ws.ClaimWorkRequest(worker_id="w", agents=["demo"], wait_ms=0))
        assert not reply.HasField("lease")
