"""The pieces of authentication that need no server: roles, auth modes, key text, tenant choice,
and the refusal to send credentials in clear."""

from __future__ import annotations

import asyncio
import itertools
import uuid

import pytest
from pydantic import ValidationError

from executor.config import ExecutorSettings
from scheduler.api.auth import ANONYMOUS, DbClock, KeyCache, Principal, new_api_key, parse_api_key, secret_hash
from scheduler.config import SchedulerSettings
from scheduler.security.rbac import ROLE_ORDER, ROLES, RPC_VERBS, VERBS, parse_auth_mode, verbs_of
from scheduler.store.auth import KeyForAuth
from shared.errors import CredentialInvalid, InvalidArgument, TenantForbidden
from shared.gen.agentrt.v1 import run_service_pb2


def test_roles_are_cumulative_and_every_rpc_needs_a_known_verb():
    for lower, higher in itertools.pairwise(ROLE_ORDER):
        assert ROLES[lower] < ROLES[higher]
    assert set(RPC_VERBS.values()) <= set(VERBS)
    methods = {m.name for m in run_service_pb2.DESCRIPTOR.services_by_name["RunService"].methods}
    assert set(RPC_VERBS) == methods
    assert verbs_of(["viewer", "no-such-role"]) == ROLES["viewer"]
    assert verbs_of([]) == frozenset()


@pytest.mark.parametrize("text, modes", [("api_key", {"api_key"}), ("jwt", {"jwt"}),
                                          ("api_key,jwt", {"api_key", "jwt"}), (" none ", {"none"})])
def test_auth_modes(text, modes):
    assert parse_auth_mode(text) == modes


@pytest.mark.parametrize("text", ["", "basic", "none,api_key", "api_key,oauth"])
def test_bad_auth_modes_are_refused_in_one_line(text):
    with pytest.raises(ValueError, match="auth_mode"):
        parse_auth_mode(text)
    with pytest.raises(ValidationError, match="auth_mode"):
        SchedulerSettings(auth_mode=text)


def test_jwt_mode_needs_its_issuer_audience_and_keys():
    with pytest.raises(ValidationError, match="jwt_issuer"):
        SchedulerSettings(auth_mode="jwt", jwt_issuer="https://idp")
    with pytest.raises(ValidationError, match="jwt_jwks_file"):
        SchedulerSettings(auth_mode="jwt", jwt_issuer="i", jwt_audience="a", jwt_jwks_file="f", jwt_jwks_url="u")
    assert SchedulerSettings(auth_mode="jwt", jwt_issuer="i", jwt_audience="a", jwt_jwks_url="https://x").auth_mode


def test_tls_settings_go_together():
    with pytest.raises(ValidationError, match="tls_key_file"):
        SchedulerSettings(tls_cert_file="c.pem")
    with pytest.raises(ValidationError, match="mutual TLS"):
        SchedulerSettings(work_client_identities=["executor"])


def test_api_key_text_round_trips_and_malformed_keys_are_refused():
    key_id, text, digest = new_api_key()
    parsed_id, secret = parse_api_key(text)
    assert parsed_id == key_id and secret_hash(secret) == digest and text.startswith("agrt_")
    for bad in ("agrt_", "agrt_nothex_" + "0" * 64, f"agrt_{key_id.hex}_short", "Bearer x", text[:-1]):
        with pytest.raises(CredentialInvalid):
            parse_api_key(bad)


def principal(tenants: tuple[str, ...], role: str = "operator") -> Principal:
    return Principal("api_key", f"key:{uuid.uuid4()}", "k", (role,), tenants, ROLES[role])


def test_the_tenant_of_a_call():
    one = principal(("acme",))
    assert one.tenant_of_call([]) == "acme"
    assert one.tenant_of_call([("x-tenant-id", "acme")]) == "acme"
    with pytest.raises(TenantForbidden):
        one.tenant_of_call([("x-tenant-id", "globex")])
    several = principal(("*",), "admin")
    assert several.tenant_of_call([("x-tenant-id", "globex")]) == "globex"
    with pytest.raises(InvalidArgument, match="x-tenant-id"):
        several.tenant_of_call([])
    assert ANONYMOUS.tenant_of_call([("x-tenant-id", "any")]) == "any"


def test_an_executor_refuses_to_send_its_token_in_clear():
    with pytest.raises(ValidationError, match="in clear"):
        ExecutorSettings(work_token="s3cret")
    with pytest.raises(ValidationError, match="in clear"):
        ExecutorSettings(run_api_key="agrt_x")
    assert ExecutorSettings(work_token="s3cret", scheduler_insecure=True).work_token is not None
    tls = ExecutorSettings(work_token="s3cret", scheduler_tls_ca_file="/etc/ca.crt").scheduler_tls
    assert tls is not None and tls.ca_file == "/etc/ca.crt"


class CountingSource:
    """A key store in memory that counts its reads (the cache's database)."""

    def __init__(self, keys: dict) -> None:
        self.keys = keys
        self.reads = 0
        self.gate: asyncio.Event | None = None

    async def key_for_auth(self, key_id):
        self.reads += 1
        if self.gate is not None:
            await self.gate.wait()
        return self.keys.get(key_id)

    async def database_epoch(self) -> float:
        return 1_700_000_000.0


async def test_key_cache_keeps_real_keys_through_a_flood_of_made_up_ids_and_shares_lookups():
    key_id, text, digest = new_api_key()
    row = KeyForAuth(key_id, "k", ("acme",), "viewer", digest, False, None)
    source = CountingSource({key_id: row})
    cache = KeyCache(source, DbClock(source), ttl_s=60, size=10, unknown_size=5)
    assert (await cache.principal(text)).tenants == ("acme",)
    for _ in range(50):  # unknown ids evict only each other
        with pytest.raises(CredentialInvalid):
            await cache.principal(f"agrt_{uuid.uuid4().hex}_{'0' * 64}")
    reads = source.reads
    await cache.principal(text)
    assert source.reads == reads  # still cached
    cache.forget(key_id)
    source.gate = asyncio.Event()
    calls = [asyncio.create_task(cache.principal(text)) for _ in range(20)]
    await asyncio.sleep(0.01)
    source.gate.set()
    assert {p.id for p in await asyncio.gather(*calls)} == {f"key:{key_id}"}
    assert source.reads == reads + 1  # twenty concurrent calls, one read
