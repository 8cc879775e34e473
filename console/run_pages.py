"""The runs pages: the list with its live counts, a run's page with its live status and timeline, its
actions (approve, reject, input, cancel, signal, settle an in-doubt call, reveal), needs attention, and
the queue."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from console import views
from console.api import STATUSES, TERMINAL, status_name
from console.session import Session
from console.web import Console, back, error_text, form_request_id, form_text, json_field
from shared.errors import AgentrtError, InvalidArgument
from shared.gen.agentrt.v1 import run_service_pb2 as rs

# ---------------------------------------------------------------------- runs


FILTER_FIELDS = ("agent", "label", "min_priority", "max_priority", "tenant", "created_after", "created_before")


def run_filters(request: Request) -> dict[str, Any]:
    """The runs page's filters as the form shows them (the query string: stable, linkable URLs)."""
    params = request.query_params
    filters: dict[str, Any] = {name: params.get(name, "").strip()[:2000] for name in FILTER_FIELDS}
    filters.update(statuses=[s for s in params.getlist("status") if s in STATUSES],
                   page_token=params.get("page_token", "")[:2000])
    return filters


def _labels(text: str) -> dict[str, str]:
    """`team=a, env=prod`: every pair must match."""
    labels: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        key, sep, value = part.partition("=")
        if part and (not sep or not key.strip()):
            raise InvalidArgument("label", f"{part!r} is not key=value (separate several with commas)")
        if part:
            labels[key.strip()] = value.strip()
    return labels


def _priority(field: str, text: str) -> int:
    if not text:
        return 0
    if not text.isdigit() or not 1 <= int(text) <= 9:
        raise InvalidArgument(field, "must be a whole number from 1 to 9")
    return int(text)


def _when(field: str, text: str) -> dt.datetime | None:
    """A time from the form (a datetime-local field, read as UTC unless it names a zone)."""
    if not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(field, "is not a time (YYYY-MM-DDTHH:MM, UTC)") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


async def runs_page(console: Console, request: Request, session: Session) -> Response:
    """The scheduler filters and pages (ListRuns); the "Older runs" link carries every filter with its token.
    The counts by status come over SSE right after the page loads (GetStats counts every run of the
    tenant: the list must not wait for it); the queue page renders them in place."""
    f = run_filters(request)
    try:
        reply = await console.api(session).list_runs(
            statuses=f["statuses"], agent=f["agent"], page_size=console.settings.page_size,
            page_token=f["page_token"], labels=_labels(f["label"]),
            min_priority=_priority("min_priority", f["min_priority"]),
            max_priority=_priority("max_priority", f["max_priority"]), tenant_id=f["tenant"],
            created_after=_when("created_after", f["created_after"]),
            created_before=_when("created_before", f["created_before"]))
    except InvalidArgument as error:  # shown beside the form it came from, which keeps what was typed
        return console.page(request, session, "runs.html", 400, runs=[], filters=f, next_query="",
                            counts=[(status, "…") for status in STATUSES], error=error_text(error))
    next_query = ""
    if reply.next_page_token:
        next_query = urlencode([*[("status", s) for s in f["statuses"]],
                                *[(name, f[name]) for name in FILTER_FIELDS if f[name]],
                                ("page_token", reply.next_page_token)])
    return console.page(request, session, "runs.html", runs=reply.runs, filters=f, next_query=next_query,
                        counts=[(status, "…") for status in STATUSES], error="")


def sse_event(event: str, html: str) -> str:
    return f"event: {event}\n" + "".join(f"data: {line}\n" for line in html.splitlines() or [""]) + "\n"


async def sse_stream(request: Request, console: Console,
                     produce: Callable[[], Awaitable[tuple[str, str, bool]]],
                     ) -> StreamingResponse:
    """Server-Sent Events: `produce` answers (event, html, slow); an event goes out only when its html
    changed. Ends when the browser goes away, or after 10 minutes (EventSource reconnects)."""
    interval = console.settings.poll_interval_ms / 1000

    async def events() -> AsyncIterator[str]:
        last = ""
        deadline = time.monotonic() + 600
        yield "retry: 2000\n\n"
        while time.monotonic() < deadline and not await request.is_disconnected():
            try:
                event, html, slow = await produce()
            except AgentrtError as error:
                event, html, slow = "problem", f"<p class=\"error\">{views.escape(error_text(error))}</p>", True
            if html != last:
                last = html
                yield sse_event(event, html)
            else:
                yield ": still here\n\n"
            await asyncio.sleep(interval * (5 if slow else 1))

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"cache-control": "no-store", "x-accel-buffering": "no"})


async def counts_stream(console: Console, request: Request, session: Session) -> Response:
    api = console.api(session)
    template = console.templates.get_template("_counts.html")

    async def produce() -> tuple[str, str, bool]:
        return "counts", template.render(counts=views.counts(await api.stats())), False

    return await sse_stream(request, console, produce)


async def run_page(console: Console, request: Request, session: Session, *, reveal: bool = False,
                   reason: str = "", status_code: int = 200, error: str = "") -> Response:
    run_id = request.path_params["run_id"]
    api = console.api(session)
    run = await api.get_run(run_id, reveal=reveal, reason=reason)
    (history, more), tree = await asyncio.gather(api.history(run_id, reveal=reveal, reason=reason), api.tree(run_id))
    return console.page(request, session, "run.html", status_code, run=run, live=views.live_run(run, history, more),
                        history=history, tree=views.tree(tree), revealed=reveal, error=error,
                        in_doubt=views.in_doubt(history), new_request_id=lambda: str(uuid.uuid4()))


async def run_stream(console: Console, request: Request, session: Session) -> Response:
    run_id = request.path_params["run_id"]
    api = console.api(session)
    template = console.templates.get_template("_run_live.html")
    shown = request.query_params.get("shown", "")  # the status the page's actions were rendered for
    seen: dict[str, Any] = {}

    async def produce() -> tuple[str, str, bool]:
        run = await api.get_run(run_id)
        if seen.get("version") != run.version:
            history, more = await api.history(run_id)
            live = views.live_run(run, history, more)
            seen.update(version=run.version, html=template.render(live=live, stale=bool(shown) and live.status != shown,
                                                                  run_path=f"/runs/{run_id}"))
        return "run", str(seen["html"]), status_name(run.status) in TERMINAL

    return await sse_stream(request, console, produce)


async def reveal(console: Console, request: Request, session: Session, form: FormData) -> Response:
    return await run_page(console, request, session, reveal=True, reason=form_text(form, "reason", 1000))


async def resume(console: Console, request: Request, session: Session, form: FormData) -> Response:
    run_id = request.path_params["run_id"]
    decision = form_text(form, "decision")
    if decision not in ("approve", "reject", "input"):
        raise InvalidArgument("decision", "must be approve, reject or input")
    input_json = json_field(form, "input_json", required=decision == "input")
    await console.api(session).resume(run_id, decision, input_json=input_json, comment=form_text(form, "comment", 2000),
                                      operator=session.principal, request_id=form_request_id(form))
    notice = {"approve": "approved", "reject": "rejected", "input": "answered"}[decision]
    return back(form, f"/runs/{run_id}", notice)


async def cancel(console: Console, request: Request, session: Session, form: FormData) -> Response:
    """With its children (not spawned detached), or with keep_children the run alone."""
    run_id = request.path_params["run_id"]
    keep_children = form_text(form, "keep_children") == "yes"
    await console.api(session).cancel(run_id, reason=form_text(form, "reason", 1000) or "cancelled from the console",
                                      request_id=form_request_id(form), keep_children=keep_children)
    return back(form, f"/runs/{run_id}", "cancelled-alone" if keep_children else "cancelled")


async def retry(console: Console, request: Request, session: Session, form: FormData) -> Response:
    """A FAILED or CANCELLED run started again (RetryRun): the answer is the new run's page."""
    run_id = request.path_params["run_id"]
    reason = form_text(form, "reason", 1000) or "retried from the console"
    reply = await console.api(session).retry(run_id, reason=reason, request_id=form_request_id(form))
    return back(form, f"/runs/{reply.run.run_id}", "retried")


async def signal(console: Console, request: Request, session: Session, form: FormData) -> Response:
    run_id = request.path_params["run_id"]
    name = form_text(form, "name", 200)
    if not name:
        raise InvalidArgument("name", "is required")
    await console.api(session).signal(run_id, name, payload_json=json_field(form, "payload_json"),
                                      request_id=form_request_id(form))
    return back(form, f"/runs/{run_id}", "signalled")


async def resolve(console: Console, request: Request, session: Session, form: FormData) -> Response:
    """As `agentrt tools resolve`: an outcome, and evidence of it (what was checked, and where)."""
    run_id = request.path_params["run_id"]
    outcome = form_text(form, "outcome")
    if outcome not in ("SUCCEEDED", "NOT_EXECUTED", "UNKNOWN"):
        raise InvalidArgument("outcome", "must be SUCCEEDED, NOT_EXECUTED or UNKNOWN")
    evidence_text = form_text(form, "evidence", 20_000)
    if not evidence_text:
        raise InvalidArgument("evidence", "is required: say what you checked and what it showed")
    try:
        parsed = json.loads(evidence_text)
        evidence = parsed if isinstance(parsed, dict) else {"note": evidence_text}
    except ValueError:
        evidence = {"note": evidence_text}
    evidence.setdefault("resolved_in", "console")
    result_json = json_field(form, "result_json")
    if outcome == "SUCCEEDED" and not result_json:
        raise InvalidArgument("result_json", "is required when the call succeeded: the answer the tool gave")
    await console.api(session).resolve(
        run_id, form_text(form, "step_key", 500), outcome, evidence=evidence, result_json=result_json,
        remote_resource_id=form_text(form, "remote_resource_id", 500), resolved_by=session.principal or "console",
        comment=form_text(form, "comment", 2000), request_id=form_request_id(form))
    return back(form, f"/runs/{run_id}", "resolved")


# ---------------------------------------------------------------------- needs attention, queue, registry


async def attention_page(console: Console, request: Request, session: Session) -> Response:
    api = console.api(session)
    approvals = await views.oldest_first(api, "PAUSED_HUMAN")
    in_doubt_runs = await views.oldest_first(api, "PAUSED_INDOUBT")
    # Only the ledger rows: a long run's journal is not needed to settle its in-doubt call.
    histories = await asyncio.gather(*(api.history(run.run_id, parts=(rs.HISTORY_PART_TOOL_EXECUTIONS,))
                                       for run in in_doubt_runs[:20]))
    in_doubt = [(run, views.in_doubt(history)) for run, (history, _) in zip(in_doubt_runs, histories, strict=False)]
    return console.page(request, session, "attention.html", approvals=approvals, in_doubt=in_doubt,
                        more_in_doubt=max(0, len(in_doubt_runs) - 20), new_request_id=lambda: str(uuid.uuid4()))


async def queue_page(console: Console, request: Request, session: Session) -> Response:
    stats = await console.api(session).stats()
    return console.page(request, session, "queue.html", stats=stats, counts=views.counts(stats),
                        new_request_id=lambda: str(uuid.uuid4()))


async def set_limit(console: Console, request: Request, session: Session, form: FormData) -> Response:
    """As `agentrt limits set`: the scheduler allows it to an admin of every tenant ('*') only."""
    scope = form_text(form, "scope")
    if scope not in ("tenant", "agent", "tool"):
        raise InvalidArgument("scope", "must be tenant, agent or tool")
    await console.api(session).set_limit(
        scope, form_text(form, "name", 100), form_text(form, "value", 100), tenant_id=form_text(form, "tenant_id", 200),
        subject=form_text(form, "subject", 200), reason=form_text(form, "reason", 1000),
        request_id=form_request_id(form))
    return back(form, "/queue", "limit")
