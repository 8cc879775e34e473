"""The executor's worker: N run slots, claim loops, one heartbeat per held lease, ordered shutdown.

Start: adapters and deciders (a bad definition stops here) → the scheduler
channel → the agents registered (executor/registration.py) → health →
claimers. Shutdown order (SIGTERM): health NOT_SERVING → stop claiming and
starting steps (model calls are cancelled) → withdraw the agents → let in-flight tool calls and scheduler
writes finish for most of the grace period → cancel tool calls → cancel what
is left → close adapters, deciders and the channel. Leases left behind lapse
and are taken over. `stop()` is safe to call twice.

Supervision: the claimers and the registration refresh are awaited together
(`until_a_task_dies`, first completed, as Temporal's worker waits on its pollers).
One that ends while the executor serves would leave a process that looks
alive and claims or registers nothing, so `executor/main.py` stops the worker
and exits non-zero with one log line naming the task; the platform restarts it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import time
import uuid
from typing import Any

import aiohttp
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry import trace

from executor.agents import AgentCatalog
from executor.client import WorkClient
from executor.config import ExecutorSettings
from executor.deciders import DeciderRegistry
from executor.driver import RunDriver, Services
from executor.faults import Faults, InjectedCrash
from executor.lease import HeldLease
from executor.metrics import executor_metrics
from executor.registration import Registration
from executor.shutdown import Shutdown, Stopped
from executor.tools import ToolRegistry
from executor.tools.mcp import list_mcp_tools
from shared.errors import AgentrtError
from shared.logs import bind_run
from shared.metrics import Metrics
from shared.transport import open_channel

log = logging.getLogger(__name__)


class WorkerTaskDied(RuntimeError):
    """A claimer or the registration refresh ended while the executor was serving."""


class Worker:
    def __init__(self, settings: ExecutorSettings, catalog: AgentCatalog, faults: Faults | None = None,
                 tracer_provider: trace.TracerProvider | None = None) -> None:
        self.settings = settings
        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer("agentrt.executor")
        self.catalog = catalog
        self.faults = faults or Faults(settings.fault_points, settings.fault_action)
        self.worker_id = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.shutdown = Shutdown()
        self.active: dict[str, asyncio.Task[None]] = {}
        self.claimed = 0
        self.leases_lost = 0
        self.run_errors = 0
        self.renewal_failures: collections.Counter[str] = collections.Counter()  # refused heartbeats, by reason
        self.reconciler: Any = None  # the in-process Reconciler (executor/main.py), for its totals
        self.metrics_port: int | None = None
        self._exported_metrics: Metrics | None = None
        self.health_port: int | None = None
        self._slots = asyncio.Semaphore(settings.slots)
        self._claimers: list[asyncio.Task[None]] = []
        self._stopped = False
        self._channel: grpc.aio.Channel | None = None
        self._session: aiohttp.ClientSession | None = None
        self._health_server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None  # type: ignore[name-defined]
        self.services: Services | None = None
        self.registration: Registration | None = None
        self._registration_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        s = self.settings
        await list_mcp_tools(self.catalog)  # the MCP servers' tools join their agents' definitions
        agents = self.catalog.all()
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max(100, s.slots)))
        try:
            tools = ToolRegistry(agents, self._session, self.tracer)
            key = s.openai_api_key.get_secret_value() if s.openai_api_key else None
            deciders = DeciderRegistry(
                agents, self._session, key, self.tracer, prices=s.model_prices,
                anthropic_api_key=s.anthropic_api_key.get_secret_value() if s.anthropic_api_key else None)
        except BaseException:
            await self._session.close()
            raise
        self._channel = open_channel(s.scheduler_addr, s.scheduler_tls, options=[
            ("grpc.keepalive_time_ms", 30_000), ("grpc.max_receive_message_length", 64 << 20)])
        client = WorkClient(self._channel, rpc_timeout_s=s.rpc_timeout_s,
                            token=s.work_token.get_secret_value() if s.work_token else None,
                            batch=s.batch_writes, batch_max_items=s.batch_max_items,
                            batch_in_flight=s.batch_in_flight)
        self.services = Services(catalog=self.catalog, deciders=deciders, tools=tools, client=client,
                                 worker_id=self.worker_id, faults=self.faults, shutdown=self.shutdown,
                                 tracer=self.tracer)
        self.registration = Registration(client, self.catalog, self.worker_id, s.registration_ttl_ms, self.shutdown)
        try:
            # Before the first claim; the refresh task retries a failure, but a refused token ends us here.
            await self.registration.register_once(first=True)
        except BaseException:
            await self._channel.close()
            await self._session.close()
            raise
        self._registration_task = asyncio.create_task(self._refresh_registration(), name="agent-registration")
        await self._start_health()
        self._exported_metrics = executor_metrics(self)
        self.metrics_port = self._exported_metrics.serve(s.metrics_addr)
        self._exported_metrics.start_export(s)
        self._claimers = [asyncio.create_task(self._claim_loop(), name=f"claimer-{i}") for i in range(s.claimers)]
        log.info("executor %s serving %s with %d slots via %s", self.worker_id, ", ".join(self.catalog.names()),
                 s.slots, s.scheduler_addr)

    async def _refresh_registration(self) -> None:
        assert self.registration is not None
        self.faults.hit("before_registration_refresh")
        await self.registration.run()

    async def until_a_task_dies(self) -> WorkerTaskDied:
        """The first of the claimers and the registration refresh to end before shutdown, as the reason
        this executor must stop (each runs until `stop()` otherwise)."""
        tasks = [*self._claimers, *([self._registration_task] if self._registration_task else [])]
        assert tasks, "start() first"
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        task = min(done, key=tasks.index)
        if task.cancelled():
            why = "was cancelled"
        elif (error := task.exception()) is not None:
            why = f"died: {type(error).__name__}: {error}"
        else:
            why = "ended"
        return WorkerTaskDied(f"executor {self.worker_id}: task {task.get_name()} {why}; "
                              "stopping (exit 1) so that it is restarted")

    async def _start_health(self) -> None:
        if not self.settings.health_addr:
            return
        server = grpc.aio.server()
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        self.health_port = server.add_insecure_port(self.settings.health_addr)
        if not self.health_port:
            raise OSError(f"cannot listen on {self.settings.health_addr}")
        await server.start()
        self._health_server = server
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)

    async def _claim_loop(self) -> None:
        assert self.services is not None
        client, stopping = self.services.client, self.shutdown.stopping
        pause = 0.1
        while not stopping.is_set():
            self.faults.hit("before_claim")
            await self._slots.acquire()
            try:
                lease = await self.shutdown.race(
                    client.claim(self.worker_id, self.catalog.names(), self.settings.claim_wait_ms), stopping)
            except Stopped:
                self._slots.release()
                return
            except AgentrtError as exc:
                self._slots.release()
                log.warning("claim failed (%s); retrying in %.1fs", exc.message, pause)
                with contextlib.suppress(Stopped):
                    await self.shutdown.race(asyncio.sleep(pause), stopping)
                pause = min(pause * 2, 5.0)
                continue
            pause = 0.1
            if lease is None:
                self._slots.release()
                continue
            self.claimed += 1
            received = time.monotonic()
            held = HeldLease(client, lease, self.worker_id, fraction=self.settings.heartbeat_fraction,
                             received_at=received, faults=self.faults)
            driver = RunDriver(lease, held, self.services, received)
            task = asyncio.create_task(self._drive(driver, held), name=f"run-{lease.run.run_id}")
            self.active[lease.run.run_id] = task

    async def _drive(self, driver: RunDriver, held: HeldLease) -> None:
        task = asyncio.current_task()
        assert task is not None

        def on_lost(why: str) -> None:
            self.renewal_failures[held.lost_reason] += 1
            task.cancel()

        # Before the heartbeat task starts, so its records name the run too (each run is its own task).
        bind_run(run_id=held.run_id, tenant=driver.run.tenant_id, fencing_token=held.fencing_token)
        held.start(on_lost)
        try:
            self.faults.hit("after_claim_commit", held.run_id)
            await driver.run_lease()
        except asyncio.CancelledError:
            if held.lost is None and not self.shutdown.stopping.is_set():
                raise
            if held.lost is not None:
                self.leases_lost += 1
            log.warning("run %s: work cancelled (%s)", held.run_id, held.lost or "shutdown")
        except InjectedCrash as exc:
            log.error("run %s: abandoned at injected fault %s", held.run_id, exc)
        except Exception:
            self.run_errors += 1
            log.exception("run %s: executor error; the lease is left to lapse", held.run_id)
        finally:
            held.detach()  # from here on a failed heartbeat must not cancel this task
            self.active.pop(held.run_id, None)
            self._slots.release()
            await held.stop()

    async def stop(self, grace: float | None = None) -> None:
        if self._stopped:
            return
        self._stopped = True
        grace = self.settings.shutdown_grace_s if grace is None else grace
        deadline = time.monotonic() + grace
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        self.shutdown.begin_stopping()
        await asyncio.gather(*self._claimers, return_exceptions=True)
        if self._registration_task is not None:  # a refresh in flight is not waited for
            self._registration_task.cancel()
            await asyncio.gather(self._registration_task, return_exceptions=True)
        if self.registration is not None:
            await self.registration.withdraw()  # no new runs for agents nobody serves any more
        running = set(self.active.values())
        if running:
            _, running = await asyncio.wait(running, timeout=max(0.0, grace * 0.8))
        if running:
            self.shutdown.begin_hard_stop()
            _, running = await asyncio.wait(running, timeout=max(0.05, deadline - time.monotonic()))
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=1.0)
        if self.services is not None:
            await self.services.deciders.close()
            await self.services.tools.close()
        if self._session is not None:
            await self._session.close()
        if self.services is not None:
            await self.services.client.close()
        if self._channel is not None:
            await self._channel.close()
        if self._health_server is not None:
            await self._health_server.stop(0)
        if self._exported_metrics is not None:
            self._exported_metrics.stop()
        log.info("executor %s stopped", self.worker_id)

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
