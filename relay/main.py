"""Relay wiring and lifecycle.

Start: pool → schema check → shard table → Kafka producer (an unreachable
bootstrap is an error here, not a retry loop) → health endpoint → the named
tasks: relay-loop, shard-leases, outbox-listener, lag-reporter, retention,
health-reporter. The tasks are watched together: one failing stops the relay.

Shutdown order: health → NOT_SERVING; the loop finishes its round (marks what
Kafka acknowledged) within the grace period, else it is cancelled; shards are
handed back and the membership left so other relays take over at once; the
side tasks stop; the producer flushes and closes; the pool closes; the health
server stops. `stop()` is safe to call twice; `async with RelayServer(...)` works.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Coroutine
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from relay.config import RelaySettings
from relay.leases import ShardLeases
from relay.loop import RelayLoop, RelayMetrics
from relay.metrics import relay_metrics
from relay.publisher import Publisher
from relay.retention import run_retention
from relay.store import RelayStore, connect_pool
from relay.wakeup import OutboxListener
from shared.db import require_schema
from shared.errors import Unavailable
from shared.metrics import Metrics
from shared.tracing import setup_tracing

log = logging.getLogger(__name__)
HEALTH_SERVICE = "agentrt.relay"


class RelayServer:
    def __init__(self, settings: RelaySettings, tracer_provider: Any = None) -> None:
        self.settings = settings
        self.tracer_provider = tracer_provider  # None: the process's, set up from the settings
        self.metrics = RelayMetrics()
        self.health_port: int | None = None
        self.store: RelayStore | None = None
        self.publisher: Publisher | None = None
        self.leases: ShardLeases | None = None
        self._health: Any = None
        self._server: grpc.aio.Server | None = None
        self._stopping = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._side_tasks: list[asyncio.Task[None]] = []
        self._stopped = False
        self.exported_metrics: Metrics | None = None
        self.metrics_port: int | None = None

    async def start(self) -> None:
        s = self.settings
        provider = self.tracer_provider or setup_tracing(s.tracing())
        pool = await connect_pool(s.database_url, min_size=s.db_pool_min, max_size=s.db_pool_max,
                                  command_timeout=s.db_command_timeout_s)
        self.store = RelayStore(pool)
        publisher = Publisher(s, provider)
        try:
            async with pool.acquire() as conn:
                await require_schema(conn)
            await self.store.ensure_shards(s.shard_count)
            await publisher.start()
        except BaseException:
            await pool.close()
            raise
        self.publisher = publisher

        round_lock = asyncio.Lock()
        shards_acquired = asyncio.Event()
        listener = OutboxListener(s.database_url)
        self.leases = ShardLeases(self.store, s, round_lock, shards_acquired)
        loop = RelayLoop(self.store, publisher, self.leases, listener, s, round_lock, shards_acquired,
                         self.metrics)
        self.leases.before_release = loop.finish_marking

        try:
            await self._start_health()
        except BaseException:
            await publisher.stop()
            await pool.close()
            raise
        self.exported_metrics = relay_metrics(self.metrics, self.leases)
        self.metrics_port = self.exported_metrics.serve(s.metrics_addr)
        self.exported_metrics.start_export(s)
        stopping = self._stopping
        self._loop_task = asyncio.create_task(loop.run(stopping), name="relay-loop")
        self._side_tasks = [
            self._spawn(self.leases.run(stopping), "shard-leases"),
            self._spawn(listener.run(stopping), "outbox-listener"),
            self._spawn(loop.report_lag(stopping), "lag-reporter"),
            self._spawn(run_retention(self.store, s, stopping), "retention"),
            self._spawn(self._report_health(stopping), "health-reporter"),
        ]
        log.info("relay %s started: topic %s (%s), %d shards, Kafka %s, health on port %s",
                 s.relay_id, s.topic, s.topic_policy, s.shard_count, s.kafka_bootstrap, self.health_port)

    @staticmethod
    def _spawn(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return asyncio.create_task(coro, name=name)

    async def _start_health(self) -> None:
        self._health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        self.health_port = server.add_insecure_port(self.settings.health_addr)
        if not self.health_port:
            raise OSError(f"cannot listen on {self.settings.health_addr}")
        await server.start()
        self._server = server
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._health.set(HEALTH_SERVICE, health_pb2.HealthCheckResponse.SERVING)

    async def _report_health(self, stopping: asyncio.Event) -> None:
        # "" is liveness (the process works); "agentrt.relay" is readiness: Kafka answers and a
        # primary is reachable (probed every second: NOT_SERVING through a failover, docs/ha.md).
        serving = True
        while not stopping.is_set():
            if self.store is not None:
                try:
                    self.metrics.database_healthy = await asyncio.wait_for(self.store.primary_reachable(), 5)
                except (Unavailable, TimeoutError):
                    self.metrics.database_healthy = False
            healthy = self.metrics.broker_healthy and self.metrics.database_healthy
            if healthy != serving and self._health is not None:
                status = health_pb2.HealthCheckResponse.SERVING if healthy else \
                    health_pb2.HealthCheckResponse.NOT_SERVING
                await self._health.set(HEALTH_SERVICE, status)
                log.info("readiness %s (broker %s, database %s)", "SERVING" if healthy else "NOT_SERVING",
                         "up" if self.metrics.broker_healthy else "failing",
                         "a primary" if self.metrics.database_healthy else "no primary")
                serving = healthy
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), 1.0)

    async def wait(self) -> None:
        """Returns when stop() was asked for; raises if a task failed."""
        tasks: list[asyncio.Task[Any]] = [t for t in (self._loop_task, *self._side_tasks) if t is not None]
        stop_wait = asyncio.create_task(self._stopping.wait(), name="stop-requested")
        try:
            done, _ = await asyncio.wait([*tasks, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
        for task in done:
            if task is not stop_wait and not task.cancelled() and task.exception() is not None:
                log.error("relay task %s failed: %r", task.get_name(), task.exception())
                raise task.exception()  # type: ignore[misc]

    def request_stop(self) -> None:
        self._stopping.set()

    async def stop(self, grace: float | None = None) -> None:
        if self._stopped:
            return
        self._stopped = True
        grace = self.settings.shutdown_grace_s if grace is None else grace
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        self._stopping.set()
        if self._loop_task is not None:
            done, _ = await asyncio.wait([self._loop_task], timeout=grace)
            if not done:
                log.warning("relay loop did not finish its round within %.1fs; cancelling", grace)
                self._loop_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._loop_task
        if self.leases is not None and self.store is not None:
            try:
                await asyncio.wait_for(self.leases.release_all(), 5)
                await asyncio.wait_for(self.store.leave_membership(self.settings.relay_id), 5)
            except Exception as exc:  # leases then simply expire
                log.warning("could not hand back shards cleanly: %r", exc)
        if self._side_tasks:
            _, pending = await asyncio.wait(self._side_tasks, timeout=5)
            for task in pending:
                task.cancel()
            await asyncio.gather(*self._side_tasks, return_exceptions=True)
        if self.exported_metrics is not None:
            self.exported_metrics.stop()
        if self.publisher is not None:
            await self.publisher.stop()
        if self.store is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.store.pool.close(), 5)
        if self._server is not None:
            await self._server.stop(0.5)
        log.info("relay %s stopped (published %d events this run)", self.settings.relay_id,
                 self.metrics.published_total)

    async def __aenter__(self) -> RelayServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()



async def serve(settings: RelaySettings) -> None:
    """Runs until SIGINT/SIGTERM (or a failed task), then shuts down in order."""
    server = RelayServer(settings)
    loop = asyncio.get_running_loop()
    await server.start()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.request_stop)
    try:
        await server.wait()
    finally:
        await server.stop()
