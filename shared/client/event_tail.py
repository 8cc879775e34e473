"""Reading agent events off a topic without a consumer group: `agentrt events tail` and `agentrt dev` use it.

Every partition of the topic is assigned directly (no group join, no committed
offsets: a reader that only watches must not move anyone's position, and a
group join on Tansu costs half a session timeout). `from_beginning=False`
means "events published after start()": the end of each partition at start, or
the beginning of a topic that did not exist yet when it appears.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from shared.cloudevents import AgentEvent, MalformedEvent
from shared.kafka_client import KafkaClientSettings

_METADATA_EVERY_S = 0.5


class KafkaUnreachable(Exception):
    """The bootstrap servers did not answer."""


@dataclass(frozen=True)
class Unreadable:
    """A record on the topic that is not an agentrt CloudEvent."""

    topic: str
    partition: int
    offset: int
    problem: str


def event_as_json(event: AgentEvent) -> dict[str, Any]:
    """CloudEvents JSON (attribute names as in the spec; agentrt's extensions lowercased) plus where it was read."""
    data: dict[str, Any] = {
        "specversion": event.specversion, "id": str(event.id), "source": event.source, "type": event.type,
        "subject": event.subject, "time": event.time.isoformat().replace("+00:00", "Z"),
        "datacontenttype": event.datacontenttype, "tenantid": event.tenant_id, "fencingtoken": event.fencing_token,
        "runversion": event.run_version, "sequence": event.sequence, "data": event.payload,
        "kafka": {"topic": event.topic, "partition": event.partition, "offset": event.offset},
    }
    if event.traceparent:
        data["traceparent"] = event.traceparent
    return data


class EventTail:
    def __init__(self, settings: KafkaClientSettings, topic: str, *, from_beginning: bool = False) -> None:
        self.settings = settings
        self.topic = topic
        self.from_beginning = from_beginning
        self._consumer: AIOKafkaConsumer | None = None
        self._assigned = False
        self._existed_at_start = False
        self._next_metadata_at = 0.0

    @property
    def assigned(self) -> bool:
        return self._assigned

    async def start(self) -> EventTail:
        consumer = AIOKafkaConsumer(**self.settings.kafka_client_kwargs(), group_id=None, enable_auto_commit=False,
                                    auto_offset_reset="earliest", fetch_max_wait_ms=100)
        try:
            await consumer.start()
        except KafkaError as exc:
            await consumer.stop()
            raise KafkaUnreachable(f"cannot reach Kafka at {self.settings.kafka_bootstrap} ({exc})") from None
        self._consumer = consumer
        self._existed_at_start = self.topic in await consumer.topics()
        await self._assign_if_there()
        return self

    async def _assign_if_there(self) -> None:
        assert self._consumer is not None
        if time.monotonic() < self._next_metadata_at:
            return
        self._next_metadata_at = time.monotonic() + _METADATA_EVERY_S
        # A metadata request for every topic: unlike asking for this one, it never auto-creates it.
        # (consumer.topics() does the same but throws the partition counts away.)
        cluster = await self._consumer._client.fetch_all_metadata()
        partitions = [TopicPartition(self.topic, p) for p in sorted(cluster.partitions_for_topic(self.topic) or ())]
        if not partitions:
            return
        self._consumer.assign(partitions)
        if self.from_beginning or not self._existed_at_start:
            await self._consumer.seek_to_beginning(*partitions)
        else:
            await self._consumer.seek_to_end(*partitions)
        self._assigned = True

    async def poll(self, timeout_s: float = 0.2) -> list[AgentEvent | Unreadable]:
        """What arrived within timeout_s (an empty list while the topic does not exist yet)."""
        assert self._consumer is not None, "start() first"
        if not self._assigned:
            await self._assign_if_there()
            if not self._assigned:
                await asyncio.sleep(min(timeout_s, _METADATA_EVERY_S))
                return []
        batches = await self._consumer.getmany(timeout_ms=int(timeout_s * 1000))
        out: list[AgentEvent | Unreadable] = []
        for records in batches.values():
            for record in records:
                try:
                    out.append(AgentEvent.from_record(record))
                except MalformedEvent as exc:
                    out.append(Unreadable(record.topic, record.partition, record.offset, exc.problem))
        return out

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
