"""Schedules in the store (docs/design.md §schedules): their definitions, and firing one due schedule.

Every time comes from the database clock (`db_now` of the locked row). A fire
submits its run with client_request_id `schedule:<id>:<nominal fire time>` in
the transaction that moves the schedule on, under the schedule's row lock
(taken with SKIP LOCKED): one run per fire time, whichever replica fires it,
and a fire retried after a crash finds the run it made.

The input values the target agent marks sensitive are stored sealed under the
schedule's own data key (migration 0018); a fire opens them and seals them again
under its run's key, as SubmitRun seals.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import uuid
from typing import Any

import asyncpg
from asyncpg import Record

from scheduler.admission import LiveVersion, admit, render_key
from scheduler.schedule_times import Timing, jitter_of, timing
from scheduler.security.sealing import RunKey, Sensitivity, Unopened, plain_values, redact_labels
from scheduler.states import TERMINAL
from scheduler.store.auth import write_audit
from scheduler.store.core import Database, Repository, db_call
from scheduler.store.keys import KeyStore
from scheduler.store.queries import Q
from scheduler.store.types import AuditEntry, SubmitSpec
from shared.canonical import sha256_of, uuid7
from shared.db import execute, fetch, fetchrow, fetchval
from shared.errors import AlreadyExists, EncryptionKeyMissing, InvalidArgument, NotFound, SealedValueInvalid

log = logging.getLogger(__name__)

OVERLAPS = ("SKIP", "BUFFER_ONE", "ALLOW_ALL")
MAX_CATCH_UP_FIRES = 1000  # fires one pass makes up at most (the rest are counted as skipped)
BUFFER_RECHECK = dt.timedelta(seconds=1)  # how soon a buffered fire looks at its blocking run again
KEY_MISSING_RETRY = dt.timedelta(seconds=60)  # how soon a schedule whose data key no KEK opens is tried again


@dataclasses.dataclass(frozen=True)
class ScheduleSpec:
    agent_name: str
    agent_version: str
    input: dict[str, Any]
    labels: dict[str, str]
    interval_ms: int | None
    cron: str | None
    time_zone: str
    overlap: str
    catch_up_window_ms: int
    jitter_ms: int

    def digest(self) -> bytes:
        return sha256_of(dataclasses.asdict(self))

    def timing(self) -> Timing:
        return timing(self.interval_ms, self.cron, self.time_zone)

    def params(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "spec_hash": self.digest()}


def spec_of(row: Record) -> ScheduleSpec:
    return ScheduleSpec(**{f.name: row[f.name] for f in dataclasses.fields(ScheduleSpec)})


def schedule_state(row: Record) -> dict[str, Any]:
    """What an audit row records of a schedule before and after an action: its timing and target, never
    its input or labels (the audit event reaches Kafka, whose readers are wider than the audit's)."""
    return {"schedule_id": str(row["id"]), "name": row["name"], "paused": row["paused"],
            "agent_name": row["agent_name"], "agent_version": row["agent_version"],
            "interval_ms": row["interval_ms"], "cron": row["cron"], "time_zone": row["time_zone"],
            "overlap": row["overlap"], "catch_up_window_ms": row["catch_up_window_ms"],
            "jitter_ms": row["jitter_ms"], "spec_sha256": bytes(row["spec_hash"]).hex()}


async def _audit(conn: asyncpg.Connection, audit: AuditEntry, action: str, before: Record | None,
                 after: Record) -> None:
    await write_audit(conn, audit, tenant_id=after["tenant_id"], action=action, stream_id=after["id"],
                      before=schedule_state(before) if before is not None else None, after=schedule_state(after))


def fire_request_id(schedule_id: uuid.UUID, fire_at: dt.datetime) -> str:
    """Never change this format: it is what makes a fire time submit exactly one run."""
    return f"schedule:{schedule_id}:{fire_at.astimezone(dt.UTC).isoformat()}"


@dataclasses.dataclass
class _Fire:
    """One pass over a locked, due schedule: what it submits and how the row moves on."""

    row: Record
    now: dt.datetime
    last_run_id: uuid.UUID | None
    active: bool  # the last run has not ended
    buffered: dt.datetime | None
    fired: int = 0
    skipped: int = 0
    last_fire_at: dt.datetime | None = None


class ScheduleStore(Repository):
    """Schedules: create, update, pause, delete, list, and the firing of a due one (a run submitted)."""

    def __init__(self, db: Database, keys: KeyStore) -> None:
        super().__init__(db)
        self.keys = keys

    async def _seal_spec(self, conn: asyncpg.Connection, schedule_id: uuid.UUID, spec: ScheduleSpec,
                         existing: Record | None) -> tuple[ScheduleSpec, dict[str, Any]]:
        """The spec as stored, with its key columns: the input's values the serving agent version marks
        sealed under the schedule's data key (the one `existing` holds, else a new one wrapped by the
        keyring: none, ENCRYPTION_KEY_MISSING), the schedule id their associated data. Nothing marked in
        it: as given, no key. Sealing is deterministic under one key, so an unchanged spec hashes the same."""
        *_, sensitive = await self._flow_of(conn, spec)
        paths = Sensitivity.of_json(sensitive).input
        if not paths:
            return spec, {"key_id": None, "wrapped_key": None}
        # Labels are free text every run of the schedule carries: one holding a marked value is redacted.
        spec = dataclasses.replace(spec, labels=redact_labels(spec.labels, plain_values(spec.input, paths)))
        key = self.keys.schedule_key(schedule_id, existing["key_id"], existing["wrapped_key"]) if existing else None
        if key is not None:
            assert existing is not None
            key_id, wrapped = existing["key_id"], bytes(existing["wrapped_key"])
        else:
            data_key = os.urandom(32)
            key_id, wrapped = self.keys.keyring().wrap(data_key)
            key = RunKey(schedule_id, data_key, Sensitivity())
        sealed = key.seal_paths(spec.input, paths)
        if sealed == spec.input:  # no marked field present
            return spec, {"key_id": None, "wrapped_key": None}
        return dataclasses.replace(spec, input=sealed), {"key_id": key_id, "wrapped_key": wrapped}

    def _opened(self, row: Record) -> ScheduleSpec:
        """A stored schedule's spec with its sealed input values opened (for a fire)."""
        spec = spec_of(row)
        key = self.keys.schedule_key(row["id"], row["key_id"], row["wrapped_key"])
        if key is None:
            return spec
        try:
            return dataclasses.replace(spec, input=key.unseal(spec.input))
        except Unopened:
            raise self.keys.integrity_failure("spec.input_json", f"schedule {row['id']}") from None

    def _first(self, spec: ScheduleSpec, schedule_id: uuid.UUID, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
        """The first nominal fire time after `now`, and when it is due (with its jitter)."""
        first = spec.timing().next_after(now)
        return first, first + jitter_of(schedule_id, first, spec.jitter_ms)

    @db_call
    async def create_schedule(self, tenant_id: str, name: str, spec: ScheduleSpec,
                              audit: AuditEntry) -> tuple[Record, bool]:
        """The new schedule (audited as `schedule.create`), or the one of that name and spec (nothing audited)."""
        schedule_id = uuid7()
        async with self.db.tenant_tx(tenant_id) as conn:
            now = await fetchval(conn, Q.server_now)
            first, due = self._first(spec, schedule_id, now)
            stored, key = await self._seal_spec(conn, schedule_id, spec, None)
            row = await fetchrow(conn, Q.insert_schedule, id=schedule_id, tenant_id=tenant_id, name=name,
                                 next_fire_at=first, due_at=due, **stored.params(), **key)
            if row is not None:
                await _audit(conn, audit, "schedule.create", None, row)
                return row, True
            existing = await fetchrow(conn, Q.schedule_by_name, tenant_id=tenant_id, name=name)
            assert existing is not None  # schedules are deleted only by DeleteSchedule, never by retention
            again, _ = await self._seal_spec(conn, existing["id"], spec, existing)
        if bytes(existing["spec_hash"]) != again.digest():
            raise AlreadyExists(f"a schedule named {name!r} exists with another spec (use UpdateSchedule)",
                                name=name, schedule_id=existing["id"])
        return existing, False

    async def _locked(self, conn: asyncpg.Connection, tenant_id: str, schedule_id: uuid.UUID) -> Record:
        row = await fetchrow(conn, Q.lock_schedule, id=schedule_id, tenant_id=tenant_id)
        if row is None:
            raise NotFound(f"schedule {schedule_id} not found", schedule_id=schedule_id)
        return row

    @db_call
    async def update_schedule(self, tenant_id: str, schedule_id: uuid.UUID, spec: ScheduleSpec,
                              audit: AuditEntry) -> Record:
        async with self.db.tenant_tx(tenant_id) as conn:
            row = await self._locked(conn, tenant_id, schedule_id)
            stored, key = await self._seal_spec(conn, schedule_id, spec, row)
            if bytes(row["spec_hash"]) == stored.digest():
                return row  # the spec it has (a retry): the next fire is not counted again, nothing audited
            first, due = self._first(spec, schedule_id, row["db_now"])
            updated = await fetchrow(conn, Q.update_schedule, id=schedule_id, next_fire_at=first, due_at=due,
                                     **stored.params(), **key)
            assert updated is not None
            await _audit(conn, audit, "schedule.update", row, updated)
        return updated

    @db_call
    async def pause_schedule(self, tenant_id: str, schedule_id: uuid.UUID, paused: bool,
                             audit: AuditEntry) -> Record:
        """Audited as `schedule.pause` / `schedule.resume`; pausing a paused schedule (or resuming a running
        one) changes nothing and audits nothing."""
        async with self.db.tenant_tx(tenant_id) as conn:
            row = await self._locked(conn, tenant_id, schedule_id)
            first = due = None
            if not paused and row["paused"]:
                first, due = self._first(spec_of(row), schedule_id, row["db_now"])
            updated = await fetchrow(conn, Q.pause_schedule, id=schedule_id, paused=paused, next_fire_at=first,
                                     due_at=due)
            assert updated is not None
            if paused != row["paused"]:
                await _audit(conn, audit, "schedule.pause" if paused else "schedule.resume", row, updated)
        return updated

    @db_call
    async def delete_schedule(self, tenant_id: str, schedule_id: uuid.UUID, audit: AuditEntry) -> Record:
        async with self.db.tenant_tx(tenant_id) as conn:
            row = await self._locked(conn, tenant_id, schedule_id)
            deleted = await fetchrow(conn, Q.delete_schedule, id=schedule_id)
            assert deleted is not None
            await write_audit(conn, audit, tenant_id=row["tenant_id"], action="schedule.delete", stream_id=row["id"],
                              before=schedule_state(row))
        return deleted

    @db_call
    async def list_schedules(self, tenant_id: str) -> list[Record]:
        async with self.db.tenant_tx(tenant_id) as conn:
            return list(await fetch(conn, Q.list_schedules, tenant_id=tenant_id))

    # ------------------------------------------------------------------ firing

    @db_call
    async def fire_due_schedule(self) -> bool:
        """Fires one due schedule (its missed fire times within the catch-up window, its overlap policy
        applied); False when none is due. One transaction, the schedule's row locked throughout."""
        async with self.work_pool.acquire() as conn, conn.transaction():
            row = await fetchrow(conn, Q.lock_due_schedule)
            if row is None:
                return False
            fire = _Fire(row, row["db_now"], row["last_run_id"],
                         row["last_run_status"] is not None and row["last_run_status"] not in TERMINAL,
                         row["buffered_fire_at"])
            try:
                spec = self._opened(row)
            except (EncryptionKeyMissing, SealedValueInvalid) as exc:  # one unreadable schedule never holds up
                # the others
                log.error("schedule %s not fired: %s", row["id"], exc)
                await execute(conn, Q.record_fire, id=row["id"], next_fire_at=row["next_fire_at"],
                              due_at=fire.now + KEY_MISSING_RETRY, buffered_fire_at=fire.buffered,
                              last_run_id=fire.last_run_id, last_fire_at=None, fired=0, skipped=0)
                return True
            if fire.buffered is not None and not fire.active:
                await self._submit(conn, fire, spec, fire.buffered)
                fire.buffered = None
            nominal = await self._fire_missed(conn, fire, spec)
            due = nominal + jitter_of(row["id"], nominal, spec.jitter_ms)
            if fire.buffered is not None:
                due = min(due, fire.now + BUFFER_RECHECK)
            await execute(conn, Q.record_fire, id=row["id"], next_fire_at=nominal, due_at=due,
                          buffered_fire_at=fire.buffered, last_run_id=fire.last_run_id,
                          last_fire_at=fire.last_fire_at, fired=fire.fired, skipped=fire.skipped)
            return True

    async def _fire_missed(self, conn: asyncpg.Connection, fire: _Fire, spec: ScheduleSpec) -> dt.datetime:
        """Every nominal fire time already due: made (within the catch-up window) or skipped.
        Returns the next nominal fire time, not yet due."""
        row, clock = fire.row, spec.timing()
        nominal: dt.datetime = row["next_fire_at"]
        horizon = fire.now - dt.timedelta(milliseconds=spec.catch_up_window_ms)
        if nominal < horizon:  # long downtime: jump to the window (interval fire times keep their phase)
            start = clock.first_at_or_after(horizon, nominal)
            fire.skipped += 1 if spec.interval_ms is None else max(1, (start - nominal) // dt.timedelta(
                milliseconds=spec.interval_ms))
            nominal = start
        for _ in range(MAX_CATCH_UP_FIRES):
            if nominal + jitter_of(row["id"], nominal, spec.jitter_ms) > fire.now:
                return nominal
            if spec.overlap == "ALLOW_ALL" or not fire.active:
                await self._submit(conn, fire, spec, nominal)
            elif spec.overlap == "BUFFER_ONE" and fire.buffered is None:
                fire.buffered = nominal
            else:
                fire.skipped += 1
            nominal = clock.next_after(nominal)
        return clock.first_at_or_after(fire.now, nominal)

    async def _submit(self, conn: asyncpg.Connection, fire: _Fire, spec: ScheduleSpec, fire_at: dt.datetime) -> None:
        row = fire.row
        request_id = fire_request_id(row["id"], fire_at)
        run = SubmitSpec(agent_name=spec.agent_name, agent_version=spec.agent_version, input=spec.input,
                         client_request_id=request_id, max_attempts=self.settings.default_max_attempts,
                         labels={**spec.labels, "agentrt.schedule": row["name"]})
        priority, key, key_max, sensitive = await self._flow_of(conn, spec)
        run_id, stored, sealed = uuid7(), run.input, None
        marks = Sensitivity.of_json(sensitive)
        if marks.any:  # sealed as SubmitRun seals (api/shield.py); no keyring: the fire fails, nothing in clear
            sealed = self.keys.new_run_key(run_id, marks)
            stored = sealed.key.seal_paths(run.input, marks.input)
        submitted = await fetchrow(
            conn, Q.submit_run, run_id=run_id, tenant_id=row["tenant_id"], agent_name=run.agent_name,
            agent_version=run.agent_version, input=stored, labels=run.labels, max_attempts=run.max_attempts,
            key_id=sealed.key_id if sealed else None, wrapped_key=sealed.wrapped if sealed else None,
            sensitive=marks.to_json() if sealed else None,
            max_steps=0, max_tokens=0, max_cost_usd=0.0, deadline_at=None, client_request_id=request_id,
            submit_hash=run.submit_hash(), event_id=uuid7(), traceparent=None, tracestate=None,
            priority=priority, concurrency_key=key, concurrency_max=key_max, retry_of_run_id=None,
            fair_step=(await self.db.flow(conn)).fair_step(row["tenant_id"]))
        if submitted is None:  # this fire time already has its run (the request id names it): never a second
            submitted = await fetchrow(conn, Q.get_run_by_client_request, tenant_id=row["tenant_id"],
                                       client_request_id=request_id)
            assert submitted is not None
        else:
            await execute(conn, Q.notify_work, agent_name=run.agent_name)
            fire.fired += 1
        fire.last_run_id, fire.active, fire.last_fire_at = submitted["id"], True, fire_at

    async def _flow_of(self, conn: asyncpg.Connection, spec: ScheduleSpec,
                       ) -> tuple[int, str | None, int | None, dict[str, Any] | None]:
        """A fired run's priority, concurrency key and sensitive marks, as SubmitRun gives them: from the
        registration of the version that will serve it (none live, or an input it no longer takes: the defaults)."""
        rows = await fetch(conn, Q.live_versions, agent_name=spec.agent_name)
        versions = {r["agent_version"]: LiveVersion(r["input_schema"], r["default_priority"], r["concurrency_key"],
                                                    r["concurrency_max"], r["sensitive"]) for r in rows}
        try:
            served = admit(versions, spec.agent_name, spec.agent_version, spec.input, allow_unregistered=True)
            key = render_key(served.concurrency_key, spec.input) if served and served.concurrency_key else None
        except InvalidArgument:
            served, key = None, None
        priority = (served.default_priority if served else None) or self.settings.default_priority
        return priority, key, served.concurrency_max if key and served else None, served.sensitive if served else None


__all__ = ["OVERLAPS", "ScheduleSpec", "ScheduleStore", "fire_request_id", "schedule_state", "spec_of"]
