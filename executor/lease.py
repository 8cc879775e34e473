"""One held lease: its local expiry estimate and the heartbeat task that keeps it.

The estimate is conservative: a lease renewed by a call sent at monotonic
time t is assumed to end at t + lease duration (the database set it later).
A refused heartbeat (LEASE_LOST, RUN_CANCELLED, ...) or an expiry that passes
while the scheduler cannot be reached cancels the run's work at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from executor.client import WorkClient
from executor.faults import Faults
from shared.errors import AgentrtError, Unavailable
from shared.gen.agentrt.v1 import work_service_pb2 as ws

log = logging.getLogger(__name__)


class HeldLease:
    def __init__(self, client: WorkClient, lease: ws.Lease, worker_id: str, *, fraction: float,
                 received_at: float, faults: Faults | None = None) -> None:
        self.client = client
        self.faults = faults
        self.run_id = lease.run.run_id
        self.ref = ws.LeaseRef(run_id=lease.run.run_id, worker_id=worker_id,
                               fencing_token=lease.run.fencing_token)
        self.duration_s = lease.lease_duration_ms / 1000
        interval = self.duration_s * fraction
        if lease.heartbeat_interval_ms:
            interval = min(interval, lease.heartbeat_interval_ms / 1000)
        self.interval_s = interval
        # The claim's own expiry was set before its answer arrived: keep a margin.
        self.expires_at = received_at + self.duration_s * 0.9
        self.lost: str | None = None
        self.lost_reason = ""  # the refusal's reason (LEASE_LOST, RUN_CANCELLED, ...) or UNAVAILABLE
        self._on_lost: Callable[[str], None] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def fencing_token(self) -> int:
        return self.ref.fencing_token

    def give_up_at(self) -> float:
        """Scheduler writes under this lease are pointless after it lapses."""
        return self.expires_at

    def alive(self) -> bool:
        return self.lost is None and time.monotonic() < self.expires_at

    def start(self, on_lost: Callable[[str], None]) -> None:
        self._on_lost = on_lost
        self._task = asyncio.create_task(self._beat(), name=f"heartbeat-{self.run_id}")

    def detach(self) -> None:
        self._on_lost = None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _lose(self, reason: str, why: str) -> None:
        if self.lost is None:
            self.lost = why
            self.lost_reason = reason
            log.warning("lease on run %s (fence %d) lost: %s", self.run_id, self.fencing_token, why)
            if self._on_lost is not None:
                self._on_lost(why)

    async def _beat(self) -> None:
        while self.lost is None:
            await asyncio.sleep(max(0.0, min(self.interval_s, self.expires_at - time.monotonic() - 0.05)))
            if self.faults is not None:
                self.faults.hit("before_heartbeat", self.run_id)
            sent = time.monotonic()
            try:
                await self.client.heartbeat(self.ref, give_up_at=self.expires_at)
            except Unavailable as exc:
                self._lose(exc.reason, f"heartbeat unanswered until the lease lapsed: {exc.message}")
                return
            except AgentrtError as exc:
                self._lose(exc.reason, f"{exc.reason}: {exc.message}")
                return
            self.expires_at = sent + self.duration_s
