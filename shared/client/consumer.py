"""The exactly-once consumer library for downstream services.

Kafka delivers at least once (the relay may publish an event twice); this
library makes the *effect* happen once. For every event, a PostgreSQL
transaction inserts (consumer_name, event_id) into consumed_events and runs the
handler's own writes on the same connection; a conflict on that insert means
the event was already applied, so the handler is skipped. The Kafka offset is
committed only after the database commit: a crash in between redelivers the
event, and the dedupe row turns the redelivery into a skip.

Consecutive events of one partition are applied up to `apply_batch_max` to a
transaction, each under its own savepoint (one commit, and one synchronous
replication round trip, for the lot): a handler that raises undoes only its own
writes, the events before it commit, and it goes on alone as below. A lost
database loses the whole batch uncommitted, and it is applied again.

A handler that raises is retried with backoff; after `max_attempts` (or at
once for `PermanentFailure`) the event goes to the dead-letter topic with the
reason, and the partition moves on. A lost database is not the handler's
fault: it is retried without counting attempts and never dead-letters.

The handler runs inside a CONSUMER span whose parent is the span that wrote
the outbox row (the `traceparent` header), so the trace continues from the
writing transaction.

Usage:

    async def apply(event: AgentEvent, conn: asyncpg.Connection) -> None:
        await conn.execute("INSERT INTO my_table ...", event.run_id, ...)

    consumer = EventConsumer(ConsumerSettings(group_id="billing"), apply)
    await consumer.start()
    await consumer.run(stopping)      # until stopping is set
    await consumer.stop()

What it does not do: a handler that calls an external API must make that
call idempotent itself (the dedupe row covers only writes in this transaction).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import ConsumerStoppedError, KafkaError
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from shared.cloudevents import AgentEvent, MalformedEvent
from shared.db import CONNECTION_ERRORS, PRIMARY_LOST, count_connection, expire_stale
from shared.kafka_client import KafkaClientSettings
from shared.tracing import FENCING_TOKEN, RUN_ID, RUN_VERSION, TENANT, extract_context

log = logging.getLogger(__name__)

Handler = Callable[[AgentEvent, asyncpg.Connection], Awaitable[None]]

# The two statements of the protocol. (Inline rather than a .sql file: the
# shared package ships no data files.)
SQL_CLAIM_EVENT = """
INSERT INTO consumed_events (consumer_name, event_id) VALUES ($1, $2)
ON CONFLICT (consumer_name, event_id) DO NOTHING
RETURNING true
"""
# For a downstream service on its own database (agentrt's migrations create it too).
SQL_CREATE_CONSUMED_EVENTS = """
CREATE TABLE IF NOT EXISTS consumed_events (
  consumer_name text NOT NULL,
  event_id uuid NOT NULL,
  consumed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (consumer_name, event_id)
);
CREATE INDEX IF NOT EXISTS consumed_events_consumed_at_idx ON consumed_events (consumed_at);
"""

DLQ_REASON = "agentrt_dlq_reason"
DLQ_CONSUMER = "agentrt_dlq_consumer"
DLQ_ATTEMPTS = "agentrt_dlq_attempts"
DLQ_ORIGIN = "agentrt_dlq_origin"  # topic/partition/offset

# The database or its primary is gone (from asyncpg, inside or outside the handler): retry, never
# dead-letter. shared.db's one table: connection loss, admin shutdown, a standby's `read-only
# transaction`, no primary among a multi-host DSN's hosts.
_DB_LOST: tuple[type[BaseException], ...] = PRIMARY_LOST
# Outside the handler (pool, dedupe insert, commit) socket errors mean the same.
_DB_UNAVAILABLE: tuple[type[BaseException], ...] = CONNECTION_ERRORS


class _HandlerFailed(Exception):
    """The handler's own exception (in __cause__), told apart from a lost database."""


class PermanentFailure(Exception):
    """Raised by a handler for an event that will never succeed: dead-letter it without retries."""


class ConsumerSettings(KafkaClientSettings):
    section: ClassVar[str] = "consumer"

    database_url: str = "postgresql://postgres@127.0.0.1:5432/agentrt"
    # AGENTRT_TOPICS="a,b" (comma-separated) or a list in the config file.
    topics: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["agentrt.events"])
    group_id: str = "agentrt-consumer"
    service_name: str = "agentrt-consumer"
    # The dedupe identity; defaults to group_id. Never change it for a live
    # consumer: every event would look new to it.
    consumer_name: str | None = None
    dead_letter_topic: str = "agentrt.events.dlq"
    max_attempts: int = Field(5, ge=1)
    # Consecutive events of a partition applied in one transaction (each under a savepoint);
    # 1: a transaction per event.
    apply_batch_max: int = Field(100, ge=1)
    retry_backoff_base_ms: int = Field(200, ge=1)
    retry_backoff_cap_ms: int = Field(10_000, ge=1)
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    fetch_max_wait_ms: int = Field(100, ge=0)
    max_poll_records: int = Field(500, ge=1)
    session_timeout_ms: int = Field(10_000, ge=1_000)
    heartbeat_interval_ms: int = Field(3_000, ge=100)
    db_pool_min: int = Field(1, ge=1)
    db_pool_max: int = Field(8, ge=1)
    startup_timeout_s: float = Field(15.0, gt=0)

    @field_validator("topics", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @property
    def dedupe_name(self) -> str:
        return self.consumer_name or self.group_id


def _failed(span: trace.Span, exc: BaseException) -> None:
    cause = exc.__cause__ if isinstance(exc, _HandlerFailed) and exc.__cause__ else exc
    span.record_exception(cause)
    span.set_status(Status(StatusCode.ERROR, f"{type(cause).__name__}: {cause}"))


@dataclass
class ConsumerStats:
    applied: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    handler_failures: int = 0
    commit_failures: int = 0


class _WaitForBatch(ConsumerRebalanceListener):  # type: ignore[misc]
    """Before partitions are taken away, let the batch in hand finish and commit."""

    def __init__(self, lock: asyncio.Lock) -> None:
        self._lock = lock

    async def on_partitions_revoked(self, revoked: Any) -> None:
        async with self._lock:
            pass

    async def on_partitions_assigned(self, assigned: Any) -> None:
        # Operators (and the acceptance suite's broker-restart experiment) read this line to see a rejoin.
        log.info("partitions assigned: %s", ",".join(sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned)))


class EventConsumer:
    def __init__(self, settings: ConsumerSettings, handler: Handler, *, pool: asyncpg.Pool | None = None,
                 tracer_provider: Any = None) -> None:
        self.settings = settings
        self.handler = handler
        self.stats = ConsumerStats()
        self._pool = pool
        self._owns_pool = pool is None
        self._tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer("agentrt.consumer")
        self._consumer: AIOKafkaConsumer | None = None
        self._dlq: AIOKafkaProducer | None = None
        self._batch_lock = asyncio.Lock()
        self._stopping = asyncio.Event()

    @property
    def pool(self) -> asyncpg.Pool:
        assert self._pool is not None, "start() first"
        return self._pool

    async def ensure_schema(self) -> None:
        """Creates consumed_events if missing (a downstream service's own database)."""
        async with self.pool.acquire() as conn:
            await conn.execute(SQL_CREATE_CONSUMED_EVENTS)

    async def start(self) -> None:
        s = self.settings
        if self._pool is None:
            self._pool = await asyncpg.create_pool(s.database_url, min_size=s.db_pool_min, max_size=s.db_pool_max,
                                                    init=count_connection)
        common = s.kafka_client_kwargs()
        consumer = AIOKafkaConsumer(
            **common, group_id=s.group_id, enable_auto_commit=False, auto_offset_reset=s.auto_offset_reset,
            fetch_max_wait_ms=s.fetch_max_wait_ms, max_poll_records=s.max_poll_records,
            session_timeout_ms=s.session_timeout_ms, heartbeat_interval_ms=s.heartbeat_interval_ms)
        dlq = AIOKafkaProducer(**common, acks="all", enable_idempotence=False)
        try:
            await asyncio.wait_for(consumer.start(), s.startup_timeout_s)
            await asyncio.wait_for(dlq.start(), s.startup_timeout_s)
        except BaseException:
            for client in (consumer, dlq):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.stop(), 2)
            if self._owns_pool:
                await self._pool.close()
            raise
        consumer.subscribe(s.topics, listener=_WaitForBatch(self._batch_lock))
        self._consumer, self._dlq = consumer, dlq

    async def run(self, stopping: asyncio.Event | None = None) -> None:
        """Consumes until `stopping` is set (or stop() is called)."""
        assert self._consumer is not None, "start() first"
        consumer = self._consumer
        while not self._stopping.is_set() and not (stopping is not None and stopping.is_set()):
            try:
                batches = await consumer.getmany(timeout_ms=200)
            except ConsumerStoppedError:
                return
            if not batches:
                continue
            async with self._batch_lock:
                results = await asyncio.gather(*(self._consume_partition(tp, records, stopping)
                                                 for tp, records in batches.items()))
                offsets = {tp: next_offset for tp, next_offset in results if next_offset is not None}
                if offsets:
                    await self._commit(offsets)

    async def _consume_partition(self, tp: TopicPartition, records: list[Any],
                                 stopping: asyncio.Event | None) -> tuple[TopicPartition, int | None]:
        next_offset: int | None = None
        i = 0
        while i < len(records) and not self._stopped(stopping):
            chunk = records[i:i + self.settings.apply_batch_max]
            applied, failure = await self._apply_batch(chunk)
            if applied:
                i += applied
                next_offset = records[i - 1].offset + 1
            if applied == len(chunk) or i >= len(records):
                continue
            # records[i] goes alone: malformed, its handler failed in the batch, or the batch was lost.
            if not await self._consume_one(records[i], stopping, failure):
                break
            next_offset = records[i].offset + 1
            i += 1
        return tp, next_offset

    def _stopped(self, stopping: asyncio.Event | None) -> bool:
        return self._stopping.is_set() or (stopping is not None and stopping.is_set())

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        assert self._consumer is not None
        try:
            await self._consumer.commit(offsets)
        except (KafkaError, OSError) as exc:
            # The database already holds the effects; redelivery will be deduped.
            self.stats.commit_failures += 1
            log.warning("offset commit failed (%s); those events will be redelivered and skipped", exc)

    def _backoff(self, attempt: int) -> float:
        s = self.settings
        delay = min(s.retry_backoff_cap_ms, s.retry_backoff_base_ms * 2 ** min(attempt - 1, 30))
        return delay / 1000 * (0.5 + random.random() / 2)

    async def _pause(self, seconds: float, stopping: asyncio.Event | None) -> bool:
        """Sleeps; False if asked to stop meanwhile."""
        waits = [asyncio.ensure_future(self._stopping.wait())]
        if stopping is not None:
            waits.append(asyncio.ensure_future(stopping.wait()))
        try:
            done, _ = await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
        return not done

    async def _consume_one(self, record: Any, stopping: asyncio.Event | None,
                           first_failure: _HandlerFailed | None = None) -> bool:
        """Applies, skips or dead-letters one record. False: stopped before it was settled.
        `first_failure`: its handler already failed once in a batch (that was attempt 1)."""
        try:
            event = AgentEvent.from_record(record)
        except MalformedEvent as exc:
            return await self._dead_letter(record, f"malformed event: {exc.problem}", 0, stopping)
        attempt = 0
        db_failures = 0
        while True:
            attempt += 1
            try:
                if first_failure is not None:
                    earlier, first_failure = first_failure, None
                    raise earlier
                await self._apply(event)
                return True
            except _DB_UNAVAILABLE as exc:
                attempt -= 1
                db_failures += 1
                await expire_stale(exc, self._pool)
                log.warning("database unavailable while applying %s (%s); retrying", event.id, exc)
                if not await self._pause(self._backoff(db_failures), stopping):
                    return False
            except _HandlerFailed as failed:
                cause = failed.__cause__
                assert cause is not None
                if isinstance(cause, PermanentFailure):
                    return await self._dead_letter(record, f"PermanentFailure: {cause}", attempt, stopping)
                self.stats.handler_failures += 1
                reason = f"{type(cause).__name__}: {cause}"
                if attempt >= self.settings.max_attempts:
                    return await self._dead_letter(record, reason, attempt, stopping)
                log.warning("handler failed on event %s (attempt %d/%d): %s", event.id, attempt,
                            self.settings.max_attempts, reason)
                if not await self._pause(self._backoff(attempt), stopping):
                    return False

    def _span(self, event: AgentEvent) -> trace.Span:
        """The CONSUMER span of one event, a child of the span that wrote its outbox row."""
        attributes: dict[str, Any] = {
            "messaging.system": "kafka", "messaging.operation": "process", "messaging.operation.type": "process",
            "messaging.operation.name": "process", "messaging.destination.name": event.topic,
            "messaging.kafka.message.offset": event.offset, "messaging.kafka.message.key": str(event.run_id),
            "messaging.destination.partition.id": str(event.partition),
            "messaging.kafka.destination.partition": event.partition, "messaging.message.id": str(event.id),
            "messaging.consumer.group.name": self.settings.group_id, "cloudevents.event_type": event.type,
            RUN_ID: str(event.run_id), TENANT: event.tenant_id, FENCING_TOKEN: event.fencing_token,
            RUN_VERSION: event.run_version,
        }
        return self._tracer.start_span(
            f"process {event.type}", context=extract_context(event.trace_carrier()), kind=SpanKind.CONSUMER,
            attributes=attributes, record_exception=False, set_status_on_exception=False)

    async def _claim_and_handle(self, conn: asyncpg.Connection, event: AgentEvent, span: trace.Span) -> bool:
        """The dedupe row, then the handler, on `conn` (inside the caller's transaction). True: applied;
        False: applied before (skipped). The handler's own exception comes out as _HandlerFailed."""
        if not await conn.fetchval(SQL_CLAIM_EVENT, self.settings.dedupe_name, event.id):
            span.set_attribute("agentrt.duplicate", True)
            return False
        try:
            await self.handler(event, conn)
        except _DB_LOST:
            raise
        except Exception as exc:
            raise _HandlerFailed() from exc
        return True

    async def _apply(self, event: AgentEvent) -> None:
        """One event in a transaction of its own."""
        span = self._span(event)
        with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
            try:
                async with self.pool.acquire() as conn, conn.transaction():
                    applied = await self._claim_and_handle(conn, event, span)
            except Exception as exc:
                _failed(span, exc)
                raise
            self._count(span, applied)

    async def _apply_batch(self, records: list[Any]) -> tuple[int, _HandlerFailed | None]:
        """Applies the leading well-formed events of `records` in one transaction, each under a savepoint.
        Returns how many committed, and the handler failure of the next one if that is where it stopped.
        (0, None): nothing committed (fewer than two events, or the database was lost); go one at a time."""
        events: list[AgentEvent] = []
        for record in records:
            try:
                events.append(AgentEvent.from_record(record))
            except MalformedEvent:
                break
        if len(events) < 2:
            return 0, None
        done: list[tuple[trace.Span, bool]] = []
        failure: _HandlerFailed | None = None
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                for event in events:
                    span = self._span(event)
                    done.append((span, False))
                    with trace.use_span(span, end_on_exit=False, record_exception=False,
                                        set_status_on_exception=False):
                        try:
                            async with conn.transaction():  # a savepoint: a failure undoes this event's writes only
                                done[-1] = (span, await self._claim_and_handle(conn, event, span))
                        except _HandlerFailed as failed:
                            cause = failed.__cause__
                            _failed(span, cause if cause is not None else failed)
                            span.end()
                            done.pop()
                            failure = failed
                            break
        except BaseException as exc:
            for span, _ in done:
                _failed(span, exc)
                span.end()
            if isinstance(exc, _DB_UNAVAILABLE):
                await expire_stale(exc, self._pool)
                log.warning("database unavailable while applying a batch of %d events (%s); applying them again",
                            len(done), exc)
                return 0, None
            raise
        for span, applied in done:
            self._count(span, applied)
            span.end()
        return len(done), failure

    def _count(self, span: trace.Span, applied: bool) -> None:
        if applied:
            self.stats.applied += 1
            span.set_status(Status(StatusCode.OK))
        else:
            self.stats.duplicates += 1

    async def _dead_letter(self, record: Any, reason: str, attempts: int, stopping: asyncio.Event | None) -> bool:
        assert self._dlq is not None
        s = self.settings
        headers = [*(record.headers or ()),
                   (DLQ_REASON, reason[:4000].encode()), (DLQ_CONSUMER, s.dedupe_name.encode()),
                   (DLQ_ATTEMPTS, str(attempts).encode()),
                   (DLQ_ORIGIN, f"{record.topic}/{record.partition}/{record.offset}".encode())]
        failures = 0
        while True:
            try:
                await self._dlq.send_and_wait(s.dead_letter_topic, value=record.value, key=record.key,
                                              headers=headers)
                self.stats.dead_lettered += 1
                log.error("event at %s/%d/%d sent to %s after %d attempts: %s", record.topic, record.partition,
                          record.offset, s.dead_letter_topic, attempts, reason)
                return True
            except (KafkaError, OSError) as exc:
                failures += 1
                log.warning("dead-letter publish failed (%s); retrying", exc)
                if not await self._pause(self._backoff(failures), stopping):
                    return False

    async def stop(self) -> None:
        self._stopping.set()
        async with self._batch_lock:
            consumer, self._consumer = self._consumer, None
            dlq, self._dlq = self._dlq, None
        for client in (consumer, dlq):
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.stop(), 5)
        if self._owns_pool and self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def __aenter__(self) -> EventConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
