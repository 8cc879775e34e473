"""OIDC/JWT bearer tokens for RunService: signature by a JWKS key, issuer, audience, validity by database time.

A token is trusted only for what an asymmetric key of the configured issuer signed. So the
algorithm comes from a fixed allow-list that can never hold `none` or an HMAC algorithm (an
HMAC "secret" would be the issuer's *public* key, which anybody can read), and the key the
token names must be of the type its algorithm needs: an RSA key is never used to check an
ES256 signature, nor the reverse. Keys embedded in or pointed to by the token header (`jwk`,
`jku`, `x5u`) are never looked at.

Validity (`exp`, `nbf`, `iat`) is judged by `now`, the database clock the caller read, never
by this process's clock, because every time-based decision uses the database clock (see
docs/design.md §scope). PyJWT checks the signature, issuer and audience; its own clock checks
are switched off.

Keys come from a JWKS file (re-read when it changes on disk) or a JWKS URL (cached for
`refresh_s`, refreshed in the background so verifications with known keys never wait on the
IdP). A token naming an unknown key id makes one refetch (key rotation), at most once every
REFETCH_INTERVAL_S, so a flood of made-up key ids cannot hammer the IdP. A failed fetch or a
broken file keeps the last good keys. The cache timers are process-local pacing, not decisions
about tokens, so they use the monotonic clock, which no wall-clock step can move.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import jwt

from shared.errors import CredentialExpired, CredentialInvalid, Unavailable

log = logging.getLogger(__name__)

REFETCH_INTERVAL_S = 10.0  # least time between two fetches a token (unknown kid, no keys yet) asks for
FETCH_TIMEOUT_S = 5.0
MAX_JWKS_BYTES = 1_048_576
MAX_TOKEN_BYTES = 16_384  # far above any real bearer token; bounds the work a hostile one can cause

# The key type (and EC curve) each supported algorithm needs. A name not here cannot be configured:
# there is no HS* (symmetric) and no `none`.
_KTY_FOR_ALG: dict[str, str] = {
    "RS256": "RSA", "RS384": "RSA", "RS512": "RSA",
    "PS256": "RSA", "PS384": "RSA", "PS512": "RSA",
    "ES256": "EC", "ES384": "EC", "ES512": "EC",
    "EdDSA": "OKP",
}
_CRV_FOR_ALG: dict[str, str] = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}


@dataclass(frozen=True)
class JwtConfig:
    issuer: str
    audience: str
    jwks_file: str | None = None  # a JWKS JSON file on disk (re-read when its mtime changes)
    jwks_url: str | None = None  # fetched with aiohttp, cached; exactly one of file/url
    algorithms: tuple[str, ...] = ("RS256", "ES256")
    tenant_claim: str = "tenant"  # string or list of strings in the token
    roles_claim: str = "roles"  # string or list of strings; dotted path allowed, e.g. "realm_access.roles"
    subject_claim: str = "sub"
    refresh_s: float = 300.0  # JWKS cache lifetime for the URL
    leeway_s: float = 30.0


@dataclass(frozen=True)
class VerifiedToken:
    subject: str
    issuer: str
    tenants: tuple[str, ...]
    roles: tuple[str, ...]
    expires_at: float  # epoch seconds (exp)
    key_id: str | None


def _is_refused_algorithm(name: str) -> bool:
    return name.lower() == "none" or name.upper().startswith("HS")


def check_config(config: JwtConfig) -> None:
    """Refuse a configuration that could not verify safely; the message is one line for the operator."""
    if not isinstance(config.issuer, str) or not config.issuer:
        raise ValueError("jwt: issuer must be set (the `iss` every accepted token carries)")
    if not isinstance(config.audience, str) or not config.audience:
        raise ValueError("jwt: audience must be set (the `aud` every accepted token carries)")
    if (config.jwks_file is None) == (config.jwks_url is None):
        raise ValueError("jwt: set exactly one of jwks_file and jwks_url")
    if config.jwks_file is not None and not config.jwks_file:
        raise ValueError("jwt: jwks_file is empty")
    if config.jwks_url is not None:
        parts = urlsplit(config.jwks_url)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError("jwt: jwks_url must be an http(s) URL with a host")
        # Keys fetched in clear could be swapped on the way: plain http only to this machine.
        if parts.scheme == "http" and parts.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("jwt: jwks_url must be https (http only to a loopback address)")
    if isinstance(config.algorithms, str) or not config.algorithms:
        raise ValueError("jwt: algorithms must be a non-empty list of algorithm names, e.g. [RS256, ES256]")
    for name in config.algorithms:
        if not isinstance(name, str):
            raise ValueError("jwt: algorithms must be names such as RS256")
        if _is_refused_algorithm(name):
            raise ValueError(f"jwt: algorithm {name!r} is refused: only asymmetric signatures are accepted")
        if name not in _KTY_FOR_ALG:
            raise ValueError(f"jwt: algorithm {name!r} is not supported (choose from {', '.join(_KTY_FOR_ALG)})")
    for label, claim in (("tenant_claim", config.tenant_claim), ("roles_claim", config.roles_claim),
                         ("subject_claim", config.subject_claim)):
        if not isinstance(claim, str) or not claim:
            raise ValueError(f"jwt: {label} must be a claim name")
    if not (isinstance(config.refresh_s, int | float) and math.isfinite(config.refresh_s) and config.refresh_s > 0):
        raise ValueError("jwt: refresh_s must be a positive number of seconds")
    if not (isinstance(config.leeway_s, int | float) and math.isfinite(config.leeway_s) and config.leeway_s >= 0):
        raise ValueError("jwt: leeway_s must be zero or a positive number of seconds")


@dataclass
class _KeySet:
    """The usable signing keys of one JWKS document, by key id, and the keys prepared per algorithm."""

    by_kid: dict[str | None, dict[str, Any]]
    prepared: dict[tuple[str | None, str], Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.by_kid)


def parse_jwks(document: Any, source: str) -> _KeySet:
    """The signature keys of a JWKS document. Symmetric, encryption-only and unreadable keys are left
    out (logged), so one odd entry never costs the others; a document with no usable key is an error."""
    if not isinstance(document, Mapping) or not isinstance(document.get("keys"), list):
        raise ValueError(f"{source}: not a JWKS document (an object with a `keys` list)")
    by_kid: dict[str | None, dict[str, Any]] = {}
    for index, entry in enumerate(document["keys"]):
        problem = _unusable_key(entry)
        if problem is None and entry.get("kid") in by_kid:
            problem = "a second key with the same kid"
        if problem is not None:
            log.warning("%s: key %d left out: %s", source, index, problem)
            continue
        by_kid[entry.get("kid")] = dict(entry)
    if not by_kid:
        raise ValueError(f"{source}: the JWKS holds no usable signature key")
    return _KeySet(by_kid)


def _unusable_key(entry: Any) -> str | None:
    if not isinstance(entry, Mapping):
        return "not an object"
    kty = entry.get("kty")
    if kty not in ("RSA", "EC", "OKP"):
        return f"key type {kty!r} is not an asymmetric signature key"
    if entry.get("use", "sig") != "sig":
        return "not a signature key (use is not sig)"
    kid = entry.get("kid")
    if kid is not None and not isinstance(kid, str):
        return "kid is not a string"
    pinned = entry.get("alg")
    if pinned is not None and pinned not in _KTY_FOR_ALG:
        return f"alg {pinned!r} is not a supported signature algorithm"
    try:
        jwt.PyJWK(dict(entry))
    except (jwt.PyJWTError, ValueError, TypeError) as exc:
        return f"unreadable ({type(exc).__name__})"
    return None


def _invalid(problem: str, message: str) -> CredentialInvalid:
    return CredentialInvalid(message, problem=problem)


def _claim(payload: Mapping[str, Any], name: str) -> Any:
    """A claim by its exact name (namespaced claims are URLs full of dots), else by its dotted path."""
    if name in payload:
        return payload[name]
    value: Any = payload
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _strings(value: Any, claim: str) -> tuple[str, ...]:
    """A claim that is a string or a list of strings, as a tuple without blanks or repeats."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise _invalid("claims", f"token claim {claim!r} is neither a string nor a list of strings")
    return tuple(dict.fromkeys(item for item in items if item))


def _epoch(payload: Mapping[str, Any], name: str) -> float | None:
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _invalid("claims", f"token claim {name!r} is not a number of epoch seconds")
    return float(value)


def _check_times(payload: Mapping[str, Any], now: float, leeway: float) -> float:
    """exp, nbf and iat against the database clock's `now`; returns exp."""
    expires_at = _epoch(payload, "exp")
    if expires_at is None:
        raise _invalid("claims", "token has no expiry (exp)")
    if now > expires_at + leeway:
        raise CredentialExpired("the token has expired; get a new one from the identity provider")
    not_before = _epoch(payload, "nbf")
    if not_before is not None and now + leeway < not_before:
        raise _invalid("not_yet_valid", "the token is not valid yet (nbf is in the future)")
    issued_at = _epoch(payload, "iat")
    if issued_at is not None and now + leeway < issued_at:
        raise _invalid("not_yet_valid", "the token was issued in the future (iat); check the issuer's clock")
    return expires_at


def _header(token: Any) -> tuple[str, str | None]:
    """The header's alg and kid, refused before any key is looked up or fetched."""
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_BYTES:
        raise _invalid("malformed", "the bearer token is not a JWT")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise _invalid("malformed", "the bearer token is not a JWT") from None
    alg, kid = header.get("alg"), header.get("kid")
    if not isinstance(alg, str) or (kid is not None and not isinstance(kid, str)):
        raise _invalid("malformed", "the token header's alg or kid is not a string")
    if alg.lower() == "none":
        raise _invalid("algorithm", "unsigned tokens (alg none) are refused")
    if alg.upper().startswith("HS"):
        raise _invalid("algorithm", "HMAC-signed tokens are refused: only the issuer's asymmetric keys are trusted")
    return alg, kid


_PYJWT_PROBLEMS: tuple[tuple[type[Exception], str, str], ...] = (
    # Most specific first: InvalidSignatureError is a DecodeError.
    (jwt.InvalidSignatureError, "signature", "the token's signature does not verify"),
    (jwt.InvalidIssuerError, "issuer", "the token was not issued by the configured issuer"),
    (jwt.InvalidAudienceError, "audience", "the token is not meant for this service (audience)"),
    (jwt.InvalidAlgorithmError, "algorithm", "the token's algorithm is not allowed for its key"),
    (jwt.InvalidKeyError, "algorithm", "the token's algorithm does not fit its key"),
    (jwt.DecodeError, "malformed", "the bearer token is not a well-formed JWT"),
)


class JwtVerifier:
    """Verifies RunService bearer tokens against one issuer's JWKS. `verify` may run concurrently."""

    def __init__(self, config: JwtConfig, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        check_config(config)
        self._config = config
        self._allowed = frozenset(config.algorithms)
        self._monotonic = monotonic  # the pacing clock; tests step it instead of sleeping
        self._keys: _KeySet | None = None
        self._generation = 0  # bumped by every successful load; lets waiters see that a fetch happened
        self._file_signature: tuple[int, int, int] | None = None
        self._file_error: str | None = None
        self._session: aiohttp.ClientSession | None = None
        self._refetch_lock = asyncio.Lock()
        self._last_on_demand_fetch: float | None = None
        self._next_refresh_at = 0.0
        self._refresher: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> None:
        """Load the keys. A file that cannot be read is a configuration error (ValueError); a URL that
        fails is logged and fetched again when a token needs it."""
        if self._config.jwks_file is not None:
            self._reload_file_if_changed()
            if self._keys is None:
                raise ValueError(f"jwt: jwks_file {self._config.jwks_file}: {self._file_error}")
            return
        async with self._refetch_lock:
            await self._fetch()

    async def close(self) -> None:
        """Stop the background refresh and the HTTP session; safe to call twice."""
        self._closed = True
        refresher, self._refresher = self._refresher, None
        if refresher is not None:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def verify(self, token: str, *, now: float) -> VerifiedToken:
        """The caller's identity, tenants and roles, or a typed refusal. `now` is epoch seconds by the
        database clock: expiry is decided by it, never by this process's clock."""
        alg, kid = _header(token)
        if alg not in self._allowed:
            raise _invalid("algorithm", "the token's algorithm is not in the configured allow-list")
        jwk = await self._key_for(kid)
        key = self._prepared_key(jwk, alg)
        config = self._config
        try:
            payload = jwt.decode(
                token, key=key, algorithms=[alg], audience=config.audience, issuer=config.issuer,
                options={"verify_signature": True, "verify_exp": False, "verify_nbf": False,
                         "verify_iat": False, "verify_iss": True, "verify_aud": True,
                         "require": ["exp", "iss", "aud", config.subject_claim]},
            )
        except jwt.MissingRequiredClaimError as exc:
            raise _invalid("claims", f"the token lacks the required claim {exc.claim!r}") from None
        except jwt.PyJWTError as exc:
            raise self._refusal(exc) from None
        return self._identity(payload, now, kid)

    @staticmethod
    def _refusal(exc: Exception) -> CredentialInvalid:
        for kind, problem, message in _PYJWT_PROBLEMS:
            if isinstance(exc, kind):
                return _invalid(problem, message)
        return _invalid("claims", f"the token's claims do not verify ({type(exc).__name__})")

    def _identity(self, payload: Mapping[str, Any], now: float, kid: str | None) -> VerifiedToken:
        config = self._config
        expires_at = _check_times(payload, now, config.leeway_s)
        subject = _claim(payload, config.subject_claim)
        if not isinstance(subject, str) or not subject:
            raise _invalid("claims", f"the token's subject claim {config.subject_claim!r} is missing or empty")
        tenants = _strings(_claim(payload, config.tenant_claim), config.tenant_claim)
        if not tenants:
            raise _invalid("claims", f"the token names no tenant (claim {config.tenant_claim!r})")
        roles = _strings(_claim(payload, config.roles_claim), config.roles_claim)
        return VerifiedToken(subject=subject, issuer=str(payload["iss"]), tenants=tenants, roles=roles,
                             expires_at=expires_at, key_id=kid)

    def _prepared_key(self, jwk: dict[str, Any], alg: str) -> Any:
        """The JWK as a key for `alg`, refused unless its type (and curve, and pinned alg) fit `alg`."""
        needs_kty, needs_crv = _KTY_FOR_ALG[alg], _CRV_FOR_ALG.get(alg)
        pinned = jwk.get("alg")
        if jwk.get("kty") != needs_kty or (needs_crv is not None and jwk.get("crv") != needs_crv) or (
                pinned is not None and pinned != alg):
            raise _invalid("algorithm", "the token's algorithm does not match the type of the key it names")
        keys, own_kid = self._keys, jwk.get("kid")
        cache = keys.prepared if keys is not None and keys.by_kid.get(own_kid) is jwk else {}
        prepared = cache.get((own_kid, alg))
        if prepared is None:
            try:
                prepared = jwt.PyJWK(jwk, algorithm=alg).key
            except (jwt.PyJWTError, ValueError, TypeError):
                raise _invalid("algorithm", "the token's algorithm does not fit the key it names") from None
            cache[(own_kid, alg)] = prepared
        return prepared

    async def _key_for(self, kid: str | None) -> dict[str, Any]:
        """The JWK the token names; an unknown kid from a URL JWKS costs one (rate-limited) refetch."""
        if self._config.jwks_file is not None:
            self._reload_file_if_changed()
        else:
            self._refresh_in_background_when_due()
            if self._keys is None or (kid is not None and kid not in self._keys.by_kid):
                await self._refetch_on_demand(self._generation)
        keys = self._keys
        if keys is None:
            raise Unavailable("the identity provider's signing keys could not be loaded yet; retry shortly")
        if kid is None:
            if len(keys) != 1:
                raise _invalid("unknown_kid", "the token names no key id (kid) and the issuer has several keys")
            return next(iter(keys.by_kid.values()))
        jwk = keys.by_kid.get(kid)
        if jwk is None:
            raise _invalid("unknown_kid", "the token's key id (kid) is not one of the issuer's keys")
        return jwk

    # --- JWKS file ---------------------------------------------------------------------------------

    def _reload_file_if_changed(self) -> None:
        """Re-read the file when its mtime (or size, or inode: a rename over it) changed. A file that
        cannot be read or parsed keeps the last good keys and is tried again on its next change."""
        path = self._config.jwks_file
        assert path is not None
        try:
            stat = os.stat(path)
            signature = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            if signature == self._file_signature:
                return
            with open(path, "rb") as handle:
                document = json.loads(handle.read(MAX_JWKS_BYTES + 1))
            keys = parse_jwks(document, path)
        except (OSError, ValueError) as exc:
            self._note_file_error(path, str(exc) if isinstance(exc, ValueError) else type(exc).__name__)
            return
        self._file_signature, self._file_error = signature, None
        self._install(keys, path)

    def _note_file_error(self, path: str, error: str) -> None:
        if error != self._file_error:  # once per distinct problem, not once per verification
            log.warning("JWKS file %s not loaded (%s); keeping the last good keys", path, error)
        self._file_error = error

    def _install(self, keys: _KeySet, source: str) -> None:
        self._keys = keys
        self._generation += 1
        log.info("JWKS from %s: %d signing key(s)", source, len(keys))

    # --- JWKS URL ----------------------------------------------------------------------------------

    def _refresh_in_background_when_due(self) -> None:
        """Past the cache lifetime, refresh in a task: verifications with known keys never wait on the IdP."""
        if self._closed or self._keys is None or self._monotonic() < self._next_refresh_at:
            return
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.create_task(self._refresh(self._generation), name="jwks-refresh")

    async def _refresh(self, generation: int) -> None:
        async with self._refetch_lock:
            if generation == self._generation and self._monotonic() >= self._next_refresh_at:
                await self._fetch()

    async def _refetch_on_demand(self, generation: int) -> None:
        """One fetch for a token the cached keys cannot check, at most once per REFETCH_INTERVAL_S.
        Callers queued behind a fetch that just succeeded use its keys instead of fetching again."""
        async with self._refetch_lock:
            if generation != self._generation or self._closed:
                return
            started = self._monotonic()
            if self._last_on_demand_fetch is not None and started - self._last_on_demand_fetch < REFETCH_INTERVAL_S:
                return
            self._last_on_demand_fetch = started
            await self._fetch()

    async def _fetch(self) -> None:
        """GET the JWKS URL (the caller holds the refetch lock). Failure keeps the last good keys."""
        url = self._config.jwks_url
        assert url is not None
        try:
            keys = parse_jwks(await self._get_json(url), url)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self._next_refresh_at = self._monotonic() + min(REFETCH_INTERVAL_S, self._config.refresh_s)
            kept = "keeping the last good keys" if self._keys is not None else "no keys yet"
            log.warning("JWKS fetch from %s failed (%s); %s", url, str(exc) or type(exc).__name__, kept)
            return
        self._next_refresh_at = self._monotonic() + self._config.refresh_s
        self._install(keys, url)

    async def _get_json(self, url: str) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S))
        async with self._session.get(url, headers={"Accept": "application/json"},
                                     allow_redirects=False) as response:
            if response.status != 200:
                raise ValueError(f"HTTP status {response.status}")
            body = await response.content.read(MAX_JWKS_BYTES + 1)
        if len(body) > MAX_JWKS_BYTES:
            raise ValueError(f"the JWKS is larger than {MAX_JWKS_BYTES} bytes")
        return json.loads(body)
