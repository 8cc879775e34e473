"""Credentials for the tests about authentication: API keys written through the store, and an
OIDC issuer of our own (an RSA key, a JWKS file, tokens signed with PyJWT)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from scheduler.api.auth import local_principal, new_api_key
from scheduler.config import SchedulerSettings
from scheduler.store import Store
from shared.db import init_connection

ISSUER = "https://idp.test.invalid"
AUDIENCE = "agentrt-tests"
ROLES = ("viewer", "submitter", "operator", "admin")


async def make_key(db_url: str, *, role: str, tenants: list[str], name: str | None = None,
                   expires_in_s: int = 0) -> tuple[str, str]:
    """A key created the way `agentrt keys create --database-url` does: (key id, secret)."""
    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=1, init=init_connection)
    try:
        key_id, secret, digest = new_api_key()
        await Store(pool, SchedulerSettings(database_url=db_url)).auth.create_api_key(
            key_id=key_id, name=name or f"{role}-key", tenants=tenants, role=role, secret_hash=digest,
            expires_in_s=expires_in_s, audit=local_principal("tests").audit(reason="test setup"))
    finally:
        await pool.close()
    return str(key_id), secret


async def expire_key(db_url: str, key_id: str) -> None:
    """Moves a key's life into the past (both ends, so its CHECK still holds)."""
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("UPDATE api_keys SET created_at = clock_timestamp() - interval '2 hours', "
                           "expires_at = clock_timestamp() - interval '1 hour' WHERE id = $1", uuid.UUID(key_id))
    finally:
        await conn.close()


@dataclass
class Issuer:
    """An identity provider for tests: its signing key, its JWKS file, and tokens it signs."""

    directory: Path
    kid: str = "k1"
    key: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(public_exponent=65537,
                                                                                     key_size=2048))

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.jwks_file = self.directory / "jwks.json"
        self.write_jwks()

    def write_jwks(self) -> None:
        public = json.loads(RSAAlgorithm.to_jwk(self.key.public_key()))
        self.jwks_file.write_text(json.dumps({"keys": [{**public, "kid": self.kid, "alg": "RS256", "use": "sig"}]}))

    def settings(self) -> dict[str, Any]:
        return {"jwt_issuer": ISSUER, "jwt_audience": AUDIENCE, "jwt_jwks_file": str(self.jwks_file),
                "jwt_leeway_s": 0}

    def token(self, *, tenant: str | list[str] = "acme", roles: list[str] | None = None, sub: str = "alice",
              exp_in_s: float = 600, issuer: str = ISSUER, audience: str = AUDIENCE, kid: str | None = None,
              key: Any = None, now: float | None = None) -> str:
        issued = now if now is not None else time.time()
        claims = {"iss": issuer, "aud": audience, "sub": sub, "tenant": tenant, "roles": roles or ["viewer"],
                  "iat": int(issued) - 5, "exp": int(issued + exp_in_s)}
        return jwt.encode(claims, key or self.key, algorithm="RS256", headers={"kid": kid or self.kid})

    def unsigned(self, **claims: Any) -> str:
        """An `alg: none` token: header and claims, no signature."""
        import base64

        def part(value: dict[str, Any]) -> str:
            return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

        body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "tenant": "acme", "roles": ["admin"],
                "exp": int(time.time()) + 600, **claims}
        return f"{part({'alg': 'none', 'typ': 'JWT', 'kid': self.kid})}.{part(body)}."
