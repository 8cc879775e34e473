"""The scheduler's data-access layer: the only code that runs SQL against run state.

Also here: the schema's migrations (migrate.py), the least-privilege database roles
(database_roles.py) and the named queries (queries.py over ../sql/queries.sql).

`Store` holds one repository per part, each a class of its own built over the shared
`Database` (core.py: the pools, the settings, the flow limits' cache) and over the
parts it needs, passed to its constructor:

- `store.runs` (runs.py): RunService's reads and operator writes;
- `store.retries` (retry.py): RetryRun, a new run from a FAILED or CANCELLED one;
- `store.work` (work.py): the lease holder's claim, heartbeat, checkpoints and end;
- `store.tools` (work_tools.py): the lease holder's tool-ledger writes;
- `store.children` (children.py): child runs and the run tree;
- `store.schedules`, `store.registry`, `store.auth` (API keys and the audit
  trail), `store.keys` (data keys), `store.limits` (runtime flow limits).

The fenced writes share `Recovery` (recovery.py: commit-unknown replay and the
refusal diagnosis); types.py holds the lease, the write fields and event-id
bindings, rows.py the typed rows and named results handed to the RPC layer.

Every statement is a named block of sql/queries.sql run with its parameters by
name; the fenced writes share one guard (docs/design.md §leases-and-fencing).
"""

from __future__ import annotations

import asyncpg

from scheduler.config import SchedulerSettings
from scheduler.states import TERMINAL
from scheduler.store.auth import ApiKeyRow, AuthStore, KeyForAuth
from scheduler.store.children import ChildSpec, ChildStore
from scheduler.store.core import (
    COMMIT_UNKNOWN_COUNTER,
    Database,
    Repository,
    connect_pool,
    db_call,
    request_event_id,
)
from scheduler.store.fenced import (
    BeginCall,
    CheckpointWrite,
    CompleteAndBegin,
    CompleteCall,
    InDoubt,
    NotExecuted,
    RunFinish,
    ToolOutcome,
)
from scheduler.store.keys import KeyStore
from scheduler.store.limits import LimitsStore, TenantFlow
from scheduler.store.recovery import Recovery
from scheduler.store.registry import AgentSpec, RegistryStore
from scheduler.store.retry import RetryStore
from scheduler.store.rows import (
    Began,
    Chained,
    CheckpointRow,
    CompactJournalPage,
    Completed,
    EventRow,
    ExecutionRow,
    Finished,
    GlobalStats,
    JournalPage,
    JournalRow,
    Pruned,
    Resolved,
    RunRow,
    TenantStats,
    Written,
)
from scheduler.store.runs import RunStore
from scheduler.store.schedules import ScheduleSpec, ScheduleStore
from scheduler.store.types import (
    HISTORY_PARTS,
    NO_JOURNAL,
    AuditEntry,
    Claimed,
    Effect,
    History,
    HistoryCursor,
    HistoryPage,
    Journal,
    LeaseRef,
    ResolveOutcome,
    RunEnd,
    RunFilter,
    SubmitSpec,
    ToolIntent,
    WriteBinding,
    bind_write,
)
from scheduler.store.work import WorkStore
from scheduler.store.work_tools import ToolWrites
from shared.tracing import Trace


class Store:
    """Every read and write of run state, one repository per part (see the module's docstring).
    `pool`, `work_pool`, `settings`: the shared `db`'s."""

    def __init__(self, pool: asyncpg.Pool, settings: SchedulerSettings,
                 work_pool: asyncpg.Pool | None = None) -> None:
        self.db = db = Database(pool, settings, work_pool)
        self.pool, self.work_pool, self.settings = db.pool, db.work_pool, db.settings
        recovery = Recovery()
        self.keys = KeyStore(db)
        self.runs = RunStore(db, self.keys)
        self.retries = RetryStore(db, self.runs, self.keys)
        self.work = WorkStore(db, recovery)
        self.tools = ToolWrites(db, self.keys, recovery)
        self.children = ChildStore(db, self.keys, recovery)
        self.schedules = ScheduleStore(db, self.keys)
        self.registry = RegistryStore(db)
        self.auth = AuthStore(db)
        self.limits = LimitsStore(db)

    def repositories(self) -> dict[str, Repository]:
        """The parts by attribute name (the connection-loss sweep walks them)."""
        return {name: part for name, part in vars(self).items() if isinstance(part, Repository)}


__all__ = [
    "COMMIT_UNKNOWN_COUNTER",
    "HISTORY_PARTS",
    "NO_JOURNAL",
    "TERMINAL",
    "AgentSpec",
    "ApiKeyRow",
    "AuditEntry",
    "AuthStore",
    "Began",
    "BeginCall",
    "Chained",
    "CheckpointRow",
    "CheckpointWrite",
    "ChildSpec",
    "ChildStore",
    "Claimed",
    "CompactJournalPage",
    "CompleteAndBegin",
    "CompleteCall",
    "Completed",
    "Database",
    "Effect",
    "EventRow",
    "ExecutionRow",
    "Finished",
    "GlobalStats",
    "History",
    "HistoryCursor",
    "HistoryPage",
    "InDoubt",
    "Journal",
    "JournalPage",
    "JournalRow",
    "KeyForAuth",
    "KeyStore",
    "LeaseRef",
    "LimitsStore",
    "NotExecuted",
    "Pruned",
    "Recovery",
    "RegistryStore",
    "Repository",
    "ResolveOutcome",
    "Resolved",
    "RetryStore",
    "RunEnd",
    "RunFilter",
    "RunFinish",
    "RunRow",
    "RunStore",
    "ScheduleSpec",
    "ScheduleStore",
    "Store",
    "SubmitSpec",
    "TenantFlow",
    "TenantStats",
    "ToolIntent",
    "ToolOutcome",
    "ToolWrites",
    "Trace",
    "WorkStore",
    "WriteBinding",
    "Written",
    "bind_write",
    "connect_pool",
    "db_call",
    "request_event_id",
]
