"""The relay loop: claim → publish → mark (or park), one round at a time.

A round holds no database transaction or lock while it waits on Kafka: the
claim is a fenced read, the mark a separate statement after the broker's
acknowledgement. Kafka trouble means backoff and another round (re-sending
from the first unmarked row); repeated timeouts re-create the producer.

Waking: right after a round that found work the loop goes again; for
`busy_window_ms` after the last work it polls every `busy_poll_ms`; after that
it sets its `wants_wakeup` flag (so outbox inserts NOTIFY), looks once more,
and sleeps until a NOTIFY, a newly acquired shard, or `idle_poll_ms`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import time
from dataclasses import dataclass, field

from relay.config import FAULT_ACTIONS, FAULT_AFTER_ACK_BEFORE_MARK, FAULT_MID_BATCH, FAULT_POINTS, RelaySettings
from relay.leases import ShardLeases
from relay.publisher import KafkaUnreachable, Publisher
from relay.store import Lag, RelayStore
from relay.wakeup import OutboxListener
from shared.errors import Unavailable
from shared.faults import FaultArm, act, parse_fault_spec

log = logging.getLogger(__name__)


@dataclass
class RelayMetrics:
    published_total: int = 0
    parked_total: int = 0
    rounds: int = 0
    broker_failing_since: float | None = None
    last_broker_error: str | None = None
    producer_recreated: int = 0
    held_back_total: int = 0  # rows a round could not publish; each is sent again in a later round
    lag: Lag | None = None
    started: float = field(default_factory=time.monotonic)
    database_healthy: bool = True  # the last probe found a primary (RelayServer._report_health)

    @property
    def broker_healthy(self) -> bool:
        return self.broker_failing_since is None


def _die_here(point: str) -> None:
    log.error("fault point %s reached: SIGKILL self", point)
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)


async def _wait_any(events: list[asyncio.Event], stopping: asyncio.Event, seconds: float) -> None:
    waiters = [asyncio.ensure_future(e.wait()) for e in (*events, stopping)]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


class RelayLoop:
    def __init__(self, store: RelayStore, publisher: Publisher, leases: ShardLeases, listener: OutboxListener,
                 settings: RelaySettings, round_lock: asyncio.Lock, shards_acquired: asyncio.Event,
                 metrics: RelayMetrics) -> None:
        self.store = store
        self.publisher = publisher
        self.leases = leases
        self.listener = listener
        self.settings = settings
        self.round_lock = round_lock
        self.shards_acquired = shards_acquired
        self.metrics = metrics
        self._rounds_with_rows = 0
        self._wants_wakeup = False
        self._failures = 0
        self._failed_rounds = 0
        # The mark of the previous round runs while the next round claims and
        # publishes; its ids are kept out of that claim. At most one in flight.
        self._marking: asyncio.Task[None] | None = None
        self._marking_ids: list[int] = []
        self._fault_arm: FaultArm | None = None
        if settings.fault_point:  # tests only: fault_round is the default occurrence
            self._fault_arm = FaultArm(parse_fault_spec(settings.fault_point, FAULT_POINTS, FAULT_ACTIONS,
                                                        default_occurrence=settings.fault_round))

    def _backoff(self) -> float:
        s = self.settings
        delay = min(s.retry_backoff_cap_ms, s.retry_backoff_base_ms * 2 ** min(self._failures - 1, 30))
        return delay / 1000 * (0.5 + random.random() / 2)

    async def _fault(self, point: str) -> None:
        arm = self._fault_arm
        if arm is not None and arm.spec.point == point and arm.should_fire(occurrence=self._rounds_with_rows):
            if point == FAULT_MID_BATCH:
                await asyncio.sleep(0.005)  # let the first batch reach the wire
            if arm.spec.action == "sigstop":
                act("sigstop", point, f"round {self._rounds_with_rows}")
            else:
                _die_here(point)

    async def _set_wants_wakeup(self, wanted: bool) -> None:
        if self._wants_wakeup != wanted:
            await self.store.set_wants_wakeup(self.settings.relay_id, wanted)
            self._wants_wakeup = wanted

    async def finish_marking(self) -> None:
        """Waits for the mark in flight; raises Unavailable if it failed for good."""
        task, self._marking = self._marking, None
        self._marking_ids = []
        if task is not None:
            await task

    async def run_round(self, held: dict[int, int]) -> tuple[int, bool]:
        """One round. Returns (rows claimed, whether Kafka failed)."""
        s = self.settings
        self.listener.woken.clear()
        if self._marking is not None and self._marking.done():
            await self.finish_marking()
        # Acknowledged rows whose mark is still running: already in Kafka, so
        # leaving them out keeps each run's order and saves a duplicate.
        in_flight = self._marking_ids
        rows = await self.store.claim_batch(s.relay_id, held, s.shard_count, s.batch_size, in_flight)
        if not rows:
            return 0, False
        self._rounds_with_rows += 1
        self.metrics.rounds += 1
        if self._wants_wakeup:
            await self._set_wants_wakeup(False)

        async def after_send() -> None:
            await self._fault(FAULT_MID_BATCH)

        result = await self.publisher.publish(rows, after_send=after_send if s.fault_point else None)
        self.metrics.held_back_total += result.held_back
        if result.delivered:
            await self._fault(FAULT_AFTER_ACK_BEFORE_MARK)
            ids = [row.id for row in result.delivered]
            retried = [row.id for row in result.delivered if row.retrying]
            await self.finish_marking()
            self._marking_ids = ids
            self._marking = asyncio.create_task(self._mark(ids, retried), name="relay-mark")
            self.metrics.published_total += len(ids)
        for row, reason in result.refused:
            count = await self.store.park(row.id, reason, s.relay_id)
            if count is not None:
                self.metrics.parked_total += 1
                log.error("parked outbox row %d (event %s, run %s, %s): %s; the run's later events wait "
                          "until `agentrt outbox retry|skip %d`", row.id, row.event_id, row.run_id,
                          row.event_type, reason, row.id)
        if result.error is not None:
            self._failures += 1
            self._failed_rounds += 1
            if self.metrics.broker_failing_since is None:
                self.metrics.broker_failing_since = time.monotonic()
            self.metrics.last_broker_error = f"{type(result.error).__name__}: {result.error}"
            log.warning("Kafka publish failed (%s); %d rows wait for the next round",
                        self.metrics.last_broker_error, result.held_back)
            return len(rows), True
        self._failures = 0
        self._failed_rounds = 0
        if self.metrics.broker_failing_since is not None:
            log.info("Kafka is back after %.1fs", time.monotonic() - self.metrics.broker_failing_since)
            self.metrics.broker_failing_since = None
        return len(rows), False

    async def _mark(self, ids: list[int], retried: list[int]) -> None:
        # Acknowledged events must be marked; a lost database here only costs
        # duplicates later, so retry for a while rather than re-send at once.
        attempt = 0
        while True:
            try:
                await self.store.mark_published(ids, retried)
                return
            except Unavailable as exc:
                attempt += 1
                if attempt >= 20:
                    raise
                log.warning("cannot mark %d published rows yet (%s); retrying", len(ids), exc)
                await asyncio.sleep(min(0.05 * 2**attempt, 2.0))

    async def _heal_producer(self) -> None:
        # aiokafka retries inside a producer, but a producer can stay wedged on
        # dead connections (timeouts without end): after a few failed rounds in
        # a row, throw it away and connect anew.
        if self.publisher.connected and self._failed_rounds < self.settings.recreate_producer_after:
            return
        log.warning("re-creating the Kafka producer (%s)", "not connected" if not self.publisher.connected
                    else f"{self._failed_rounds} failed rounds in a row")
        try:
            await self.publisher.recreate()
            self.metrics.producer_recreated += 1
            self._failed_rounds = 0
        except KafkaUnreachable as exc:
            log.warning("%s", exc)

    async def run(self, stopping: asyncio.Event) -> None:
        try:
            await self._run(stopping)
        finally:
            try:
                await self.finish_marking()
            except Unavailable as exc:
                log.warning("last mark failed (%s); those events will be published again", exc)

    async def _run(self, stopping: asyncio.Event) -> None:
        s = self.settings
        last_work = time.monotonic()
        while not stopping.is_set():
            held = self.leases.usable()
            if not held:
                self.shards_acquired.clear()
                await _wait_any([self.shards_acquired], stopping, s.idle_poll_ms / 1000)
                continue
            try:
                async with self.round_lock:
                    claimed, failed = await self.run_round(held)
            except Unavailable as exc:
                self._failures += 1
                log.warning("relay round failed: %s", exc)
                await _wait_any([], stopping, self._backoff())
                continue
            if failed:
                await _wait_any([], stopping, self._backoff())
                await self._heal_producer()
                continue
            now = time.monotonic()
            if claimed:
                last_work = now
                continue
            if now - last_work < s.busy_window_ms / 1000:
                await _wait_any([self.listener.woken, self.shards_acquired], stopping, s.busy_poll_ms / 1000)
                continue
            if not self._wants_wakeup:
                try:
                    await self._set_wants_wakeup(True)
                except Unavailable as exc:
                    log.warning("cannot ask for wake-ups: %s", exc)
                continue  # one more look: a row may have committed before the flag did
            self.shards_acquired.clear()
            await _wait_any([self.listener.woken, self.shards_acquired], stopping, s.idle_poll_ms / 1000)

    async def report_lag(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.settings.lag_report_interval_s)
            if stopping.is_set():
                return
            try:
                lag = await self.store.lag()
            except Unavailable as exc:
                log.warning("cannot read outbox lag: %s", exc)
                continue
            self.metrics.lag = lag
            failing = self.metrics.broker_failing_since
            if failing is not None:
                log.warning("Kafka failing for %.0fs (%s): %d events waiting, oldest %.1fs, %d parked",
                            time.monotonic() - failing, self.metrics.last_broker_error, lag.pending,
                            lag.oldest_age_s, lag.parked)
            elif lag.pending or lag.parked:
                log.info("outbox lag: %d events waiting, oldest %.1fs, %d parked (%d ever); "
                         "this relay holds %d shards, published %d",
                         lag.pending, lag.oldest_age_s, lag.parked, lag.parked_total,
                         self.leases.held_count, self.metrics.published_total)
