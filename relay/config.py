"""Relay settings: env AGENTRT_*, or the `relay:` section of AGENTRT_CONFIG_FILE."""

from __future__ import annotations

import os
import re
import socket
import uuid
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from shared.faults import parse_fault_spec
from shared.kafka_client import KafkaClientSettings

# Fault points the relay can be told to die at (SIGKILL of itself), for tests.
FAULT_AFTER_ACK_BEFORE_MARK = "after_broker_ack_before_outbox_mark"
FAULT_MID_BATCH = "mid_batch_send"
FAULT_POINTS = (FAULT_AFTER_ACK_BEFORE_MARK, FAULT_MID_BATCH)
FAULT_ACTIONS = ("sigkill", "sigstop")

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def default_relay_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class RelaySettings(KafkaClientSettings):
    section: ClassVar[str] = "relay"
    service_name: str = "agentrt-relay"
    database_url: str = "postgresql://postgres@127.0.0.1:5432/agentrt"
    relay_id: str = Field(default_factory=default_relay_id)
    # The stock loop: under uvloop the bench's commit-to-consumer p99 rose from 89 to 157 ms
    # (aiokafka's timing), for no throughput the relay needs (it makes ~20,000 events/s either way).
    event_loop: Literal["auto", "asyncio", "uvloop"] = "asyncio"

    # single: every event to `topic`. per_event_type: to `<topic>.<event_type>`
    # (per-run order then holds within each topic, not across them).
    topic: str = "agentrt.events"
    topic_policy: Literal["single", "per_event_type"] = "single"
    cloudevents_source: str = "/agentrt"

    batch_size: int = Field(500, ge=1, le=10_000)
    # Largest single record (headers + key + value); a bigger row is parked.
    max_message_bytes: int = Field(1_048_576, ge=1_024)
    # Upper bound of one partition's record batch per round.
    max_batch_bytes: int = Field(1_048_576, ge=16_384)
    # Tansu refuses InitProducerId; turn on for a real Kafka cluster.
    enable_idempotence: bool = False

    shard_count: int = Field(16, ge=1, le=4096)
    shard_lease_ms: int = Field(15_000, ge=500, le=600_000)

    # Wake-up: poll fast while busy, sleep on LISTEN/NOTIFY when idle.
    busy_poll_ms: int = Field(5, ge=1)
    busy_window_ms: int = Field(250, ge=0)
    idle_poll_ms: int = Field(1_000, ge=10)

    retry_backoff_base_ms: int = Field(100, ge=1)
    retry_backoff_cap_ms: int = Field(10_000, ge=1)
    # Failed rounds in a row (timeouts, dead connections) after which the
    # producer is thrown away and re-created.
    recreate_producer_after: int = Field(3, ge=1)
    startup_timeout_s: float = Field(15.0, gt=0)

    published_retention_s: float = Field(7 * 86_400.0, ge=0)
    consumed_retention_s: float = Field(30 * 86_400.0, ge=0)
    retention_interval_s: float = Field(60.0, gt=0)
    retention_batch_size: int = Field(1_000, ge=1, le=100_000)

    lag_report_interval_s: float = Field(10.0, gt=0)
    health_addr: str = "0.0.0.0:50053"
    db_pool_min: int = Field(1, ge=1)
    db_pool_max: int = Field(4, ge=2)
    db_command_timeout_s: float = Field(30.0, gt=0)
    shutdown_grace_s: float = Field(10.0, ge=0)

    # Tests only: the relay SIGKILLs itself at this point on round `fault_round` (a shared.faults
    # spec, e.g. after_broker_ack_before_outbox_mark@probability=0.05 or ...@action=sigstop).
    fault_point: str | None = None
    fault_round: int = Field(1, ge=1)

    @field_validator("topic")
    @classmethod
    def _topic_name(cls, value: str) -> str:
        if not _TOPIC.match(value) or value in {".", ".."}:
            raise ValueError("topic names use letters, digits, '.', '_' and '-' (at most 200)")
        return value

    @field_validator("fault_point")
    @classmethod
    def _known_fault(cls, value: str | None) -> str | None:
        if value:
            parse_fault_spec(value, FAULT_POINTS, FAULT_ACTIONS)
        return value or None

    @model_validator(mode="after")
    def _sizes(self) -> RelaySettings:
        if self.max_batch_bytes < self.max_message_bytes:
            raise ValueError("max_batch_bytes must be at least max_message_bytes")
        if self.retry_backoff_cap_ms < self.retry_backoff_base_ms:
            raise ValueError("retry_backoff_cap_ms must be at least retry_backoff_base_ms")
        return self

    def topic_for(self, event_type: str) -> str:
        if self.topic_policy == "single":
            return self.topic
        return f"{self.topic}.{re.sub(r'[^A-Za-z0-9._-]', '_', event_type)}"[:249]
