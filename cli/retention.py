"""`agentrt retention run|list|set|clear`: retention of terminal runs (docs/retention.md).

`run` sweeps once, as the scheduler's background task does (`--dry-run`
counts and changes nothing); `set` and `clear` write the per-tenant policies
(tenant '*' is the default), which only the schema's owner may do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from shared.errors import InvalidArgument

T = TypeVar("T")
MAX_KEEP_DAYS = 36_500


def _tenant(text: str) -> str:
    from scheduler.api.validate import require_tenant

    return text if text == "*" else require_tenant("--tenant", text)


def _keep_days(value: int) -> int:
    if not 1 <= value <= MAX_KEEP_DAYS:
        raise InvalidArgument("--keep-days", f"must be between 1 and {MAX_KEEP_DAYS}")
    return value


async def with_store(database_url: str | None, action: Callable[[Any], Awaitable[T]], **overrides: Any) -> T:
    """`action` on a one-connection Store from the settings (and `overrides`), closed after; the
    database-side CLI commands (retention, encryption) run through it."""
    from scheduler.config import SchedulerSettings
    from scheduler.store import Store, connect_pool

    if database_url:
        overrides["database_url"] = database_url
    settings = SchedulerSettings(**overrides)
    pool = await connect_pool(settings.database_url, min_size=1, max_size=1, command_timeout=60)
    try:
        return await action(Store(pool, settings))
    finally:
        await pool.close()


def _run(args: argparse.Namespace) -> int:
    from scheduler.background.retention import sweep

    if not 1 <= args.batch_runs <= 10_000:
        raise InvalidArgument("--batch-runs", "must be between 1 and 10000")

    if not 0 <= args.pause_ms <= 60_000:
        raise InvalidArgument("--pause-ms", "must be between 0 and 60000")

    async def act(store: Any) -> dict[str, Any]:
        counts = await sweep(store, batch_runs=args.batch_runs, pause_s=args.pause_ms / 1000, dry_run=args.dry_run)
        return {"dry_run": args.dry_run, **counts.as_dict()}

    print(json.dumps(asyncio.run(with_store(args.database_url, act)), sort_keys=True))
    return 0


def _list(args: argparse.Namespace) -> int:
    rows = asyncio.run(with_store(args.database_url, lambda store: store.runs.retention_policies()))
    for row in rows:
        print(json.dumps({"tenant": row["tenant_id"], "keep_days": row["keep_days"],
                          "updated_at": row["updated_at"].isoformat()}, sort_keys=True))
    if not rows:
        print("no retention policy: terminal runs are kept for ever")
    return 0


def _set(args: argparse.Namespace) -> int:
    tenant, days = _tenant(args.tenant), _keep_days(args.keep_days)
    row = asyncio.run(with_store(args.database_url, lambda store: store.runs.set_retention_policy(tenant, days)))
    print(f"tenant {row['tenant_id']}: terminal runs kept {row['keep_days']} days after they finish")
    return 0


def _clear(args: argparse.Namespace) -> int:
    tenant = _tenant(args.tenant)
    if not asyncio.run(with_store(args.database_url, lambda store: store.runs.clear_retention_policy(tenant))):
        raise InvalidArgument("--tenant", f"no retention policy for tenant {tenant}")
    print(f"tenant {tenant}: " + ("no default policy: runs without one of their own are kept for ever"
                                  if tenant == "*" else "the default policy applies"))
    return 0


def cmd_retention(args: argparse.Namespace) -> int:
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "run": _run, "list": _list, "set": _set, "clear": _clear}
    return handlers[args.retention_command](args)


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("retention", help="retention of terminal runs: sweep now, or show and set the policies")
    p.set_defaults(func=cmd_retention)
    actions = p.add_subparsers(dest="retention_command", required=True)
    url_help = "PostgreSQL URL (default: AGENTRT_DATABASE_URL); set and clear need the schema's owner"
    q = actions.add_parser("run", help="one sweep now; prints the rows deleted by table")
    q.add_argument("--dry-run", action="store_true", help="count what would be deleted; change nothing")
    q.add_argument("--batch-runs", type=int, default=100, help="runs per batch (default 100)")
    q.add_argument("--pause-ms", type=int, default=200, help="pause after each batch (default 200)")
    q.add_argument("--database-url", help=url_help)
    q = actions.add_parser("list", help="the retention policies (tenant '*' is the default)")
    q.add_argument("--database-url", help=url_help)
    q = actions.add_parser("set", help="keep a tenant's terminal runs N days after they finish ('*': the default)")
    q.add_argument("--tenant", required=True)
    q.add_argument("--keep-days", type=int, required=True)
    q.add_argument("--database-url", help=url_help)
    q = actions.add_parser("clear", help="drop a tenant's own policy (the default then applies)")
    q.add_argument("--tenant", required=True)
    q.add_argument("--database-url", help=url_help)
