"""The JWT verifier: real keys, real signatures, a real loopback JWKS server; no database.

`NOW` (the database clock the caller passes) is a year behind this process's clock, so every
token that verifies here would be expired by the process clock: acceptance proves `now` decides.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from scheduler.security.jwt_verify import REFETCH_INTERVAL_S, JwtConfig, JwtVerifier, VerifiedToken
from shared.errors import CredentialExpired, CredentialInvalid, Unavailable

ISSUER = "https://idp.example.test/realms/agentrt"
AUDIENCE = "agentrt-scheduler"
NOW = time.time() - 365 * 86400


@functools.cache
def rsa_key(index: int) -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@functools.cache
def ec_key(index: int) -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def jwk_of(private_key: Any, kid: str | None) -> dict[str, Any]:
    public = private_key.public_key()
    algorithm = jwt.algorithms.RSAAlgorithm if isinstance(public, rsa.RSAPublicKey) else jwt.algorithms.ECAlgorithm
    jwk: dict[str, Any] = algorithm.to_jwk(public, as_dict=True)
    jwk["use"] = "sig"
    if kid is not None:
        jwk["kid"] = kid
    return jwk


def jwks(*keys: tuple[Any, str | None]) -> dict[str, Any]:
    return {"keys": [jwk_of(key, kid) for key, kid in keys]}


def claims(**overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {"iss": ISSUER, "aud": AUDIENCE, "sub": "user-1", "tenant": "acme",
                               "roles": ["operator"], "iat": int(NOW) - 10, "exp": int(NOW) + 600}
    payload.update(overrides)
    return {name: value for name, value in payload.items() if value is not None}


def sign(private_key: Any, alg: str = "RS256", kid: str | None = "rsa-1", **overrides: Any) -> str:
    headers = {"kid": kid} if kid is not None else None
    return jwt.encode(claims(**overrides), private_key, algorithm=alg, headers=headers)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_made(header: dict[str, Any], payload: dict[str, Any], signature: Callable[[bytes], bytes]) -> str:
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(payload).encode())}"
    return f"{signing_input}.{b64url(signature(signing_input.encode()))}"


def problem_of(error: pytest.ExceptionInfo[CredentialInvalid]) -> str:
    return error.value.metadata["problem"]


class StepClock:
    """The verifier's pacing clock, stepped by the test instead of sleeping."""

    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def write_jwks(path: Path, document: dict[str, Any] | str, *, mtime: float | None = None) -> None:
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


@pytest.fixture
def jwks_path(tmp_path: Path) -> Path:
    path = tmp_path / "jwks.json"
    write_jwks(path, jwks((rsa_key(0), "rsa-1"), (ec_key(0), "ec-1")))
    return path


@pytest.fixture
async def file_verifier(jwks_path: Path) -> AsyncIterator[JwtVerifier]:
    verifier = JwtVerifier(JwtConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=str(jwks_path)))
    await verifier.start()
    yield verifier
    await verifier.close()


class JwksServer:
    """A loopback IdP: serves `document` at /jwks (or `status` when it is not 200) and counts requests."""

    def __init__(self) -> None:
        self.document: dict[str, Any] = jwks((rsa_key(0), "rsa-1"))
        self.status = 200
        self.requests = 0
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.status != 200:
            return web.Response(status=self.status, text="identity provider down")
        return web.json_response(self.document)


@pytest.fixture
async def idp() -> AsyncIterator[JwksServer]:
    server = JwksServer()
    app = web.Application()
    app.router.add_get("/jwks", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    server.url = f"http://{host}:{port}/jwks"
    yield server
    await runner.cleanup()


@pytest.fixture
def clock() -> StepClock:
    return StepClock()


@pytest.fixture
async def url_verifier(idp: JwksServer, clock: StepClock) -> AsyncIterator[JwtVerifier]:
    verifier = JwtVerifier(JwtConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=idp.url), monotonic=clock)
    await verifier.start()
    yield verifier
    await verifier.close()


# --- valid tokens ----------------------------------------------------------------------------------


async def test_an_rs256_token_verifies(file_verifier: JwtVerifier) -> None:
    verified = await file_verifier.verify(sign(rsa_key(0)), now=NOW)
    assert verified == VerifiedToken(subject="user-1", issuer=ISSUER, tenants=("acme",), roles=("operator",),
                                     expires_at=float(int(NOW) + 600), key_id="rsa-1")


async def test_an_es256_token_verifies(file_verifier: JwtVerifier) -> None:
    verified = await file_verifier.verify(sign(ec_key(0), "ES256", "ec-1", sub="svc-7"), now=NOW)
    assert (verified.subject, verified.key_id) == ("svc-7", "ec-1")


async def test_a_token_listing_several_audiences_including_ours_verifies(file_verifier: JwtVerifier) -> None:
    verified = await file_verifier.verify(sign(rsa_key(0), aud=["other", AUDIENCE]), now=NOW)
    assert verified.subject == "user-1"


# --- time, by the database clock -------------------------------------------------------------------


async def test_expiry_is_judged_by_now_with_the_leeway(file_verifier: JwtVerifier) -> None:
    within = sign(rsa_key(0), exp=int(NOW) - 20, iat=int(NOW) - 600)
    assert (await file_verifier.verify(within, now=NOW)).expires_at == int(NOW) - 20
    beyond = sign(rsa_key(0), exp=int(NOW) - 31, iat=int(NOW) - 600)
    with pytest.raises(CredentialExpired) as error:
        await file_verifier.verify(beyond, now=NOW)
    assert beyond not in str(error.value) and "\n" not in str(error.value)


async def test_now_decides_expiry_not_the_process_clock(file_verifier: JwtVerifier) -> None:
    expired_by_process_clock = int(time.time()) - 3600
    token = sign(rsa_key(0), exp=expired_by_process_clock, iat=expired_by_process_clock - 600)
    verified = await file_verifier.verify(token, now=expired_by_process_clock - 60)
    assert verified.expires_at == expired_by_process_clock
    valid_by_process_clock = int(time.time()) + 3600
    token = sign(rsa_key(0), exp=valid_by_process_clock, iat=int(time.time()))
    with pytest.raises(CredentialExpired):
        await file_verifier.verify(token, now=valid_by_process_clock + 60)


async def test_a_token_without_exp_is_refused(file_verifier: JwtVerifier) -> None:
    with pytest.raises(CredentialInvalid) as error:
        await file_verifier.verify(sign(rsa_key(0), exp=None), now=NOW)
    assert problem_of(error) == "claims"
    with pytest.raises(CredentialInvalid) as error:
        await file_verifier.verify(sign(rsa_key(0), exp="tomorrow"), now=NOW)
    assert problem_of(error) == "claims"


async def test_nbf_and_iat_in_the_future_are_not_yet_valid(file_verifier: JwtVerifier) -> None:
    assert await file_verifier.verify(sign(rsa_key(0), nbf=int(NOW) + 20), now=NOW)
    futures: tuple[dict[str, Any], ...] = ({"nbf": int(NOW) + 31}, {"iat": int(NOW) + 31})
    for future in futures:
        with pytest.raises(CredentialInvalid) as error:
            await file_verifier.verify(sign(rsa_key(0), **future), now=NOW)
        assert problem_of(error) == "not_yet_valid"


# --- issuer, audience, signature --------------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "problem"), [
    ({"iss": "https://evil.example.test/"}, "issuer"),
    ({"aud": "some-other-service"}, "audience"),
    ({"iss": None}, "claims"),
    ({"aud": None}, "claims"),
    ({"sub": None}, "claims"),
])
async def test_issuer_audience_and_required_claims(
        file_verifier: JwtVerifier, overrides: dict[str, Any], problem: str) -> None:
    token = sign(rsa_key(0), **overrides)
    with pytest.raises(CredentialInvalid) as error:
        await file_verifier.verify(token, now=NOW)
    assert problem_of(error) == problem
    assert token not in error.value.message and "\n" not in error.value.message


async def test_a_signature_by_another_key_with_the_same_kid_is_refused(file_verifier: JwtVerifier) -> None:
    with pytest.raises(CredentialInvalid) as error:
        await file_verifier.verify(sign(rsa_key(1), kid="rsa-1"), now=NOW)
    assert problem_of(error) == "signature"


@pytest.mark.parametrize("token", ["", "not-a-jwt", "a.b.c", "x" * 20_000])
async def test_malformed_tokens_are_refused(file_verifier: JwtVerifier, token: str) -> None:
    with pytest.raises(CredentialInvalid) as error:
        await file_verifier.verify(token, now=NOW)
    assert problem_of(error) == "malformed"


# --- algorithms ------------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
async def test_an_unsigned_token_is_refused(file_verifier: JwtVerifier, alg: str) -> None:
    token = hand_made({"alg": alg, "typ": "JWT", "kid": "rsa-1"}, claims(), lambda _: b"")
    with pytest.raises(CredentialInvalid) as error:
        await file_verifier.verify(token, now=NOW)
    assert problem_of(error) == "algorithm"


async def test_hs256_signed_with_the_public_key_pem_is_refused(file_verifier: JwtVerifier) -> None:
    """The classic key confusion: the issuer's public key, which anybody has, as an HMAC secret."""
    pem = rsa_key(0).public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    for alg, digest in (("HS256", hashlib.sha256), ("HS512", hashlib.sha512)):
        token = hand_made({"alg": alg, "typ": "JWT", "kid": "rsa-1"}, claims(),
                          lambda data, digest=digest: hmac.new(pem, data, digest).digest())  # type: ignore[misc]
        with pytest.raises(CredentialInvalid) as error:
            await file_verifier.verify(token, now=NOW)
        assert problem_of(error) == "algorithm"


async def test_an_allowed_algorithm_that_does_not_fit_the_key_type_is_refused(file_verifier: JwtVerifier) -> None:
    # ES256 is allowed, but the kid names the RSA key; RS256 is allowed, but the kid names the EC key.
    for token in (sign(ec_key(0), "ES256", "rsa-1"), sign(rsa_key(0), "RS256", "ec-1")):
        with pytest.raises(CredentialInvalid) as error:
            await file_verifier.verify(token, now=NOW)
        assert problem_of(error) == "algorithm"


async def test_an_algorithm_outside_the_allow_list_is_refused(jwks_path: Path) -> None:
    verifier = JwtVerifier(JwtConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=str(jwks_path),
                                     algorithms=("RS256",)))
    await verifier.start()
    for token in (sign(ec_key(0), "ES256", "ec-1"), sign(rsa_key(0), "PS256", "rsa-1")):
        with pytest.raises(CredentialInvalid) as error:
            await verifier.verify(token, now=NOW)
        assert problem_of(error) == "algorithm"
    await verifier.close()


async def test_a_key_pinned_to_another_algorithm_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pinned.json"
    document = jwks((rsa_key(0), "rsa-1"))
    document["keys"][0]["alg"] = "PS256"
    write_jwks(path, document)
    verifier = JwtVerifier(JwtConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=str(path),
                                     algorithms=("RS256", "PS256")))
    await verifier.start()
    with pytest.raises(CredentialInvalid) as error:
        await verifier.verify(sign(rsa_key(0), "RS256"), now=NOW)
    assert problem_of(error) == "algorithm"
    assert (await verifier.verify(sign(rsa_key(0), "PS256"), now=NOW)).key_id == "rsa-1"


# --- key ids and the JWKS file ---------------------------------------------------------------------


async def test_an_unknown_kid_with_a_file_jwks_is_refused(file_verifier: JwtVerifier) -> None:
    with pytest.raises(CredentialInvalid) as error:
        await file_verifier.verify(sign(rsa_key(0), kid="rsa-9"), now=NOW)
    assert problem_of(error) == "unknown_kid"


async def test_a_token_without_kid_needs_a_jwks_of_exactly_one_key(file_verifier: JwtVerifier,
                                                                   tmp_path: Path) -> None:
    with pytest.raises(CredentialInvalid) as error:
        await file_verifier.verify(sign(rsa_key(0), kid=None), now=NOW)
    assert problem_of(error) == "unknown_kid"
    single = tmp_path / "single.json"
    write_jwks(single, jwks((rsa_key(0), "rsa-1")))
    verifier = JwtVerifier(JwtConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=str(single)))
    await verifier.start()
    assert (await verifier.verify(sign(rsa_key(0), kid=None), now=NOW)).key_id is None


async def test_the_jwks_file_is_reread_when_it_changes(file_verifier: JwtVerifier, jwks_path: Path) -> None:
    old_token, new_token = sign(rsa_key(0), kid="rsa-1"), sign(rsa_key(1), kid="rsa-2")
    assert await file_verifier.verify(old_token, now=NOW)
    write_jwks(jwks_path, jwks((rsa_key(1), "rsa-2")), mtime=time.time() + 5)
    assert (await file_verifier.verify(new_token, now=NOW)).key_id == "rsa-2"
    with pytest.raises(CredentialInvalid) as error:
        await file_verifier.verify(old_token, now=NOW)
    assert problem_of(error) == "unknown_kid"
    write_jwks(jwks_path, "{ half a rewrite", mtime=time.time() + 10)
    assert (await file_verifier.verify(new_token, now=NOW)).key_id == "rsa-2"  # the last good keys stay


async def test_an_unreadable_jwks_file_fails_the_start(tmp_path: Path) -> None:
    verifier = JwtVerifier(JwtConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=str(tmp_path / "missing.json")))
    with pytest.raises(ValueError, match="jwks_file"):
        await verifier.start()


async def test_symmetric_keys_in_the_jwks_are_left_out(tmp_path: Path) -> None:
    path = tmp_path / "mixed.json"
    document = jwks((rsa_key(0), "rsa-1"))
    document["keys"].append({"kty": "oct", "kid": "hmac-1", "k": b64url(b"secret")})
    write_jwks(path, document)
    verifier = JwtVerifier(JwtConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=str(path)))
    await verifier.start()
    token = hand_made({"alg": "RS256", "kid": "hmac-1"}, claims(), lambda _: b"x")
    with pytest.raises(CredentialInvalid) as error:
        await verifier.verify(token, now=NOW)
    assert problem_of(error) == "unknown_kid"


# --- the JWKS URL ----------------------------------------------------------------------------------


async def test_a_url_jwks_is_fetched_once_and_cached(url_verifier: JwtVerifier, idp: JwksServer) -> None:
    for _ in range(5):
        assert await url_verifier.verify(sign(rsa_key(0)), now=NOW)
    assert idp.requests == 1


async def test_an_unknown_kid_refetches_the_url_jwks(url_verifier: JwtVerifier, idp: JwksServer) -> None:
    idp.document = jwks((rsa_key(0), "rsa-1"), (rsa_key(1), "rsa-2"))  # the IdP rotates in a new key
    assert (await url_verifier.verify(sign(rsa_key(1), kid="rsa-2"), now=NOW)).key_id == "rsa-2"
    assert idp.requests == 2


async def test_unknown_kid_refetches_are_rate_limited(url_verifier: JwtVerifier, idp: JwksServer,
                                                      clock: StepClock) -> None:
    bad = [sign(rsa_key(0), kid=f"made-up-{n}") for n in range(30)]
    outcomes = await asyncio.gather(*(url_verifier.verify(token, now=NOW) for token in bad), return_exceptions=True)
    for token in bad:
        with pytest.raises(CredentialInvalid) as error:
            await url_verifier.verify(token, now=NOW)
        assert problem_of(error) == "unknown_kid"
    assert all(isinstance(outcome, CredentialInvalid) for outcome in outcomes)
    assert idp.requests == 2  # the start, then one refetch for the whole flood
    clock.t += REFETCH_INTERVAL_S - 0.5
    with pytest.raises(CredentialInvalid):
        await url_verifier.verify(bad[0], now=NOW)
    assert idp.requests == 2
    clock.t += 1.0
    with pytest.raises(CredentialInvalid):
        await url_verifier.verify(bad[0], now=NOW)
    assert idp.requests == 3
    assert await url_verifier.verify(sign(rsa_key(0)), now=NOW)  # known keys never wait on the limiter


async def wait_for_requests(idp: JwksServer, count: int) -> None:
    for _ in range(200):
        if idp.requests >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the JWKS was fetched {idp.requests} times, not {count}")


async def test_a_failing_url_keeps_the_last_good_keys(url_verifier: JwtVerifier, idp: JwksServer,
                                                      clock: StepClock) -> None:
    idp.status = 503
    clock.t += 301.0  # past refresh_s: the next verification starts a background refresh
    assert await url_verifier.verify(sign(rsa_key(0)), now=NOW)
    await wait_for_requests(idp, 2)
    await asyncio.sleep(0.05)
    assert (await url_verifier.verify(sign(rsa_key(0)), now=NOW)).key_id == "rsa-1"
    idp.status, idp.document = 200, jwks((rsa_key(1), "rsa-2"))
    clock.t += REFETCH_INTERVAL_S
    await url_verifier.verify(sign(rsa_key(0)), now=NOW)
    await wait_for_requests(idp, 3)
    for _ in range(100):  # the refresh replaced the keys: the old kid is gone
        try:
            await url_verifier.verify(sign(rsa_key(0)), now=NOW)
        except CredentialInvalid as exc:
            assert exc.metadata["problem"] == "unknown_kid"
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the refreshed JWKS was not installed")


async def test_a_url_down_at_start_is_fetched_when_a_token_needs_it(idp: JwksServer, clock: StepClock) -> None:
    idp.status = 500
    verifier = JwtVerifier(JwtConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=idp.url), monotonic=clock)
    await verifier.start()  # logged, not raised
    with pytest.raises(Unavailable):
        await verifier.verify(sign(rsa_key(0)), now=NOW)
    idp.status = 200
    with pytest.raises(Unavailable):  # within the refetch interval: no new fetch
        await verifier.verify(sign(rsa_key(0)), now=NOW)
    assert idp.requests == 2
    clock.t += REFETCH_INTERVAL_S
    assert (await verifier.verify(sign(rsa_key(0)), now=NOW)).key_id == "rsa-1"
    assert idp.requests == 3
    await verifier.close()
    await verifier.close()


# --- tenants, roles, subject -----------------------------------------------------------------------


async def test_a_tenant_list_and_a_dotted_roles_claim(jwks_path: Path) -> None:
    verifier = JwtVerifier(JwtConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=str(jwks_path),
                                     roles_claim="realm_access.roles", tenant_claim="https://agentrt.dev/tenants"))
    await verifier.start()
    namespaced: dict[str, Any] = {"https://agentrt.dev/tenants": ["acme", "globex"]}
    token = sign(rsa_key(0), tenant=None, roles=None, realm_access={"roles": ["admin", "reader", "admin"]},
                 **namespaced)
    verified = await verifier.verify(token, now=NOW)
    assert verified.tenants == ("acme", "globex")
    assert verified.roles == ("admin", "reader")
    namespaced = {"https://agentrt.dev/tenants": "acme"}
    no_roles = sign(rsa_key(0), tenant=None, roles=None, **namespaced)
    assert (await verifier.verify(no_roles, now=NOW)).roles == ()


@pytest.mark.parametrize("overrides", [
    {"tenant": None}, {"tenant": []}, {"tenant": ""}, {"tenant": ["acme", 7]}, {"tenant": {"id": "acme"}},
    {"roles": [1, 2]}, {"sub": ""}, {"sub": 42},
])
async def test_missing_or_malformed_tenant_roles_or_subject_are_refused(
        file_verifier: JwtVerifier, overrides: dict[str, Any]) -> None:
    with pytest.raises(CredentialInvalid) as error:
        await file_verifier.verify(sign(rsa_key(0), **overrides), now=NOW)
    assert problem_of(error) == "claims"


async def test_a_configured_subject_claim_is_required(jwks_path: Path) -> None:
    verifier = JwtVerifier(JwtConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=str(jwks_path),
                                     subject_claim="client_id"))
    await verifier.start()
    assert (await verifier.verify(sign(rsa_key(0), client_id="ci-bot"), now=NOW)).subject == "ci-bot"
    with pytest.raises(CredentialInvalid) as error:
        await verifier.verify(sign(rsa_key(0)), now=NOW)
    assert problem_of(error) == "claims"


# --- configuration ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "words"), [
    ({"algorithms": ("RS256", "HS256")}, "HS256"),
    ({"algorithms": ("none",)}, "none"),
    ({"algorithms": ("RS256", "hs512")}, "hs512"),
    ({"algorithms": ("RS257",)}, "not supported"),
    ({"algorithms": ()}, "algorithms"),
    ({"algorithms": "RS256"}, "algorithms"),
    ({"jwks_url": "http://127.0.0.1/jwks"}, "exactly one"),
    ({"jwks_file": None}, "exactly one"),
    ({"jwks_file": None, "jwks_url": "file:///etc/jwks.json"}, "http"),
    ({"issuer": ""}, "issuer"),
    ({"audience": ""}, "audience"),
    ({"refresh_s": 0}, "refresh_s"),
    ({"leeway_s": -1}, "leeway_s"),
])
def test_bad_configurations_are_refused(overrides: dict[str, Any], words: str) -> None:
    settings: dict[str, Any] = {"issuer": ISSUER, "audience": AUDIENCE, "jwks_file": "/etc/agentrt/jwks.json"}
    settings.update(overrides)
    with pytest.raises(ValueError) as error:
        JwtVerifier(JwtConfig(**settings))
    assert words in str(error.value) and "\n" not in str(error.value)
