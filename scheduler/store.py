"""The scheduler's data-access layer: the only code that runs SQL against run state.

`Store` is assembled from its parts:

- scheduler/store_types.py: the lease, the write fields and event-id bindings;
- scheduler/rows.py: the typed rows and named results it hands the RPC layer;
- scheduler/store_core.py: the pool, `db_call`, the fenced-write runner;
- scheduler/replay.py: commit-unknown replay and the refusal diagnosis;
- scheduler/store_runs.py: RunService's reads and operator writes;
- scheduler/store_retry.py: RetryRun (a new run from a FAILED or CANCELLED one);
- scheduler/store_work.py, scheduler/store_work_tools.py: the lease holder's
  claim, heartbeat and fenced writes;
- scheduler/store_registry.py: the agent registry;
- scheduler/store_auth.py: API keys and the audit trail.

Every statement is a named block of sql/queries.sql run with its parameters by
name; the fenced writes share one guard (docs/design.md §leases-and-fencing).
"""

from __future__ import annotations

from scheduler.rows import (
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
from scheduler.states import TERMINAL
from scheduler.store_auth import ApiKeyRow, AuthStore, KeyForAuth
from scheduler.store_children import ChildSpec, ChildStore
from scheduler.store_core import COMMIT_UNKNOWN_COUNTER, connect_pool, db_call, request_event_id
from scheduler.store_keys import KeyStore
from scheduler.store_limits import LimitsStore, TenantFlow
from scheduler.store_registry import AgentSpec, RegistryStore
from scheduler.store_retry import RetryStore
from scheduler.store_schedules import ScheduleSpec, ScheduleStore
from scheduler.store_types import (
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
from scheduler.store_work import WorkStore
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
