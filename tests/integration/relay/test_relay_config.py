"""Bad configuration is one readable line and a non-zero exit at start; the health endpoint tells the truth."""

from __future__ import annotations

import asyncio
import os
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from relay_support import REPO_ROOT, insert_events, make_run, relay_settings, running_relay, wait_until

from devstack.kafka_testing import TansuBroker, free_port
from relay.main import HEALTH_SERVICE

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


async def relay_cli(**env_overrides: str) -> tuple[int, list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
    env.update({"AGENTRT_HEALTH_ADDR": "127.0.0.1:0", **env_overrides})
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "relay", cwd=REPO_ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, err.decode().strip().splitlines()


async def test_bad_configuration_is_one_line_and_a_non_zero_exit(db_url, db):
    dead = f"127.0.0.1:{free_port()}"
    await db.execute("INSERT INTO relay_config (id, shard_count) VALUES (1, 16)")  # the default
    cases = {
        "unknown topic policy": (
            {"AGENTRT_TOPIC_POLICY": "round_robin"},
            "agentrt relay: error: invalid setting topic_policy: Input should be 'single' or 'per_event_type'"),
        "bootstrap without a port": (
            {"AGENTRT_KAFKA_BOOTSTRAP": "kafka.internal"},
            "agentrt relay: error: invalid setting kafka_bootstrap: Value error, 'kafka.internal' is not host:port"),
        "unreachable bootstrap": (
            {"AGENTRT_DATABASE_URL": db_url, "AGENTRT_KAFKA_BOOTSTRAP": dead, "AGENTRT_STARTUP_TIMEOUT_S": "3"},
            f"agentrt relay: error: KAFKA_UNREACHABLE: cannot reach Kafka at {dead} within 3s"),
        "shard count other than the database's": (
            {"AGENTRT_DATABASE_URL": db_url, "AGENTRT_SHARD_COUNT": "32", "AGENTRT_KAFKA_BOOTSTRAP": dead},
            "agentrt relay: error: SHARD_COUNT_MISMATCH: shard_count 32 configured, but this database's relays "
            "use 16; every relay must use the same shard count"),
        "unknown fault point": (
            {"AGENTRT_FAULT_POINT": "before_lunch"},
            "agentrt relay: error: invalid setting fault_point: Value error, unknown fault point 'before_lunch'"),
    }
    results = await asyncio.gather(*(relay_cli(**env) for env, _ in cases.values()))
    for (name, (_, expected)), (code, lines) in zip(cases.items(), results, strict=True):
        assert code == 1, (name, lines)
        assert len(lines) == 1, (name, lines)
        assert lines[0].startswith(expected), (name, lines[0])


async def _health(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5)
        return reply.status


async def test_health_follows_the_broker(db_url, db, private_broker: TansuBroker):
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    run_id = await make_run(db)
    settings = relay_settings(db_url, private_broker.bootstrap, kafka_request_timeout_ms=1_000)
    async with running_relay(settings) as relay:
        port = relay.health_port
        assert port
        assert await _health(port, "") == serving
        assert await _health(port, HEALTH_SERVICE) == serving
        private_broker.kill()
        await insert_events(db, run_id, 1)
        await wait_until(lambda: _is(port, HEALTH_SERVICE, not_serving), 30, "readiness to drop with Kafka gone")
        assert await _health(port, "") == serving, "liveness stays: the process itself is fine"
        private_broker.start()
        await wait_until(lambda: _is(port, HEALTH_SERVICE, serving), 30, "readiness back with Kafka")


async def _is(port: int, service: str, status: int) -> bool:
    return await _health(port, service) == status


async def test_relays_starting_together_agree_on_the_shard_count(db_url, db):
    """Another relay's insert of the config row commits while this one waits on it: no false mismatch.

    The insert that loses the race does nothing, and a read in the same statement
    cannot see the winner's row (its snapshot is older): the relay must read again.
    """
    from relay.store import RelayStore, connect_pool

    other = await connect_pool(db_url, min_size=1, max_size=1, command_timeout=10)
    pool = await connect_pool(db_url, min_size=1, max_size=2, command_timeout=10)
    try:
        async with other.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            await conn.execute("INSERT INTO relay_config (id, shard_count) VALUES (1, 16)")
            loser = asyncio.create_task(RelayStore(pool).ensure_shards(16))
            # The loser blocks on the winner's uncommitted row (a lock wait the database can show).
            await wait_until(lambda: _lock_waits(db), 30, "the second relay to wait on the first one's insert")
            assert not loser.done()
            await tx.commit()
            await asyncio.wait_for(loser, 30)  # raised ShardCountMismatch(database=None) before the fix
        assert await db.fetchval("SELECT count(*) FROM relay_shards") == 16
    finally:
        await pool.close()
        await other.close()


async def _lock_waits(db) -> bool:
    return bool(await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"))
