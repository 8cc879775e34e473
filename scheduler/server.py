"""Scheduler wiring and lifecycle: pool, notifier, gRPC server, health, reflection.

Shutdown order: health → NOT_SERVING (probes drain traffic), stop accepting and
let in-flight calls finish within the grace period, stop the notifier, close
the pool. `stop()` is safe to call twice; `async with SchedulerServer(...)` works.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from scheduler.api.auth import RunAuth, build_run_auth
from scheduler.api.metrics import SchedulerMetrics
from scheduler.api.reflection_v1 import enable_reflection
from scheduler.api.schedule_service import ScheduleFirer
from scheduler.api.service import RunServicer, WorkServicer
from scheduler.api.wire import add_service
from scheduler.background.notifier import WorkNotifier
from scheduler.background.pruner import CheckpointPruner
from scheduler.background.retention import RunRetention
from scheduler.config import SchedulerSettings
from scheduler.store import Store, connect_pool
from scheduler.store.core import WORK_SCOPE, check_row_security
from scheduler.store.migrate import require_current_schema
from shared.db import trace_queries
from shared.errors import AgentrtError
from shared.gen.agentrt.v1 import run_service_pb2, work_service_pb2
from shared.tracing import ServerSpans, records_spans, setup_tracing
from shared.transport import server_credentials

log = logging.getLogger(__name__)
RUN_SERVICE = run_service_pb2.DESCRIPTOR.services_by_name["RunService"]
WORK_SERVICE = work_service_pb2.DESCRIPTOR.services_by_name["WorkService"]
SERVICE_NAMES = (RUN_SERVICE.full_name, WORK_SERVICE.full_name)


def max_receive_bytes(settings: SchedulerSettings) -> int:
    """gRPC's receive limit: a bigger message is answered RESOURCE_EXHAUSTED before any handler runs.

    Room for a request carrying several JSON fields at their size limit, plus 1 MiB; within it,
    an oversized field is refused INVALID_ARGUMENT by name (docs/errors.md).
    """
    return settings.max_payload_bytes * 4 + (1 << 20)


class SchedulerServer:
    def __init__(self, settings: SchedulerSettings, *, tracer_provider: Any = None) -> None:
        self.settings = settings
        self.tracer_provider = tracer_provider
        self.port: int | None = None
        self.store: Store | None = None
        self._server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None  # type: ignore[name-defined]
        self._notifier: WorkNotifier | None = None
        self.firer: ScheduleFirer | None = None
        self._stopped = False
        self.metrics: SchedulerMetrics | None = None
        self.metrics_port: int | None = None
        self.auth: RunAuth | None = None
        self.retention: RunRetention | None = None
        self.pruner: CheckpointPruner | None = None
        self._primary_watch: asyncio.Task[None] | None = None
        self.primary_serving = True  # the last probe's answer (readiness of RunService and WorkService)

    async def start(self) -> int:
        s = self.settings
        s.refuse_open_work_service()
        provider = setup_tracing(s.tracing(), self.tracer_provider)
        pool = await connect_pool(s.database_url, min_size=s.db_pool_min, max_size=s.db_pool_max,
                                  command_timeout=s.db_command_timeout_s)
        try:
            async with pool.acquire() as conn:
                await require_current_schema(conn)
                await check_row_security(conn, s.require_row_security)
            # The work path's own pool, in the row-level security work scope (migration 0016).
            work_pool = await connect_pool(s.database_url, min_size=s.db_pool_min, max_size=s.db_pool_max,
                                           command_timeout=s.db_command_timeout_s, scope=WORK_SCOPE)
        except BaseException:
            await pool.close()
            raise
        # A span per named statement (shared/db.py), where spans are recorded at all.
        trace_queries(provider.get_tracer("agentrt.sql") if s.trace_sql and records_spans(provider) else None)
        self.store = Store(pool, s, work_pool)
        self._notifier = WorkNotifier(s.database_url)
        await self._notifier.start(work_pool)
        limit = max_receive_bytes(s)
        metered = s.metrics_addr or s.otel_metrics_exporter == "otlp"
        self.metrics = SchedulerMetrics(s.claim_wait_tenant_labels) if metered else None
        if self.metrics is not None:
            self.store.keys.on_integrity_failure = self.metrics.sealed_value_failed
        server = grpc.aio.server(
            interceptors=[
                ServerSpans(provider, self.metrics.observe_rpc if self.metrics else None).interceptor(),
            ],
            options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit * 4),
                     ("grpc.so_reuseport", 0)],
        )
        # Not the generated add_*_to_server: bytes that are no message answer INVALID_ARGUMENT (wire.py).
        self.auth = await build_run_auth(s, self.store.auth)
        add_service(server, RUN_SERVICE, RunServicer(self.store, s, self.auth, self._notifier))
        add_service(server, WORK_SERVICE, WorkServicer(
            self.store, s, self._notifier, tracer=provider.get_tracer("agentrt.grpc.server"),
            observe=self.metrics.observe_rpc if self.metrics else None, recording=records_spans(provider),
            metrics=self.metrics))
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        enable_reflection((*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name), server)
        tls = s.server_tls
        if tls is None:
            self.port = server.add_insecure_port(s.listen_addr)
            log.warning("the gRPC port %s is plaintext: credentials and payloads travel in clear "
                        "(set tls_cert_file and tls_key_file)", s.listen_addr)
        else:
            self.port = server.add_secure_port(s.listen_addr, server_credentials(tls))
        if not self.port:
            raise OSError(f"cannot listen on {s.listen_addr}")
        await server.start()
        self._server = server
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.metrics is not None:
            self.metrics_port = self.metrics.start(s.metrics_addr, self.store, settings=s)
        self.retention = RunRetention(self.store, s, self.metrics.retention_batch if self.metrics else None)
        self.retention.start()
        self.pruner = CheckpointPruner(self.store, s)  # idle unless checkpoint_keep_last > 0
        self.pruner.start()
        self.firer = ScheduleFirer(self.store, s)
        self.firer.start()
        if s.db_probe_interval_s > 0:
            self._primary_watch = asyncio.create_task(self._watch_primary(s.db_probe_interval_s),
                                                      name="primary-watch")
        log.info("scheduler listening on %s (port %d)", s.listen_addr, self.port)
        return self.port

    async def _watch_primary(self, interval_s: float) -> None:
        """RunService and WorkService answer NOT_SERVING while no primary is reachable (a failover),
        SERVING again once one is; "" (liveness) stays SERVING: the scheduler rides it out."""
        assert self.store is not None and self._health is not None
        timeout = max(interval_s, self.settings.db_command_timeout_s)
        while True:
            await asyncio.sleep(interval_s)
            try:
                reachable = await asyncio.wait_for(self.store.runs.primary_reachable(), timeout)
            except (AgentrtError, TimeoutError) as exc:
                reachable, why = False, str(exc)
            else:
                why = "" if reachable else "the database answers as a standby (read-only)"
            if reachable == self.primary_serving:
                continue
            self.primary_serving = reachable
            status = health_pb2.HealthCheckResponse.SERVING if reachable else \
                health_pb2.HealthCheckResponse.NOT_SERVING
            for name in SERVICE_NAMES:
                await self._health.set(name, status)
            if reachable:
                log.info("a primary is reachable again: health SERVING")
            else:
                log.warning("no primary reachable (%s): health NOT_SERVING until one is", why)

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    async def stop(self, grace: float | None = None) -> None:
        if self._stopped:
            return
        self._stopped = True
        grace = self.settings.shutdown_grace_s if grace is None else grace
        if self._primary_watch is not None:
            self._primary_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._primary_watch
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self.firer is not None:
            await self.firer.stop()
        if self._server is not None:
            await self._server.stop(grace)
        if self.retention is not None:
            await self.retention.stop()
        if self.pruner is not None:
            await self.pruner.stop()
        if self.metrics is not None:
            await self.metrics.stop()
        if self.auth is not None and self.auth.jwt is not None:
            await self.auth.jwt.close()
        if self._notifier is not None:
            await self._notifier.stop()
        if self.store is not None:
            await self.store.pool.close()
            if self.store.work_pool is not self.store.pool:
                await self.store.work_pool.close()
        if self.settings.trace_sql:
            trace_queries(None)
        log.info("scheduler stopped")

    async def __aenter__(self) -> SchedulerServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()



async def serve(settings: SchedulerSettings) -> None:
    """Runs until SIGINT/SIGTERM, then shuts down in order."""
    server = SchedulerServer(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    try:
        await stop.wait()
    finally:
        await server.stop()
