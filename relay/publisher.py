"""Publishes one round of outbox rows to Kafka, in record batches that succeed or fail whole.

Delivery is at least once and in order per run (docs/design.md §outbox-and-relay).

Per-run order rests on three facts:
- a run's events go to one partition (key = ce_subject = the outbox row's
  run_id, Kafka's murmur2 partitioner), in outbox id order;
- each round sends at most one record batch per partition and waits for every
  answer before the next round, and a Kafka record batch is appended whole or
  not at all, so a failure never leaves a hole with later events of the same
  run delivered after it;
- the next round starts again from the oldest unmarked row of every run, so a
  retry re-sends from the first event not known to be acknowledged. A batch
  that timed out may still land later: that is a duplicate of events already
  re-sent in order, never a first delivery out of order.

A row refused for good (over `max_message_bytes`, or a permanent broker error)
is reported for parking; the rest of its run in this round is held back. A
permanent error on a batch of several rows is narrowed down by sending that
partition's rows one at a time until the bad one is found.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from aiokafka.partitioner import murmur2
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from relay.config import RelaySettings
from relay.spans import PublishSpans, publish_tracer
from relay.store import OutboxRow
from shared.cloudevents import encode_headers
from shared.errors import Unavailable
from shared.kafka_client import is_permanent_record_error
from shared.sensitive import redact_sealed_text

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_Sent = tuple[TopicPartition, asyncio.Future[Any]]  # a batch handed to the producer, and its answer


class KafkaUnreachable(Unavailable):
    """No broker answered within the startup timeout."""

    reason = "KAFKA_UNREACHABLE"


@dataclass
class RoundResult:
    delivered: list[OutboxRow] = field(default_factory=list)
    refused: list[tuple[OutboxRow, str]] = field(default_factory=list)
    held_back: int = 0
    # The first transient failure of the round, if any (rows stay unpublished).
    error: BaseException | None = None


@dataclass
class _Batches:
    """One round's record batches: the builder and the rows appended to it, per partition."""

    builders: dict[TopicPartition, Any] = field(default_factory=dict)
    members: dict[TopicPartition, list[OutboxRow]] = field(default_factory=dict)


def partition_for(key: bytes, partitions: list[int]) -> int:
    """Kafka's default partitioner (murmur2), so Java clients agree on where a run lives."""
    return partitions[key_hash(key) % len(partitions)]


def key_hash(key: bytes) -> int:
    return int(murmur2(key) & 0x7FFFFFFF)


class Publisher:
    def __init__(self, settings: RelaySettings, tracer_provider: Any = None) -> None:
        self.settings = settings
        self._tracer_provider = tracer_provider  # None: the process's (setup_tracing)
        self._producer: AIOKafkaProducer | None = None
        # Partitions narrowed down one row per round after a permanent batch error:
        # value = rows still to try one by one.
        self._isolate: dict[TopicPartition, int] = {}
        # After a failed round the cluster may have changed under us (a broker
        # restarted, a leader moved): refresh metadata before sending again.
        # Tansu with memory storage even acknowledges, and then loses, records
        # sent with stale metadata to a topic its restarted process never created.
        self._metadata_stale = False
        # murmur2 in pure Python is the relay's costliest step per event; a run
        # has many events, so remember each run's hash.
        self._key_hash: dict[str, int] = {}
        # Publish spans only where spans are recorded (relay/spans.py); read at start().
        self._tracer: Any = None

    @property
    def connected(self) -> bool:
        return self._producer is not None

    def _new_producer(self) -> AIOKafkaProducer:
        s = self.settings
        return AIOKafkaProducer(
            **s.kafka_client_kwargs(),
            acks="all",
            enable_idempotence=s.enable_idempotence,
            max_request_size=s.max_batch_bytes + 65_536,
            max_batch_size=s.max_batch_bytes,
            linger_ms=0,
            retry_backoff_ms=min(s.retry_backoff_base_ms, 1_000),
        )

    async def start(self, within_s: float | None = None) -> None:
        """Connects; raises KafkaUnreachable if no broker answers in time."""
        self._tracer = publish_tracer(self._tracer_provider)
        timeout = self.settings.startup_timeout_s if within_s is None else within_s
        producer = self._new_producer()
        try:
            await asyncio.wait_for(producer.start(), timeout)
        except (KafkaError, OSError, TimeoutError) as exc:
            await _stop_quietly(producer)
            detail = "no answer" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            raise KafkaUnreachable(
                f"cannot reach Kafka at {self.settings.kafka_bootstrap} within {timeout:g}s ({detail})",
                bootstrap=self.settings.kafka_bootstrap) from None
        self._producer = producer

    async def recreate(self) -> None:
        """Throws the producer away (its connections and in-flight batches) and connects anew."""
        old, self._producer = self._producer, None
        if old is not None:
            await _stop_quietly(old)
        await self.start(within_s=self.settings.kafka_request_timeout_ms / 1000)

    async def stop(self) -> None:
        old, self._producer = self._producer, None
        if old is not None:
            await _stop_quietly(old, flush_timeout=5.0)

    async def publish(self, rows: list[OutboxRow], *,
                      after_send: Callable[[], Awaitable[None]] | None = None) -> RoundResult:
        """Sends one round; never raises for Kafka trouble (it is in the result)."""
        result = RoundResult()
        producer = self._producer
        if producer is None:
            result.error = Unavailable("no Kafka producer")
            result.held_back = len(rows)
            return result
        if self._metadata_stale and not await self._refresh_metadata(producer, result):
            result.held_back = len(rows)
            return result
        spans = PublishSpans(self._tracer) if self._tracer is not None else None
        batches = await self._build_batches(producer, rows, result, spans)
        sent = await self._send_batches(producer, batches, result, after_send)
        if sent:
            await self._settle(sent, batches.members, result)
        if spans is not None:
            spans.settle(result.delivered, result.error)
        if result.error is not None:
            self._metadata_stale = True
        return result

    async def _refresh_metadata(self, producer: AIOKafkaProducer, result: RoundResult) -> bool:
        """After a failed round: fresh cluster metadata first, or no round at all (the error is in `result`)."""
        try:
            refreshed = await producer.client.force_metadata_update()
        except (KafkaError, OSError, TimeoutError) as exc:
            refreshed, result.error = False, exc
        if not refreshed:
            result.error = result.error or KafkaConnectionError("metadata refresh failed")
            return False
        self._metadata_stale = False
        return True

    async def _build_batches(self, producer: AIOKafkaProducer, rows: list[OutboxRow],
                             result: RoundResult, spans: PublishSpans | None = None) -> _Batches:
        """Appends each row to its partition's one batch of the round, in order.

        A run whose row cannot go out this round (no partitions known, row too
        large, its partition's batch closed or full) has the rest of its rows
        held back, so nothing of a run is sent after a row that was not.
        """
        s = self.settings
        partitions: dict[str, list[int]] = {}
        batches = _Batches()
        builders, members = batches.builders, batches.members
        closed: set[TopicPartition] = set()
        blocked_runs: set[str] = set()
        hashes = self._key_hash
        if len(hashes) > 200_000:
            hashes.clear()

        for row in rows:
            if row.run_id in blocked_runs:
                result.held_back += 1
                continue
            topic = s.topic_for(row.event_type)
            if topic not in partitions:
                try:
                    partitions[topic] = sorted(await producer.partitions_for(topic))
                except (KafkaError, OSError, TimeoutError) as exc:
                    result.error = result.error or exc
                    partitions[topic] = []
            if not partitions[topic]:
                blocked_runs.add(row.run_id)
                result.held_back += 1
                continue
            key = row.run_id.encode()
            hashed = hashes.get(row.run_id)
            if hashed is None:
                hashed = hashes[row.run_id] = key_hash(key)
            topic_partitions = partitions[topic]
            tp = (topic, topic_partitions[hashed % len(topic_partitions)])
            value = redact_sealed_text(row.payload_json).encode()  # never a sealed value on Kafka
            traceparent, tracestate = row.traceparent, row.tracestate
            if spans is not None:
                traceparent, tracestate = spans.start(row, tp[0], tp[1])
            headers = encode_headers(
                event_id=row.event_id, event_type=row.event_type, source=s.cloudevents_source,
                run_id=row.run_id, time=row.time_text, tenant_id=row.tenant_id,
                fencing_token=row.fencing_token, run_version=row.run_version, outbox_id=row.id,
                traceparent=traceparent, tracestate=tracestate, creation=(row.traceparent, row.tracestate))
            size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)
            if size > s.max_message_bytes:
                reason = f"record is {size} bytes, over max_message_bytes {s.max_message_bytes}"
                result.refused.append((row, reason))
                if spans is not None:
                    spans.fail(row, reason)
                blocked_runs.add(row.run_id)
                continue
            if tp in closed:
                if spans is not None:
                    spans.fail(row, "batch closed: held back for a later round")
                blocked_runs.add(row.run_id)
                result.held_back += 1
                continue
            builder = builders.get(tp)
            if builder is None:
                builder = builders[tp] = producer.create_batch()
                members[tp] = []
            if builder.append(timestamp=row.created_ms, key=key, value=value, headers=headers) is None:
                # Batch full: this partition waits for the next round from here on.
                if spans is not None:
                    spans.fail(row, "batch full: held back for a later round")
                closed.add(tp)
                blocked_runs.add(row.run_id)
                result.held_back += 1
                continue
            members[tp].append(row)
            if tp in self._isolate:
                closed.add(tp)
        return batches

    async def _send_batches(self, producer: AIOKafkaProducer, batches: _Batches, result: RoundResult,
                            after_send: Callable[[], Awaitable[None]] | None) -> list[_Sent]:
        """Hands every batch to the producer; the answers are awaited together in `_settle`."""
        sent: list[_Sent] = []
        for tp, builder in batches.builders.items():
            try:
                future = await producer.send_batch(builder, tp[0], partition=tp[1])
            except (KafkaError, OSError, TimeoutError) as exc:
                result.error = result.error or exc
                result.held_back += len(batches.members[tp])
                continue
            sent.append((tp, future))
            if after_send is not None:
                await after_send()
                after_send = None
        return sent

    async def _settle(self, sent: list[_Sent], members: dict[TopicPartition, list[OutboxRow]],
                      result: RoundResult) -> None:
        """Waits for every batch's answer and sorts its rows: delivered, refused for good, or held back."""
        # aiokafka expires a batch after request_timeout; the guard only
        # catches a sender that stopped answering altogether.
        guard = self.settings.kafka_request_timeout_ms / 1000 * 2 + 5
        _, pending = await asyncio.wait([f for _, f in sent], timeout=guard)
        for future in pending:
            future.cancel()
        for tp, future in sent:
            rows_in_batch = members[tp]
            error: BaseException | None
            if future in pending:
                error = KafkaTimeoutError(f"no answer for {tp} within {guard:g}s")
            elif future.cancelled():
                error = asyncio.CancelledError()
            else:
                error = future.exception()
            if error is None:
                result.delivered.extend(rows_in_batch)
                self._note_success(tp)
            elif is_permanent_record_error(error):
                self._refused_batch(tp, rows_in_batch, error, result)
            else:
                result.error = result.error or error
                result.held_back += len(rows_in_batch)

    def _refused_batch(self, tp: TopicPartition, rows_in_batch: list[OutboxRow], error: BaseException,
                       result: RoundResult) -> None:
        """A permanent broker refusal: a lone row is parked; a batch is narrowed down one row per round."""
        if len(rows_in_batch) == 1:
            result.refused.append((rows_in_batch[0], f"broker refused: {type(error).__name__}: {error}"))
            self._isolate.pop(tp, None)
        else:
            log.warning("broker refused a batch of %d rows for %s (%s); "
                        "sending them one by one to find the bad one", len(rows_in_batch), tp, error)
            self._isolate[tp] = len(rows_in_batch)
            result.held_back += len(rows_in_batch)

    def _note_success(self, tp: TopicPartition) -> None:
        if tp in self._isolate:
            self._isolate[tp] -= 1
            if self._isolate[tp] <= 0:
                del self._isolate[tp]


async def _stop_quietly(producer: AIOKafkaProducer, flush_timeout: float = 2.0) -> None:
    # stop() flushes pending batches first; with the broker gone that can hang.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(producer.stop(), flush_timeout)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(producer.client.close(), 1.0)
