"""Losing the primary, as the services see it, against real PostgreSQL (docs/ha.md).

A failover shows a service three things: its sessions die (admin shutdown, a closed socket), a
session or a new connection lands on a server that takes no writes (`read-only transaction`, as
on a hot standby or a demoted primary), and for a while no host of a multi-host DSN is a primary.
Each is one class of shared.db's table; the scheduler answers UNAVAILABLE, drops its stale
sessions, reports NOT_SERVING while no primary answers and SERVING after, and counts it all.
Here a database set `default_transaction_read_only` stands in for the standby: the server refuses
writes with the very error a standby sends (SQLSTATE 25006). Experiment 10 (tests/acceptance/
test_primary_failover.py) does it with a real standby under Patroni.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections.abc import Awaitable, Callable

import asyncpg
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import claim, eid, lease_ref, reason_of, rpc_error, scheduler_stack, snapshot, submit

from shared.db import CONNECTION_ERRORS, DB_STATS, PRIMARY_LOST, STALE_SESSIONS, expire_stale, is_primary_lost
from shared.gen.agentrt.v1 import run_service_pb2
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration

RUN_SERVICE = run_service_pb2.DESCRIPTOR.services_by_name["RunService"].full_name
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


async def until(probe: Callable[[], Awaitable[object]], within_s: float, what: str) -> object:
    deadline = time.monotonic() + within_s
    while True:
        found = await probe()
        if found:
            return found
        assert time.monotonic() < deadline, f"not within {within_s:g}s: {what}"
        await asyncio.sleep(0.05)


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(agentrt_db_[^ ]+) (\S+)$", text, re.M)}


async def health(addr: str, service: str) -> int:
    async with grpc.aio.insecure_channel(addr) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                               timeout=5)
        return int(reply.status)


async def raised(call: Awaitable[object]) -> BaseException:
    try:
        await call
    except BaseException as exc:  # the test inspects what the server sent
        return exc
    raise AssertionError("the call succeeded")


async def test_each_way_of_losing_the_primary_is_one_class_of_the_table(db_url, db):
    # A standby's refusal: the server answers, but takes no writes.
    standby_like = await asyncpg.connect(db_url, server_settings={"default_transaction_read_only": "on"})
    try:
        refused = await raised(standby_like.execute("INSERT INTO runtime_counters (name, value) VALUES ('x', 1)"))
    finally:
        await standby_like.close()
    assert isinstance(refused, asyncpg.ReadOnlySQLTransactionError), refused
    assert refused.sqlstate == "25006"
    # A session ended under it (what a fast shutdown or a switchover does to every session).
    victim = await asyncpg.connect(db_url)
    try:
        await db.execute("SELECT pg_terminate_backend($1)", victim.get_server_pid())
        ended = await raised(victim.fetchval("SELECT 1"))
    finally:
        victim.terminate()
    # Which one depends on timing: AdminShutdownError when the query meets the FATAL,
    # ConnectionDoesNotExistError or InterfaceError ("connection is closed") when the socket closed
    # first, or (asyncpg 0.32) InternalClientError when the FATAL came while it was idle.
    assert isinstance(ended, asyncpg.AdminShutdownError | asyncpg.ConnectionDoesNotExistError
                      | asyncpg.InterfaceError | asyncpg.exceptions.InternalClientError), ended
    assert isinstance(ended, PRIMARY_LOST), ended
    # No host of the DSN has the role asked for (a multi-host DSN while no primary is up).
    missing = await raised(asyncpg.connect(db_url, target_session_attrs="standby", timeout=10))
    assert isinstance(missing, asyncpg.TargetServerAttributeNotMatched), missing
    # Nobody listening at all.
    closed = await raised(asyncpg.connect("postgresql://postgres@127.0.0.1:1/postgres", timeout=5))
    for exc in (refused, ended, missing, closed):
        assert is_primary_lost(exc), exc
    assert isinstance(refused, PRIMARY_LOST) and isinstance(refused, STALE_SESSIONS)
    assert not isinstance(closed, STALE_SESSIONS) and isinstance(closed, CONNECTION_ERRORS)
    # Control: a query's own error is none of them (it must surface, not be retried).
    syntax = await raised(db.execute("SELEC 1"))
    assert not is_primary_lost(syntax)


async def test_a_pool_drops_its_stale_sessions_after_a_read_only_refusal(db_url, db):
    pool = await asyncpg.create_pool(db_url, min_size=2, max_size=2)
    assert pool is not None
    try:
        before = {await pool.fetchval("SELECT pg_backend_pid()") for _ in range(4)}
        async with pool.acquire() as conn:
            refused = await raised(conn.execute("SET TRANSACTION READ ONLY; CREATE TABLE nope (x int)"))
        expired = DB_STATS.pools_expired
        await expire_stale(refused, pool)
        assert DB_STATS.pools_expired == expired + 1
        after = {await pool.fetchval("SELECT pg_backend_pid()") for _ in range(4)}
        assert before and not before & after, (before, after)  # every session was replaced
    finally:
        await pool.close()


async def test_the_scheduler_rides_out_a_read_only_primary(db_url, db):
    """Sessions ended, the database refusing writes for a while: UNAVAILABLE (never INTERNAL), health
    NOT_SERVING, then back without a restart once writes are taken again."""
    name = await db.fetchval("SELECT current_database()")
    async with scheduler_stack(db_url, db_probe_interval_s=0.1, metrics_addr="127.0.0.1:0") as stack:
        port = stack.server.metrics_port
        assert port
        assert await health(stack.addr, RUN_SERVICE) == SERVING
        await submit(stack)
        opened = scrape(port)["agentrt_db_connections_opened_total"]
        await db.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        try:
            await db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE datname = current_database() AND pid <> pg_backend_pid()")
            codes = set()
            for _ in range(3):
                failed = await raised(submit(stack))
                assert isinstance(failed, grpc.aio.AioRpcError), failed
                codes.add(failed.code())
            assert codes == {grpc.StatusCode.UNAVAILABLE}, codes

            async def not_serving() -> bool:
                return await health(stack.addr, RUN_SERVICE) == NOT_SERVING

            await until(not_serving, 10, "RunService NOT_SERVING while no primary takes writes")
            assert await health(stack.addr, "") == SERVING, "liveness stays: the process is fine"
            samples = scrape(port)
            assert samples.get('agentrt_db_unavailable_errors_total{error="ReadOnlySQLTransactionError"}', 0) >= 1, \
                samples
        finally:
            await db.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')

        async def serving() -> bool:
            return await health(stack.addr, RUN_SERVICE) == SERVING

        await until(serving, 10, "SERVING again once a primary takes writes")
        await submit(stack)  # the same process, new sessions
        after = scrape(port)
        assert after["agentrt_db_connections_opened_total"] > opened, after
        assert after["agentrt_db_pool_expirations_total"] >= 1, after


# ------------------------------------------------------------------ a failover moves the clock


def _save(ref: ws.LeaseRef, expected: int, cursor: str) -> ws.SaveCheckpointRequest:
    return ws.SaveCheckpointRequest(lease=ref, expected_version=expected, state_json=json.dumps({"cursor": cursor}),
                                    schema_version=1, event_id=eid())


async def _skew(db: asyncpg.Connection, run_id: str, seconds: float) -> None:
    """The new primary's clock `seconds` ahead of the one that wrote the lease (behind when negative):
    for every `lease_expires_at < clock_timestamp()` the same as the expiry written that much earlier."""
    await db.execute("UPDATE agent_runs SET lease_expires_at = lease_expires_at - make_interval(secs => $2) "
                     "WHERE id = $1::uuid", run_id, seconds)


async def test_a_clock_ahead_after_failover_ends_leases_early_and_the_fence_holds(db_url, db):
    """docs/ha.md, leases across hosts: a clock 40 s ahead ends a 30 s lease at once while its holder
    is alive. Another worker claims with a greater fence; every write of the first is LEASE_LOST
    and changes nothing. Early takeover, never two holders that can write."""
    async with scheduler_stack(db_url, lease_duration_ms=30_000) as stack:
        run = await submit(stack)
        first = await claim(stack, "worker-a")
        assert first is not None
        ref_a = lease_ref(first)
        saved = await stack.work.SaveCheckpoint(_save(ref_a, first.run.version, "a-1"))
        await stack.work.Heartbeat(ws.HeartbeatRequest(lease=ref_a))  # alive and in time by its own clock
        await _skew(db, run.run_id, 40)
        second = await claim(stack, "worker-b")
        assert second is not None and second.run.run_id == run.run_id
        assert second.run.fencing_token == first.run.fencing_token + 1
        taken = await snapshot(db, run.run_id)
        for call in (stack.work.Heartbeat(ws.HeartbeatRequest(lease=ref_a)),
                     stack.work.SaveCheckpoint(_save(ref_a, saved.version, "a-2"))):
            refused = await rpc_error(call)
            assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and reason_of(refused) == "LEASE_LOST"
        assert await snapshot(db, run.run_id) == taken
        ref_b = lease_ref(second)
        again = await stack.work.SaveCheckpoint(_save(ref_b, second.run.version, "b-1"))
        assert again.version == saved.version + 1
        fences = [r["fencing_token"] for r in await db.fetch(
            "SELECT fencing_token FROM agent_checkpoints WHERE run_id = $1::uuid ORDER BY version", run.run_id)]
        assert fences == sorted(fences) and fences[-1] == first.run.fencing_token + 1


async def test_a_clock_behind_after_failover_only_delays_a_takeover(db_url, db):
    """A clock 40 s behind keeps a lapsed lease alive 40 s longer: nobody else can claim the run
    meanwhile (liveness, not safety), and its holder's writes still go through."""
    async with scheduler_stack(db_url, lease_duration_ms=2_000) as stack:
        run = await submit(stack)
        first = await claim(stack, "worker-a")
        assert first is not None
        await _skew(db, run.run_id, -40)
        await asyncio.sleep(2.5)  # past the 2 s lease by the writer's clock
        assert await claim(stack, "worker-b") is None
        saved = await stack.work.SaveCheckpoint(_save(lease_ref(first), first.run.version, "a-1"))
        assert saved.version == first.run.version + 1
        assert (await snapshot(db, run.run_id))["run"]["fencing_token"] == first.run.fencing_token


async def test_the_listeners_keep_trying_while_no_host_is_a_primary(db_url, caplog):
    """The scheduler's work notifier and the relay's outbox listener hold their own connection. While
    no host of the DSN is what it asks for (here: a standby, of a server that is a primary), each
    logs and tries again; neither task ends (an ended relay side task would stop the relay)."""
    from relay.wakeup import OutboxListener
    from scheduler.background.notifier import WorkNotifier

    never = f"{db_url}?target_session_attrs=standby"
    notifier = WorkNotifier(never)
    await notifier.start()
    stopping = asyncio.Event()
    listener = asyncio.create_task(OutboxListener(never).run(stopping))
    try:
        async def both_retried() -> bool:
            text = caplog.text
            return "work notifier disconnected" in text and "outbox listener disconnected" in text

        await until(both_retried, 20, "both listeners to log a failed connection")
        await asyncio.sleep(0.5)  # and to try again
        assert not listener.done()
        assert notifier._task is not None and not notifier._task.done()
        assert not notifier.connected.is_set()
    finally:
        stopping.set()
        await notifier.stop()
        await asyncio.wait_for(listener, 10)
