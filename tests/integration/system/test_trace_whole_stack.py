"""One trace per tool step across the whole stack: a real `agentrt dev` session (scheduler, two
executors, relay and the mock tool server as processes) and a consumer process, all turned on by
OTEL_TRACES_EXPORTER=otlp and OTEL_EXPORTER_OTLP_ENDPOINT only, export to an in-process OTLP receiver.

A tool step's trace runs executor (agent.step) → the tool's HTTP call → scheduler (the RPC whose
transaction wrote the outbox row) → relay (publish, linked to that writer) → Kafka headers →
consumer (process); every hop carries the run's fencing token and version.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests_paths import REPO

from devstack.embedded_pg import free_port
from devstack.kafka_testing import kafka_for_tests
from devstack.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

SERVER, CLIENT, PRODUCER, CONSUMER = 2, 3, 4, 5  # opentelemetry.proto.trace.v1.Span.SpanKind
SERVICES = {"agentrt-scheduler", "agentrt-executor", "agentrt-relay", "agentrt-consumer"}


def stack_env(db_url: str, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGENTRT_", "OTEL_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    # The standard variables only: no agentrt tracing setting is set anywhere.
    return {**env, "AGENTRT_DATABASE_URL": db_url, "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_BSP_SCHEDULE_DELAY": "100"}


async def dev_session(env: dict[str, str], data_dir: Path, bootstrap: str) -> str:
    """`agentrt dev --runs 2 --exit-when-done` to its end (every process stopped, so their spans flushed)."""
    summary_path = data_dir.parent / "summary.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "dev", "--data-dir", str(data_dir), "--listen",
        f"127.0.0.1:{free_port()}", "--plain", "--tool-latency-ms", "5", "--runs", "2", "--auto-approve",
        "--exit-when-done", "--timeout", "90", "--kafka-bootstrap", bootstrap, "--summary-json", str(summary_path),
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 180)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    output = out.decode(errors="replace")
    assert proc.returncode == 0, output[-4000:]
    summary = json.loads(summary_path.read_text())
    assert summary["ok"] and summary["runs"]["by_status"] == {"COMPLETED": 2}, summary["runs"]
    return output


@contextlib.asynccontextmanager
async def consumer_process(env: dict[str, str], bootstrap: str, log: Path) -> AsyncIterator[None]:
    """devstack.acceptance.consumer_app (shared.client.consumer.EventConsumer) reading the session's events."""
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "devstack.acceptance.consumer_app", cwd=REPO, stdout=out, stderr=out,
            env={**env, "AGENTRT_KAFKA_BOOTSTRAP": bootstrap, "AGENTRT_GROUP_ID": "trace-test",
                 "AGENTRT_TOPICS": "agentrt.events", "AGENTRT_LOG_LEVEL": "WARNING"})
    try:
        yield
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def tool_step_chain(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan] | None:
    """A consumer span of an agent.tool_succeeded event whose ancestors are relay → scheduler → tool step."""
    by_id = {s.span_id: s for s in spans}
    for consumed in spans:
        if not (consumed.service == "agentrt-consumer" and consumed.kind == CONSUMER
                and consumed.name == "process agent.tool_succeeded"):
            continue
        publish = by_id.get(consumed.parent_span_id)
        writer = by_id.get(publish.parent_span_id) if publish is not None else None
        step = by_id.get(writer.parent_span_id) if writer is not None else None
        if publish is None or writer is None or step is None:
            continue
        if (publish.service, publish.kind, writer.service, writer.kind, step.service, step.name) == (
                "agentrt-relay", PRODUCER, "agentrt-scheduler", SERVER, "agentrt-executor", "agent.step"):
            return {"step": step, "writer": writer, "publish": publish, "consumer": consumed}
    return None


async def wait_for_chain(receiver: OtlpReceiver, within_s: float) -> dict[str, ReceivedSpan]:
    deadline = time.monotonic() + within_s
    while True:
        chain = tool_step_chain(receiver.spans)
        if chain is not None:
            return chain
        services = sorted({s.service for s in receiver.spans})
        assert time.monotonic() < deadline, f"no whole tool-step trace in {within_s:g}s; spans from {services}"
        await asyncio.sleep(0.2)


async def test_a_tool_steps_trace_runs_from_the_executor_to_the_consumer_with_the_fence_on_every_hop(
        db_url, db, tmp_path):
    with kafka_for_tests(tmp_path / "tansu.log") as (bootstrap, _broker):
        async with OtlpReceiver() as receiver:
            env = stack_env(db_url, receiver.grpc_endpoint)
            await dev_session(env, tmp_path / "dev", bootstrap)
            async with consumer_process(env, bootstrap, tmp_path / "consumer.log"):
                chain = await wait_for_chain(receiver, 60)
    spans = receiver.spans
    # OTEL_* alone turned export on in every service `agentrt dev` started, and in the consumer.
    assert SERVICES <= {s.service for s in spans}

    step, writer, publish, consumed = chain["step"], chain["writer"], chain["publish"], chain["consumer"]
    run_id, fence = step.attributes["agentrt.run_id"], step.attributes["agentrt.fencing_token"]
    assert isinstance(fence, int) and fence >= 1 and step.attributes["agentrt.tool"]
    assert {s.trace_id for s in chain.values()} == {step.trace_id}
    for hop in chain.values():
        assert hop.attributes["agentrt.run_id"] == run_id, hop.name
        assert hop.attributes["agentrt.fencing_token"] == fence, hop.name
        assert isinstance(hop.attributes["agentrt.run_version"], int), hop.name
    # The event's version is the one its writer's transaction made; the relay and consumer agree.
    version = writer.attributes["agentrt.run_version"]
    assert publish.attributes["agentrt.run_version"] == consumed.attributes["agentrt.run_version"] == version
    assert writer.name.rsplit("/", 1)[-1] in ("CompleteToolCall", "CompleteAndBeginToolCall")

    # The relay's publish span is the writer's child and links to it; the consumer continued from
    # the publish span through the record's traceparent header.
    assert (writer.trace_id, writer.span_id) in publish.links
    assert publish.name == "publish agentrt.events"
    for hop, operation in ((publish, "publish"), (consumed, "process")):
        assert hop.attributes["messaging.system"] == "kafka"
        assert hop.attributes["messaging.operation"] == operation
        assert hop.attributes["messaging.destination.name"] == "agentrt.events"
        assert hop.attributes["messaging.kafka.message.key"] == run_id
        assert isinstance(hop.attributes["messaging.kafka.destination.partition"], int)
    assert publish.attributes["messaging.message.id"] == consumed.attributes["messaging.message.id"]

    # The tool call's HTTP span: the step's child, with the fence and the ledger's idempotency key.
    [http] = [s for s in spans if s.parent_span_id == step.span_id and s.kind == CLIENT]
    assert http.attributes["http.request.method"] == "POST" and http.attributes["http.response.status_code"] == 200
    assert http.attributes["agentrt.fencing_token"] == fence
    key = await db.fetchval("SELECT idempotency_key FROM tool_executions WHERE run_id = $1 AND step_key = $2",
                            run_id, step.attributes["agentrt.step_key"])
    assert key and http.attributes["agentrt.idempotency_key"] == key
    # The scheduler's RPC spans follow the RPC conventions.
    assert writer.attributes["rpc.system"] == "grpc" and writer.attributes["rpc.service"] == "agentrt.v1.WorkService"
