"""Schedules (issue 19): definitions through RunService, and firing by the database clock on
several replicas: one run per fire time (its client request id names the schedule and the time),
overlap policies, catch-up after downtime, pause."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import grpc
import pytest
from executor_support import wait_for
from support import Stack, rpc_error, scheduler_stack

from shared.gen.agentrt.v1 import run_service_pb2 as rs

pytestmark = pytest.mark.integration


def every(ms: int, overlap: int = rs.SCHEDULE_OVERLAP_ALLOW_ALL, **fields: Any) -> rs.ScheduleSpec:
    return rs.ScheduleSpec(agent_name="nightly", input_json='{"report": "daily"}', labels={"team": "ops"},
                           interval_ms=ms, overlap=overlap, **fields)


async def create(stack: Stack, name: str, spec: rs.ScheduleSpec) -> rs.CreateScheduleResponse:
    return await stack.runs.CreateSchedule(rs.CreateScheduleRequest(name=name, spec=spec), metadata=stack.md())


async def fired_runs(db: Any, name: str) -> list[dict[str, Any]]:
    rows = await db.fetch("SELECT id, status, client_request_id, labels, input FROM agent_runs "
                          "WHERE labels->>'agentrt.schedule' = $1 ORDER BY created_at", name)
    return [dict(r) for r in rows]


def fire_time(run: dict[str, Any]) -> dt.datetime:
    return dt.datetime.fromisoformat(run["client_request_id"].split(":", 2)[2])


async def test_two_replicas_fire_each_time_once_without_gaps(db_url, db):
    """A schedule every second for about 20 s, two scheduler replicas polling it: one run per fire
    time, consecutive fire times one second apart, and the schedule's count agrees."""
    async with scheduler_stack(db_url, schedule_poll_interval_ms=100) as one, \
            scheduler_stack(db_url, schedule_poll_interval_ms=100) as two:
        made = await create(one, "every-second", every(1000))
        assert made.created
        await wait_for(lambda: _count_at_least(db, "every-second", 20), 40, "20 fires")
        await one.runs.PauseSchedule(rs.PauseScheduleRequest(schedule_id=made.schedule.schedule_id, paused=True),
                                     metadata=one.md())
        fired = (one.server.firer.fired, two.server.firer.fired)
    runs = await fired_runs(db, "every-second")
    times = [fire_time(r) for r in runs]
    assert len(times) == len(set(times)) >= 20
    gaps = {b - a for a, b in zip(sorted(times), sorted(times)[1:], strict=False)}
    assert gaps == {dt.timedelta(seconds=1)}, gaps
    row = await db.fetchrow("SELECT fires, skipped FROM agent_schedules WHERE name = 'every-second'")
    assert (row["fires"], row["skipped"]) == (len(runs), 0)
    assert runs[0]["input"] == {"report": "daily"} and runs[0]["labels"]["team"] == "ops"
    assert sum(fired) >= len(runs), fired


async def _count_at_least(db: Any, name: str, n: int) -> bool:
    return len(await fired_runs(db, name)) >= n


async def test_skip_and_buffer_one_while_the_last_run_is_not_over(db_url, db):
    async with scheduler_stack(db_url, schedule_poll_interval_ms=100) as stack:
        skip = await create(stack, "skip", every(1000, rs.SCHEDULE_OVERLAP_SKIP))
        buffer = await create(stack, "buffer", every(1000, rs.SCHEDULE_OVERLAP_BUFFER_ONE))

        async def skipped(name: str) -> bool:
            return bool(await db.fetchval("SELECT skipped >= 2 FROM agent_schedules WHERE name = $1", name))

        await wait_for(lambda: skipped("skip"), 15, "two skipped fires")
        await wait_for(lambda: skipped("buffer"), 15, "two fires past the buffered one")
        assert len(await fired_runs(db, "skip")) == len(await fired_runs(db, "buffer")) == 1
        buffered = await db.fetchval("SELECT buffered_fire_at FROM agent_schedules WHERE name = 'buffer'")
        assert buffered is not None
        for name in ("skip", "buffer"):  # the blocking run ends: the next fire (or the buffered one) goes
            [run] = await fired_runs(db, name)
            await stack.runs.CancelRun(rs.CancelRunRequest(run_id=str(run["id"])), metadata=stack.md())
        await wait_for(lambda: _count_at_least(db, "buffer", 2), 10, "the buffered fire")
        await wait_for(lambda: _count_at_least(db, "skip", 2), 10, "the next fire")
        runs = await fired_runs(db, "buffer")
        assert fire_time(runs[1]) == buffered, "the buffered fire keeps its own fire time"
        for made in (skip, buffer):
            await stack.runs.DeleteSchedule(rs.DeleteScheduleRequest(schedule_id=made.schedule.schedule_id),
                                            metadata=stack.md())


async def test_after_downtime_only_fires_within_the_catch_up_window_are_made(db_url, db):
    async with scheduler_stack(db_url, schedule_poll_interval_ms=0) as stack:  # no firer yet: "down"
        made = await create(stack, "catch-up", every(1000, catch_up_window_ms=3000))
        # Simulates ten seconds of downtime: the schedule's next fire lies ten seconds back.
        await db.execute("UPDATE agent_schedules SET next_fire_at = next_fire_at - interval '10 seconds', "
                         "due_at = due_at - interval '10 seconds'")
    async with scheduler_stack(db_url, schedule_poll_interval_ms=100):
        await wait_for(lambda: _count_at_least(db, "catch-up", 3), 10, "the fires within the window")
    row = await db.fetchrow("SELECT fires, skipped FROM agent_schedules WHERE id = $1::uuid",
                            made.schedule.schedule_id)
    runs = await fired_runs(db, "catch-up")
    assert row["fires"] == len(runs) and row["skipped"] >= 6
    assert len(runs) <= 6, "fires older than the window were skipped, not made"


async def test_create_is_idempotent_by_name_and_update_pause_list_delete(db_url, db):
    async with scheduler_stack(db_url, schedule_poll_interval_ms=0) as stack:
        spec = rs.ScheduleSpec(agent_name="nightly", cron="0 3 * * *", time_zone="Europe/Paris")
        first = await create(stack, "nightly", spec)
        again = await create(stack, "nightly", spec)
        assert first.created and not again.created and again.schedule == first.schedule
        nominal = first.schedule.next_fire_at.ToDatetime(tzinfo=dt.UTC)
        assert nominal.astimezone(dt.timezone(dt.timedelta(hours=1))).hour in (3, 4)  # 03:00 Paris (CET/CEST)
        error = await rpc_error(create(stack, "nightly", every(5000)))
        assert error.code() == grpc.StatusCode.ALREADY_EXISTS
        sid = first.schedule.schedule_id
        updated = await stack.runs.UpdateSchedule(rs.UpdateScheduleRequest(schedule_id=sid, spec=every(5000)),
                                                  metadata=stack.md())
        assert updated.spec.interval_ms == 5000 and updated.spec.cron == ""
        paused = await stack.runs.PauseSchedule(rs.PauseScheduleRequest(schedule_id=sid, paused=True),
                                                metadata=stack.md())
        assert paused.paused
        listed = await stack.runs.ListSchedules(rs.ListSchedulesRequest(), metadata=stack.md())
        assert [s.name for s in listed.schedules] == ["nightly"]
        other = await stack.runs.ListSchedules(rs.ListSchedulesRequest(), metadata=stack.md("tenant-b"))
        assert list(other.schedules) == []
        error = await rpc_error(stack.runs.DeleteSchedule(rs.DeleteScheduleRequest(schedule_id=sid),
                                                          metadata=stack.md("tenant-b")))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        await stack.runs.DeleteSchedule(rs.DeleteScheduleRequest(schedule_id=sid), metadata=stack.md())
        assert await db.fetchval("SELECT count(*) FROM agent_schedules") == 0
        assert json.loads(first.schedule.spec.input_json) == {}
