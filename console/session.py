"""The session cookie and CSRF tokens.

The cookie holds the signed-in person's credential, so it is encrypted and authenticated (Fernet:
AES-128-CBC plus HMAC-SHA256, with the time it was made inside) and read back only within the
session's age. It is HttpOnly (no script reads it), Secure, SameSite=Strict (no other site's page
sends it) and scoped to the whole console. Each session carries its own random CSRF token that every
form repeats; a POST whose token does not match the session's is refused before anything is called.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cryptography.fernet import Fernet, InvalidToken

COOKIE = "agentrt_console"


def _key(secret: str) -> bytes:
    return base64.urlsafe_b64encode(hashlib.sha256(("agentrt-console-session:" + secret).encode()).digest())


@dataclass(frozen=True)
class Session:
    """What the cookie carries. An anonymous session (no credential) exists only for its CSRF token."""

    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    credential: str = ""
    kind: str = ""  # api_key | token
    tenant: str = ""  # x-tenant-id, for a credential of several tenants
    principal: str = ""
    role: str = ""

    @property
    def signed_in(self) -> bool:
        return bool(self.credential)


class SessionCodec:
    def __init__(self, secret: str, max_age_s: int) -> None:
        self._fernet = Fernet(_key(secret or secrets.token_urlsafe(32)))
        self.max_age_s = max_age_s

    def dump(self, session: Session, *, now: float | None = None) -> str:
        """The cookie's value; `now` (seconds since the epoch) stamps it at another time (tests)."""
        data = json.dumps(asdict(session)).encode()
        return (self._fernet.encrypt(data) if now is None else self._fernet.encrypt_at_time(data, int(now))).decode()

    def load(self, cookie: str | None) -> Session | None:
        """The session, or None if the cookie is missing, forged, tampered with or too old."""
        if not cookie:
            return None
        try:
            data: dict[str, Any] = json.loads(self._fernet.decrypt(cookie.encode(), ttl=self.max_age_s))
        except (InvalidToken, ValueError):
            return None
        try:
            return Session(**{k: str(v) for k, v in data.items() if k in Session.__dataclass_fields__})
        except TypeError:
            return None


def csrf_ok(session: Session | None, submitted: str | None) -> bool:
    return bool(session and submitted and hmac.compare_digest(session.csrf.encode(), submitted.encode()))


def signed_in(session: Session, *, credential: str, kind: str, tenant: str, principal: str, role: str) -> Session:
    """A new session (and a new CSRF token) at sign-in, so a token seen before it is worth nothing after."""
    return replace(Session(), credential=credential, kind=kind, tenant=tenant, principal=principal, role=role)
