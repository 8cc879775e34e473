"""The tenant gate (issue 24, defect 4): an `x-tenant-id` the credential may not act for is refused
PERMISSION_DENIED (TENANT_NOT_ALLOWED) by every RunService method, before anything is read or
written: the methods scoped by the credential rather than the header (keys, limits, audit) too.

The methods are found by reflection on the generated RunService descriptor, so a new method is
covered without being listed here.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from auth_support import Issuer, make_key
from db_snapshot import snapshot_all
from google.protobuf import message_factory
from google.protobuf.message import Message
from support import TENANT, scheduler_stack
from test_auth import auth_settings, bearer, refusal, world_of
from test_bad_input import RUN_RPCS, World, base_request

from shared.gen.agentrt.v1 import run_service_pb2 as rs

pytestmark = pytest.mark.integration
OTHER = "globex"  # a tenant none of the credentials below may act for
RUN_SERVICE = rs.DESCRIPTOR.services_by_name["RunService"]


def request_for(method: Any, world: World) -> Message:
    """An acceptable request where test_bad_input has one; else the method's empty request message."""
    if method.name in RUN_RPCS:
        return base_request(method.name, world)
    return message_factory.GetMessageClass(method.input_type)()


@pytest.fixture
def issuer(tmp_path):
    return Issuer(tmp_path)


async def test_every_run_service_method_refuses_a_tenant_header_the_credential_does_not_hold(db_url, issuer):
    world = await world_of(db_url)
    own_admin = (await make_key(db_url, role="admin", tenants=[TENANT]))[1]
    two_admin = (await make_key(db_url, role="admin", tenants=[TENANT, "initech"]))[1]
    credentials = {
        "one tenant's admin key": own_admin,
        "two tenants' admin key": two_admin,
        "one tenant's admin JWT": issuer.token(tenant=TENANT, roles=["admin"], sub="root"),
        "one tenant's viewer key": (await make_key(db_url, role="viewer", tenants=[TENANT]))[1],
    }
    methods = list(RUN_SERVICE.methods)
    assert {m.name for m in methods} >= {"ListApiKeys", "RevokeApiKey", "SubmitRun"}
    async with scheduler_stack(db_url, **auth_settings(issuer)) as stack:
        before = await snapshot_all(db_url)
        outcomes = {(kind, method.name): await refusal(stack, method.name, request_for(method, world),
                                                       bearer(credential, OTHER))
                    for kind, credential in credentials.items() for method in methods}
        after = await snapshot_all(db_url)
        # The same credential and request with its own tenant named (or none) is not refused by the gate.
        for name in ("ListApiKeys", "RevokeApiKey"):
            code, _ = await refusal(stack, name, base_request(name, world), bearer(own_admin, TENANT))
            assert code == grpc.StatusCode.OK, name
    wrong = {key: outcome for key, outcome in outcomes.items()
             if outcome[0] != grpc.StatusCode.PERMISSION_DENIED
             # A viewer lacks most verbs: the role check refuses first, also PERMISSION_DENIED.
             or outcome[1] not in ("TENANT_NOT_ALLOWED", "ROLE_FORBIDS" if "viewer" in key[0] else None)}
    assert not wrong, wrong
    assert {outcome for (kind, _), outcome in outcomes.items() if "admin" in kind} == {
        (grpc.StatusCode.PERMISSION_DENIED, "TENANT_NOT_ALLOWED")}
    assert after == before, "a call refused by the tenant gate changed rows"


async def test_auth_mode_none_still_takes_any_tenant_and_checks_the_header_on_every_method(db_url):
    """auth_mode none trusts the header (any tenant), but a malformed one is refused by every method."""
    world = await world_of(db_url)
    async with scheduler_stack(db_url) as stack:
        before = await snapshot_all(db_url)
        for method in RUN_SERVICE.methods:
            code, reason = await refusal(stack, method.name, request_for(method, world),
                                         [("x-tenant-id", "bad tenant!")])
            assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"), method.name
        assert await snapshot_all(db_url) == before
        code, _ = await refusal(stack, "ListApiKeys", rs.ListApiKeysRequest(), [("x-tenant-id", OTHER)])
        assert code == grpc.StatusCode.OK
