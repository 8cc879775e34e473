"""The WorkService side of the store: claim, heartbeat and the lease holder's fenced writes.

Hot-path writes (claim, heartbeat, checkpoint, Tx1, Tx2, in-doubt, finish) are
single statements from sql/queries.sql: one round trip, atomic by
construction, every predicate on the database clock, every fenced write under
the one guard (the `fenced_guard` fragment: docs/design.md §leases-and-fencing).
A Tx1, a chained step and an ending Tx2 are set-form statements that
carry the writes of many runs sent at the same moment, each judged and answered
alone (scheduler/store/batched.py). When a write matches no row,
scheduler/store/recovery.py says why.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from asyncpg import Record

from scheduler.config import ConcurrencyLimits
from scheduler.states import TRANSITIONS, Op, RunStatus, run_status, sources, transition
from scheduler.store.batched import ALONE, SetWrite
from scheduler.store.core import (
    Database,
    Repository,
    binding_params,
    db_call,
    fence_params,
    fenced_write,
    insert_event,
    prefixed,
    trace_params,
)
from scheduler.store.fenced import CheckpointWrite, CompleteCall, RunFinish
from scheduler.store.queries import Q
from scheduler.store.recovery import Recovery
from scheduler.store.rows import (
    CheckpointRow,
    CompactJournalPage,
    Completed,
    ExecutionRow,
    Finished,
    JournalPage,
    JournalRow,
    RunRow,
    SignalRow,
    Written,
)
from scheduler.store.types import Claimed, LeaseRef
from shared.db import fetch, fetchrow, fetchval
from shared.errors import InvalidArgument
from shared.tracing import NO_TRACE, Trace, annotate

# FinishRun's outcomes: the statement's mode, the operation, and its target status, which is the
# transition table's (finish_run's SQL sets exactly this target, or the exhausted one below).
_FINISH = {outcome: (mode, op, TRANSITIONS[(RunStatus.RUNNING, op)]) for outcome, mode, op in (
    ("COMPLETED", "end", Op.FINISH_COMPLETED), ("FAILED", "end", Op.FINISH_FAILED),
    ("PAUSED_HUMAN", "end", Op.FINISH_PAUSED_HUMAN), ("RETRY", "retry", Op.FINISH_RETRY),
    ("SLEEP", "sleep", Op.FINISH_SLEEP))}
_EXHAUSTED = {True: TRANSITIONS[(RunStatus.RUNNING, Op.FINISH_RETRY_EXHAUSTED_PAUSE)],
              False: TRANSITIONS[(RunStatus.RUNNING, Op.FINISH_RETRY_EXHAUSTED)]}
_TOOL_END_OP = {RunStatus.COMPLETED: Op.COMPLETE_TOOL_CALL_AND_COMPLETE,
                RunStatus.FAILED: Op.COMPLETE_TOOL_CALL_AND_FAIL}


# Due re-queued runs one claim statement makes ready (claim_work's `waking`).
WAKE_BATCH = 64

# complete_tool_call_and_end's per-element arrays, in the order of a write's values.
END_COLUMNS = ("run_ids", "worker_ids", "fencing_tokens", "expected_versions", "step_keys", "outcomes", "states",
               "state_hashes", "schema_versions", "responses", "remote_resource_ids", "error_codes", "evidences",
               "event_ids", "next_step_keys", "end_outcomes", "end_results", "end_reasons", "end_error_classes",
               "end_event_ids", "traceparents", "tracestates", "write_ops", "write_hashes")


class _SlotTaken(Exception):
    """A concurrent claim took the last slot of a group first: roll this claim back."""


class WorkStore(Repository):
    """The lease holder's side of a run: claim, heartbeat, checkpoint, journal reads and the run's end."""

    def __init__(self, db: Database, recovery: Recovery) -> None:
        super().__init__(db)
        self.recovery = recovery
        self._keys_used = False  # runs with concurrency keys exist (once true, for good)
        self._keys_checked_at = float("-inf")
        # The last Tx2 of many runs that end with it, sent at the same moment, go as one statement
        # (scheduler/store/batched.py): one shared statement per way of ending.
        self.ends = {op: SetWrite(self.work_pool, Q.complete_tool_call_and_end, END_COLUMNS,
                                  {"allowed_statuses": sources(op)}) for op in _TOOL_END_OP.values()}

    @db_call
    async def claim(self, worker_id: str, agents: list[str], trace: Trace = NO_TRACE) -> Claimed | None:
        lease_ms = self.settings.lease_duration_ms
        async with self.work_pool.acquire() as conn:
            for _ in range(16):  # bounded: each pass ends one cancelled/expired run or returns
                row = await self._claim_within_limits(conn, worker_id, agents)
                if row is None:
                    continue  # the claim would have passed a limit: rolled back, judged again
                if row["id"] is None:
                    if row["woken"] or row["parked"]:
                        continue  # runs became ready, or blocked ones moved aside: look again
                    if row["looked"]:
                        continue  # every free run looked at was taken by concurrent claims
                    return None
                reason = None
                if row["cancel_requested_at"] is not None:
                    reason, event = f"cancelled: {row['cancel_reason']}", "agent.run_cancelled"
                elif row["deadline_at"] is not None and row["deadline_at"] <= row["db_now"]:
                    reason, event = "budget exhausted: deadline passed", "agent.run_failed"
                if reason is None:
                    checkpoint, execution = prefixed(row, "cp_"), prefixed(row, "te_")
                    return Claimed(
                        run=RunRow.of(row),
                        checkpoint=None if checkpoint is None else CheckpointRow.of(checkpoint, run_id=row["id"]),
                        step_execution=None if execution is None else ExecutionRow.of(execution, run_id=row["id"]),
                        lease_duration_ms=lease_ms,
                        signals=tuple(SignalRow.of_claim(item) for item in row["pending_signals"]),
                        signals_seen=row["signals_seen"], claim_wait_s=row["claim_wait_s"],
                        has_data_key=row["has_data_key"])
                op = Op.APPLY_CANCEL if event == "agent.run_cancelled" else Op.EXPIRE_DEADLINE
                async with conn.transaction():
                    locked = await fetchrow(conn, Q.lock_run, run_id=row["id"])
                    assert locked is not None
                    if locked["fencing_token"] != row["fencing_token"]:
                        continue  # taken over in between: its new holder will end it
                    target = transition(locked["status"], op)
                    ended = await fetchrow(conn, Q.end_run, run_id=row["id"], status=target.value, reason=reason,
                                           cancel=False, cancel_reason=None)
                    assert ended is not None
                    await insert_event(conn, ended, event,
                                      {"reason": reason, "intents_in_doubt": ended["doubted_intents"]}, trace)
        return None

    async def _limits_apply(self, conn: Any, limits: ConcurrencyLimits) -> bool:
        """Whether a concurrency limit may apply to a claim: a tenant or agent limit is configured, or runs
        with concurrency keys were ever submitted (runtime_counters, read at most once a second until true)."""
        if limits.active:
            return True
        if not self._keys_used and time.monotonic() >= self._keys_checked_at + 1.0:
            self._keys_used = await fetchval(conn, Q.get_counter, name="concurrency_keys_used") is not None
            self._keys_checked_at = time.monotonic()
        return self._keys_used

    async def _claim_within_limits(self, conn: Any, worker_id: str, agents: list[str]) -> Any:
        """One claim statement. Without limits that could apply: claim_work_plain, one round trip. Else
        claim_work in its own transaction, kept only when no concurrency limit of the claimed run is passed
        (slot_overflow, after the statement locked its groups); None when it was rolled back."""
        limits = (await self.db.flow(conn)).concurrency
        if not await self._limits_apply(conn, limits):
            return await fetchrow(conn, Q.claim_work_plain, worker_id=worker_id, agents=agents,
                                  lease_ms=self.settings.lease_duration_ms, wake_batch=WAKE_BATCH)
        try:
            async with conn.transaction():
                row = await fetchrow(
                    conn, Q.claim_work, worker_id=worker_id, lease_ms=self.settings.lease_duration_ms,
                    agents=agents, wake_batch=WAKE_BATCH, lookahead=self.settings.claim_lookahead,
                    recheck_ms=self.settings.concurrency_recheck_ms, **limits.params())
                assert row is not None  # one row always: the counts, and the claimed run's columns or NULLs
                if row["id"] is not None and row["slot_locks"]:
                    overflow = await fetchval(
                        conn, Q.slot_overflow, tenant_id=row["tenant_id"], agent_name=row["agent_name"],
                        concurrency_key=row["concurrency_key"], tenant_max=row["tenant_max"],
                        agent_max=row["agent_max"], key_max=row["concurrency_max"] or 0)
                    if overflow is not None:
                        raise _SlotTaken(overflow)
                return row
        except _SlotTaken:
            return None

    @db_call
    async def heartbeat(self, lease: LeaseRef) -> dt.datetime:
        async with self.work_pool.acquire() as conn:
            row = await fetchrow(conn, Q.heartbeat, **fence_params(lease, Op.HEARTBEAT),
                                 lease_ms=self.settings.lease_duration_ms)
            if row is not None:
                annotate(tenant_id=row["tenant_id"])
                return row["lease_expires_at"]  # type: ignore[no-any-return]
            raise await self.recovery.refusal(conn, Op.HEARTBEAT, lease, None)

    @db_call
    async def save_checkpoint(self, lease: LeaseRef, write: CheckpointWrite, trace: Trace = NO_TRACE) -> Written:
        """A new checkpoint, with its journal entries appended and its signals marked consumed in the
        same statement."""
        binding = write.binding(lease)
        async with self.work_pool.acquire() as conn:
            written = await fenced_write(
                conn, Q.save_checkpoint, **fence_params(lease, Op.SAVE_CHECKPOINT),
                expected_version=write.expected_version, schema_version=write.schema_version, state=write.stored,
                step_key=write.step_key, state_hash=write.state_hash, event_id=write.event_id,
                event_type=write.event_type, event_payload=write.payload, **trace_params(trace),
                **binding_params(binding), **write.journal.params,
                consume_signal_seqs=list(write.consume_signal_seqs))
            if written is not None:
                return Written(written["version"], False)
            replay = await self.recovery.replay(conn, lease, binding, write.event_id, "checkpoint")
            if replay is not None:
                return Written(replay["version"], True)
            raise await self.recovery.refusal(conn, Op.SAVE_CHECKPOINT, lease, write.expected_version, write.journal,
                                              write.consume_signal_seqs)

    @db_call
    async def complete_tool_call(self, lease: LeaseRef, write: CompleteCall, trace: Trace = NO_TRACE) -> Completed:
        """Tx2 with a definite outcome; with `write.end`, the run ends in the same statement."""
        end = write.end
        op = Op.COMPLETE_TOOL_CALL if end is None else _TOOL_END_OP[run_status(end.outcome)]
        binding = write.binding(lease)
        if end is not None:  # shared with the other runs' last steps sent at the same moment (store/batched.py)
            values = (lease.run_id, lease.worker_id, lease.fencing_token, write.expected_version, write.step_key,
                      write.outcome, write.stored, write.state_hash, write.schema_version, write.response,
                      write.remote_resource_id, write.error_code, write.evidence, write.event_id, write.next_step_key,
                      end.outcome, end.result, end.reason, end.error_class, end.event_id, trace.traceparent,
                      trace.tracestate, binding.op, binding.digest)
            ending = await self.ends[op].write(lease.run_id, values, write.journal)
            if ending is ALONE:
                async with self.work_pool.acquire() as conn:
                    ending = await self.ends[op].alone(conn, values, write.journal)
            if isinstance(ending, Record):
                return Completed(ending["version"], run_status(ending["status"]), False)
        async with self.work_pool.acquire() as conn:
            if end is None:
                written = await fenced_write(conn, Q.complete_tool_call, **fence_params(lease, op), **write.params(),
                                             next_step_key=write.next_step_key, **trace_params(trace),
                                             **binding_params(binding))
                if written is not None:
                    return Completed(written["version"], TRANSITIONS[(RunStatus.WAITING_TOOL, op)], False)
                replay = await self.recovery.replay(conn, lease, binding, write.event_id, "checkpoint")
                if replay is not None:
                    return Completed(replay["version"], TRANSITIONS[(RunStatus.WAITING_TOOL, op)], True)
            else:
                found = await self.recovery.replay_all(conn, lease, binding,
                                                       ((write.event_id, "checkpoint", "event_id"),
                                                        (end.event_id, "run", "end.event_id")))
                if found is not None:
                    return Completed(found[0]["version"], run_status(end.outcome), True)
            raise await self.recovery.tool_refusal(conn, op, lease, write.expected_version, write.step_key,
                                                   close_as=write.close_as, journal=write.journal)

    @db_call
    async def finish_run(self, lease: LeaseRef, write: RunFinish, trace: Trace = NO_TRACE) -> Finished:
        """Ends the holder's attempt: COMPLETED | FAILED | PAUSED_HUMAN | RETRY | SLEEP (a timer, a signal
        wait or a wait for the children)."""
        mode, op, target = _FINISH[write.outcome]
        s = self.settings
        binding = write.binding(lease)
        async with self.work_pool.acquire() as conn:
            row = await fenced_write(
                conn, Q.finish_run, **fence_params(lease, op), expected_version=write.expected_version,
                target=target, mode=mode, sleep_ms=write.sleep_ms, backoff_base_ms=s.backoff_base_ms,
                backoff_cap_ms=s.backoff_cap_ms, backoff_jitter_ms=s.backoff_jitter_ms,
                exhausted_status=_EXHAUSTED[write.pause_when_exhausted], result=write.result,
                reason=write.reason, event_id=write.event_id, error_class=write.error_class, **trace_params(trace),
                **binding_params(binding), wait_signal=write.wait_signal, wait_children=write.wait_children)
            if row is not None:
                status = run_status(row["status"])
                return Finished(status, row["next_attempt_at"] if status is RunStatus.QUEUED else None, False)
            event = await self.recovery.replay(conn, lease, binding, write.event_id, "run")
            if event is not None:
                payload = event["payload"]
                next_at = payload.get("next_attempt_at")
                return Finished(run_status(payload["status"]), dt.datetime.fromisoformat(next_at) if next_at else None,
                                True)
            raise await self.recovery.refusal(conn, op, lease, write.expected_version)

    @db_call
    async def read_journal_compact(self, lease: LeaseRef, *, after_seq: int, page_size: int,
                                   page_bytes: int) -> CompactJournalPage:
        """As read_journal, the page as one JSON array text built by PostgreSQL."""
        async with self.work_pool.acquire() as conn:
            row = await fetchrow(conn, Q.read_journal_compact, run_id=lease.run_id, worker_id=lease.worker_id,
                                 fencing_token=lease.fencing_token, after_seq=after_seq, page_size=page_size,
                                 page_bytes=page_bytes)
            assert row is not None
            if row["fetched"] == 0:  # nothing after after_seq, or not the holder's to read
                await self.recovery.unless_holder(conn, lease)
        return CompactJournalPage(row["items"], row["beyond"] > 0)

    @db_call
    async def read_journal(self, lease: LeaseRef, *, after_seq: int, page_size: int,
                           page_bytes: int) -> JournalPage:
        """The holder's journal entries after `after_seq`, in seq order (docs/design.md §journal).

        Up to `page_size` entries and `page_bytes` of detail JSON (one entry at
        least). Not the live holder → LEASE_LOST (or NOT_FOUND), nothing written.
        """
        async with self.work_pool.acquire() as conn:
            rows = await fetch(conn, Q.read_journal, run_id=lease.run_id, worker_id=lease.worker_id,
                               fencing_token=lease.fencing_token, after_seq=after_seq, limit=page_size + 1)
            if not rows:
                await self.recovery.unless_holder(conn, lease)
        taken: list[JournalRow] = []
        used = 0
        for row in rows[:page_size]:  # (the byte budget as read_journal_compact applies it)
            if taken and used + row["page_bytes"] > page_bytes:
                break
            taken.append(JournalRow(*row))
            used += row["page_bytes"]
        return JournalPage(taken, len(taken) < len(rows))

    @db_call
    async def tool_results(self, lease: LeaseRef, step_keys: list[str], *, answer_bytes: int) -> list[ExecutionRow]:
        """The holder's ledger rows of `step_keys` (those that exist); LEASE_LOST for anyone else.

        More than `answer_bytes` of JSON in more than one row is refused (ask for
        fewer steps): an answer never silently leaves a row out.
        """
        async with self.work_pool.acquire() as conn:
            rows = await fetch(conn, Q.tool_results_for_steps, run_id=lease.run_id, worker_id=lease.worker_id,
                               fencing_token=lease.fencing_token, step_keys=step_keys)
            if not rows:
                await self.recovery.unless_holder(conn, lease)
        size = sum(row["page_bytes"] for row in rows)
        if len(rows) > 1 and size > answer_bytes:
            raise InvalidArgument("step_keys", f"the {len(rows)} results hold {size} bytes of JSON, more than one "
                                               f"answer carries ({answer_bytes}); ask for fewer steps at a time")
        return [ExecutionRow.of(row) for row in rows]



__all__ = ["WorkStore"]
