"""RunService's schedules: create, update, pause, delete and list (docs/design.md §schedules), and the
background task that fires due schedules on every replica (they share the work by SKIP LOCKED)."""

from __future__ import annotations

import datetime as dt
import logging

import grpc
from asyncpg import Record

from scheduler.api import convert
from scheduler.api import validate as v
from scheduler.api.admin_service import audit_entry
from scheduler.api.rpc import principal, rpc
from scheduler.background.periodic import PeriodicTask
from scheduler.config import SchedulerSettings
from scheduler.security.sealing import redact
from scheduler.store import ScheduleSpec, Store
from scheduler.store.schedules import spec_of
from scheduler.store.types import AuditEntry
from shared.canonical import canonical_json
from shared.errors import InvalidArgument
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.tracing import annotate

log = logging.getLogger(__name__)
OVERLAP = {rs.SCHEDULE_OVERLAP_UNSPECIFIED: "SKIP", rs.SCHEDULE_OVERLAP_SKIP: "SKIP",
           rs.SCHEDULE_OVERLAP_BUFFER_ONE: "BUFFER_ONE", rs.SCHEDULE_OVERLAP_ALLOW_ALL: "ALLOW_ALL"}
OVERLAP_NUMBER = {"SKIP": rs.SCHEDULE_OVERLAP_SKIP, "BUFFER_ONE": rs.SCHEDULE_OVERLAP_BUFFER_ONE,
                  "ALLOW_ALL": rs.SCHEDULE_OVERLAP_ALLOW_ALL}
DEFAULT_CATCH_UP_MS = 60_000
_PROBE = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


def spec_from_proto(message: rs.ScheduleSpec, limit: int) -> ScheduleSpec:
    """A validated spec; bad input is INVALID_ARGUMENT naming the field (spec.<field>). Its numbers'
    ranges are scheduler/bounds.py's, checked before the handler runs."""
    agent = v.require_name("spec.agent_name", message.agent_name)
    version = v.optional_text("spec.agent_version", message.agent_version, max_len=100) or ""
    payload = v.parse_json("spec.input_json", message.input_json, limit, default={})
    labels = dict(message.labels)
    if len(labels) > 64 or any(len(k) > 100 or len(val) > 500 or "\x00" in k + val for k, val in labels.items()):
        raise InvalidArgument("spec.labels", "at most 64 labels, keys up to 100 and values up to 500 characters")
    if bool(message.interval_ms) == bool(message.cron):
        raise InvalidArgument("spec.interval_ms", "give exactly one of interval_ms and cron")
    cron = v.optional_text("spec.cron", message.cron, max_len=200)
    zone = v.optional_text("spec.time_zone", message.time_zone, max_len=100) or "UTC"
    if message.interval_ms and message.time_zone:
        raise InvalidArgument("spec.time_zone", "is only for cron schedules")
    overlap = v.require_enum("spec.overlap", message.overlap, OVERLAP)
    spec = ScheduleSpec(agent_name=agent, agent_version=version, input=payload, labels=labels,
                        interval_ms=message.interval_ms or None, cron=cron, time_zone=zone, overlap=overlap,
                        catch_up_window_ms=message.catch_up_window_ms or DEFAULT_CATCH_UP_MS,
                        jitter_ms=message.jitter_ms)
    try:
        # Matches at all (e.g. not 31 February): from a fixed instant, no clock involved.
        spec.timing().next_after(_PROBE)
    except ValueError as exc:
        raise InvalidArgument("spec.cron" if "zone" not in str(exc) else "spec.time_zone", str(exc)) from None
    return spec


def schedule_to_proto(row: Record) -> rs.Schedule:
    spec = spec_of(row)
    message = rs.Schedule(
        schedule_id=str(row["id"]), tenant_id=row["tenant_id"], name=row["name"], paused=row["paused"],
        last_run_id=str(row["last_run_id"]) if row["last_run_id"] else "", fires=row["fires"],
        skipped=row["skipped"],
        spec=rs.ScheduleSpec(agent_name=spec.agent_name, agent_version=spec.agent_version,
                             input_json=canonical_json(redact(spec.input)), labels=spec.labels,
                             interval_ms=spec.interval_ms or 0, cron=spec.cron or "",
                             time_zone="" if spec.interval_ms else spec.time_zone,
                             overlap=OVERLAP_NUMBER[spec.overlap], catch_up_window_ms=spec.catch_up_window_ms,
                             jitter_ms=spec.jitter_ms))
    convert.set_time(message, "next_fire_at", row["next_fire_at"])
    convert.set_time(message, "last_fire_at", row["last_fire_at"])
    convert.set_time(message, "created_at", row["created_at"])
    return message


def _audit(context: grpc.aio.ServicerContext, request_id: str) -> AuditEntry:
    """Who changes a schedule (the admitted principal) and the request id (the request's, else
    `x-request-id` when sent)."""
    return audit_entry(context, rs.AuditNote(),
                       request_id=v.optional_text("request_id", request_id, max_len=200))


class ScheduleRpcs:
    store: Store
    limit: int

    def _schedule_tenant(self, context: grpc.aio.ServicerContext) -> str:
        tenant = principal().tenant_of_call(context.invocation_metadata())
        annotate(tenant_id=tenant)
        return tenant

    @rpc
    async def CreateSchedule(self, request: rs.CreateScheduleRequest,
                             context: grpc.aio.ServicerContext) -> rs.CreateScheduleResponse:
        tenant = self._schedule_tenant(context)
        name = v.require_name("name", request.name)
        spec = spec_from_proto(request.spec, self.limit)
        row, created = await self.store.schedules.create_schedule(tenant, name, spec,
                                                                  _audit(context, request.request_id))
        return rs.CreateScheduleResponse(schedule=schedule_to_proto(row), created=created)

    @rpc
    async def UpdateSchedule(self, request: rs.UpdateScheduleRequest, context: grpc.aio.ServicerContext) -> rs.Schedule:
        tenant = self._schedule_tenant(context)
        schedule_id = v.require_uuid("schedule_id", request.schedule_id)
        spec = spec_from_proto(request.spec, self.limit)
        audit = _audit(context, request.request_id)
        return schedule_to_proto(await self.store.schedules.update_schedule(tenant, schedule_id, spec, audit))

    @rpc
    async def PauseSchedule(self, request: rs.PauseScheduleRequest, context: grpc.aio.ServicerContext) -> rs.Schedule:
        tenant = self._schedule_tenant(context)
        schedule_id = v.require_uuid("schedule_id", request.schedule_id)
        return schedule_to_proto(await self.store.schedules.pause_schedule(tenant, schedule_id, request.paused,
                                                                     _audit(context, request.request_id)))

    @rpc
    async def DeleteSchedule(self, request: rs.DeleteScheduleRequest, context: grpc.aio.ServicerContext) -> rs.Schedule:
        tenant = self._schedule_tenant(context)
        schedule_id = v.require_uuid("schedule_id", request.schedule_id)
        audit = _audit(context, request.request_id)
        return schedule_to_proto(await self.store.schedules.delete_schedule(tenant, schedule_id, audit))

    @rpc
    async def ListSchedules(self, request: rs.ListSchedulesRequest,
                            context: grpc.aio.ServicerContext) -> rs.ListSchedulesResponse:
        tenant = self._schedule_tenant(context)
        rows = await self.store.schedules.list_schedules(tenant)
        return rs.ListSchedulesResponse(schedules=[schedule_to_proto(r) for r in rows])


class ScheduleFirer(PeriodicTask):
    """Fires due schedules until none is due, then waits `schedule_poll_interval_ms` (0: this replica fires none)."""

    what = "schedule firing"

    def __init__(self, store: Store, settings: SchedulerSettings) -> None:
        super().__init__("schedule-firer", settings.schedule_poll_interval_ms / 1000,
                         settings.schedule_poll_interval_ms > 0)
        self.store = store
        self.settings = settings
        self.fired = 0

    async def run_once(self) -> None:
        for _ in range(1000):  # bounded: one pass, then the pause
            if self.stopping.is_set() or not await self.store.schedules.fire_due_schedule():
                break
            self.fired += 1
