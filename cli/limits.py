"""`agentrt limits set|clear|list`: runtime flow limits through RunService (docs/flow-control.md).

Changing one needs an admin credential for every tenant ('*'); each change is audited
(`agentrt audit list --action limit.set`). Every scheduler replica applies it within
limits_refresh_ms.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from cli.runs import _client, _common, _print_json


def _where(args: argparse.Namespace) -> dict[str, str]:
    return {"tenant_id": args.for_tenant or "", "subject": args.subject or ""}


def _line(limit: dict[str, Any]) -> str:
    scope = limit.get("scope", "")
    whom = limit.get("tenant_id") or ""
    subject = limit.get("subject") or ""
    target = {"tenant": f"tenant {whom}", "agent": f"agent {subject}",
              "tool": f"tool {subject}" + (f" for tenant {whom}" if whom else "")}.get(scope, scope)
    return f"{target:36} {limit.get('name', ''):18} {limit.get('value', ''):10} " \
           f"{limit.get('updated_at', '')}  {limit.get('updated_by', '')}"


def _set(args: argparse.Namespace) -> int:
    async def main() -> dict[str, Any]:
        async with _client(args) as client:
            return await client.set_limit(args.scope, args.name, args.value, **_where(args),
                                          reason=args.reason or "", ticket_id=args.ticket or "")

    limit = asyncio.run(main())
    if args.json:
        _print_json(limit)
    else:
        print(_line(limit))
    return 0


def _clear(args: argparse.Namespace) -> int:
    async def main() -> dict[str, Any] | None:
        async with _client(args) as client:
            return await client.clear_limit(args.scope, args.name, **_where(args), reason=args.reason or "",
                                            ticket_id=args.ticket or "")

    limit = asyncio.run(main())
    if args.json:
        _print_json({"cleared": limit is not None, "limit": limit})
    else:
        print(f"cleared: {_line(limit)}" if limit else "no such runtime limit: nothing changed")
    return 0


def _list(args: argparse.Namespace) -> int:
    async def main() -> list[dict[str, Any]]:
        async with _client(args) as client:
            return await client.list_limits()

    limits = asyncio.run(main())
    if args.json:
        _print_json({"limits": limits})
        return 0
    for limit in limits:
        print(_line(limit))
    if not limits:
        print("no runtime limits (the scheduler's settings apply)")
    return 0


def add_commands(sub: Any) -> None:
    limits = sub.add_parser("limits", help="runtime flow limits (admin): set, clear, list").add_subparsers(
        dest="limits_command", required=True)
    for action, text, func in (("set", "set a limit for every scheduler replica", _set),
                               ("clear", "clear a runtime limit (the config file's value applies again)", _clear)):
        p = limits.add_parser(action, help=text)
        _common(p)
        p.add_argument("scope", choices=["tenant", "agent", "tool"])
        p.add_argument("name", help="tenant: weight, max_queued_runs, max_submits_per_s, max_running; "
                                    "agent: max_running; tool: rate, concurrency")
        if action == "set":
            p.add_argument("value", help="e.g. 40, 2.5 or 50/s (0: no limit)")
        p.add_argument("--for-tenant", help="the tenant limited ('*' = every tenant's default; tenant scope "
                                            "default: the call's tenant; tool scope: that tenant's calls only)")
        p.add_argument("--subject", help="the agent or tool (agent and tool scopes)")
        p.add_argument("--reason", help="why (audit trail)")
        p.add_argument("--ticket", help="ticket id (audit trail)")
        p.set_defaults(func=func)
    p = limits.add_parser("list", help="the runtime limits that apply to your tenants")
    _common(p)
    p.set_defaults(func=_list)
