"""Pure pieces of the relay and the consumer library: CloudEvents codec, topics, partitioning, settings."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest
from aiokafka.partitioner import DefaultPartitioner
from pydantic import ValidationError

from relay.config import RelaySettings
from relay.publisher import partition_for
from shared.client.consumer import ConsumerSettings
from shared.cloudevents import AgentEvent, MalformedEvent, encode_headers


def _headers(**overrides):
    values = dict(event_id=uuid.uuid4(), event_type="agent.checkpoint", source="/agentrt", run_id=uuid.uuid4(),
                  time=dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC), tenant_id="t-1",
                  fencing_token=7, run_version=3, outbox_id=42,
                  traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", tracestate="k=v")
    values.update(overrides)
    return values, encode_headers(**values)


def test_cloudevents_round_trip():
    values, headers = _headers()
    event = AgentEvent.from_kafka(headers=headers, value=json.dumps({"a": 1}).encode(), topic="t", partition=2,
                                  offset=9)
    assert (event.id, event.type, event.source, event.run_id, event.subject) == (
        values["event_id"], "agent.checkpoint", "/agentrt", values["run_id"], str(values["run_id"]))
    assert event.time == values["time"]
    _, whole_second = _headers(time=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
    assert dict(whole_second)["ce_time"] == b"2026-01-02T03:04:05.000000Z"
    _, as_text = _headers(time="2026-01-02T03:04:05.000001Z")
    assert dict(as_text)["ce_time"] == b"2026-01-02T03:04:05.000001Z"
    assert (event.tenant_id, event.fencing_token, event.run_version, event.sequence) == ("t-1", 7, 3, 42)
    assert event.payload == {"a": 1} and event.datacontenttype == "application/json"
    assert event.trace_carrier() == {"traceparent": values["traceparent"], "tracestate": "k=v"}
    assert dict(headers)["ce_time"] == b"2026-01-02T03:04:05.123456Z"
    assert dict(headers)["ce_sequence"] == b"00000000000000000042"


def test_no_trace_headers_without_trace_context():
    _, headers = _headers(traceparent=None, tracestate="ignored")
    names = [name for name, _ in headers]
    assert not {"traceparent", "tracestate", "ce_traceparent", "ce_tracestate"} & set(names)


def test_trace_context_is_also_the_distributed_tracing_extension():
    """ce_traceparent/ce_tracestate: the writer's context (the event's creation); the plain headers: the hop's."""
    values, headers = _headers()
    assert (dict(headers)["ce_traceparent"], dict(headers)["ce_tracestate"]) == (
        values["traceparent"].encode(), b"k=v")
    writer = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
    _, hop = _headers(creation=(writer, None))
    assert dict(hop)["ce_traceparent"] == writer.encode() and "ce_tracestate" not in dict(hop)
    assert dict(hop)["traceparent"] == values["traceparent"].encode()


@pytest.mark.parametrize(("mutate", "problem"), [
    (lambda h: [x for x in h if x[0] != "ce_id"], "missing header ce_id"),
    (lambda h: [(n, b"0.3" if n == "ce_specversion" else v) for n, v in h], "unsupported ce_specversion"),
    (lambda h: [(n, b"x" if n == "ce_fencingtoken" else v) for n, v in h], "ce_fencingtoken is not an integer"),
    (lambda h: [(n, b"not-a-uuid" if n == "ce_subject" else v) for n, v in h], "must be UUIDs"),
    (lambda h: [(n, b"yesterday" if n == "ce_time" else v) for n, v in h], "is not RFC 3339"),
])
def test_malformed_events_say_what_is_wrong(mutate, problem):
    _, headers = _headers()
    with pytest.raises(MalformedEvent, match=problem):
        AgentEvent.from_kafka(headers=mutate(headers), value=b"{}")
    with pytest.raises(MalformedEvent, match="payload is not JSON"):
        AgentEvent.from_kafka(headers=headers, value=b"{")


def test_partition_matches_kafkas_default_partitioner():
    partitions = [0, 1, 2, 3, 4, 5]
    for _ in range(200):
        key = str(uuid.uuid4()).encode()
        assert partition_for(key, partitions) == DefaultPartitioner()(key, partitions, partitions)


def test_topic_policies_and_settings_validation():
    single = RelaySettings(topic="events")
    assert single.topic_for("agent.checkpoint") == "events"
    per_type = RelaySettings(topic="events", topic_policy="per_event_type")
    assert per_type.topic_for("agent.checkpoint") == "events.agent.checkpoint"
    assert per_type.topic_for("agent/odd type") == "events.agent_odd_type"
    with pytest.raises(ValidationError, match="topic_policy"):
        RelaySettings(topic_policy="round_robin")
    with pytest.raises(ValidationError, match="not host:port"):
        RelaySettings(kafka_bootstrap="a:1,b")
    with pytest.raises(ValidationError, match="max_batch_bytes"):
        RelaySettings(max_message_bytes=2_000_000)
    with pytest.raises(ValidationError, match="SASL"):
        RelaySettings(kafka_security_protocol="SASL_SSL")
    sasl = RelaySettings(kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism="SCRAM-SHA-256",
                         kafka_sasl_username="u", kafka_sasl_password="p")
    kwargs = sasl.kafka_client_kwargs()
    assert (kwargs["sasl_mechanism"], kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == (
        "SCRAM-SHA-256", "u", "p")
    assert ConsumerSettings(topics="a, b").topics == ["a", "b"]
    assert ConsumerSettings(group_id="billing").dedupe_name == "billing"
