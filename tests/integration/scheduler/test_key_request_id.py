"""A key made by CreateApiKey with a request_id works: the text shown once names the id the key is stored
under (it named a random id, so the scheduler answered "unknown API key" to every use of such a key)."""

import pytest
from auth_support import make_key
from support import scheduler_stack

from shared.gen.agentrt.v1 import run_service_pb2 as rs

pytestmark = pytest.mark.integration


def bearer(secret: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {secret}")]


@pytest.mark.parametrize("request_id", ["", "console-form-1"])
async def test_a_key_made_with_or_without_a_request_id_signs_in(db_url, request_id):
    _, admin = await make_key(db_url, role="admin", tenants=["acme"])
    async with scheduler_stack(db_url, auth_mode="api_key", api_key_cache_ttl_ms=0, work_token="w") as stack:
        made = await stack.runs.CreateApiKey(rs.CreateApiKeyRequest(
            name="bob", role=rs.API_KEY_ROLE_OPERATOR, request_id=request_id), metadata=bearer(admin))
        assert made.key.key_id.replace("-", "") in made.secret
        stats = await stack.runs.GetStats(rs.GetStatsRequest(), metadata=bearer(made.secret))
        assert stats.role == "operator" and made.key.key_id in stats.principal
