"""`agentrt runs …` and `agentrt tools resolve`: operate a running deployment through RunService.

Human-readable output by default, `--json` for scripts. Address from --addr or
AGENTRT_ADDR (default 127.0.0.1:50051). The credential from --api-key / AGENTRT_API_KEY
or --token / AGENTRT_TOKEN (OIDC) decides the tenant; --tenant / AGENTRT_TENANT picks one
when it may act for several (and is required with auth_mode none). In a directory where
`agentrt dev` runs, .agentrt/client.json supplies the address, the session's key and its
default tenant for whatever flags and environment leave open (cli/local_config.py). TLS with --tls-ca /
AGENTRT_TLS_CA (plus --tls-cert/--tls-key for mutual TLS); a credential goes in clear
only to a loopback address or with --insecure.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from cli import local_config
from shared.client.runs import AgentrtClient, History, RunInfo
from shared.errors import InvalidArgument
from shared.transport import ClientTls, open_channel

RUN_COLUMNS = ("run_id", "agent_name", "status", "version", "fencing_token", "attempt_count", "current_step_key",
               "waiting_for")


def _option(args: argparse.Namespace, name: str, env: str) -> str | None:
    return getattr(args, name, None) or os.environ.get(env) or None


def client_tls(args: argparse.Namespace) -> ClientTls | None:
    ca, cert, key = (_option(args, "tls_ca", "AGENTRT_TLS_CA"), _option(args, "tls_cert", "AGENTRT_TLS_CERT"),
                     _option(args, "tls_key", "AGENTRT_TLS_KEY"))
    if not (ca or cert):
        return None
    return ClientTls(ca, cert, key, _option(args, "tls_server_name", "AGENTRT_TLS_SERVER_NAME"))


def _client(args: argparse.Namespace) -> AgentrtClient:
    explicit_addr = getattr(args, "addr", None) or os.environ.get("AGENTRT_ADDR") or None
    # The `agentrt dev` session of this directory fills what flags and environment leave open.
    local = local_config.for_scheduler(explicit_addr)
    tenant = _option(args, "tenant", "AGENTRT_TENANT")
    api_key, token = _option(args, "api_key", "AGENTRT_API_KEY"), _option(args, "token", "AGENTRT_TOKEN")
    if not (api_key or token):
        api_key = local.get("api_key") or None
    if not tenant and not token:
        tenant = local.get("tenant") or None
    if not (tenant or api_key or token):
        raise InvalidArgument("--api-key", "give a credential (--api-key / AGENTRT_API_KEY, --token / "
                              "AGENTRT_TOKEN) or, with auth_mode none, the tenant (--tenant / AGENTRT_TENANT)")
    addr = explicit_addr or local.get("scheduler_addr") or "127.0.0.1:50051"
    try:
        return AgentrtClient(addr, tenant=tenant, api_key=api_key if not token else None, token=token,
                             tls=client_tls(args), insecure=bool(getattr(args, "insecure", False)),
                             timeout_s=args.timeout, max_retries=2)
    except ValueError as error:
        raise InvalidArgument("--tls-ca", str(error)) from None


def _json_arg(name: str, text: str | None) -> Any:
    if text is None:
        return None
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as handle:
            text = handle.read()
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(name, f"is not valid JSON ({exc})") from None


def parse_time(name: str, text: str | None) -> dt.datetime | None:
    """An ISO-8601 time flag (UTC when it names no zone)."""
    if not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(name, "is not an ISO-8601 time") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def _labels(given: list[str] | None) -> dict[str, str]:
    """--label key=value flags (repeatable): a flag without '=' is refused, not skipped."""
    labels: dict[str, str] = {}
    for label in given or []:
        key, sep, value = label.partition("=")
        if not sep or not key:
            raise InvalidArgument("--label", f"{label!r} is not key=value")
        labels[key] = value
    return labels


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


def _print_runs(runs: list[RunInfo]) -> None:
    rows = [[str(getattr(run, column)) for column in RUN_COLUMNS] for run in runs]
    widths = [max([len(column), *(len(row[i]) for row in rows)]) for i, column in enumerate(RUN_COLUMNS)]
    print("  ".join(column.upper().ljust(widths[i]) for i, column in enumerate(RUN_COLUMNS)))
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)))


def _print_run(run: RunInfo) -> None:
    for key, value in run.as_dict().items():
        if value not in (None, "", {}, False):
            print(f"{key:18} {json.dumps(value) if isinstance(value, dict | list) else value}")


def _show(args: argparse.Namespace, run: RunInfo) -> None:
    if args.json:
        _print_json(run.as_dict())
    else:
        _print_run(run)


async def _submit(args: argparse.Namespace, client: AgentrtClient) -> None:
    payload = _json_arg("--input", args.input) or {}
    if not isinstance(payload, dict):
        raise InvalidArgument("--input", "must be a JSON object")
    labels = dict(label.split("=", 1) for label in args.label or [] if "=" in label)
    run, created = await client.submit(args.agent, payload, client_request_id=args.request_id,
                                       agent_version=args.agent_version or "", max_attempts=args.max_attempts,
                                       labels=labels, max_steps=args.max_steps,
                                       allow_unregistered=args.allow_unregistered, priority=args.priority)
    if args.json:
        _print_json({**run.as_dict(), "created": created})
    else:
        print(f"{'submitted' if created else 'already submitted'}: {run.run_id} ({run.status})")


async def _get(args: argparse.Namespace, client: AgentrtClient) -> None:
    _show(args, await client.get(args.run_id))


async def _list(args: argparse.Namespace, client: AgentrtClient) -> None:
    runs, token = await client.list(statuses=args.status or [], agent_name=args.agent or "",
                                    page_size=args.limit, page_token=args.page_token or "",
                                    labels=_labels(args.label), min_priority=args.min_priority,
                                    max_priority=args.max_priority, created_after=parse_time("--since", args.since),
                                    created_before=parse_time("--until", args.until))
    if args.json:
        _print_json({"runs": [r.as_dict() for r in runs], "next_page_token": token})
        return
    if runs:
        _print_runs(runs)
    else:
        print(_no_runs(args, client.tenant or "this credential's tenant"))
    if token:
        print(f"(more: --page-token {token})")


def _no_runs(args: argparse.Namespace, tenant: str) -> str:
    filters = [f"status {', '.join(args.status)}" if args.status else "", f"agent {args.agent}" if args.agent else "",
               *(f"label {label}" for label in args.label or []),
               f"priority {args.min_priority or 1}..{args.max_priority or 9}" if args.min_priority or args.max_priority
               else "", f"created since {args.since}" if args.since else "",
               f"created before {args.until}" if args.until else ""]
    named = "; ".join(f for f in filters if f)
    return f"no runs for tenant {tenant}" + (f" with {named}" if named else "")


async def _watch(args: argparse.Namespace, client: AgentrtClient) -> None:
    async for run in client.watch(args.run_id, poll_s=args.poll):
        if args.json:
            print(json.dumps(run.as_dict(), sort_keys=True, default=str), flush=True)
        else:
            print(f"{run.updated_at}  {run.status:15} v{run.version} fence {run.fencing_token} "
                  f"{run.current_step_key or ''} {run.pause_reason or run.terminal_reason or ''}", flush=True)
        if args.until and run.status in {s.upper() for s in args.until}:
            return


async def _cancel(args: argparse.Namespace, client: AgentrtClient) -> None:
    _show(args, await client.cancel(args.run_id, args.reason or "", ticket_id=args.ticket or "",
                                    comment=args.comment or "", keep_children=args.keep_children,
                                    request_id=args.request_id or ""))


async def _retry(args: argparse.Namespace, client: AgentrtClient) -> None:
    run, created = await client.retry(args.run_id, request_id=args.request_id or "", reason=args.reason or "",
                                      ticket_id=args.ticket or "", comment=args.comment or "")
    if args.json:
        _print_json({**run.as_dict(), "created": created})
    else:
        print(f"{'retried' if created else 'already retried'}: {run.run_id} ({run.status}), "
              f"a new run of {args.run_id}")


async def _tree(args: argparse.Namespace, client: AgentrtClient) -> None:
    nodes, token = await client.tree_page(args.run_id, max_runs=args.limit, page_token=args.page_token or "")
    if args.json:
        _print_json({"runs": [{**run.as_dict(), "depth": depth} for depth, run in nodes], "truncated": bool(token),
                     "next_page_token": token})
        return
    for depth, run in nodes:
        reason = run.terminal_reason or run.pause_reason or ""
        print(f"{'  ' * depth}{run.run_id}  {run.agent_name:20} {run.status:15} {reason[:80]}".rstrip())
    if token:
        print(f"(more descendants: --page-token {token})")


async def _signal(args: argparse.Namespace, client: AgentrtClient) -> None:
    payload = _json_arg("--payload", args.payload)
    signal = await client.signal(args.run_id, args.name, payload, request_id=args.request_id or "")
    if args.json:
        _print_json(signal.as_dict())
    else:
        print(f"{'queued' if signal.created else 'already queued'}: signal {signal.name} #{signal.seq} "
              f"for run {args.run_id} ({signal.run_status})")


async def _resume(args: argparse.Namespace, client: AgentrtClient) -> None:
    approve = True if args.approve else False if args.reject else None
    value = _json_arg("--input", args.input)
    if approve is None and value is None:
        raise InvalidArgument("--approve/--reject/--input", "say what the operator decided")
    _show(args, await client.resume(args.run_id, operator=args.operator or "", approve=approve, input=value,
                                    comment=args.comment or "", reason=args.reason or "",
                                    ticket_id=args.ticket or ""))


async def _history(args: argparse.Namespace, client: AgentrtClient) -> None:
    """One page (--page-size, --page-token), or with --all every page as it arrives (bounded memory)."""
    if not 0 < args.page_size <= 500:
        raise InvalidArgument("--page-size", "must be between 1 and 500")
    first = True
    async for page, token in client.history_pages(args.run_id, page_size=args.page_size,
                                                  page_token=args.page_token or "", include=args.include or ()):
        if args.json:
            document = {"run": page.run.as_dict(), "checkpoints": page.checkpoints,
                        "tool_executions": page.tool_executions, "events": page.events, "journal": page.journal,
                        "next_page_token": token}
            if args.all:  # one JSON document per line, a page each
                print(json.dumps(document, sort_keys=True, default=str), flush=True)
            else:
                _print_json(document)
        else:
            _print_history_page(page, show_run=first)
            if token and not args.all:
                print(f"\nmore: agentrt runs history {args.run_id} --page-token {token}  (or --all)")
        first = False
        if not args.all:
            return


async def _export(args: argparse.Namespace, client: AgentrtClient) -> None:
    """Every page of a run's history, one JSON document per line (audited as run.export)."""
    async for page, token in client.history_pages(args.run_id, page_size=500, include=args.include or (),
                                                  export=True, reason=args.reason or "", ticket_id=args.ticket or ""):
        print(json.dumps({"run": page.run.as_dict(), "checkpoints": page.checkpoints,
                          "tool_executions": page.tool_executions, "events": page.events, "journal": page.journal,
                          "next_page_token": token}, sort_keys=True, default=str), flush=True)


def _print_history_page(history: History, *, show_run: bool) -> None:
    if show_run:
        _print_run(history.run)
    if history.checkpoints:
        print(f"\ncheckpoints ({len(history.checkpoints)}):")
    for cp in history.checkpoints:
        print(f"  v{cp.get('version')} fence {cp.get('fencing_token', 0)} schema {cp.get('schema_version')} "
              f"{cp.get('created_at', '')}")
    if history.tool_executions:
        print(f"\ntool executions ({len(history.tool_executions)}):")
    for te in history.tool_executions:
        status = te.get("status", "").removeprefix("TOOL_EXECUTION_STATUS_")
        print(f"  {te.get('step_key')}  {te.get('tool_name')}  {status}  key {te.get('idempotency_key')}")
    if history.events:
        print(f"\nevents ({len(history.events)}):")
    for event in history.events:
        print(f"  #{event.get('id')} {event.get('event_type')} v{event.get('run_version', 0)} "
              f"{'published' if event.get('published_at') else 'pending'}")
    if history.journal:
        print(f"\njournal ({len(history.journal)}):")
    for entry in history.journal:
        print(f"  {entry.get('seq')} {entry.get('kind')} {entry.get('step_key', '')} {entry.get('tool', '')} "
              f"v{entry.get('run_version', 0)}")


async def _resolve(args: argparse.Namespace, client: AgentrtClient) -> None:
    outcome = "SUCCEEDED" if args.succeeded else "NOT_EXECUTED" if args.not_executed else "UNKNOWN"
    evidence = _json_arg("--evidence", args.evidence)
    if not isinstance(evidence, dict):
        evidence = {"note": args.evidence}
    result = _json_arg("--result", args.result)
    if outcome == "SUCCEEDED" and result is None:
        raise InvalidArgument("--result", "is required with --succeeded")
    run, execution = await client.resolve_tool(args.run_id, args.step_key, outcome, evidence=evidence,
                                               resolved_by=args.operator, result=result, reason=args.reason or "",
                                               ticket_id=args.ticket or "", comment=args.comment or "")
    if args.json:
        _print_json({"run": run.as_dict(), "execution": execution})
    else:
        print(f"{args.step_key}: {execution.get('status', '').removeprefix('TOOL_EXECUTION_STATUS_')}; "
              f"run {run.run_id} is {run.status}")


async def _health(addr: str, tls: ClientTls | None) -> str:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        async with open_channel(addr, tls) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    except grpc.aio.AioRpcError as error:
        return f"UNREACHABLE ({error.code().name})"


async def _status(args: argparse.Namespace, client: AgentrtClient) -> None:
    services = {"scheduler": client.addr}
    for spec in args.service or []:
        name, _, addr = spec.partition("=")
        services[name] = addr
    tls = client_tls(args)
    health = {"scheduler": await _health(client.addr, tls)}
    health.update({name: await _health(addr, None) for name, addr in services.items() if name != "scheduler"})
    stats = await client.stats()
    if stats["auth_mode"] == "none":
        print("WARNING: the scheduler runs with auth_mode none: anyone who reaches it may act for every tenant",
              file=sys.stderr)
    if args.json:
        _print_json({"services": {name: {"addr": services[name], "health": state} for name, state in health.items()},
                     **stats})
    else:
        for name, state in health.items():
            print(f"{name:10} {services[name]:24} {state}")
        print(f"auth:       {stats['auth_mode']} (as {stats['principal']}, role {stats['role'] or '-'})")
        print("runs:       " + (", ".join(f"{k} {v}" for k, v in sorted(stats["runs_by_status"].items())) or "none"))
        print(f"queued:     oldest due {stats['oldest_queued_age_s']:.1f}s")
        print(f"in doubt:   {stats['in_doubt_runs']} (oldest {stats['oldest_in_doubt_age_s']:.1f}s)")
        print(f"outbox lag: {stats['outbox_pending']} pending (oldest {stats['outbox_oldest_pending_age_s']:.1f}s)")
        waiting = ", ".join(f"{n} on the {k} limit" for k, n in sorted(stats["waiting_on_limit"].items()))
        print(f"flow:       {stats['queued']} queued, {stats['running']} running"
              + (f"; waiting: {waiting}" if waiting else ""))
        shown = {k: v for k, v in stats["limits"].items() if v not in ("0", "1.0") or k == "weight"}
        print("limits:     " + (", ".join(f"{k} {v}" for k, v in shown.items()) or "none"))
    if any(state != "SERVING" for state in health.values()):
        raise SystemExit(1)


def _runner(handler: Callable[[argparse.Namespace, AgentrtClient], Awaitable[None]]) -> Callable[..., int]:
    def run(args: argparse.Namespace) -> int:
        async def main() -> None:
            async with _client(args) as client:
                await handler(args, client)

        asyncio.run(main())
        return 0

    return run


def _common(parser: argparse.ArgumentParser, *, tenant: bool = True) -> None:
    parser.add_argument("--addr", help="scheduler address (default AGENTRT_ADDR, "
                        ".agentrt/client.json or 127.0.0.1:50051)")
    if tenant:
        parser.add_argument("--tenant", help="tenant id (default AGENTRT_TENANT, else .agentrt/client.json's; "
                                             "the credential's tenant when unset)")
    parser.add_argument("--api-key", help="API key (default AGENTRT_API_KEY)")
    parser.add_argument("--token", help="OIDC/JWT bearer token (default AGENTRT_TOKEN)")
    parser.add_argument("--tls-ca", help="CA of the scheduler's certificate (default AGENTRT_TLS_CA): TLS on")
    parser.add_argument("--tls-cert", help="client certificate for mutual TLS (default AGENTRT_TLS_CERT)")
    parser.add_argument("--tls-key", help="client key for mutual TLS (default AGENTRT_TLS_KEY)")
    parser.add_argument("--tls-server-name", help="name to check in the scheduler's certificate")
    parser.add_argument("--insecure", action="store_true",
                        help="send the credential over plaintext to a non-loopback address")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--timeout", type=float, default=10.0, help="per-call deadline in seconds")


def _audit_flags(parser: argparse.ArgumentParser, *, reason: bool = True) -> None:
    """Why the operator acts: kept in the audit trail (`agentrt audit list`)."""
    if reason:
        parser.add_argument("--reason", help="why (audit trail)")
    parser.add_argument("--ticket", help="ticket id (audit trail)")
    parser.add_argument("--comment", help="free text (audit trail)")


async def _agents(args: argparse.Namespace, client: AgentrtClient) -> None:
    agents = await client.agents()
    if args.json:
        _print_json({"agents": [a.as_dict() for a in agents]})
        return
    if not agents:
        print("no agents: no live executor has registered any")
        return
    width = max(len(f"{a.name} {a.version}") for a in agents)
    for a in agents:
        print(f"{a.name + ' ' + a.version:{width}}  executors: {', '.join(a.executors)}  "
              f"tools: {', '.join(a.tool_names) or '-'}{'  (input schema)' if a.input_schema else ''}")


def _agent_commands(sub: Any) -> None:
    agents = sub.add_parser("agents", help="the agents live executors serve").add_subparsers(
        dest="agents_command", required=True)
    p = agents.add_parser("list", help="agents, versions and the executors serving them")
    _common(p)
    p.set_defaults(func=_runner(_agents))


def _run_commands(sub: Any) -> None:
    runs = sub.add_parser("runs", help="submit and operate runs").add_subparsers(dest="runs_command", required=True)

    p = runs.add_parser("submit", help="submit a run (idempotent with --request-id)")
    _common(p)
    p.add_argument("agent")
    p.add_argument("--input", help="JSON object, or @file.json")
    p.add_argument("--request-id", help="client request id: the same id returns the same run")
    p.add_argument("--agent-version")
    p.add_argument("--max-attempts", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--label", action="append", help="key=value (repeatable)")
    p.add_argument("--priority", type=int, default=0,
                   help="1 (lowest) .. 9 (highest), claimed first among due runs; default: the agent's")
    p.add_argument("--allow-unregistered", action="store_true",
                   help="queue it even when no live executor serves the agent (one deployed later)")
    p.set_defaults(func=_runner(_submit))

    p = runs.add_parser("get", help="show one run")
    _common(p)
    p.add_argument("run_id")
    p.set_defaults(func=_runner(_get))

    p = runs.add_parser("history", help="checkpoints, ledger, events, journal, a page at a time")
    _common(p)
    p.add_argument("run_id")
    p.add_argument("--page-size", type=int, default=100, help="items of each part per page (1-500)")
    p.add_argument("--page-token", help="continue from a previous page")
    p.add_argument("--all", action="store_true", help="stream every page")
    p.add_argument("--include", action="append", choices=["checkpoints", "tool_executions", "events", "journal"],
                   help="only these parts (repeatable; default all)")
    p.set_defaults(func=_runner(_history))

    p = runs.add_parser("export", help="a run's whole history as JSON lines, a page each (operator; audited)")
    _common(p)
    p.add_argument("run_id")
    p.add_argument("--include", action="append", choices=["checkpoints", "tool_executions", "events", "journal"],
                   help="only these parts (repeatable; default all)")
    _audit_flags(p)
    p.set_defaults(func=_runner(_export))

    p = runs.add_parser("list", help="list runs, newest first")
    _common(p)
    p.add_argument("--status", action="append", help="filter (repeatable): QUEUED, RUNNING, …")
    p.add_argument("--agent")
    p.add_argument("--label", action="append", help="key=value: runs holding it (repeatable: every one)")
    p.add_argument("--min-priority", type=int, default=0, help="runs of at least this priority (1-9)")
    p.add_argument("--max-priority", type=int, default=0, help="runs of at most this priority (1-9)")
    p.add_argument("--since", help="runs created at or after this ISO-8601 time")
    p.add_argument("--until", help="runs created before this ISO-8601 time")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--page-token", help="the next page: repeat the same filters")
    p.set_defaults(func=_runner(_list))

    p = runs.add_parser("watch", help="follow a run until it ends")
    _common(p)
    p.add_argument("run_id")
    p.add_argument("--poll", type=float, default=0.5)
    p.add_argument("--until", action="append", help="also stop at this status (repeatable)")
    p.set_defaults(func=_runner(_watch))
    _operate_commands(runs)


def _operate_commands(runs: Any) -> None:
    p = runs.add_parser("cancel", help="cancel a run (a leased run ends at its holder's next write)")
    _common(p)
    p.add_argument("run_id")
    p.add_argument("--reason")
    p.add_argument("--keep-children", action="store_true",
                   help="cancel this run alone (by default its children not spawned detached go with it)")
    p.add_argument("--request-id", help="names this request: a retry with it acts once")
    _audit_flags(p, reason=False)
    p.set_defaults(func=_runner(_cancel))

    p = runs.add_parser("retry", help="start a FAILED or CANCELLED run again, as a new run")
    _common(p)
    p.add_argument("run_id")
    p.add_argument("--request-id", help="names this request: a retry with it answers the run made first")
    _audit_flags(p)
    p.set_defaults(func=_runner(_retry))

    p = runs.add_parser("tree", help="show a run and its descendants (child runs) with their statuses")
    _common(p)
    p.add_argument("run_id")
    p.add_argument("--limit", type=int, default=0, help="at most this many runs per page (default 1000)")
    p.add_argument("--page-token", help="the next page, from the line a truncated page ends with")
    p.set_defaults(func=_runner(_tree))

    p = runs.add_parser("signal", help="send a named signal to a run (a run waiting for it wakes at once)")
    _common(p)
    p.add_argument("run_id")
    p.add_argument("name")
    p.add_argument("--payload", help="JSON value (or @file)")
    p.add_argument("--request-id", help="idempotency key: the same id and signal queue it once")
    p.set_defaults(func=_runner(_signal))

    p = runs.add_parser("resume", help="answer a run paused for a human")
    _common(p)
    p.add_argument("run_id")
    decision = p.add_mutually_exclusive_group()
    decision.add_argument("--approve", action="store_true")
    decision.add_argument("--reject", action="store_true")
    p.add_argument("--input", help="JSON value for wait_for_input, or @file.json")
    p.add_argument("--operator", help="recorded as a comment: the audit names the authenticated caller")
    _audit_flags(p)
    p.set_defaults(func=_runner(_resume))


def add_commands(sub: Any) -> None:
    _run_commands(sub)
    p = sub.add_parser("status", help="service health, runs by status, queue and in-doubt ages, outbox lag")
    _common(p)
    p.add_argument("--service", action="append", help="also check NAME=HOST:PORT's gRPC health (repeatable)")
    p.set_defaults(func=_runner(_status))

    tools = sub.add_parser("tools", help="tool ledger operations").add_subparsers(dest="tools_command", required=True)
    p = tools.add_parser("resolve", help="resolve an IN_DOUBT tool execution with evidence")
    _common(p)
    p.add_argument("run_id")
    p.add_argument("step_key")
    outcome = p.add_mutually_exclusive_group(required=True)
    outcome.add_argument("--succeeded", action="store_true")
    outcome.add_argument("--not-executed", action="store_true")
    outcome.add_argument("--unknown", action="store_true")
    p.add_argument("--evidence", required=True, help="JSON object (or text) recording how you know")
    p.add_argument("--result", help="the tool's result as JSON (with --succeeded)")
    p.add_argument("--operator", default=os.environ.get("USER", "operator"),
                   help="resolved_by with auth_mode none; otherwise a comment next to the authenticated caller")
    _audit_flags(p)
    p.set_defaults(func=_runner(_resolve))
    _agent_commands(sub)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: agentrt runs …")
