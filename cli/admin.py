"""`agentrt keys …` and `agentrt audit list`: API keys and the audit trail (docs/keys-and-tls.md).

Through RunService with an admin credential, or, for the first key of a deployment,
`keys create --database-url` straight into PostgreSQL as the operator at the shell
(audited as `local:<OS user>`). The key is printed once; only its hash is stored.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import getpass
import re
import sys
from typing import Any

from cli.runs import _client, _common, _print_json, parse_time
from shared.errors import InvalidArgument

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def expires_in_s(text: str | None) -> int:
    """`--expires 90d` (s, m, h, d, w) or an ISO-8601 time; none = never."""
    if not text:
        return 0
    match = _DURATION.match(text)
    if match:
        return int(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument("--expires", "use a duration like 90d or 12h, or an ISO-8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    seconds = int((when - dt.datetime.now(dt.UTC)).total_seconds())
    if seconds <= 0:
        raise InvalidArgument("--expires", "is in the past")
    return seconds


def _tenants(args: argparse.Namespace) -> list[str]:
    return [t for part in (args.key_tenant or []) for t in part.split(",") if t]


async def _create_in_database(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from scheduler.api.auth import local_principal, new_api_key
    from scheduler.api.validate import require_tenant
    from scheduler.config import SchedulerSettings
    from scheduler.security.rbac import ROLE_ORDER
    from scheduler.store import Store, connect_pool

    tenants = _tenants(args)
    if not tenants:
        raise InvalidArgument("--tenant", "name the key's tenant (or '*' for an admin key of every tenant)")
    for tenant in tenants:
        if tenant != "*":
            require_tenant("--tenant", tenant)
    if args.role not in ROLE_ORDER:
        raise InvalidArgument("--role", f"must be one of {', '.join(ROLE_ORDER)}")
    if args.role != "admin" and (len(tenants) > 1 or tenants == ["*"]):
        raise InvalidArgument("--tenant", "only an admin key may hold several tenants or '*'")
    settings = SchedulerSettings(database_url=args.database_url, auth_mode="api_key")
    pool = await connect_pool(settings.database_url, min_size=1, max_size=1, command_timeout=10)
    try:
        key_id, secret, digest = new_api_key()
        audit = local_principal(getpass.getuser()).audit(reason=args.reason, ticket_id=args.ticket)
        key = await Store(pool, settings).auth.create_api_key(
            key_id=key_id, name=args.name, tenants=sorted(set(tenants)), role=args.role, secret_hash=digest,
            expires_in_s=expires_in_s(args.expires), audit=audit)
    finally:
        await pool.close()
    return ({"key_id": str(key.id), "name": key.name, "tenants": list(key.tenants), "role": key.role,
             "created_by": key.created_by, "expires_at": key.expires_at.isoformat() if key.expires_at else None},
            secret)


def _keys_create(args: argparse.Namespace) -> int:
    async def main() -> tuple[dict[str, Any], str]:
        if args.database_url:
            return await _create_in_database(args)
        async with _client(args) as client:
            return await client.create_key(args.name, args.role, tenants=_tenants(args),
                                           expires_in_s=expires_in_s(args.expires), reason=args.reason or "",
                                           ticket_id=args.ticket or "")

    key, secret = asyncio.run(main())
    if args.json:
        _print_json({**key, "secret": secret})
    else:
        print(f"key {key['key_id']} ({key['name']}): role {key['role']}, tenants {', '.join(key['tenants'])}",
              file=sys.stderr)
        print("shown once, store it now:", file=sys.stderr)
        print(secret)
    return 0


def _keys_list(args: argparse.Namespace) -> int:
    async def main() -> list[dict[str, Any]]:
        async with _client(args) as client:
            return await client.list_keys(include_revoked=args.include_revoked)

    keys = asyncio.run(main())
    if args.json:
        _print_json({"keys": keys})
        return 0
    for key in keys:
        state = "revoked" if key.get("revoked_at") else f"expires {key['expires_at']}" if key.get("expires_at") \
            else "live"
        print(f"{key['key_id']}  {key['name']:20} {key['role']:9} {','.join(key.get('tenants', [])):20} {state}")
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    async def main() -> dict[str, Any]:
        async with _client(args) as client:
            return await client.revoke_key(args.key_id, reason=args.reason or "", ticket_id=args.ticket or "")

    key = asyncio.run(main())
    if args.json:
        _print_json(key)
    else:
        print(f"key {key['key_id']} ({key['name']}) revoked at {key.get('revoked_at')}")
    return 0


def _audit_list(args: argparse.Namespace) -> int:
    async def main() -> list[dict[str, Any]]:
        async with _client(args) as client:
            return await client.audit_events(run_id=args.run or "", principal=args.principal or "",
                                             action=args.action or "", since=parse_time("--since", args.since),
                                             until=parse_time("--until", args.until), limit=args.limit)

    events = asyncio.run(main())
    if args.json:
        _print_json({"events": events})
        return 0
    for event in events:
        target = event.get("run_id") or "-"
        print(f"{event.get('at', '')}  {event.get('action', ''):14} {event.get('principal', ''):44} {target}  "
              f"{event.get('reason') or ''}{'  #' + event['ticket_id'] if event.get('ticket_id') else ''}")
    return 0


def add_commands(sub: Any) -> None:
    keys = sub.add_parser("keys", help="API keys (admin): create, list, revoke").add_subparsers(
        dest="keys_command", required=True)
    p = keys.add_parser("create", help="create an API key and print it once")
    _common(p, tenant=False)  # --tenant names the key's tenants here, not the call's
    p.set_defaults(func=_keys_create)
    p.add_argument("--role", required=True, choices=["viewer", "submitter", "operator", "admin"])
    p.add_argument("--tenant", dest="key_tenant", action="append",
                   help="the key's tenant (repeatable or comma-separated; '*' = every tenant, admin only)")
    p.add_argument("--name", required=True, help="who or what the key is for")
    p.add_argument("--expires", help="lifetime (90d, 12h, …) or an ISO-8601 time; default never")
    p.add_argument("--reason", help="why (audit trail)")
    p.add_argument("--ticket", help="ticket id (audit trail)")
    p.add_argument("--database-url", help="bootstrap: write the key straight into PostgreSQL (no credential)")

    p = keys.add_parser("list", help="API keys of your tenants")
    _common(p)
    p.add_argument("--include-revoked", action="store_true")
    p.set_defaults(func=_keys_list)

    p = keys.add_parser("revoke", help="revoke an API key (every replica refuses it within seconds)")
    _common(p)
    p.add_argument("key_id")
    p.add_argument("--reason", help="why (audit trail)")
    p.add_argument("--ticket", help="ticket id (audit trail)")
    p.set_defaults(func=_keys_revoke)

    audit = sub.add_parser("audit", help="the audit trail of operator actions (admin)").add_subparsers(
        dest="audit_command", required=True)
    p = audit.add_parser("list", help="audit entries, newest first")
    _common(p)
    p.add_argument("--run", help="only this run")
    p.add_argument("--principal", help="only this principal (e.g. key:<id>)")
    p.add_argument("--action", help="only this action (run.cancel, run.resume, tool.resolve, key.create, …)")
    p.add_argument("--since", help="ISO-8601 time (inclusive)")
    p.add_argument("--until", help="ISO-8601 time (exclusive)")
    p.add_argument("--limit", type=int, default=100)
    p.set_defaults(func=_audit_list)
