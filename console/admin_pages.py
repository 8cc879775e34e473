"""The registry and administration pages: agents, schedules, the audit trail, API keys."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from console.session import Session
from console.web import Console, back, form_request_id, form_text, json_field
from shared.errors import InvalidArgument
from shared.gen.agentrt.v1 import run_service_pb2 as rs

ROLES = ("viewer", "submitter", "operator", "admin")


async def agents_page(console: Console, request: Request, session: Session) -> Response:
    reply = await console.api(session).agents()
    return console.page(request, session, "agents.html", agents=reply.agents)


async def schedules_page(console: Console, request: Request, session: Session) -> Response:
    reply = await console.api(session).schedules()
    return console.page(request, session, "schedules.html", schedules=reply.schedules,
                        new_request_id=lambda: str(uuid.uuid4()))


async def pause_schedule(console: Console, request: Request, session: Session, form: FormData) -> Response:
    paused = form_text(form, "paused") == "true"
    await console.api(session).pause_schedule(request.path_params["schedule_id"], paused, form_request_id(form))
    return back(form, "/schedules", "paused" if paused else "unpaused")


async def audit_page(console: Console, request: Request, session: Session) -> Response:
    params = request.query_params
    filters = {"run_id": params.get("run_id", "").strip()[:100], "principal": params.get("principal", "").strip()[:200],
               "action": params.get("action", "").strip()[:200]}
    reply = await console.api(session).audit(**filters, page_size=100, page_token=params.get("page_token", "")[:2000])
    from urllib.parse import urlencode

    next_query = urlencode({**filters, "page_token": reply.next_page_token}) if reply.next_page_token else ""
    return console.page(request, session, "audit.html", events=reply.events, filters=filters, next_query=next_query)


async def create_schedule(console: Console, request: Request, session: Session, form: FormData) -> Response:
    """As `agentrt schedules create`: a name, an agent, its input, and an interval or a cron line."""
    name, agent = form_text(form, "name", 200), form_text(form, "agent_name", 128)
    if not name:
        raise InvalidArgument("name", "is required")
    if not agent:
        raise InvalidArgument("agent_name", "is required")
    spec = rs.ScheduleSpec(agent_name=agent, input_json=json_field(form, "input_json"),
                           cron=form_text(form, "cron", 200), time_zone=form_text(form, "time_zone", 100))
    every = form_text(form, "interval_s", 20)
    if every:
        try:
            spec.interval_ms = int(float(every) * 1000)
        except ValueError:
            raise InvalidArgument("interval_s", "is not a number of seconds") from None
    if bool(spec.interval_ms) == bool(spec.cron):
        raise InvalidArgument("interval_s", "give an interval in seconds or a cron line, one of the two")
    await console.api(session).create_schedule(name, spec, form_request_id(form))
    return back(form, "/schedules", "created")


async def keys_page(console: Console, request: Request, session: Session, *, created: Any = None,
                    secret: str = "") -> Response:
    include_revoked = request.query_params.get("revoked") == "1"
    keys = await console.api(session).keys(include_revoked=include_revoked)
    return console.page(request, session, "keys.html", keys=keys, created=created, secret=secret,
                        include_revoked=include_revoked, roles=ROLES, new_request_id=lambda: str(uuid.uuid4()))


async def create_key(console: Console, request: Request, session: Session, form: FormData) -> Response:
    """The new key's secret is on this one answer (no-store), never again."""
    name, role = form_text(form, "name", 200), form_text(form, "role")
    if role not in ROLES:
        raise InvalidArgument("role", f"must be one of {', '.join(ROLES)}")
    days = form_text(form, "expires_days", 10)
    try:
        expires_in_s = int(float(days) * 86400) if days else 0
    except ValueError:
        raise InvalidArgument("expires_days", "is not a number of days") from None
    tenants = [t.strip() for t in form_text(form, "tenants", 2000).split(",") if t.strip()]
    reply = await console.api(session).create_key(name, role, tenants=tenants, expires_in_s=expires_in_s,
                                                  reason=form_text(form, "reason", 1000),
                                                  request_id=form_request_id(form))
    return await keys_page(console, request, session, created=reply.key, secret=reply.secret)


async def revoke_key(console: Console, request: Request, session: Session, form: FormData) -> Response:
    await console.api(session).revoke_key(request.path_params["key_id"], reason=form_text(form, "reason", 1000),
                                          request_id=form_request_id(form))
    return back(form, "/keys", "revoked")
