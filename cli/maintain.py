"""`agentrt maintain indexes`: rebuild, online, the btree indexes sparse pages have bloated
(scheduler/background/maintenance.py says why they bloat; docs/retention.md when to run it).

Run as the schema's owner, like `agentrt migrate`: a cron job (the chart's maintenance CronJob)
or by hand. Prints one JSON object: every index with its size and its estimated compact size,
what was dropped (leftovers of an interrupted rebuild) and what was rebuilt, with sizes after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from shared.errors import InvalidArgument


def _positive_mib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def cmd_maintain(args: argparse.Namespace) -> int:
    import asyncpg

    from scheduler.background.maintenance import maintain_indexes
    from scheduler.config import SchedulerSettings

    if not args.bloat > 1.0:
        raise InvalidArgument("--bloat", "must be more than 1 (an index's size over its compact size)")
    url = args.database_url or SchedulerSettings().database_url

    async def run() -> dict[str, Any]:
        conn = await asyncpg.connect(url, timeout=10)
        try:
            report = await maintain_indexes(conn, bloat=args.bloat, min_bytes=int(args.min_size_mib * (1 << 20)),
                                            dry_run=args.dry_run)
        finally:
            await conn.close()
        return report.as_dict()

    print(json.dumps(asyncio.run(run()), sort_keys=True))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("maintain", help="database upkeep run by the schema's owner (e.g. from a cron job)")
    p.set_defaults(func=cmd_maintain)
    actions = p.add_subparsers(dest="maintain_command", required=True)
    q = actions.add_parser("indexes", help="rebuild online (REINDEX CONCURRENTLY) each btree index bloated "
                                           "past --bloat; prints one JSON object")
    q.add_argument("--bloat", type=float, default=2.0,
                   help="rebuild an index at least this many times its compact size (default 2.0)")
    q.add_argument("--min-size-mib", type=_positive_mib, default=1.0,
                   help="leave indexes smaller than this alone (default 1)")
    q.add_argument("--dry-run", action="store_true", help="report what would be rebuilt; change nothing")
    q.add_argument("--database-url", help="PostgreSQL URL of the schema's owner (default: AGENTRT_DATABASE_URL)")
