"""The scheduler's data-access layer: the only code that runs SQL against run state.

Also here: the schema's migrations (migrate.py), the least-privilege database roles
(database_roles.py) and the named queries (queries.py over ../sql/queries.sql).

`Store` is assembled from its parts:

- scheduler/store/types.py: the lease, the write fields and event-id bindings;
- scheduler/store/rows.py: the typed rows and named results it hands the RPC layer;
- scheduler/store/core.py: the pool, `db_call`, the fenced-write runner;
- scheduler/store/recovery.py: commit-unknown replay and the refusal diagnosis;
- scheduler/store/runs.py: RunService's reads and operator writes;
- scheduler/store/retry.py: RetryRun (a new run from a FAILED or CANCELLED one);
- scheduler/store/work.py, scheduler/store/work_tools.py: the lease holder's
  claim, heartbeat and fenced writes;
- scheduler/store/registry.py: the agent registry;
- scheduler/store/auth.py: API keys and the audit trail.

Every statement is a named block of sql/queries.sql run with its parameters by
name; the fenced writes share one guard (docs/design.md §leases-and-fencing).
"""

from __future__ import annotations

from scheduler.states import TERMINAL
from scheduler.store.auth import ApiKeyRow, AuthStore, KeyForAuth
from scheduler.store.children import ChildSpec, ChildStore
from scheduler.store.core import COMMIT_UNKNOWN_COUNTER, connect_pool, db_call, request_event_id
from scheduler.store.keys import KeyStore
from scheduler.store.limits import LimitsStore, TenantFlow
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
    tx2_binding,
)
from scheduler.store.work import WorkStore
from shared.tracing import Trace


class Store(RetryStore, WorkStore, ChildStore, RegistryStore, AuthStore, ScheduleStore, KeyStore, LimitsStore):
    """Every read and write of run state: RunService's side (`RunStore`, `RetryStore`), WorkService's (`WorkStore`)
    the agent registry (`RegistryStore`), API keys and the audit trail (`AuthStore`), schedules
    (`ScheduleStore`), runtime flow limits (`LimitsStore`)."""


__all__ = [
    "COMMIT_UNKNOWN_COUNTER",
    "HISTORY_PARTS",
    "NO_JOURNAL",
    "TERMINAL",
    "AgentSpec",
    "ApiKeyRow",
    "AuditEntry",
    "Began",
    "Chained",
    "CheckpointRow",
    "ChildSpec",
    "Claimed",
    "CompactJournalPage",
    "Completed",
    "Effect",
    "EventRow",
    "ExecutionRow",
    "Finished",
    "GlobalStats",
    "History",
    "HistoryCursor",
    "HistoryPage",
    "Journal",
    "JournalPage",
    "JournalRow",
    "KeyForAuth",
    "LeaseRef",
    "Pruned",
    "ResolveOutcome",
    "Resolved",
    "RunEnd",
    "RunFilter",
    "RunRow",
    "ScheduleSpec",
    "Store",
    "SubmitSpec",
    "TenantFlow",
    "TenantStats",
    "ToolIntent",
    "Trace",
    "WriteBinding",
    "Written",
    "bind_write",
    "connect_pool",
    "db_call",
    "request_event_id",
    "tx2_binding",
]
