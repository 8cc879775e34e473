"""What every console page and action shares: the Console (settings, the one channel to the scheduler,
the session codec, the templates), the wrappers that demand a session (and, for a POST, its CSRF
token), form reading, and how a failed call is shown."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jinja2
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from console import views
from console.api import STATUSES, Api
from console.config import ConsoleSettings
from console.session import COOKIE, Session, SessionCodec, csrf_ok
from shared.errors import AgentrtError, InvalidArgument, Unauthenticated, status_code_for

HERE = Path(__file__).resolve().parent

# What each role may do, for showing buttons only: the scheduler decides (scheduler/security/rbac.py).
_ROLE_ORDER = ("viewer", "submitter", "operator", "admin")
_FIRST_ROLE = {"cancel": "submitter", "retry": "submitter", "signal": "submitter", "schedules": "submitter",
               "resume": "operator", "resolve": "operator", "reveal": "operator", "audit": "admin", "keys": "admin",
               "limits": "admin"}
HTTP_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.UNAUTHENTICATED: 401,
               grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.NOT_FOUND: 404,
               grpc.StatusCode.ALREADY_EXISTS: 409, grpc.StatusCode.FAILED_PRECONDITION: 409,
               grpc.StatusCode.ABORTED: 409, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
               grpc.StatusCode.UNAVAILABLE: 503}
NOTICES = {"approved": "Approved: the run goes on.", "rejected": "Rejected.", "answered": "Input sent.",
           "cancelled": "Cancel requested.",
           "cancelled-alone": "Cancel requested for this run alone: its children go on.",
           "retried": "Retried: this is the new run.", "signalled": "Signal queued.",
           "resolved": "Resolution recorded: the run goes on.", "paused": "Schedule paused.",
           "unpaused": "Schedule resumed.", "signedout": "Signed out.", "created": "Schedule created.",
           "revoked": "Key revoked: it is refused from now on.",
           "limit": "Limit set: every scheduler applies it within seconds."}


def may(role: str, action: str) -> bool:
    first = _FIRST_ROLE.get(action)
    return role in _ROLE_ORDER and (first is None or _ROLE_ORDER.index(role) >= _ROLE_ORDER.index(first))


def error_text(error: AgentrtError) -> str:
    """A failed call in words a person reads, with its stable reason."""
    code = status_code_for(error)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return f"Permission denied: the scheduler refused this for your credential ({error.message})."
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"The scheduler is unavailable ({error.message}). Try again shortly."
    return f"{error.reason}: {error.message}"


@dataclass
class Console:
    settings: ConsoleSettings
    channel: grpc.aio.Channel
    codec: SessionCodec
    templates: jinja2.Environment

    # ------------------------------------------------------------------ sessions and rendering

    def session(self, request: Request) -> Session | None:
        return self.codec.load(request.cookies.get(COOKIE))

    def api(self, session: Session) -> Api:
        return Api(self.channel, credential=session.credential, tenant=session.tenant)

    def set_cookie(self, response: Response, session: Session) -> None:
        response.set_cookie(COOKIE, self.codec.dump(session), max_age=self.settings.session_max_age_s, path="/",
                            httponly=True, secure=self.settings.cookie_secure, samesite="strict")

    def page(self, request: Request, session: Session, template: str, status_code: int = 200,
             **context: Any) -> HTMLResponse:
        notice = NOTICES.get(request.query_params.get("notice", ""), "")
        body = self.templates.get_template(template).render(
            session=session, csrf=session.csrf, may=lambda action: may(session.role, action), notice=notice,
            statuses=STATUSES, path=request.url.path, trace_url_template=self.settings.trace_url_template,
            **context)
        response = HTMLResponse(body, status_code=status_code)
        if request.cookies.get(COOKIE) is None or self.codec.load(request.cookies.get(COOKIE)) != session:
            self.set_cookie(response, session)
        return response

    def failure(self, request: Request, session: Session, error: AgentrtError) -> Response:
        if isinstance(error, Unauthenticated):  # the key was revoked or expired since sign-in
            return self.page(request, Session(), "signin.html", 401,
                             error=f"Your session's credential is no longer accepted: {error.message}. "
                                   "Sign in again.")
        return self.page(request, session, "error.html", HTTP_STATUS.get(status_code_for(error), 500),
                         error=error_text(error))


def page_handler(handler: Callable[[Console, Request, Session], Awaitable[Response]],
                 ) -> Callable[[Request], Awaitable[Response]]:
    """The page needs a session: without one, the sign-in page (which comes back here after)."""

    async def endpoint(request: Request) -> Response:
        console: Console = request.app.state.console
        session = console.session(request)
        if session is None or not session.signed_in:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/signin?next={quote(target)}", status_code=303)
        try:
            return await handler(console, request, session)
        except AgentrtError as error:
            return console.failure(request, session, error)

    return endpoint


def action_handler(handler: Callable[[Console, Request, Session, FormData], Awaitable[Response]],
                   ) -> Callable[[Request], Awaitable[Response]]:
    """A POST: signed in, and the form's CSRF token is the session's, or nothing is called."""

    async def endpoint(request: Request) -> Response:
        console: Console = request.app.state.console
        session = console.session(request)
        form = await request.form()
        if session is None or not csrf_ok(session, form_csrf(form)):
            return PlainTextResponse("Refused: the form's CSRF token is missing or not this session's. "
                                     "Reload the page and try again.", status_code=403)
        if not session.signed_in:
            return RedirectResponse("/signin", status_code=303)
        try:
            return await handler(console, request, session, form)
        except AgentrtError as error:
            return console.failure(request, session, error)

    return endpoint


def quote(text: str) -> str:
    from urllib.parse import quote as url_quote

    return url_quote(text, safe="")


def form_text(form: FormData, name: str, limit: int = 100_000) -> str:
    value = form.get(name)
    text = value if isinstance(value, str) else ""
    if len(text) > limit:
        raise InvalidArgument(name, f"is longer than {limit} characters")
    return text.strip()


def form_csrf(form: FormData) -> str | None:
    """The form's CSRF token as sent (compared, never refused for its length: that would skip the check)."""
    value = form.get("csrf")
    return value if isinstance(value, str) else None


def local_path(target: str, default: str) -> str:
    """Only a path on this console (never //host or a scheme) is followed after a form."""
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else default


def json_field(form: FormData, name: str, *, required: bool = False) -> str:
    text = form_text(form, name)
    if not text:
        if required:
            raise InvalidArgument(name, "is required")
        return ""
    try:
        json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(name, f"is not JSON: {exc}") from None
    return text


def form_request_id(form: FormData) -> str:
    """The form's own id, made when the page was rendered: sending it twice acts once."""
    text = form_text(form, "request_id", 200)
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return str(uuid.uuid4())


def back(form: FormData, default: str, notice: str) -> Response:
    target = local_path(form_text(form, "next"), default)
    return RedirectResponse(f"{target}{'&' if '?' in target else '?'}notice={notice}", status_code=303)


def templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    views.register_filters(env)
    return env
