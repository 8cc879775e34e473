"""Why a fenced write matched no row, and what a retried event id finds (docs/design.md §commit-unknown).

A fenced write that matched no row wrote nothing. Before saying why, the
store asks whether the caller's event id already committed (`replay`): the
whole write → answer from what committed; none of it → explain the refusal
(`refusal`: not found, lease lost, cancelled, wrong state, version
conflict); half of it → freeze the run, never guess. The diagnosis never
writes except to apply a requested cancel or to freeze a run whose commit was
half-visible.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from asyncpg import Record

from scheduler.states import LEASED, Op, RunStatus, sources, transition
from scheduler.store.core import COMMIT_UNKNOWN_COUNTER, insert_event, log
from scheduler.store.queries import Q
from scheduler.store.types import NO_JOURNAL, Effect, Journal, LeaseRef, WriteBinding
from shared.db import execute, fetch, fetchrow
from shared.errors import (
    AgentrtError,
    AlreadyExists,
    InvalidArgument,
    InvalidTransition,
    LeaseLost,
    NotFound,
    RunCancelled,
    RunFrozen,
    VersionConflict,
)
from shared.tracing import NO_TRACE

# What a cancelled holder's report closes its open ledger row with: (status, response, remote id, error code).
CloseAs = tuple[str, Any, str | None, str | None]


@dataclass
class _Found:
    """What `replay_all` found of a write's parts."""

    present: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    artifacts: list[Any] = field(default_factory=list)
    foreign: tuple[str, Record] | None = None  # an event bound to another write, and its request field
    fences: set[int] = field(default_factory=set)  # the fences that wrote what is present


class Recovery:
    """Stateless: every method works in the caller's transaction (`conn`)."""

    async def replay(self, conn: asyncpg.Connection, lease: LeaseRef, binding: WriteBinding,
                      event_id: uuid.UUID, effect: Effect) -> Any:
        """Commit-unknown recovery by the caller's event id (docs/design.md §commit-unknown).

        The event and its write both committed, bound to this very write → the
        earlier call succeeded: answer from what committed (a record). Neither →
        None: the caller may run the write. Otherwise see `replay_all`.
        """
        found = await self.replay_all(conn, lease, binding, ((event_id, effect, "event_id"),))
        return found[0] if found is not None else None

    async def replay_all(self, conn: asyncpg.Connection, lease: LeaseRef, binding: WriteBinding,
                          writes: tuple[tuple[uuid.UUID, Effect, str], ...]) -> list[Any] | None:
        """`replay` for a write made of several (event id, effect, request field) parts committed together.

        Every event present and bound to this write (same operation, same hash
        over lease and request) with every effect present → the artifacts, in
        order. None of them present → None. An event id bound to another write
        (another operation, payload, lease, or an operator's or submit's event)
        is refused and changes nothing: ALREADY_EXISTS for the live holder or the
        same writer's retry, LEASE_LOST for anyone else. Half a commit freezes
        the run only when the caller holds its live lease: a stale or forged
        lease never changes the run (docs/design.md §commit-unknown).
        """
        found = _Found()
        for event_id, effect, field_name in writes:
            await self._inspect(conn, lease.run_id, binding, event_id, effect, field_name, found)
        if not found.present:
            return None
        if found.foreign is not None:
            field_name, event = found.foreign
            same_writer = event["write_op"] == binding.op and event["fencing_token"] == lease.fencing_token
            run = None if same_writer else await self.run_for(conn, lease)
            if same_writer or (run is not None and run["holds_lease"]):
                raise AlreadyExists(
                    f"{field_name} was already used for another write "
                    f"({'another payload' if event['write_op'] == binding.op else 'another operation'}); "
                    "nothing was written", field=field_name)
            raise self._lease_refusal(run, lease)
        if not found.missing:
            return found.artifacts
        # Half a commit. Only its writer (the fence that wrote what is present) may
        # learn of it, and only while that fence is still the run's does it freeze.
        if found.fences != {lease.fencing_token}:
            raise self._lease_refusal(await self.run_for(conn, lease), lease)
        raise await self._freeze_half_commit(conn, lease, writes, found)

    async def _inspect(self, conn: asyncpg.Connection, run_id: uuid.UUID, binding: WriteBinding,
                       event_id: uuid.UUID, effect: Effect, field_name: str, found: _Found) -> None:
        """Looks up one part of a write (its event and its effect) and records what is there."""
        event = await fetchrow(conn, Q.event_by_id, event_id=event_id)
        artifact: Any
        if effect == "checkpoint":
            artifact = await fetchrow(conn, Q.checkpoint_by_event, event_id=event_id)
            if artifact is None and event is not None and event["run_id"] == run_id:
                artifact = await self._pruned_checkpoint(conn, event)
        elif effect == "ledger":
            artifact = await fetchrow(conn, Q.tool_execution_by_intent_event, event_id=event_id)
        else:
            # A later write overwrites the marker, so with the event present the
            # write committed whatever the marker says now.
            marker = await fetchrow(conn, Q.run_by_last_event, run_id=run_id, event_id=event_id)
            artifact = event if event is not None else marker
        for row in (event, artifact):
            if row is not None and row["run_id"] != run_id:
                raise InvalidArgument(field_name, "already used for a write on another run")
            if row is not None:
                found.fences.add(row["fencing_token"])
        if event is not None and found.foreign is None and (
                event["write_op"] != binding.op or event["write_hash"] is None
                or bytes(event["write_hash"]) != binding.digest):
            found.foreign = (field_name, event)
        (found.present if event is not None else found.missing).append(f"event {event_id}")
        (found.present if artifact is not None else found.missing).append(f"{effect} of event {event_id}")
        if artifact is not None:
            found.artifacts.append(artifact)

    async def _freeze_half_commit(self, conn: asyncpg.Connection, lease: LeaseRef,
                                  writes: tuple[tuple[uuid.UUID, Effect, str], ...], found: _Found) -> RunFrozen:
        """Half a commit under the caller's own fence: count it, freeze the run if that fence still holds it."""
        run_id = lease.run_id
        if len(writes) == 1:
            event_id, effect, _ = writes[0]
            has_event = found.present[0].startswith("event ")
            reason = (f"commit state inconsistent for event {event_id}: "
                      f"{'event' if has_event else effect} present without {effect if has_event else 'event'}")
        else:
            reason = (f"commit state inconsistent for events {', '.join(str(w[0]) for w in writes)}: "
                      f"{', '.join(found.present)} present without {', '.join(found.missing)}")
        async with conn.transaction():
            run = await fetchrow(conn, Q.lock_run, run_id=run_id)
            await execute(conn, Q.bump_counter, name=COMMIT_UNKNOWN_COUNTER)
            if (run is not None and RunStatus(run["status"]) in LEASED
                    and run["fencing_token"] == lease.fencing_token):
                transition(run["status"], Op.FREEZE)
                frozen = await fetchrow(conn, Q.freeze_run, run_id=run_id, reason=reason)
                assert frozen is not None
                await insert_event(conn, frozen, "agent.run_frozen", {"reason": reason}, NO_TRACE)
        log.error("froze run %s: %s", run_id, reason)
        return RunFrozen(reason, run_id=run_id, event_id=writes[0][0])

    @staticmethod
    async def _pruned_checkpoint(conn: asyncpg.Connection, event: Record) -> dict[str, Any] | None:
        """The checkpoint an event announced, when pruning deleted it: its version and fence.

        Pruning records its horizon on the run row in the statement that deletes,
        so this read (after the checkpoint's) sees the horizon of any delete it
        missed the row to. A checkpoint missing above the horizon was never
        pruned: None, and the caller sees half a commit.
        """
        run = await fetchrow(conn, Q.read_run, run_id=event["run_id"])
        if run is None or event["run_version"] > run["checkpoints_pruned_through"]:
            return None
        return {"run_id": event["run_id"], "version": event["run_version"],
                "fencing_token": event["fencing_token"], "event_id": event["event_id"], "pruned": True}

    @staticmethod
    async def run_for(conn: asyncpg.Connection, lease: LeaseRef) -> Record | None:
        """The run with `holds_lease`: whether `lease` is its live holder, judged in SQL by the
        predicate every fenced write matches (sql/queries.sql, live_lease)."""
        return await fetchrow(conn, Q.read_run_for_lease, run_id=lease.run_id, worker_id=lease.worker_id,
                              fencing_token=lease.fencing_token)

    @staticmethod
    def _lease_refusal(run: Record | None, lease: LeaseRef) -> AgentrtError:
        """NOT_FOUND, or LEASE_LOST naming the run's current fence: for a run `lease` does not hold."""
        if run is None:
            return NotFound(f"run {lease.run_id} not found", run_id=lease.run_id)
        return LeaseLost(
            f"lease on run {lease.run_id} is not held by {lease.worker_id} with fence "
            f"{lease.fencing_token} (current fence {run['fencing_token']}, status {run['status']})",
            run_id=lease.run_id, fencing_token=run["fencing_token"], status=run["status"])

    async def unless_holder(self, conn: asyncpg.Connection, lease: LeaseRef) -> None:
        """Raises NOT_FOUND or LEASE_LOST unless `lease` holds the run (one read)."""
        run = await self.run_for(conn, lease)
        if run is None or not run["holds_lease"]:
            raise self._lease_refusal(run, lease)

    async def refusal(self, conn: asyncpg.Connection, op: Op, lease: LeaseRef,
                       expected_version: int | None, journal: Journal = NO_JOURNAL,
                       consume_signal_seqs: tuple[int, ...] = (), run: Record | None = None) -> AgentrtError:
        """Why a fenced write matched no row. Applies a requested cancel (the holder's write ends it).
        `run` is the caller's read of `run_for`, if it made one."""
        run = run or await self.run_for(conn, lease)
        if run is None or not run["holds_lease"]:
            return self._lease_refusal(run, lease)
        if run["cancel_requested_at"] is not None:
            return await self._apply_cancel(conn, lease, None, None)
        if run["status"] not in sources(op):
            try:
                transition(run["status"], op)
            except InvalidTransition as refusal:
                return refusal
        if expected_version is not None and run["version"] != expected_version:
            return VersionConflict(
                f"run {lease.run_id} is at version {run['version']}, not {expected_version}",
                run_id=lease.run_id, version=run["version"],
            )
        length = run["journal_length"]
        if journal and journal.seqs[0] != length + 1:
            return InvalidArgument("journal[0].seq", f"must be {length + 1}, the run's journal has {length} entries")
        if consume_signal_seqs:
            refused = await fetch(conn, Q.unconsumable_signals, seqs=list(consume_signal_seqs), run_id=lease.run_id)
            if refused:
                return InvalidArgument("consume_signal_seqs", f"signal {refused[0]['seq']} is consumed already or "
                                                              "not a signal of this run; nothing was written")
        return VersionConflict(f"run {lease.run_id} changed concurrently; re-read and retry",
                               run_id=lease.run_id, version=run["version"])

    async def tool_refusal(self, conn: asyncpg.Connection, op: Op, lease: LeaseRef,
                            expected_version: int | None, step_key: str, close_as: CloseAs | None,
                            journal: Journal = NO_JOURNAL) -> AgentrtError:
        run = await self.run_for(conn, lease)
        if run is not None and run["cancel_requested_at"] is not None and run["holds_lease"]:
            return await self._apply_cancel(conn, lease, step_key, close_as)
        refusal = await self.refusal(conn, op, lease, expected_version, journal, run=run)
        if not isinstance(refusal, VersionConflict) or run is None:
            return refusal
        if run["current_step_key"] != step_key:
            return InvalidArgument("step_key", f"the run is waiting on step {run['current_step_key']!r}")
        execution = await fetchrow(conn, Q.tool_execution_for_step, run_id=lease.run_id, step_key=step_key)
        if execution is None or execution["status"] != "OUTBOUND_INTENT":
            return InvalidTransition(
                f"tool execution {step_key!r} is {execution['status'] if execution else 'missing'}, "
                "not OUTBOUND_INTENT", step_key=step_key,
            )
        return refusal

    async def _apply_cancel(self, conn: asyncpg.Connection, lease: LeaseRef, step_key: str | None,
                            close_as: CloseAs | None) -> RunCancelled:
        async with conn.transaction():
            run = await fetchrow(conn, Q.lock_run_for_lease, run_id=lease.run_id, worker_id=lease.worker_id,
                                 fencing_token=lease.fencing_token)
            if run is None or not run["holds_lease"] or run["cancel_requested_at"] is None:
                raise LeaseLost(f"lease on run {lease.run_id} is no longer held", run_id=lease.run_id)
            target = transition(run["status"], Op.APPLY_CANCEL)
            if step_key is not None and close_as is not None:
                # The tool's outcome is a fact about the world: keep it even though the run ends.
                status, response, remote_id, error_code = close_as
                await execute(conn, Q.close_open_execution, run_id=lease.run_id, step_key=step_key, status=status,
                              response=response, remote_resource_id=remote_id, error_code=error_code)
            reason = f"cancelled: {run['cancel_reason']}"
            ended = await fetchrow(conn, Q.end_run, run_id=lease.run_id, status=target.value, reason=reason,
                                   cancel=False, cancel_reason=None)
            assert ended is not None
            await insert_event(conn, ended, "agent.run_cancelled", {"reason": run["cancel_reason"]}, NO_TRACE)
        return RunCancelled(f"run {lease.run_id} was cancelled: {run['cancel_reason']}", run_id=lease.run_id)


__all__ = ["CloseAs", "Recovery"]
