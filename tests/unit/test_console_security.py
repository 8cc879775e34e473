"""The console's session cookie, CSRF tokens and response headers, over real HTTP on loopback (the
console under uvicorn; no scheduler is needed for what is checked here, and none listens at the
address it is given, so any call it made would show as UNAVAILABLE)."""

from __future__ import annotations

import re
import time

import aiohttp
from console_support import console_server

from console.security import CSP
from console.session import COOKIE, Session, SessionCodec, csrf_ok
from console.web import HERE, local_path


def test_a_session_survives_the_round_trip_and_nothing_else_does() -> None:
    codec = SessionCodec("secret-1", max_age_s=60)
    session = Session(credential="agrt_abc", kind="api_key", principal="key:1", role="operator")
    cookie = codec.dump(session)
    assert "agrt_abc" not in cookie  # encrypted, not only signed
    assert codec.load(cookie) == session
    tampered = cookie[:-6] + ("A" if cookie[-6] != "A" else "B") + cookie[-5:]
    assert codec.load(tampered) is None
    assert SessionCodec("secret-2", max_age_s=60).load(cookie) is None
    assert codec.load(codec.dump(session, now=time.time() - 61)) is None  # expired
    assert codec.load(codec.dump(session, now=time.time() - 59)) == session
    assert codec.load("") is None and codec.load("not-a-token") is None


def test_csrf_tokens_are_per_session_and_compared_exactly() -> None:
    one, two = Session(), Session()
    assert one.csrf != two.csrf and len(one.csrf) >= 40
    assert csrf_ok(one, one.csrf)
    assert not csrf_ok(one, two.csrf)
    assert not csrf_ok(one, "") and not csrf_ok(one, None) and not csrf_ok(None, one.csrf)


def test_only_local_paths_are_followed_after_a_form() -> None:
    assert local_path("/runs/abc?x=1", "/runs") == "/runs/abc?x=1"
    for hostile in ("//evil.example/x", "https://evil.example", "/\\evil.example", "javascript:alert(1)", ""):
        assert local_path(hostile, "/runs") == "/runs"


def test_no_template_has_inline_script_style_or_event_handlers() -> None:
    for template in sorted((HERE / "templates").glob("*.html")):
        text = template.read_text()
        for tag in re.findall(r"<script\b[^>]*>", text):
            assert "src=" in tag, f"{template.name}: inline script {tag}"
        assert not re.search(r"\son[a-z]+\s*=", text), f"{template.name}: an inline event handler"
        assert not re.search(r"\sstyle\s*=", text) and "<style" not in text, f"{template.name}: inline style"
        assert "|safe" not in text and "Markup(" not in text, f"{template.name}: escaping switched off"


def test_the_csp_allows_nothing_inline() -> None:
    directives = dict(part.strip().split(" ", 1) for part in CSP.split(";"))
    assert directives["default-src"] == "'none'" and directives["script-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'" and directives["form-action"] == "'self'"
    assert "unsafe" not in CSP


class _Nowhere:
    addr = "127.0.0.1:9"  # discard: nothing answers gRPC there


async def test_pages_carry_the_headers_and_a_strict_cookie_and_forms_need_the_token() -> None:
    async with console_server(_Nowhere()) as url, aiohttp.ClientSession() as http:  # type: ignore[arg-type]
        async with http.get(f"{url}/signin", allow_redirects=False) as reply:
            assert reply.status == 200
            assert reply.headers["content-security-policy"] == CSP
            assert reply.headers["x-frame-options"] == "DENY" and reply.headers["x-content-type-options"] == "nosniff"
            assert reply.headers["cache-control"] == "no-store"
            [set_cookie] = reply.headers.getall("set-cookie")
            attributes = {a.strip().split("=")[0].lower() for a in set_cookie.split(";")}
            assert {"httponly", "secure", "samesite", "max-age", "path"} <= attributes
            assert "samesite=strict" in set_cookie.lower()
            cookie = set_cookie.split(";")[0].split("=", 1)[1]
            page = await reply.text()
        token = re.search(r'name="csrf" value="([^"]+)"', page)
        assert token

        async with http.get(f"{url}/static/htmx.min.js") as reply:
            assert reply.status == 200 and reply.headers["content-security-policy"] == CSP
        async with http.get(f"{url}/runs", allow_redirects=False) as reply:
            assert reply.status == 303 and reply.headers["location"].startswith("/signin?next=")

        headers = {"cookie": f"{COOKIE}={cookie}"}
        form = {"credential": "agrt_whatever", "kind": "api_key"}
        # Without the token, or with another, sign-in is refused before the scheduler is asked.
        for extra in ({}, {"csrf": "not-the-token"}):
            async with http.post(f"{url}/signin", data={**form, **extra}, headers=headers,
                                 allow_redirects=False) as reply:
                assert reply.status == 403 and "form expired" in await reply.text()
        # With it, the scheduler is asked (and is not there).
        async with http.post(f"{url}/signin", data={**form, "csrf": token.group(1)}, headers=headers,
                             allow_redirects=False) as reply:
            assert reply.status == 503 and "unavailable" in (await reply.text()).lower()
        # An action without a session's token is refused before anything is called.
        async with http.post(f"{url}/runs/abc/cancel", data={"reason": "x"}, headers=headers,
                             allow_redirects=False) as reply:
            assert reply.status == 403 and "CSRF" in await reply.text()

