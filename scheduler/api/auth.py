"""Authentication and authorization of every gRPC call, before any handler reads or writes
(docs/design.md §security).

RunService: the caller presents `authorization: Bearer <credential>`, an API key
(`agrt_<id>_<secret>`, looked up by id, its secret checked against a stored
SHA-256) or an OIDC/JWT token (scheduler/security/jwt_verify.py). The credential gives
the principal, its roles and the tenants it may act for; the role must grant
the call's verb (scheduler/security/rbac.py). Expiry is judged by the database clock
(`DbClock`). Key lookups are cached for `api_key_cache_ttl_ms`, so a
revocation takes effect on every replica within that time.

WorkService: executors only. A call passes with the executor token, or over
mutual TLS with a client certificate whose identity (CN or DNS SAN) is in
`work_client_identities`. With neither configured WorkService is open
(development only).

auth_mode `none` trusts `x-tenant-id`: every caller may do everything.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from scheduler.api import validate as v
from scheduler.security.rbac import ROLES, RPC_VERBS, parse_auth_mode, verbs_of
from scheduler.store.types import AuditEntry
from shared.errors import (
    CredentialExpired,
    CredentialInvalid,
    CredentialRequired,
    ExecutorTokenRequired,
    InvalidArgument,
    PermissionDenied,
    TenantForbidden,
)

if TYPE_CHECKING:
    from scheduler.config import SchedulerSettings
    from scheduler.security.jwt_verify import JwtVerifier
    from scheduler.store.auth import KeyForAuth

log = logging.getLogger("scheduler.auth")
KEY_PREFIX = "agrt_"
ANY_TENANT = "*"


@dataclass(frozen=True)
class Principal:
    kind: str  # api_key | jwt | anonymous | local
    id: str  # key:<uuid> | jwt:<subject>@<issuer> | anonymous | local:<os user>
    name: str
    roles: tuple[str, ...]
    tenants: tuple[str, ...]  # ("*",) = every tenant
    verbs: frozenset[str]

    def may(self, verb: str) -> bool:
        return verb in self.verbs

    def allows_tenant(self, tenant: str) -> bool:
        return ANY_TENANT in self.tenants or tenant in self.tenants

    @property
    def several_tenants(self) -> bool:
        return ANY_TENANT in self.tenants or len(self.tenants) > 1

    def tenant_of_call(self, metadata: Any) -> str:
        """The call's tenant: the credential's own, or the one `x-tenant-id` names among its tenants."""
        named = v.tenant_values(metadata)
        if self.kind == "anonymous":
            return v.tenant_from_metadata(metadata)
        if named:
            tenant = v.tenant_from_metadata(metadata)
            if not self.allows_tenant(tenant):
                raise TenantForbidden(f"this credential may not act for tenant {tenant!r}", tenant=tenant,
                                      principal=self.id)
            return tenant
        if self.several_tenants:
            raise InvalidArgument(v.TENANT_HEADER, "this credential may act for several tenants: name one")
        return self.tenants[0]

    def audit(self, *, reason: str | None = None, comment: str | None = None, ticket_id: str | None = None,
              request_id: str | None = None) -> AuditEntry:
        return AuditEntry(principal=self.id, principal_kind=self.kind, reason=reason or None,
                          comment=comment or None, ticket_id=ticket_id or None, request_id=request_id)


ANONYMOUS = Principal("anonymous", "anonymous", "anonymous", ("admin",), (ANY_TENANT,), ROLES["admin"])


def local_principal(user: str) -> Principal:
    """The operator at a shell with the database URL (bootstrap `agentrt keys create`)."""
    return Principal("local", f"local:{user}", user, ("admin",), (ANY_TENANT,), ROLES["admin"])


# --- API keys -------------------------------------------------------------------------

def new_api_key(key_id: uuid.UUID | None = None) -> tuple[uuid.UUID, str, bytes]:
    """A fresh key: its id (`key_id`, else a new one), the text shown once (which names the id), and the
    hash the database keeps."""
    key_id = key_id or uuid.uuid4()
    secret = secrets.token_hex(32)
    return key_id, f"{KEY_PREFIX}{key_id.hex}_{secret}", secret_hash(secret)


def secret_hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def parse_api_key(text: str) -> tuple[uuid.UUID, str]:
    body = text[len(KEY_PREFIX):] if text.startswith(KEY_PREFIX) else ""
    id_part, _, secret = body.partition("_")
    try:
        key_id = uuid.UUID(hex=id_part)
    except ValueError:
        raise CredentialInvalid("malformed API key", problem="malformed") from None
    if len(secret) != 64:
        raise CredentialInvalid("malformed API key", problem="malformed")
    return key_id, secret


class KeySource(Protocol):
    def key_for_auth(self, key_id: uuid.UUID) -> Awaitable[KeyForAuth | None]: ...
    def database_epoch(self) -> Awaitable[float]: ...


class DbClock:
    """The database clock, read every `resync_s` and carried forward on the local monotonic clock."""

    def __init__(self, source: KeySource, resync_s: float = 30.0) -> None:
        self._source = source
        self._resync_s = resync_s
        self._base: tuple[float, float] | None = None  # (database epoch, local monotonic) at the last read
        self._lock = asyncio.Lock()

    async def now(self) -> float:
        base = self._base
        if base is None or time.monotonic() - base[1] > self._resync_s:
            async with self._lock:
                if self._base is base:
                    start = time.monotonic()
                    epoch = await self._source.database_epoch()
                    self._base = (epoch, (start + time.monotonic()) / 2)
            base = self._base
        assert base is not None
        return base[0] + (time.monotonic() - base[1])


class KeyCache:
    """API key lookups, each kept for `ttl_s` (a revocation is seen within it).

    Known keys and unknown ids are kept apart, each least-recently-used first out, so a flood
    of made-up ids evicts only other made-up ids; concurrent lookups of one id share one query.
    """

    def __init__(self, source: KeySource, clock: DbClock, ttl_s: float, size: int = 10_000,
                 unknown_size: int = 1_000) -> None:
        self._source = source
        self._clock = clock
        self._ttl_s = ttl_s
        self._sizes = (size, unknown_size)
        self._known: OrderedDict[uuid.UUID, tuple[float, KeyForAuth]] = OrderedDict()
        self._unknown: OrderedDict[uuid.UUID, float] = OrderedDict()
        self._flights: dict[uuid.UUID, asyncio.Future[KeyForAuth | None]] = {}

    def forget(self, key_id: uuid.UUID) -> None:
        self._known.pop(key_id, None)
        self._unknown.pop(key_id, None)

    def _cached(self, key_id: uuid.UUID) -> tuple[bool, KeyForAuth | None]:
        now = time.monotonic()
        known = self._known.get(key_id)
        if known is not None and now - known[0] < self._ttl_s:
            self._known.move_to_end(key_id)
            return True, known[1]
        seen = self._unknown.get(key_id)
        if seen is not None and now - seen < self._ttl_s:
            return True, None
        return False, None

    def _keep(self, key_id: uuid.UUID, row: KeyForAuth | None, started: float) -> None:
        self.forget(key_id)
        table: OrderedDict[uuid.UUID, Any] = self._unknown if row is None else self._known
        table[key_id] = started if row is None else (started, row)
        while len(table) > self._sizes[row is None]:
            table.popitem(last=False)

    async def _lookup(self, key_id: uuid.UUID) -> KeyForAuth | None:
        hit, row = self._cached(key_id)
        if hit:
            return row
        flight = self._flights.get(key_id)
        if flight is not None:
            return await asyncio.shield(flight)
        flight = self._flights[key_id] = asyncio.get_running_loop().create_future()
        started = time.monotonic()  # the entry's age counts from before the read: a revocation is never missed
        try:
            row = await self._source.key_for_auth(key_id)
        except asyncio.CancelledError:
            flight.cancel()  # the waiters' own calls fail; a later lookup starts afresh
            raise
        except Exception as error:
            flight.set_exception(error)
            flight.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
            raise
        finally:
            del self._flights[key_id]
        flight.set_result(row)
        self._keep(key_id, row, started)
        return row

    async def principal(self, text: str) -> Principal:
        key_id, secret = parse_api_key(text)
        row = await self._lookup(key_id)
        if row is None or not hmac.compare_digest(row.secret_hash, secret_hash(secret)):
            raise CredentialInvalid("unknown API key", problem="unknown_key")
        if row.revoked:
            raise CredentialInvalid("API key revoked", problem="revoked", key_id=key_id)
        if row.expires_epoch is not None and row.expires_epoch <= await self._clock.now():
            raise CredentialExpired("API key expired", key_id=key_id)
        return Principal("api_key", f"key:{key_id}", row.name, (row.role,), row.tenants, verbs_of((row.role,)))


# --- the guard --------------------------------------------------------------------------

def _bearer(metadata: Any) -> str | None:
    values = [value for key, value in (metadata or ()) if key == "authorization"]
    if not values:
        return None
    if len(values) > 1 or not isinstance(values[0], str):
        raise CredentialInvalid("one authorization header, as text", problem="malformed")
    scheme, _, token = values[0].partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise CredentialInvalid("authorization must be `Bearer <credential>`", problem="malformed")
    return token.strip()


class RunAuth:
    """Who is calling RunService, and whether their role grants the method's verb."""

    def __init__(self, modes: frozenset[str], keys: KeyCache | None, jwt: JwtVerifier | None,
                 clock: DbClock | None) -> None:
        self.modes = modes
        self.keys = keys
        self.jwt = jwt
        self.clock = clock

    @property
    def open(self) -> bool:
        return "none" in self.modes

    async def authenticate(self, context: grpc.aio.ServicerContext) -> Principal:
        if self.open:
            return ANONYMOUS
        token = _bearer(context.invocation_metadata())
        if token is None:
            raise CredentialRequired("this call needs a credential: `authorization: Bearer <API key or token>`")
        if token.startswith(KEY_PREFIX):
            if self.keys is None:
                raise CredentialInvalid("API keys are not accepted here (auth_mode)", problem="kind")
            return await self.keys.principal(token)
        if self.jwt is None or self.clock is None:
            raise CredentialInvalid("not an API key, and JWTs are not accepted here (auth_mode)", problem="kind")
        verified = await self.jwt.verify(token, now=await self.clock.now())
        # A tenant claim is a tenant id, never '*' (every tenant is for API keys an admin made).
        if any(t == ANY_TENANT or not v.is_tenant(t) for t in verified.tenants):
            raise CredentialInvalid("the token's tenant claim holds something that is not a tenant id",
                                    problem="claims")
        return Principal("jwt", f"jwt:{verified.subject}@{verified.issuer}", verified.subject, verified.roles,
                         verified.tenants, verbs_of(verified.roles))

    async def admit(self, method: str, context: grpc.aio.ServicerContext) -> Principal:
        principal = await self.authenticate(context)
        verb = RPC_VERBS.get(method)
        if verb is None or not principal.may(verb):
            raise PermissionDenied(f"role {','.join(principal.roles) or '(none)'} may not {verb or method}",
                                   verb=verb or method, principal=principal.id)
        if principal.several_tenants and not principal.may("tenants.several"):
            raise PermissionDenied("a credential for several tenants needs the admin role",
                                   verb="tenants.several", principal=principal.id)
        # The tenant gate, here and not in each handler: an `x-tenant-id` the credential may not act
        # for is refused for every method, also those scoped by the credential rather than by the
        # header (keys, limits, audit), which would otherwise answer and write as if it were not sent.
        metadata = context.invocation_metadata()
        if v.tenant_values(metadata):
            principal.tenant_of_call(metadata)
        return principal


def peer_identities(context: grpc.aio.ServicerContext) -> set[str]:
    """The verified client certificate's common name and DNS names (mutual TLS), else nothing.

    Read from the certificate itself: gRPC's SAN list mixes DNS, IP, e-mail and URI names,
    and an IP or e-mail that happened to equal an identity must not count as one.
    """
    pems = (context.auth_context() or {}).get("x509_pem_cert", ())
    if not pems:
        return set()
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pems[0] if isinstance(pems[0], bytes) else str(pems[0]).encode())
    found = {str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)}
    try:
        found |= set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                     .get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        pass
    return found


class WorkAuth:
    """WorkService is for executors: the executor token, or an allowed mTLS identity."""

    def __init__(self, token: str | None, identities: list[str]) -> None:
        self._expected = f"Bearer {token}".encode() if token else None
        self._identities = frozenset(identities)

    @property
    def open(self) -> bool:
        return self._expected is None and not self._identities

    async def admit(self, method: str, context: grpc.aio.ServicerContext) -> Principal | None:
        if self.open:
            return None
        if self._identities and peer_identities(context) & self._identities:
            return None
        presented = next((value for key, value in (context.invocation_metadata() or ()) if key == "authorization"), "")
        if self._expected is not None and isinstance(presented, str) and \
                hmac.compare_digest(presented.encode(), self._expected):
            return None
        raise ExecutorTokenRequired("WorkService is for executors: present the executor token as "
                                    "`authorization: Bearer …` or an allowed client certificate")


async def build_run_auth(settings: SchedulerSettings, source: KeySource) -> RunAuth:
    modes = parse_auth_mode(settings.auth_mode)
    if "none" in modes:
        log.warning("auth_mode is none: every caller who reaches %s may act for every tenant (development only)",
                    settings.listen_addr)
        return RunAuth(modes, None, None, None)
    clock = DbClock(source)
    keys = KeyCache(source, clock, settings.api_key_cache_ttl_ms / 1000) if "api_key" in modes else None
    verifier = None
    if "jwt" in modes:
        from scheduler.security.jwt_verify import JwtConfig, JwtVerifier

        verifier = JwtVerifier(JwtConfig(
            issuer=settings.jwt_issuer or "", audience=settings.jwt_audience or "",
            jwks_file=settings.jwt_jwks_file, jwks_url=settings.jwt_jwks_url,
            algorithms=tuple(settings.jwt_algorithms), tenant_claim=settings.jwt_tenant_claim,
            roles_claim=settings.jwt_roles_claim, refresh_s=settings.jwt_jwks_refresh_s,
            leeway_s=settings.jwt_leeway_s))
        await verifier.start()
    return RunAuth(modes, keys, verifier, clock)
