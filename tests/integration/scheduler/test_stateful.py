"""Hypothesis stateful test: random interleavings of several workers against the real database.

The machine drives scheduler.store.Store directly (one dedicated event loop, one
asyncpg pool) with three workers that keep every lease they were ever given, so
stale fences are used on purpose. Time is simulated with SQL (a lease lapses, a
backoff or sleep ends); all other changes go through the Store.

Every rule predicts, from the database state just before the call, what the
scheduler must answer: success, or exactly which typed error (shared.errors).
Any other exception fails the test. A call made under a stale lease must raise
LeaseLost and leave the run's row, checkpoints, ledger, events and journal
byte-for-byte unchanged. After every step the reference invariants are checked with SQL.

Run journal and pruning (issue 12): checkpoint-writing calls sometimes carry 1-3 journal
entries (sometimes with a first seq that does not continue the journal: refused with
INVALID_ARGUMENT, nothing appended). The model keeps every run's expected journal; the
database's must equal it, gapless (seq 1..journal_length), each entry written under a
fence that held the run's lease. A rule prunes checkpoints (small keep_last), each
statement's effect predicted exactly; a run always keeps its current checkpoint.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from scheduler.config import SchedulerSettings
from scheduler.store import (
    NO_JOURNAL,
    BeginCall,
    CheckpointWrite,
    CompleteAndBegin,
    CompleteCall,
    InDoubt,
    Journal,
    LeaseRef,
    NotExecuted,
    RunEnd,
    RunFinish,
    Store,
    SubmitSpec,
    ToolIntent,
    connect_pool,
)
from shared.canonical import request_hash
from shared.db import init_connection
from shared.errors import (
    AgentrtError,
    AlreadyExists,
    DecisionNotCheckpointed,
    InvalidArgument,
    InvalidTransition,
    LeaseLost,
    NotFound,
    RunCancelled,
    VersionConflict,
)

pytestmark = pytest.mark.integration

T = TypeVar("T")
WORKERS = ("w0", "w1", "w2")
AGENT = "stateful-agent"
TENANT = "tenant-a"
TOOL = "crm.update"
MAX_RUNS = 8  # in one example
MAX_ACTIVE = 4  # not yet ended
SHAPES = ("queued", "running", "decided", "waiting", "waiting", "in_doubt", "paused_human", "retrying")
LEASE_PICK = st.integers(0, 9)  # see Runtime.pick_lease
RUN_PICK = st.integers(0, 9)  # see Runtime.pick_run
LEASED = ("RUNNING", "WAITING_TOOL")
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
# Nothing becomes due or lapses by itself within a test: time only moves through the
# `lease_lapses` and `time_passes` rules (SQL), so every prediction is exact.
LONG_MS = 600_000
STORE_SETTINGS = dict(lease_duration_ms=LONG_MS, backoff_base_ms=LONG_MS, backoff_cap_ms=LONG_MS,
                      backoff_jitter_ms=0)

# Journal entries a checkpoint-writing call sends: none, 1-3 continuing the journal, or two whose first
# seq does not continue it (GAP: skips one; REPEAT: repeats the last one, a gap when the journal is empty).
GAP, REPEAT = -1, -2
JOURNAL = st.sampled_from([0, 0, 0, 1, 2, 3, GAP, REPEAT])
KINDS = ("tool", "answer", "sleep", "input", "exception")
# How a holder closes its tool call: Tx2; Tx2 that ends the run; Tx2 + Tx1 of the next step (whose
# checkpoint records that decision, or, "undecided", another request: DECISION_NOT_CHECKPOINTED).
COMPLETE_MODES = ("tx2", "tx2", "tx2", "end:COMPLETED", "end:FAILED", "and_begin", "and_begin", "undecided")
ZERO_ID = uuid.UUID(int=0)

# One text per run covering everything a write could change: its row, checkpoints, ledger rows, events, journal.
FINGERPRINT_SQL = """
SELECT r.id, md5(concat_ws(' / ', r::text,
  (SELECT string_agg(c::text, ' | ' ORDER BY c.version) FROM agent_checkpoints c WHERE c.run_id = r.id),
  (SELECT string_agg(t::text, ' | ' ORDER BY t.step_key) FROM tool_executions t WHERE t.run_id = r.id),
  (SELECT string_agg(o::text, ' | ' ORDER BY o.id) FROM outbox o WHERE o.run_id = r.id),
  (SELECT string_agg(j::text, ' | ' ORDER BY j.seq) FROM run_journal j WHERE j.run_id = r.id))) AS fingerprint
FROM agent_runs r"""
# The same without what pruning may change (checkpoints and the run's pruned horizon).
UNPRUNABLE_SQL = """
SELECT r.id, md5(concat_ws(' / ', (to_jsonb(r) - 'checkpoints_pruned_through')::text,
  (SELECT string_agg(t::text, ' | ' ORDER BY t.step_key) FROM tool_executions t WHERE t.run_id = r.id),
  (SELECT string_agg(o::text, ' | ' ORDER BY o.id) FROM outbox o WHERE o.run_id = r.id),
  (SELECT string_agg(j::text, ' | ' ORDER BY j.seq) FROM run_journal j WHERE j.run_id = r.id))) AS fingerprint
FROM agent_runs r"""

# The errors a refused call may raise; anything else (or another one than predicted) is a failure.
Outcome = type[AgentrtError] | None


class Runtime(RuleBasedStateMachine):
    def __init__(self, loop: asyncio.AbstractEventLoop, store: Store, conn: asyncpg.Connection) -> None:
        super().__init__()
        self.loop, self.store, self.conn = loop, store, conn
        self.sql("TRUNCATE agent_runs, agent_checkpoints, tool_executions, outbox, consumed_events, "
                 "runtime_counters, run_journal CASCADE")
        self.runs: list[uuid.UUID] = []
        self.leases: list[LeaseRef] = []  # every lease ever handed out; old ones are stale on purpose
        self.fences: dict[uuid.UUID, int] = {}  # the fence each run must have now
        self.versions: dict[uuid.UUID, int] = {}  # the highest version seen
        self.terminal: dict[uuid.UUID, dict[str, Any]] = {}  # frozen picture of each ended run
        self.saves: list[tuple[Any, ...]] = []  # successful SaveCheckpoint calls, for replays
        self.finishes: list[tuple[Any, ...]] = []  # successful FinishRun calls, for replays
        self.completes: list[tuple[Any, ...]] = []  # successful Tx2 calls (all modes), for replays
        # The journal each run must have: (seq, kind, step_key, node, tool, detail, fencing_token, run_version).
        self.journals: dict[uuid.UUID, list[tuple[Any, ...]]] = {}
        self.refused: set[int] = set()  # detail "n" of entries sent with writes not (yet) known to have committed
        self.pruned: dict[uuid.UUID, int] = {}  # each run's checkpoints_pruned_through, predicted by `prune`
        self.counter = itertools.count(1)

    # ------------------------------------------------------------------ plumbing

    def wait(self, awaitable: Awaitable[T]) -> T:
        return self.loop.run_until_complete(awaitable)

    def sql(self, query: str, *args: Any) -> str:
        return self.wait(self.conn.execute(query, *args))

    def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        return self.wait(self.conn.fetch(query, *args))

    def row(self, run_id: uuid.UUID) -> dict[str, Any]:
        record = self.wait(self.conn.fetchrow(
            "SELECT *, coalesce(lease_expires_at > clock_timestamp(), false) AS live "
            "FROM agent_runs WHERE id = $1", run_id))
        assert record is not None
        return dict(record)

    def picture(self, run_id: uuid.UUID) -> dict[str, Any]:
        """Everything any write could change for one run."""
        return {
            "run": dict(self.wait(self.conn.fetchrow("SELECT * FROM agent_runs WHERE id = $1", run_id))),
            "checkpoints": [dict(r) for r in self.fetch(
                "SELECT * FROM agent_checkpoints WHERE run_id = $1 ORDER BY version", run_id)],
            "ledger": [dict(r) for r in self.fetch(
                "SELECT * FROM tool_executions WHERE run_id = $1 ORDER BY step_key", run_id)],
            "events": [dict(r) for r in self.fetch("SELECT * FROM outbox WHERE run_id = $1 ORDER BY id", run_id)],
            "journal": [dict(r) for r in self.fetch(
                "SELECT * FROM run_journal WHERE run_id = $1 ORDER BY seq", run_id)],
        }

    def ledger(self, run_id: uuid.UUID, step_key: str | None) -> dict[str, Any] | None:
        record = self.wait(self.conn.fetchrow(
            "SELECT * FROM tool_executions WHERE run_id = $1 AND step_key = $2", run_id, step_key))
        return dict(record) if record else None

    def checkpoint(self, run_id: uuid.UUID, version: int) -> dict[str, Any] | None:
        record = self.wait(self.conn.fetchrow(
            "SELECT * FROM agent_checkpoints WHERE run_id = $1 AND version = $2", run_id, version))
        return dict(record) if record else None

    def call(self, expected: Outcome, make: Callable[[], Awaitable[T]]) -> T | None:
        """Runs a Store call and checks it ended as predicted: success (None) or that error class."""
        try:
            result = self.wait(make())
        except AgentrtError as error:
            assert expected is not None, f"expected success, got {type(error).__name__}: {error.message}"
            assert type(error) is expected, f"expected {expected.__name__}, got {type(error).__name__}: {error}"
            return None
        assert expected is None, f"expected {expected.__name__}, but the call succeeded: {result!r}"
        return result

    def pick_lease(self, i: int) -> LeaseRef:
        """i < 7 (most draws): a lease that is live now, if any; else any lease ever given (often stale)."""
        if i < 7:
            holders = {(r["id"], r["lease_owner"], r["fencing_token"]) for r in self.fetch(
                "SELECT id, lease_owner, fencing_token FROM agent_runs "
                "WHERE lease_owner IS NOT NULL AND lease_expires_at > clock_timestamp()")}
            live = [lease for lease in self.leases
                    if (lease.run_id, lease.worker_id, lease.fencing_token) in holders]
            if live:
                return live[i % len(live)]
        return self.leases[(i * 7919) % len(self.leases)]

    def pick_run(self, i: int, *statuses: str) -> uuid.UUID:
        """i < 7 (most draws): a run in one of `statuses` (default: not ended), if any; else any run."""
        if i < 7:
            wanted = statuses or ("QUEUED", "RUNNING", "WAITING_TOOL", "PAUSED_INDOUBT", "PAUSED_HUMAN")
            candidates = [r["id"] for r in self.fetch(
                "SELECT id FROM agent_runs WHERE status = ANY($1::text[]) ORDER BY created_at, id", list(wanted))]
            if candidates:
                return candidates[i % len(candidates)]
        return self.runs[i % len(self.runs)]

    def holds(self, lease: LeaseRef, run: dict[str, Any]) -> bool:
        return (run["lease_owner"] == lease.worker_id and run["fencing_token"] == lease.fencing_token
                and run["live"] and run["status"] in LEASED)

    def fenced(self, lease: LeaseRef, make: Callable[[], Awaitable[T]]) -> dict[str, Any] | None:
        """For a stale lease: the call must be LEASE_LOST and change nothing (returns None).
        For the live holder: returns the run row as it was before the call, which the caller runs."""
        run = self.row(lease.run_id)
        if self.holds(lease, run):
            return run
        before = self.picture(lease.run_id)
        self.call(LeaseLost, make)
        assert self.picture(lease.run_id) == before, "a write under a stale fence changed something"
        return None

    def make_journal(self, run_id: uuid.UUID, mode: int) -> tuple[Journal, list[tuple[Any, ...]], bool]:
        """The entries a checkpoint-writing call sends (see JOURNAL), numbered from the model's journal.
        Returns them, the rows they add when the write commits (seq, kind, step_key, node, tool, detail)
        and whether they continue the journal. Each is counted refused until its write is known to commit."""
        if mode == 0:
            return NO_JOURNAL, [], True
        length = len(self.journals[run_id])
        first = length + 1 if mode > 0 else length if mode == REPEAT and length else length + 2
        rows = []
        for k in range(mode if mode > 0 else 2):
            n = next(self.counter)
            kind = KINDS[n % len(KINDS)]
            rows.append((first + k, kind, f"j-{n}" if k % 2 == 0 else "", "node" if k else "",
                         TOOL if kind == "tool" else "", {"n": n}))
            self.refused.add(n)
        journal = Journal.of([(seq, kind, step, node, tool, json.dumps(detail))
                              for seq, kind, step, node, tool, detail in rows])
        return journal, rows, mode > 0

    def journal_committed(self, run_id: uuid.UUID, rows: list[tuple[Any, ...]], fence: int, version: int) -> None:
        for row in rows:
            self.refused.discard(row[5]["n"])
            self.journals[run_id].append((*row, fence, version))

    def assert_cancelled(self, run_id: uuid.UUID) -> None:
        run = self.row(run_id)
        assert run["status"] == "CANCELLED" and run["terminal_reason"].startswith("cancelled")
        assert run["lease_owner"] is None

    # ------------------------------------------------------------------ initial runs

    @initialize(shapes=st.lists(st.sampled_from(SHAPES), min_size=1, max_size=MAX_ACTIVE))
    def start(self, shapes: list[str]) -> None:
        """Each example starts with a few runs already driven into various states (through the Store,
        with every prediction checked), so that the random steps meet deep states often."""
        # Queued shapes last: a claim takes the oldest due run, which must be the one being driven.
        for k, shape in enumerate(sorted(shapes, key=lambda name: name == "queued")):
            self.submit(max_attempts=2)
            if shape == "queued":
                continue
            self.do_claim(WORKERS[k % len(WORKERS)])
            lease = self.leases[-1]
            assert lease.run_id == self.runs[-1]
            if shape == "paused_human":
                self.do_finish(lease, "PAUSED_HUMAN", False, 0)
            elif shape == "retrying":
                self.do_finish(lease, "RETRY", False, 0)
            elif shape != "running":
                self.do_save_checkpoint(lease, True, 0, (k + 1) % 3)
                if shape in ("waiting", "in_doubt"):
                    self.do_begin_tool_call(lease, "match")
                if shape == "in_doubt":
                    self.do_mark_tool_in_doubt(lease, False)
            self.reference_invariants()

    # ------------------------------------------------------------------ rules: RunService

    @precondition(lambda self: len(self.runs) < MAX_RUNS and len(self.runs) - len(self.terminal) < MAX_ACTIVE)
    @rule(max_attempts=st.integers(1, 3))
    def submit(self, max_attempts: int) -> None:
        spec = SubmitSpec(agent_name=AGENT, agent_version="", input={"n": next(self.counter)},
                          client_request_id=None, max_attempts=max_attempts, labels={})
        row, created = self.wait(self.store.runs.submit_run(TENANT, spec))
        assert created and row["status"] == "QUEUED" and row["version"] == 0 and row["fencing_token"] == 0
        self.runs.append(row["id"])
        self.fences[row["id"]] = 0
        self.versions[row["id"]] = 0
        self.journals[row["id"]] = []
        self.pruned[row["id"]] = 0

    @precondition(lambda self: self.runs)
    @rule(i=RUN_PICK)
    def cancel(self, i: int) -> None:
        run_id = self.pick_run(i)
        before = self.row(run_id)
        status = before["status"]
        flagged = before["cancel_requested_at"] is not None
        # A retried cancel of a cancelled run answers with the outcome; other ended runs refuse.
        expected: Outcome = InvalidTransition if status in TERMINAL and not flagged else None
        picture = self.picture(run_id)
        result = self.call(expected, lambda: self.store.runs.cancel_run(TENANT, run_id, reason="stateful cancel"))
        after = self.row(run_id)
        if result is None or status in TERMINAL or (status in LEASED and flagged):
            assert self.picture(run_id) == picture
            return
        if status in LEASED:  # flagged only; the holder's next write (or a takeover claim) ends it
            assert after["status"] == status and after["cancel_requested_at"] is not None
            assert after["lease_owner"] == before["lease_owner"]
            assert after["fencing_token"] == before["fencing_token"]
        else:
            self.assert_cancelled(run_id)

    @precondition(lambda self: self.runs)
    @rule(i=RUN_PICK)
    def resume(self, i: int) -> None:
        run_id = self.pick_run(i, "PAUSED_HUMAN")
        status = self.row(run_id)["status"]
        expected: Outcome = None if status == "PAUSED_HUMAN" else InvalidTransition
        before = self.picture(run_id)
        result = self.call(expected, lambda: self.store.runs.resume_run(
            TENANT, run_id, human_input={"decision": "APPROVE", "input": None, "operator": "op", "comment": None}))
        after = self.row(run_id)
        if result is None:
            assert self.picture(run_id) == before
            return
        assert after["status"] == "QUEUED" and after["attempt_count"] == 0 and after["lease_owner"] is None

    @precondition(lambda self: self.runs)
    @rule(i=RUN_PICK, outcome=st.sampled_from(["SUCCEEDED", "NOT_EXECUTED", "UNKNOWN"]),
          other_step=st.booleans())
    def resolve(self, i: int, outcome: str, other_step: bool) -> None:
        run_id = self.pick_run(i, "PAUSED_INDOUBT")
        before_run = self.row(run_id)
        step = "no-such-step" if other_step else before_run["current_step_key"] or "no-step"
        row = self.ledger(run_id, step)
        expected: Outcome = None
        if before_run["status"] != "PAUSED_INDOUBT":
            expected = InvalidTransition
        elif row is None:
            expected = NotFound
        elif row["status"] != "IN_DOUBT":
            expected = InvalidTransition
        # A run on checkpoint schema 2 (its latest checkpoint's) records a definite resolution in its journal.
        latest = self.wait(self.conn.fetchrow(
            "SELECT schema_version FROM agent_checkpoints WHERE run_id = $1 ORDER BY version DESC LIMIT 1", run_id))
        schema = latest["schema_version"] if latest else before_run["checkpoint_schema_version"]
        journaled = outcome != "UNKNOWN" and schema >= 2
        before = self.picture(run_id)
        result = self.call(expected, lambda: self.store.runs.resolve_tool_execution(
            TENANT, run_id, step_key=step, outcome=outcome,  # type: ignore[arg-type]
            result={"ok": True} if outcome == "SUCCEEDED" else None, remote_resource_id=None,
            evidence={"looked_up": True}, resolved_by="reconciler", event_id=None))
        after = self.row(run_id)
        if result is None:
            assert self.picture(run_id) == before
            return
        resolved = self.ledger(run_id, step)
        assert resolved is not None
        if outcome == "UNKNOWN":
            assert after["status"] == "PAUSED_INDOUBT" and resolved["status"] == "IN_DOUBT"
            assert resolved["reconciliation_evidence"] is not None
            assert after["journal_length"] == before_run["journal_length"]
            return
        assert after["status"] == "QUEUED" and after["attempt_count"] == 0 and after["lease_owner"] is None
        assert resolved["status"] == outcome
        assert after["journal_length"] == before_run["journal_length"] + journaled
        if outcome == "SUCCEEDED":
            assert after["version"] == before_run["version"] + 1
            state = self.checkpoint(run_id, after["version"])["state_json"]  # type: ignore[index]
            assert "pending_tool" not in state
            if journaled:
                assert state["journal_len"] == after["journal_length"]
            else:
                assert state["tool_results"][step]["response"] == {"ok": True}
        else:
            assert after["version"] == before_run["version"]
        if journaled:
            detail: dict[str, Any] = {"status": outcome, "resolved_by": "reconciler"}
            if outcome == "SUCCEEDED":
                detail["remote_resource_id"] = None
            self.journals[run_id].append((before_run["journal_length"] + 1, "result", step, "", TOOL, detail,
                                          before_run["fencing_token"], after["version"]))

    # ------------------------------------------------------------------ rules: simulated time

    @precondition(lambda self: self.runs)
    @rule(i=RUN_PICK)
    def lease_lapses(self, i: int) -> None:
        # Simulates time passing: the holder stopped heartbeating and the lease ran out.
        self.sql("UPDATE agent_runs SET lease_expires_at = clock_timestamp() - interval '1 second' "
                 "WHERE id = $1 AND status IN ('RUNNING', 'WAITING_TOOL')", self.pick_run(i, *LEASED))

    @precondition(lambda self: self.runs)
    @rule()
    def time_passes(self) -> None:
        # Simulates time passing: every backoff and durable sleep ends.
        self.sql("UPDATE agent_runs SET next_attempt_at = clock_timestamp() - interval '1 millisecond' "
                 "WHERE status = 'QUEUED' AND next_attempt_at > clock_timestamp()")

    # ------------------------------------------------------------------ rules: checkpoint pruning

    @precondition(lambda self: self.runs)
    @rule(keep_last=st.sampled_from([1, 1, 2, 3]), batch_runs=st.integers(1, 4),
          max_versions=st.sampled_from([1, 2, 256]),
          sweep=st.sampled_from([True, True, False]))
    def prune(self, keep_last: int, batch_runs: int, max_versions: int, sweep: bool) -> None:
        """Checkpoint pruning with checkpoint_keep_last = keep_last: one statement, or a whole sweep the way
        the background pruner makes it (scheduler.background.pruner.prune_once). Each statement's effect is predicted
        exactly from the rows just before it: of its batch (the next batch_runs runs by id), each run keeps
        its latest keep_last versions and loses at most max_versions older ones, the horizon recorded on its
        row; nothing else changes (no other column, no ledger row, event or journal entry)."""
        untouched = {r["id"]: r["fingerprint"] for r in self.fetch(UNPRUNABLE_SQL)}
        before_sweep = {r["id"]: r["checkpoints_pruned_through"] for r in self.fetch(
            "SELECT id, checkpoints_pruned_through FROM agent_runs")}
        after = ZERO_ID
        while True:
            runs = {r["id"]: dict(r) for r in self.fetch("SELECT * FROM agent_runs")}
            checkpoints = {(r["run_id"], r["version"]): dict(r) for r in self.fetch("SELECT * FROM agent_checkpoints")}
            batch = sorted(rid for rid in runs if rid > after)[:batch_runs]
            horizons: dict[uuid.UUID, int] = {}
            behind = 0
            for rid in batch:
                version, previous = runs[rid]["version"], runs[rid]["checkpoints_pruned_through"]
                if version - keep_last > previous:
                    horizons[rid] = min(version - keep_last, previous + max_versions)
                    behind += version - keep_last > previous + max_versions
            doomed = {key for key in checkpoints if key[0] in horizons and key[1] <= horizons[key[0]]}
            last, looked_at, deleted, more = self.wait(
                self.store.runs.prune_checkpoints(after=after, batch_runs=batch_runs, keep_last=keep_last,
                                                  max_versions_per_run=max_versions))
            assert (last, looked_at, deleted, more) == (batch[-1] if batch else None, len(batch), len(doomed), behind)
            self.pruned.update(horizons)
            assert {r["id"]: r["checkpoints_pruned_through"] for r in self.fetch(
                "SELECT id, checkpoints_pruned_through FROM agent_runs")} == self.pruned
            assert {(r["run_id"], r["version"]): dict(r) for r in self.fetch("SELECT * FROM agent_checkpoints")} \
                == {key: row for key, row in checkpoints.items() if key not in doomed}, "pruning deleted another row"
            if not sweep:
                break
            if more:
                continue  # the same batch again, as prune_once does
            if last is None or looked_at < batch_runs:
                break
            after = last
        assert {r["id"]: r["fingerprint"] for r in self.fetch(UNPRUNABLE_SQL)} == untouched, \
            "pruning changed something besides checkpoints and the pruned horizon"
        fingerprints = {r["id"]: r["fingerprint"] for r in self.fetch(FINGERPRINT_SQL)}
        for rid in self.terminal:  # an ended run changes only by pruning
            self.terminal[rid] = fingerprints[rid]
        if not sweep:
            return
        # What a sweep promises: every run keeps (exactly) its latest keep_last versions, or those kept
        # by an earlier sweep with a smaller keep_last; never its current one.
        for r in self.fetch("SELECT id, version, checkpoints_pruned_through FROM agent_runs"):
            kept = [c["version"] for c in self.fetch(
                "SELECT version FROM agent_checkpoints WHERE run_id = $1 ORDER BY version", r["id"])]
            horizon = max(before_sweep[r["id"]], r["version"] - keep_last)
            assert r["checkpoints_pruned_through"] == horizon, (r, keep_last)
            assert kept == list(range(horizon + 1, r["version"] + 1))
            # Its latest keep_last versions (those an earlier sweep left) and its current one are there.
            assert set(range(max(r["version"] - keep_last, before_sweep[r["id"]]) + 1, r["version"] + 1)) \
                <= set(kept)
            assert r["version"] == 0 or kept[-1] == r["version"]

    # ------------------------------------------------------------------ rules: WorkService

    @precondition(lambda self: self.runs)
    @rule(worker=st.sampled_from(WORKERS))
    def claim(self, worker: str) -> None:
        self.do_claim(worker)

    def do_claim(self, worker: str) -> None:
        before = {r["id"]: dict(r) for r in self.fetch(
            "SELECT *, (status = 'QUEUED' AND next_attempt_at <= clock_timestamp()) "
            "    OR (status IN ('RUNNING', 'WAITING_TOOL') AND lease_expires_at < clock_timestamp()) AS claimable "
            "FROM agent_runs")}
        claimable = {rid for rid, r in before.items() if r["claimable"]}
        claimed = self.call(None, lambda: self.store.work.claim(worker, [AGENT]))
        after = {r["id"]: dict(r) for r in self.fetch("SELECT * FROM agent_runs")}
        got = claimed.run["id"] if claimed is not None else None
        if claimed is None:
            # Only flagged (cancel-requested) runs may be claimable and yet not handed out: the claim ends them.
            assert all(before[rid]["cancel_requested_at"] is not None for rid in claimable), "claimable run missed"
        for rid, row in after.items():
            grew = row["fencing_token"] - before[rid]["fencing_token"]
            assert grew in (0, 1), "a claim moves a fence by exactly one"
            if grew and rid != got:
                assert rid in claimable and before[rid]["cancel_requested_at"] is not None
                self.assert_cancelled(rid)
            self.fences[rid] = row["fencing_token"]
        if claimed is None:
            return
        run, old = claimed.run, before[got]
        assert got in claimable and old["cancel_requested_at"] is None
        assert run["fencing_token"] == old["fencing_token"] + 1 and run["lease_owner"] == worker
        assert run["version"] == old["version"]
        if old["status"] == "QUEUED":
            assert run["status"] == "RUNNING" and run["attempt_count"] == old["attempt_count"] + 1
        else:  # a takeover keeps the status (WAITING_TOOL stays WAITING_TOOL) and is not a new attempt
            assert run["status"] == old["status"] and run["attempt_count"] == old["attempt_count"]
        if run["status"] == "WAITING_TOOL":
            assert claimed.step_execution is not None and claimed.step_execution["status"] == "OUTBOUND_INTENT"
            assert claimed.step_execution["step_key"] == run["current_step_key"]
        if run["version"] > 0:
            assert claimed.checkpoint is not None and claimed.checkpoint["version"] == run["version"]
        assert run["journal_length"] == len(self.journals[got])  # the next holder learns where the journal is
        self.leases.append(LeaseRef(got, worker, run["fencing_token"]))

    @precondition(lambda self: self.runs)
    @rule(worker=st.sampled_from(WORKERS), choices=st.lists(st.integers(0, 9), min_size=1, max_size=5))
    def progress(self, worker: str, choices: list[int]) -> None:
        """A well-behaved worker's next few steps, so that deep states (tool calls, pauses, takeovers of
        WAITING_TOOL runs) are reached often: claim when it holds nothing; else checkpoint a decision,
        run Tx1 for it, close the call (Tx2, in doubt, not executed) or finish. The invariants are
        checked after each of these steps too."""
        for n, choice in enumerate(choices):
            if n:
                self.reference_invariants()
            self.progress_once(worker, choice)

    def progress_once(self, worker: str, choice: int) -> None:
        holders = {(r["id"], r["lease_owner"], r["fencing_token"]) for r in self.fetch(
            "SELECT id, lease_owner, fencing_token FROM agent_runs "
            "WHERE lease_owner = $1 AND lease_expires_at > clock_timestamp()", worker)}
        live = [lease for lease in self.leases if (lease.run_id, lease.worker_id, lease.fencing_token) in holders]
        if not live:
            self.do_claim(worker)
            return
        lease = live[choice % len(live)]
        run = self.row(lease.run_id)
        if run["status"] == "WAITING_TOOL":
            if choice < 5:
                self.do_complete_tool_call(lease, choice % 4 != 0, False, "and_begin" if choice in (2, 4) else "tx2",
                                           (0, 3, 2, 1, 1)[choice])
            elif choice < 8:
                self.do_mark_tool_in_doubt(lease, False)
            else:
                self.do_tool_not_executed(lease, False)
            return
        cp = self.checkpoint(lease.run_id, run["version"]) if run["version"] else None
        decided = (cp or {}).get("state_json", {}).get("pending_tool")
        if decided is not None and self.ledger(lease.run_id, decided["step_key"]) is None and choice < 8:
            self.do_begin_tool_call(lease, "match")
        elif choice < 6:
            self.do_save_checkpoint(lease, True, 0, choice % 4)
        else:
            outcome = ["COMPLETED", "FAILED", "PAUSED_HUMAN", "RETRY", "SLEEP"][choice % 5]
            self.do_finish(lease, outcome, choice % 2 == 0, 0)

    @precondition(lambda self: self.leases)
    @rule(i=LEASE_PICK)
    def heartbeat(self, i: int) -> None:
        self.do_heartbeat(self.pick_lease(i))

    def do_heartbeat(self, lease: LeaseRef) -> None:
        make = lambda: self.store.work.heartbeat(lease)  # noqa: E731
        run = self.fenced(lease, make)
        if run is None:
            return
        flagged = run["cancel_requested_at"] is not None
        expires = self.call(RunCancelled if flagged else None, make)
        if flagged:
            self.assert_cancelled(lease.run_id)
        else:
            assert expires is not None and expires >= run["lease_expires_at"]

    @precondition(lambda self: self.leases)
    @rule(i=LEASE_PICK, with_tool=st.sampled_from([True, True, False]), skew=st.sampled_from([0, 0, 0, 1, -1]),
          journal=JOURNAL)
    def save_checkpoint(self, i: int, with_tool: bool, skew: int, journal: int) -> None:
        self.do_save_checkpoint(self.pick_lease(i), with_tool, skew, journal)

    def do_save_checkpoint(self, lease: LeaseRef, with_tool: bool, skew: int, journal_mode: int = 0) -> None:
        n = next(self.counter)
        step = f"step-{n}" if with_tool else None
        state: dict[str, Any] = {"n": n}
        if with_tool:
            request = {"n": n}
            state["pending_tool"] = {"step_key": step, "tool_name": TOOL, "request": request,
                                     "request_hash": request_hash(TOOL, request).hex()}
        current = self.row(lease.run_id)["version"]
        expected_version = max(current + skew, 0) if skew >= 0 or current > 0 else current + 1
        event_id = uuid.uuid4()
        journal, entries, continues = self.make_journal(lease.run_id, journal_mode)
        schema = 2 if entries or self.journals[lease.run_id] or n % 2 else 1  # a journaled run stays on 2
        args = (lease, dict(expected_version=expected_version, state=state, schema_version=schema, step_key=step,
                            event_id=event_id, event_type="agent.checkpoint", event_payload={}))
        make = lambda: self.store.work.save_checkpoint(args[0], CheckpointWrite(**args[1], journal=journal))  # noqa: E731
        run = self.fenced(lease, make)
        if run is None:
            return
        if run["cancel_requested_at"] is not None:
            expected: Outcome = RunCancelled
        elif run["status"] != "RUNNING":
            expected = InvalidTransition
        elif expected_version != run["version"]:
            expected = VersionConflict
        elif not continues:
            expected = InvalidArgument  # journal[0].seq: the entries must continue the run's journal
        else:
            expected = None
        before = self.picture(lease.run_id)
        result = self.call(expected, make)
        if expected is RunCancelled:
            self.assert_cancelled(lease.run_id)
            return
        if result is None:
            assert self.picture(lease.run_id) == before
            return
        version, replayed = result
        assert version == run["version"] + 1 and not replayed
        after = self.row(lease.run_id)
        assert after["version"] == version and after["status"] == "RUNNING"
        assert after["current_step_key"] == (step or run["current_step_key"])
        written = self.checkpoint(lease.run_id, version)
        assert written is not None and written["state_json"] == state
        assert written["fencing_token"] == lease.fencing_token and written["event_id"] == event_id
        assert after["journal_length"] == run["journal_length"] + len(entries)
        self.journal_committed(lease.run_id, entries, lease.fencing_token, version)
        self.saves.append((args, journal, version))

    @precondition(lambda self: self.leases)
    @rule(i=LEASE_PICK, journals=st.lists(st.sampled_from([0, 1, 2, 3]), min_size=2, max_size=5))
    def long_run(self, i: int, journals: list[int]) -> None:
        """A holder's checkpoints in a row (a long run, issue 12), each recording 0-3 journal entries, so that
        versions and journals grow past what pruning keeps."""
        lease = self.pick_lease(i)
        for mode in journals:
            self.do_save_checkpoint(lease, False, 0, mode)
            run = self.row(lease.run_id)
            if not self.holds(lease, run) or run["status"] != "RUNNING":
                break  # refused (stale, waiting on a tool, cancelled): the rest would be refused too

    @precondition(lambda self: self.saves)
    @rule(i=LEASE_PICK)
    def save_checkpoint_retried(self, i: int) -> None:
        """Commit unknown, case (a): the same event id answers from what committed and writes nothing
        (also once pruning deleted the checkpoint: the run's recorded horizon says so)."""
        args, journal, version = self.saves[-1 - i % len(self.saves)]
        run_id = args[0].run_id
        before = self.picture(run_id)
        result = self.call(None, lambda: self.store.work.save_checkpoint(args[0],
                                                                          CheckpointWrite(**args[1], journal=journal)))
        assert result == (version, True)
        assert self.picture(run_id) == before

    @precondition(lambda self: self.leases)
    @rule(i=LEASE_PICK, mode=st.sampled_from(["match", "match", "match", "other_args", "other_step"]))
    def begin_tool_call(self, i: int, mode: str) -> None:
        self.do_begin_tool_call(self.pick_lease(i), mode)

    def do_begin_tool_call(self, lease: LeaseRef, mode: str) -> None:
        current = self.row(lease.run_id)
        cp = self.checkpoint(lease.run_id, current["version"]) if current["version"] else None
        decided = (cp or {}).get("state_json", {}).get("pending_tool")
        n = next(self.counter)
        if decided is not None and mode != "other_step":
            step, request = decided["step_key"], decided["request"]
            if mode == "other_args":
                request = {"n": -n}
        else:
            step, request = f"step-{n}", {"n": n}
        matches = (decided is not None and decided["step_key"] == step
                   and decided["request_hash"] == request_hash(TOOL, request).hex())
        key = f"idem:{lease.run_id}:{step}"
        execution_id, event_id = uuid.uuid4(), uuid.uuid4()
        make = lambda: self.store.tools.begin_tool_call(  # noqa: E731
            lease, BeginCall(expected_version=current["version"], intent=ToolIntent(
                step_key=step, tool_name=TOOL, idempotency_key=key, request=request, execution_id=execution_id,
                event_id=event_id)))
        run = self.fenced(lease, make)
        if run is None:
            return
        existing = self.ledger(lease.run_id, step)
        if existing is not None:
            expected: Outcome = None  # the holder gets the existing row: never a licence to resend
        elif run["cancel_requested_at"] is not None:
            expected = RunCancelled
        elif run["status"] != "RUNNING":
            expected = InvalidTransition
        elif not matches:
            expected = DecisionNotCheckpointed
        else:
            expected = None
        before = self.picture(lease.run_id)
        result = self.call(expected, make)
        if expected is RunCancelled:
            self.assert_cancelled(lease.run_id)
            return
        if result is None:
            assert self.picture(lease.run_id) == before
            return
        row, was_existing, replayed = result
        assert not replayed
        if existing is not None:
            assert was_existing and row["id"] == existing["id"]
            assert self.picture(lease.run_id) == before
            return
        assert not was_existing and row["id"] == execution_id and row["status"] == "OUTBOUND_INTENT"
        assert row["fencing_token"] == lease.fencing_token
        after = self.row(lease.run_id)
        assert after["status"] == "WAITING_TOOL" and after["current_step_key"] == step
        assert after["version"] == run["version"]

    def tool_precheck(self, run: dict[str, Any], step: str, versioned: bool,
                      expected_version: int) -> Outcome:
        """The refusal a holder's Tx2 / not-executed / in-doubt call must get, or None."""
        if run["cancel_requested_at"] is not None:
            return RunCancelled
        if run["status"] != "WAITING_TOOL":
            return InvalidTransition
        if versioned and expected_version != run["version"]:
            return VersionConflict
        if run["current_step_key"] != step:
            return InvalidArgument
        row = self.ledger(run["id"], step)
        assert row is not None and row["status"] == "OUTBOUND_INTENT"  # the WAITING_TOOL invariant
        return None

    def tool_step(self, run_id: uuid.UUID, other_step: bool) -> str:
        return "other-step" if other_step else self.row(run_id)["current_step_key"] or "no-step"

    @precondition(lambda self: self.leases)
    @rule(i=LEASE_PICK, succeeded=st.booleans(), other_step=st.sampled_from([False, False, False, True]),
          mode=st.sampled_from(COMPLETE_MODES), journal=JOURNAL)
    def complete_tool_call(self, i: int, succeeded: bool, other_step: bool, mode: str, journal: int) -> None:
        self.do_complete_tool_call(self.pick_lease(i), succeeded, other_step, mode, journal)

    def do_complete_tool_call(self, lease: LeaseRef, succeeded: bool, other_step: bool, mode: str = "tx2",
                              journal_mode: int = 0) -> None:
        """Tx2 (see COMPLETE_MODES): alone, ending the run, or with Tx1 of the next step."""
        step = self.tool_step(lease.run_id, other_step)
        version = self.row(lease.run_id)["version"]
        n = next(self.counter)
        state: dict[str, Any] = {"after": step, "n": n}
        journal, entries, continues = self.make_journal(lease.run_id, journal_mode)
        schema = 2 if entries or self.journals[lease.run_id] or n % 2 else 1
        error_code = None if succeeded else "E_DEFINITE"
        event_id = uuid.uuid4()
        end = RunEnd(mode[4:], "ended with its last tool call", {"n": n}, "", uuid.uuid4()) \
            if mode.startswith("end:") else None
        intent = None
        if mode in ("and_begin", "undecided"):
            request = {"n": n}
            decided = request if mode == "and_begin" else {"n": -n}
            intent = ToolIntent(f"step-{n}", TOOL, f"idem:{lease.run_id}:step-{n}", request, uuid.uuid4(),
                                uuid.uuid4())
            state["pending_tool"] = {"step_key": intent.step_key, "tool_name": TOOL, "request": decided,
                                     "request_hash": request_hash(TOOL, decided).hex()}
            make: Callable[[], Awaitable[Any]] = lambda: self.store.tools.complete_and_begin_tool_call(  # noqa: E731
                lease, CompleteAndBegin(
                    expected_version=version, step_key=step, succeeded=succeeded, response={"answer": 1},
                    remote_resource_id=None, error_code=error_code, state=state, schema_version=schema,
                    evidence=None, event_id=event_id, intent=intent, journal=journal))
        else:
            make = lambda: self.store.work.complete_tool_call(  # noqa: E731
                lease, CompleteCall(
                    expected_version=version, step_key=step, succeeded=succeeded, response={"answer": 1},
                    remote_resource_id=None, error_code=error_code, state=state, schema_version=schema,
                    next_step_key=None, evidence=None, event_id=event_id, end=end, journal=journal))
        run = self.fenced(lease, make)
        if run is None:
            return
        expected = self.tool_precheck(run, step, True, version)
        if expected is None and not continues:
            expected = InvalidArgument  # journal[0].seq
        elif expected is None and mode == "undecided":
            expected = DecisionNotCheckpointed
        before = self.picture(lease.run_id)
        open_row = self.ledger(lease.run_id, step)
        result = self.call(expected, make)
        if expected is RunCancelled:
            self.assert_cancelled(lease.run_id)
            if open_row is not None and open_row["status"] == "OUTBOUND_INTENT":  # the outcome is kept
                assert self.ledger(lease.run_id, step)["status"] == ("SUCCEEDED" if succeeded else "FAILED")  # type: ignore[index]
            return
        if result is None:
            assert self.picture(lease.run_id) == before
            return
        after = self.row(lease.run_id)
        assert after["version"] == version + 1
        if intent is not None:
            new_version, row, replayed = result
            assert new_version == version + 1 and not replayed
            assert row["id"] == intent.execution_id and row["status"] == "OUTBOUND_INTENT"
            assert row["step_key"] == intent.step_key and row["fencing_token"] == lease.fencing_token
            assert after["status"] == "WAITING_TOOL" and after["current_step_key"] == intent.step_key
            assert after["lease_owner"] == lease.worker_id
        elif end is not None:
            assert result == (version + 1, end.outcome, False)
            assert after["status"] == end.outcome and after["lease_owner"] is None
            assert after["finished_at"] is not None
            if end.outcome == "COMPLETED":
                assert after["result"] == {"n": n}
        else:
            assert result == (version + 1, "RUNNING", False)
            assert after["status"] == "RUNNING"
        closed = self.ledger(lease.run_id, step)
        assert closed is not None and closed["status"] == ("SUCCEEDED" if succeeded else "FAILED")
        assert closed["completed_at"] is not None
        written = self.checkpoint(lease.run_id, version + 1)
        assert written is not None and written["state_json"] == state
        assert written["fencing_token"] == lease.fencing_token
        assert after["journal_length"] == run["journal_length"] + len(entries)
        self.journal_committed(lease.run_id, entries, lease.fencing_token, version + 1)
        self.completes.append((lease.run_id, make, result))

    @precondition(lambda self: self.completes)
    @rule(i=LEASE_PICK)
    def complete_tool_call_retried(self, i: int) -> None:
        """Commit unknown, case (a) for Tx2 (alone, ending the run, with Tx1): the same call answers from
        what committed (also once its checkpoint was pruned) and writes nothing."""
        run_id, make, committed = self.completes[-1 - i % len(self.completes)]
        before = self.picture(run_id)
        result = self.call(None, make)
        assert result is not None and result[0] == committed[0] and result[2] is True
        if isinstance(committed[1], str):
            assert result[1] == committed[1]
        else:  # the ledger row of the next step's intent
            assert result[1]["id"] == committed[1]["id"]
        assert self.picture(run_id) == before

    @precondition(lambda self: self.leases)
    @rule(i=LEASE_PICK, other_step=st.sampled_from([False, False, True]))
    def tool_not_executed(self, i: int, other_step: bool) -> None:
        self.do_tool_not_executed(self.pick_lease(i), other_step)

    def do_tool_not_executed(self, lease: LeaseRef, other_step: bool) -> None:
        step = self.tool_step(lease.run_id, other_step)
        version = self.row(lease.run_id)["version"]
        make = lambda: self.store.tools.tool_not_executed(  # noqa: E731
            lease, NotExecuted(expected_version=version, step_key=step, error_code="NOT_FOUND_DOWNSTREAM",
                               evidence={"lookup": "absent"}, event_id=uuid.uuid4()))
        run = self.fenced(lease, make)
        if run is None:
            return
        expected = self.tool_precheck(run, step, True, version)
        before = self.picture(lease.run_id)
        result = self.call(expected, make)
        if expected is RunCancelled:
            self.assert_cancelled(lease.run_id)
            return
        if result is None:
            assert self.picture(lease.run_id) == before
            return
        # Back to QUEUED (backoff); at max_attempts the run ends FAILED instead (a retry loop must end).
        exhausted = run["attempt_count"] >= run["max_attempts"]
        want = "FAILED" if exhausted else "QUEUED"
        assert result == (version, want, False)
        after = self.row(lease.run_id)
        assert after["status"] == want and after["lease_owner"] is None and after["version"] == version
        assert after["journal_length"] == run["journal_length"]  # it writes no checkpoint, so no entries
        if exhausted:
            assert after["terminal_reason"].startswith("attempts exhausted") and after["finished_at"] is not None
        assert self.ledger(lease.run_id, step)["status"] == "NOT_EXECUTED"  # type: ignore[index]

    @precondition(lambda self: self.leases)
    @rule(i=LEASE_PICK, other_step=st.sampled_from([False, False, True]))
    def mark_tool_in_doubt(self, i: int, other_step: bool) -> None:
        self.do_mark_tool_in_doubt(self.pick_lease(i), other_step)

    def do_mark_tool_in_doubt(self, lease: LeaseRef, other_step: bool) -> None:
        step = self.tool_step(lease.run_id, other_step)
        make = lambda: self.store.tools.mark_tool_in_doubt(  # noqa: E731
            lease, InDoubt(step_key=step, error_code="TIMEOUT", detail="no answer in 30 s", event_id=uuid.uuid4()))
        run = self.fenced(lease, make)
        if run is None:
            return
        expected = self.tool_precheck(run, step, False, 0)
        before = self.picture(lease.run_id)
        open_row = self.ledger(lease.run_id, step)
        result = self.call(expected, make)
        if expected is RunCancelled:
            self.assert_cancelled(lease.run_id)
            if open_row is not None and open_row["status"] == "OUTBOUND_INTENT":
                assert self.ledger(lease.run_id, step)["status"] == "IN_DOUBT"  # type: ignore[index]
            return
        if result is None:
            assert self.picture(lease.run_id) == before
            return
        assert result is False
        after = self.row(lease.run_id)
        assert after["status"] == "PAUSED_INDOUBT" and after["lease_owner"] is None
        assert "TIMEOUT" in after["pause_reason"]
        assert self.ledger(lease.run_id, step)["status"] == "IN_DOUBT"  # type: ignore[index]

    @precondition(lambda self: self.leases)
    @rule(i=LEASE_PICK, outcome=st.sampled_from(["COMPLETED", "FAILED", "PAUSED_HUMAN", "RETRY", "SLEEP"]),
          pause_when_exhausted=st.booleans(), skew=st.sampled_from([0, 0, 0, 1]))
    def finish(self, i: int, outcome: str, pause_when_exhausted: bool, skew: int) -> None:
        self.do_finish(self.pick_lease(i), outcome, pause_when_exhausted, skew)

    def do_finish(self, lease: LeaseRef, outcome: str, pause_when_exhausted: bool, skew: int) -> None:
        version = self.row(lease.run_id)["version"] + skew
        event_id = uuid.uuid4()
        args = (lease, dict(expected_version=version, outcome=outcome, reason=f"finish {outcome}",
                            result={"done": True} if outcome == "COMPLETED" else None,
                            sleep_ms=LONG_MS if outcome == "SLEEP" else 0, pause_when_exhausted=pause_when_exhausted,
                            error_class="", event_id=event_id))
        make = lambda: self.store.work.finish_run(args[0], RunFinish(**args[1]))  # noqa: E731
        run = self.fenced(lease, make)
        if run is None:
            return
        if run["cancel_requested_at"] is not None:
            expected: Outcome = RunCancelled
        elif run["status"] != "RUNNING":
            expected = InvalidTransition
        elif version != run["version"]:
            expected = VersionConflict
        else:
            expected = None
        before = self.picture(lease.run_id)
        result = self.call(expected, make)
        if expected is RunCancelled:
            self.assert_cancelled(lease.run_id)
            return
        if result is None:
            assert self.picture(lease.run_id) == before
            return
        status, next_at, replayed = result
        exhausted = outcome == "RETRY" and run["attempt_count"] >= run["max_attempts"]
        if exhausted:
            want = "PAUSED_HUMAN" if pause_when_exhausted else "FAILED"
        elif outcome in ("RETRY", "SLEEP"):
            want = "QUEUED"
        else:
            want = outcome
        after = self.row(lease.run_id)
        assert status == want == after["status"] and not replayed
        assert after["lease_owner"] is None and after["lease_expires_at"] is None
        assert after["version"] == run["version"] and after["fencing_token"] == run["fencing_token"]
        if want == "QUEUED":
            assert next_at is not None and next_at == after["next_attempt_at"]
            assert after["attempt_count"] == (0 if outcome == "SLEEP" else run["attempt_count"])
        if exhausted:
            reason = after["terminal_reason"] if want == "FAILED" else after["pause_reason"]
            assert reason.startswith("attempts exhausted")
        self.finishes.append((args, result))

    @precondition(lambda self: self.finishes)
    @rule(i=LEASE_PICK)
    def finish_retried(self, i: int) -> None:
        """Commit unknown, case (a) for FinishRun: the same event id answers what committed."""
        args, (status, next_at, _) = self.finishes[-1 - i % len(self.finishes)]
        run_id = args[0].run_id
        before = self.picture(run_id)
        result = self.call(None, lambda: self.store.work.finish_run(args[0], RunFinish(**args[1])))
        assert result == (status, next_at, True)
        assert self.picture(run_id) == before

    @precondition(lambda self: self.leases)
    @rule(i=LEASE_PICK, j=st.integers(0, 10_000),
          op=st.sampled_from(["save", "begin", "finish", "in_doubt", "not_executed"]),
          forged=st.sampled_from([False, False, True]))
    def reuse_event_id(self, i: int, j: int, op: str, forged: bool) -> None:
        """An event id already used (any run's, any operation's, a submit's) under a live, stale or forged
        lease: never a replay of another write, never a freeze; refused with nothing changed anywhere."""
        events = self.fetch("SELECT event_id, run_id, write_op, fencing_token FROM outbox ORDER BY id")
        if not events:
            return
        event = events[j % len(events)]
        lease = self.pick_lease(i)
        if forged:
            lease = LeaseRef(lease.run_id, "mallory", max(1, lease.fencing_token + j % 3 - 1))
        run = self.row(lease.run_id)
        version, step = run["version"], run["current_step_key"] or "step-x"
        event_id = event["event_id"]
        write_op, make = {
            "save": ("SaveCheckpoint", lambda: self.store.work.save_checkpoint(lease, CheckpointWrite(
                expected_version=version, state={"reused": True}, schema_version=1, step_key=None,
                event_id=event_id, event_type="agent.checkpoint", event_payload={}))),
            "begin": ("BeginToolCall", lambda: self.store.tools.begin_tool_call(lease, BeginCall(
                expected_version=version, intent=ToolIntent(
                    step_key=step, tool_name=TOOL, idempotency_key=f"reuse-{uuid.uuid4()}", request={"reused": True},
                    execution_id=uuid.uuid4(), event_id=event_id)))),
            "finish": ("FinishRun", lambda: self.store.work.finish_run(lease, RunFinish(
                expected_version=version, outcome="FAILED", reason="reused", result=None, sleep_ms=0,
                pause_when_exhausted=False, error_class="", event_id=event_id))),
            "in_doubt": ("MarkToolInDoubt", lambda: self.store.tools.mark_tool_in_doubt(lease, InDoubt(
                step_key=step, error_code="reused", detail="", event_id=event_id))),
            "not_executed": ("CompleteToolCall.NOT_EXECUTED", lambda: self.store.tools.tool_not_executed(
                lease, NotExecuted(expected_version=version, step_key=step, error_code="reused",
                                   evidence={"reused": True}, event_id=event_id))),
        }[op]
        if event["run_id"] != lease.run_id:
            expected: Outcome = InvalidArgument
        elif ((event["write_op"] == write_op and event["fencing_token"] == lease.fencing_token)
              or self.holds(lease, run)):
            expected = AlreadyExists
        else:
            expected = LeaseLost
        before = {r["id"]: r["fingerprint"] for r in self.fetch(FINGERPRINT_SQL)}
        self.call(expected, make)
        assert {r["id"]: r["fingerprint"] for r in self.fetch(FINGERPRINT_SQL)} == before, \
            "a reused event id changed something"

    # ------------------------------------------------------------------ invariants

    @invariant()
    def reference_invariants(self) -> None:
        runs = {r["id"]: dict(r) for r in self.fetch("SELECT * FROM agent_runs")}
        fingerprints = {r["id"]: r["fingerprint"] for r in self.fetch(FINGERPRINT_SQL)}
        assert set(runs) == set(self.runs)
        journals: dict[uuid.UUID, list[tuple[Any, ...]]] = {rid: [] for rid in runs}
        for r in self.fetch("SELECT run_id, seq, kind, step_key, node, tool, detail, fencing_token, run_version "
                            "FROM run_journal ORDER BY run_id, seq"):
            journals[r["run_id"]].append(tuple(r)[1:])
        held = {(lease.run_id, lease.fencing_token) for lease in self.leases}
        checkpoints: dict[uuid.UUID, list[int]] = {rid: [] for rid in runs}
        for r in self.fetch("SELECT run_id, version, fencing_token FROM agent_checkpoints ORDER BY run_id, version"):
            checkpoints[r["run_id"]].append(r["version"])
            assert r["fencing_token"] <= runs[r["run_id"]]["fencing_token"]
        for rid, run in runs.items():
            # 1. Only RUNNING / WAITING_TOOL hold a lease; owner and expiry go together.
            assert (run["status"] in LEASED) == (run["lease_owner"] is not None), run
            assert (run["lease_owner"] is None) == (run["lease_expires_at"] is None), run
            # Fences move only by claims (tracked exactly), so they never decrease; nor do versions.
            assert run["fencing_token"] == self.fences[rid], (rid, run["fencing_token"], self.fences[rid])
            assert run["version"] >= self.versions[rid]
            self.versions[rid] = run["version"]
            # A run's checkpoint versions are exactly those pruning left: horizon+1..version, no gaps, the
            # current one always there; only pruning moves the horizon (as predicted).
            pruned = run["checkpoints_pruned_through"]
            assert pruned == self.pruned[rid], (rid, pruned, self.pruned[rid])
            assert checkpoints[rid] == list(range(pruned + 1, run["version"] + 1)), (rid, checkpoints[rid], run)
            assert pruned < run["version"] or pruned == run["version"] == 0, (rid, pruned, run["version"])
            # The journal is gapless (seq 1..journal_length, each once, in order); every entry was written
            # under a fence that held the run's lease, by a checkpoint the run has reached, in time order;
            # and it is exactly what the model says the committed writes appended (nothing from refused ones).
            journal = journals[rid]
            assert [e[0] for e in journal] == list(range(1, run["journal_length"] + 1)), (rid, journal, run)
            for entry, earlier in zip(journal, [None, *journal], strict=False):
                assert (rid, entry[6]) in held and entry[6] <= run["fencing_token"], (rid, entry, run)
                assert 1 <= entry[7] <= run["version"], (rid, entry, run)
                if earlier is not None:
                    assert earlier[6] <= entry[6] and earlier[7] <= entry[7], (rid, earlier, entry)
                assert not (isinstance(entry[5], dict) and entry[5].get("n") in self.refused), \
                    f"an entry of a refused write was appended: {entry}"
            assert journal == self.journals[rid], (rid, journal, self.journals[rid])
            assert (run["finished_at"] is not None) == (run["status"] in TERMINAL)
            # Terminal runs never change again (row, checkpoints, ledger, events).
            if run["status"] in TERMINAL:
                if rid in self.terminal:
                    assert fingerprints[rid] == self.terminal[rid], f"terminal run {rid} changed"
                else:
                    self.terminal[rid] = fingerprints[rid]
            else:
                assert rid not in self.terminal, f"terminal run {rid} left its terminal state"
        # Every WAITING_TOOL run has an open ledger row for its current step; PAUSED_INDOUBT an in-doubt one.
        assert self.fetch("""
            SELECT r.id FROM agent_runs r
            WHERE r.status = 'WAITING_TOOL' AND NOT EXISTS (
              SELECT 1 FROM tool_executions te
              WHERE te.run_id = r.id AND te.step_key = r.current_step_key AND te.status = 'OUTBOUND_INTENT')""") == []
        assert self.fetch("""
            SELECT r.id FROM agent_runs r
            WHERE r.status = 'PAUSED_INDOUBT' AND NOT EXISTS (
              SELECT 1 FROM tool_executions te
              WHERE te.run_id = r.id AND te.step_key = r.current_step_key AND te.status = 'IN_DOUBT')""") == []
        # A terminal run holds no open intent (issue 11): its in-flight call is IN_DOUBT or closed.
        assert self.fetch("""SELECT te.id FROM tool_executions te JOIN agent_runs r ON r.id = te.run_id
                             WHERE te.status = 'OUTBOUND_INTENT'
                               AND r.status IN ('COMPLETED', 'FAILED', 'CANCELLED')""") == []
        # No two ledger rows per (run, step_key); a row's fence is one the run had.
        assert self.fetch("SELECT run_id, step_key FROM tool_executions GROUP BY 1, 2 HAVING count(*) > 1") == []
        assert self.fetch("""SELECT te.id FROM tool_executions te JOIN agent_runs r ON r.id = te.run_id
                             WHERE te.fencing_token > r.fencing_token OR te.fencing_token < 1""") == []
        # Nothing was ever frozen as half-committed.
        assert self.fetch("SELECT * FROM runtime_counters WHERE name = 'commit_unknown_inconsistent'") == []


def test_random_interleavings_keep_the_reference_invariants(db_url):
    loop = asyncio.new_event_loop()
    pool = loop.run_until_complete(connect_pool(db_url, min_size=1, max_size=2))
    conn = loop.run_until_complete(asyncpg.connect(db_url))
    try:
        loop.run_until_complete(init_connection(conn))
        store = Store(pool, SchedulerSettings(database_url=db_url, **STORE_SETTINGS))
        run_state_machine_as_test(
            lambda: Runtime(loop, store, conn),
            settings=settings(max_examples=30, stateful_step_count=30, deadline=None, database=None,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]),
        )
    finally:
        loop.run_until_complete(conn.close())
        loop.run_until_complete(pool.close())
        loop.close()
