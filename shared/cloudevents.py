"""Agent events as CloudEvents in the Kafka protocol binding, binary mode.

The relay encodes an outbox row with `encode_headers`; consumers decode a Kafka
record with `AgentEvent.from_record`. Both directions live here so the header
names have one spelling.

Binary mode: the payload is the Kafka value (JSON), every CloudEvents attribute
is a `ce_<name>` header, `content-type` carries the data content type. agentrt's
own attributes are CloudEvents extensions (lowercase, alphanumeric):
`ce_tenantid`, `ce_fencingtoken`, `ce_runversion`, and `ce_sequence` (the
outbox id, zero-padded so it sorts as text; within one run it grows in commit
order). Trace context travels twice: as plain W3C `traceparent` / `tracestate`
headers, the hop's context as OpenTelemetry's Kafka propagation expects (the
relay's publish span when it records spans), and as the CloudEvents
distributed-tracing extension (`ce_traceparent` / `ce_tracestate`), the
writing transaction's context, unchanged across hops as that extension asks.
The Kafka key is `ce_subject` (a run id; an audited object's id for audit
events), so one subject's events share a partition. The contract:
docs/events/asyncapi.yaml.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

SPEC_VERSION = "1.0"
CONTENT_TYPE = "application/json"

H_SPECVERSION = "ce_specversion"
H_ID = "ce_id"
H_SOURCE = "ce_source"
H_TYPE = "ce_type"
H_SUBJECT = "ce_subject"
H_TIME = "ce_time"
H_CONTENT_TYPE = "content-type"
H_TENANT = "ce_tenantid"
H_FENCING_TOKEN = "ce_fencingtoken"
H_RUN_VERSION = "ce_runversion"
H_SEQUENCE = "ce_sequence"
H_TRACEPARENT = "traceparent"
H_TRACESTATE = "tracestate"
# The distributed-tracing extension attributes in binary mode.
H_CE_TRACEPARENT = "ce_traceparent"
H_CE_TRACESTATE = "ce_tracestate"

_SEQUENCE_DIGITS = 20  # bigint fits; never change: consumers compare it as text

Headers = list[tuple[str, bytes]]


class MalformedEvent(ValueError):
    """A Kafka record that is not an agentrt CloudEvent (missing or unreadable attribute)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def format_sequence(outbox_id: int) -> str:
    return str(outbox_id).zfill(_SEQUENCE_DIGITS)


def format_time(value: dt.datetime) -> str:
    """RFC 3339 in UTC, always with microseconds (the relay has PostgreSQL format it the same way)."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_SPEC_VERSION_BYTES = SPEC_VERSION.encode()
_CONTENT_TYPE_BYTES = CONTENT_TYPE.encode()


def encode_headers(*, event_id: uuid.UUID | str, event_type: str, source: str, run_id: uuid.UUID | str,
                   time: dt.datetime | str, tenant_id: str, fencing_token: int, run_version: int,
                   outbox_id: int, traceparent: str | None, tracestate: str | None,
                   creation: tuple[str | None, str | None] | None = None) -> Headers:
    """`time` is a datetime or text already in `format_time`'s form. Runs once per event in the relay.

    `traceparent`/`tracestate`: the hop's context (plain headers); `creation`: the writing
    transaction's (the `ce_` extension headers), by default the same."""
    headers: Headers = [
        (H_SPECVERSION, _SPEC_VERSION_BYTES),
        (H_ID, str(event_id).encode()),
        (H_SOURCE, source.encode()),
        (H_TYPE, event_type.encode()),
        (H_SUBJECT, str(run_id).encode()),
        (H_TIME, (time if isinstance(time, str) else format_time(time)).encode()),
        (H_CONTENT_TYPE, _CONTENT_TYPE_BYTES),
        (H_TENANT, tenant_id.encode()),
        (H_FENCING_TOKEN, str(fencing_token).encode()),
        (H_RUN_VERSION, str(run_version).encode()),
        (H_SEQUENCE, str(outbox_id).zfill(_SEQUENCE_DIGITS).encode()),
    ]
    if traceparent:
        headers.append((H_TRACEPARENT, traceparent.encode()))
        if tracestate:
            headers.append((H_TRACESTATE, tracestate.encode()))
    origin, origin_state = creation if creation is not None else (traceparent, tracestate)
    if origin:
        headers.append((H_CE_TRACEPARENT, origin.encode()))
        if origin_state:
            headers.append((H_CE_TRACESTATE, origin_state.encode()))
    return headers


@dataclass(frozen=True)
class AgentEvent:
    """One agent event as a consumer sees it."""

    id: uuid.UUID
    type: str
    source: str
    subject: str
    time: dt.datetime
    specversion: str
    datacontenttype: str
    run_id: uuid.UUID  # the subject as a UUID: a run's id, or for an audit event the audited object's
    tenant_id: str
    fencing_token: int
    run_version: int
    sequence: int
    payload: Any
    traceparent: str | None = None
    tracestate: str | None = None
    # Where it was read from (not part of the event's identity).
    topic: str = ""
    partition: int = -1
    offset: int = -1
    headers: dict[str, str] = field(default_factory=dict, repr=False)

    def trace_carrier(self) -> dict[str, str]:
        carrier = {}
        if self.traceparent:
            carrier[H_TRACEPARENT] = self.traceparent
            if self.tracestate:
                carrier[H_TRACESTATE] = self.tracestate
        return carrier

    @classmethod
    def from_kafka(cls, *, headers: Sequence[tuple[str, bytes | None]], value: bytes | None,
                   topic: str = "", partition: int = -1, offset: int = -1) -> AgentEvent:
        text: dict[str, str] = {}
        for name, raw in headers:
            if raw is None:
                continue
            try:
                text[name] = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedEvent(f"header {name} is not UTF-8") from None

        def need(name: str) -> str:
            if name not in text or not text[name]:
                raise MalformedEvent(f"missing header {name}")
            return text[name]

        def need_int(name: str) -> int:
            try:
                return int(need(name))
            except ValueError:
                raise MalformedEvent(f"header {name} is not an integer: {text[name]!r}") from None

        if need(H_SPECVERSION) != SPEC_VERSION:
            raise MalformedEvent(f"unsupported {H_SPECVERSION} {text[H_SPECVERSION]!r}")
        try:
            event_id = uuid.UUID(need(H_ID))
            run_id = uuid.UUID(need(H_SUBJECT))
        except ValueError as exc:
            raise MalformedEvent(f"ce_id/ce_subject must be UUIDs: {exc}") from None
        try:
            time = dt.datetime.fromisoformat(need(H_TIME).replace("Z", "+00:00"))
        except ValueError:
            raise MalformedEvent(f"header {H_TIME} is not RFC 3339: {text[H_TIME]!r}") from None
        content_type = text.get(H_CONTENT_TYPE, CONTENT_TYPE)
        try:
            payload = json.loads(value) if value else None
        except ValueError as exc:
            raise MalformedEvent(f"payload is not JSON: {exc}") from None
        return cls(
            id=event_id, type=need(H_TYPE), source=need(H_SOURCE), subject=str(run_id), time=time,
            specversion=SPEC_VERSION, datacontenttype=content_type, run_id=run_id,
            tenant_id=need(H_TENANT), fencing_token=need_int(H_FENCING_TOKEN),
            run_version=need_int(H_RUN_VERSION), sequence=need_int(H_SEQUENCE), payload=payload,
            traceparent=text.get(H_TRACEPARENT), tracestate=text.get(H_TRACESTATE),
            topic=topic, partition=partition, offset=offset, headers=text)

    @classmethod
    def from_record(cls, record: Any) -> AgentEvent:
        """From an aiokafka ConsumerRecord."""
        return cls.from_kafka(headers=record.headers or (), value=record.value, topic=record.topic,
                              partition=record.partition, offset=record.offset)
