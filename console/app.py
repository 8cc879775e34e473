"""The console's ASGI app (Starlette): its routes, sign-in and sign-out. Every page reads or acts
through RunService with the signed-in person's credential (console/api.py); the scheduler decides what
they may see and do.

URLs are stable so alerts and chat can link them: /runs, /runs/{run_id}, /attention, /queue,
/agents, /schedules, /audit, /keys.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import grpc
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from console import admin_pages, run_pages
from console.api import Api
from console.config import ConsoleSettings
from console.security import SecurityHeaders
from console.session import Session, SessionCodec, csrf_ok, signed_in
from console.web import (
    HERE,
    HTTP_STATUS,
    Console,
    action_handler,
    error_text,
    form_csrf,
    form_text,
    local_path,
    page_handler,
    templates,
)
from shared.errors import AgentrtError, status_code_for
from shared.transport import ClientTls, open_channel, require_tls

log = logging.getLogger("agentrt.console")
MAX_COOKIE_CHARS = 3900  # browsers keep cookies up to 4096 bytes, name and attributes included

# ---------------------------------------------------------------------- sign-in


async def signin_page(request: Request) -> Response:
    console: Console = request.app.state.console
    session = console.session(request) or Session()
    return console.page(request, session, "signin.html", next=local_path(request.query_params.get("next", ""), "/runs"))


async def signin(request: Request) -> Response:
    console: Console = request.app.state.console
    session = console.session(request)
    form = await request.form()
    if session is None or not csrf_ok(session, form_csrf(form)):
        return console.page(request, Session(), "signin.html", 403,
                            error="The sign-in form expired. It has been reloaded: sign in again.")
    target = local_path(form_text(form, "next"), "/runs")
    credential = form_text(form, "credential", 20_000)
    kind = "token" if form_text(form, "kind") == "token" else "api_key"
    tenant = form_text(form, "tenant", 200)
    if not credential:
        return console.page(request, session, "signin.html", 400, next=target,
                            error="Enter an API key or a token.")
    try:
        stats = await Api(console.channel, credential=credential, tenant=tenant).stats()
    except AgentrtError as error:
        code = status_code_for(error)
        if code == grpc.StatusCode.UNAUTHENTICATED:
            text = f"Sign-in failed: the scheduler does not accept this {'token' if kind == 'token' else 'API key'} "\
                   f"({error.message})."
        elif code == grpc.StatusCode.PERMISSION_DENIED:
            text = f"Sign-in failed: {error.message}. A credential for several tenants needs a tenant."
        else:
            text = f"Sign-in failed: {error_text(error)}"
        return console.page(request, session, "signin.html", HTTP_STATUS.get(code, 500), next=target, error=text,
                            tenant=tenant)
    new = signed_in(session, credential=credential, kind=kind, tenant=tenant, principal=stats.principal,
                    role=stats.role or "viewer")
    if len(console.codec.dump(new)) > MAX_COOKIE_CHARS:  # a browser drops a bigger cookie without a word
        return console.page(request, session, "signin.html", 400, next=target, tenant=tenant,
                            error="Sign-in failed: this token is too long to keep in a browser cookie "
                                  f"(over {MAX_COOKIE_CHARS} characters once encrypted); ask for a shorter one.")
    response = RedirectResponse(target, status_code=303)
    console.set_cookie(response, new)
    log.info("console sign-in", extra={"principal": stats.principal, "role": stats.role})
    return response


async def signout(request: Request) -> Response:
    console: Console = request.app.state.console
    session = console.session(request)
    form = await request.form()
    if session is None or not csrf_ok(session, form_csrf(form)):
        return PlainTextResponse("Refused: the form's CSRF token is missing or not this session's.", status_code=403)
    response = RedirectResponse("/signin?notice=signedout", status_code=303)
    console.set_cookie(response, Session())
    return response


async def switch_tenant(console: Console, request: Request, session: Session, form: FormData) -> Response:
    """A credential of several tenants (or '*') acts for one at a time: the scheduler checks the new one."""
    tenant = form_text(form, "tenant", 200)
    stats = await Api(console.channel, credential=session.credential, tenant=tenant).stats()
    response = RedirectResponse("/runs", status_code=303)
    console.set_cookie(response, replace(session, tenant=tenant, role=stats.role or session.role,
                                         principal=stats.principal))
    return response


async def home(request: Request) -> Response:
    return RedirectResponse("/runs", status_code=303)


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


def build_app(settings: ConsoleSettings, channel: grpc.aio.Channel | None = None) -> Starlette:
    """The ASGI app. `channel` (tests) or one opened from the settings (TLS as the CLI's flags)."""
    tls = ClientTls(settings.tls_ca, settings.tls_cert, settings.tls_key, settings.tls_server_name) \
        if settings.tls_ca or settings.tls_cert else None
    if channel is None:
        from shared.client.runs import is_loopback

        require_tls(credential=True, tls=tls, insecure=settings.insecure or is_loopback(settings.scheduler_addr),
                    what=f"the console's scheduler at {settings.scheduler_addr}")
        channel = open_channel(settings.scheduler_addr, tls)
    console = Console(settings, channel, SessionCodec(settings.session_secret, settings.session_max_age_s),
                      templates())
    routes = [
        Route("/", home),
        Route("/healthz", healthz),
        Route("/signin", signin_page, methods=["GET"]),
        Route("/signin", signin, methods=["POST"]),
        Route("/signout", signout, methods=["POST"]),
        Route("/tenant", action_handler(switch_tenant), methods=["POST"]),
        Route("/runs", page_handler(run_pages.runs_page)),
        Route("/runs/counts/stream", page_handler(run_pages.counts_stream)),
        Route("/runs/{run_id}", page_handler(run_pages.run_page), methods=["GET"]),
        Route("/runs/{run_id}/stream", page_handler(run_pages.run_stream)),
        Route("/runs/{run_id}/reveal", action_handler(run_pages.reveal), methods=["POST"]),
        Route("/runs/{run_id}/resume", action_handler(run_pages.resume), methods=["POST"]),
        Route("/runs/{run_id}/cancel", action_handler(run_pages.cancel), methods=["POST"]),
        Route("/runs/{run_id}/retry", action_handler(run_pages.retry), methods=["POST"]),
        Route("/runs/{run_id}/signal", action_handler(run_pages.signal), methods=["POST"]),
        Route("/runs/{run_id}/resolve", action_handler(run_pages.resolve), methods=["POST"]),
        Route("/attention", page_handler(run_pages.attention_page)),
        Route("/queue", page_handler(run_pages.queue_page), methods=["GET"]),
        Route("/queue/limits", action_handler(run_pages.set_limit), methods=["POST"]),
        Route("/agents", page_handler(admin_pages.agents_page)),
        Route("/schedules", page_handler(admin_pages.schedules_page), methods=["GET"]),
        Route("/schedules/{schedule_id}/pause", action_handler(admin_pages.pause_schedule), methods=["POST"]),
        Route("/schedules", action_handler(admin_pages.create_schedule), methods=["POST"]),
        Route("/audit", page_handler(admin_pages.audit_page)),
        Route("/keys", page_handler(admin_pages.keys_page), methods=["GET"]),
        Route("/keys", action_handler(admin_pages.create_key), methods=["POST"]),
        Route("/keys/{key_id}/revoke", action_handler(admin_pages.revoke_key), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.console = console
    app.add_middleware(SecurityHeaders)
    return app
