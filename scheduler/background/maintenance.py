"""Index upkeep: rebuild the runtime's btree indexes that sparse pages have bloated.

Most of the runtime's indexes are time-ordered (UUIDv7 ids, `created_at`, `outbound_intent_at`):
rows enter at the right edge and retention deletes them from the left. PostgreSQL reuses a btree
page only once every entry on it is gone, so a run that outlives its neighbours (paused in doubt
for an operator, waiting days on an approval) pins the page it sits on. With half a percent of
runs lingering, three pages in four never empty, and an index grows at the insert rate while the
rows it holds stay flat (docs/retention.md, Index upkeep, shows it measured). `REINDEX INDEX CONCURRENTLY`
rebuilds an index without blocking reads or writes; this module finds the indexes worth it.

Run by the schema's owner (`agentrt maintain indexes`, the chart's maintenance CronJob): rebuilding
or dropping an index needs ownership of its table, which the services' least-privilege roles do not
have. Nothing here runs inside a transaction: REINDEX/DROP INDEX CONCURRENTLY cannot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from shared.db import load_queries
from shared.errors import InvalidArgument, PermissionDenied

M = load_queries(Path(__file__).parents[1] / "sql" / "maintenance.sql")

DEFAULT_BLOAT = 2.0
DEFAULT_MIN_BYTES = 1 << 20


@dataclass(frozen=True)
class IndexSize:
    """One btree index: its size and the size a fresh build would take (None before the table's
    first VACUUM or ANALYZE counted its entries)."""

    index: str
    table: str
    bytes: int
    entries: int
    compact_bytes: int | None

    @property
    def bloat(self) -> float | None:
        return None if not self.compact_bytes else self.bytes / self.compact_bytes

    def needs_rebuild(self, bloat: float, min_bytes: int) -> bool:
        ratio = self.bloat
        return ratio is not None and ratio >= bloat and self.bytes >= min_bytes


@dataclass
class MaintenanceReport:
    """What one pass found and did; sizes in bytes."""

    dry_run: bool
    indexes: list[IndexSize] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    rebuilt: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "dropped": self.dropped, "rebuilt": self.rebuilt,
                "indexes": [{"index": i.index, "table": i.table, "bytes": i.bytes, "entries": i.entries,
                             "compact_bytes": i.compact_bytes,
                             "bloat": None if i.bloat is None else round(i.bloat, 3)} for i in self.indexes]}


async def index_sizes(conn: asyncpg.Connection) -> list[IndexSize]:
    """Every valid btree index of the schema's tables, with its estimated compact size."""
    return [IndexSize(r["index_name"], r["table_name"], r["bytes"], r["entries"], r["compact_bytes"])
            for r in await conn.fetch(M["btree_indexes"])]


async def _require_owner(conn: asyncpg.Connection, index: str) -> None:
    if not await conn.fetchval(M["owns_indexes_table"], index):
        raise PermissionDenied(f"rebuilding index {index} needs the owner of its table; connect with the "
                               "schema owner's URL (the one `agentrt migrate` uses)")


async def maintain_indexes(conn: asyncpg.Connection, *, bloat: float = DEFAULT_BLOAT,
                           min_bytes: int = DEFAULT_MIN_BYTES, dry_run: bool = False) -> MaintenanceReport:
    """Drops what an interrupted rebuild left, then rebuilds, one at a time and online, each index
    at least `bloat` times its compact size and at least `min_bytes` large. `dry_run` only reports."""
    if not bloat > 1.0:
        raise InvalidArgument("bloat", "must be more than 1 (an index's size over its compact size)")
    if min_bytes < 0:
        raise InvalidArgument("min_bytes", "must not be negative")
    report = MaintenanceReport(dry_run=dry_run, indexes=await index_sizes(conn))
    for row in await conn.fetch(M["leftover_indexes"]):
        report.dropped.append({"index": row["index_name"], "table": row["table_name"], "bytes": row["bytes"]})
        if not dry_run:
            await _require_owner(conn, row["index_name"])
            await conn.execute(await conn.fetchval(M["drop_index_sql"], row["index_name"]))
    for index in report.indexes:
        if not index.needs_rebuild(bloat, min_bytes):
            continue
        entry: dict[str, Any] = {"index": index.index, "table": index.table, "bytes_before": index.bytes,
                                 "bloat_before": round(index.bloat or 0.0, 3)}
        report.rebuilt.append(entry)
        if dry_run:
            continue
        await _require_owner(conn, index.index)
        started = time.monotonic()
        await conn.execute(await conn.fetchval(M["reindex_sql"], index.index))
        entry["seconds"] = round(time.monotonic() - started, 3)
        entry["bytes_after"] = await conn.fetchval(M["index_bytes"], index.index)
    return report
