"""The one sealing filter (scheduler/api/shield.py), swept: every RPC that names a run, and every free-text
and JSON field it takes, is called with a marked value planted in that field (directly, and each
WorkService write again as a WriteBatch item). Then no table (all of them, from the catalog, read raw
as superuser), outbox row, Kafka record, log line, exported span, metric point or Prometheus scrape
holds its bytes. The RPCs and their fields are enumerated by reflection over the service descriptors:
a new RPC, or a new text field, that this test does not plant fails it.

The instance that started it (issue 24, defect 1): a run ended by a CompleteToolCall `end` whose
reason quotes the card stored the reason in clear (FinishRun's was redacted)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from relay_support import TopicReader
from sealing_support import raw_tables
from support import TENANT, claim, eid, lease_ref, scheduler_stack, tool_state
from test_sensitive_whole_stack import env_for, scrape, stop_and_collect

from devstack.embedded_pg import free_port
from devstack.kafka_testing import kafka_for_tests
from devstack.otlp_receiver import OtlpReceiver
from devstack.services import Service
from scheduler.api.shield import _OTHER_RUNS, IDENTIFIER_FIELDS
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.gen.agentrt.v1 import work_service_pb2_grpc as ws_grpc
from shared.writes import WRITE_OPS

pytestmark = pytest.mark.integration

CARD = "4111-SWEEP-card-secret-5f0a"  # the run's marked input
PIN = "pin-SWEEP-signal-secret-77c3"  # a declared signal's marked field
OTP = "otp-SWEEP-resume-secret-19be"  # ResumeRun's marked input field
NEEDLES = (CARD, PIN, OTP)
TOPIC = "agentrt.events"

SCHEMA = {"type": "object", "properties": {"card": {"type": "string", "x-agentrt-sensitive": True},
                                           "amount": {"type": "integer"}}}
SENSITIVE = {"input": [["card"]], "tools": {"pay.charge": {"input": [["card"]], "output": [["token"]]}}}
SIGNALS = {"approve": {"type": "object", "required": ["n"],
                       "properties": {"pin": {"type": "string", "x-agentrt-sensitive": True},
                                      "n": {"type": "integer"}}}}
RESUME = {"type": "object", "properties": {"otp": {"type": "string", "x-agentrt-sensitive": True}}}


def keyring() -> str:
    return json.dumps({"current": "k1", "keys": {"k1": base64.b64encode(os.urandom(32)).decode()}})


# -- reflection: which RPCs and fields the filter must cover ---------------------------------------

SERVICES = (ws.DESCRIPTOR.services_by_name["WorkService"], rs.DESCRIPTOR.services_by_name["RunService"])
# RPCs whose request names no run: nothing of a run is known to seal there (SubmitRun and schedules
# seal their input's marked paths under a new key; RegisterAgents carries schemas, the admin RPCs
# keys and limits). WriteBatch is covered item by item.
NO_RUN = {"ClaimWork", "RegisterAgents", "WriteBatch", "SubmitRun", "ListRuns", "CreateSchedule",
          "UpdateSchedule", "PauseSchedule", "DeleteSchedule", "ListSchedules", "GetStats", "ListAgents",
          "CreateApiKey", "ListApiKeys", "RevokeApiKey", "SetLimit", "ClearLimit", "ListLimits"}


def text_fields(descriptor: Any, prefix: str = "") -> set[str]:
    """Every field path (without list indexes) of a message type that the filter must seal or redact:
    string fields that are not identifiers, and string-valued maps."""
    found: set[str] = set()
    for field in descriptor.fields:
        path = f"{prefix}{field.name}"
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                if field.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_STRING:
                    found.add(path)
            elif not field.message_type.full_name.startswith("google."):
                found |= text_fields(field.message_type, f"{path}.")
        elif field.type == FieldDescriptor.TYPE_STRING and field.name not in IDENTIFIER_FIELDS:
            found.add(path)
    return found


def names_a_run(descriptor: Any) -> bool:
    return "lease" in descriptor.fields_by_name or "run_id" in descriptor.fields_by_name


def required() -> dict[str, set[str]]:
    """{method: its text fields} for every RPC naming a run, and every WriteBatch op as "WriteBatch.<op>"."""
    need = {m.name: text_fields(m.input_type) for s in SERVICES for m in s.methods if names_a_run(m.input_type)}
    for op, method in WRITE_OPS.items():
        need[f"WriteBatch.{method}"] = text_fields(ws.WriteBatchItem.DESCRIPTOR.fields_by_name[op].message_type)
    return need


def planted_in(message: Message, prefix: str = "") -> set[str]:
    """The field paths of `message` that hold a needle."""
    found: set[str] = set()
    for field, value in message.ListFields():
        path = f"{prefix}{field.name}"
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                if any(isinstance(v, str) and any(n in v for n in NEEDLES) for v in value.values()):
                    found.add(path)
            else:
                for item in (value if field.is_repeated else [value]):
                    found |= planted_in(item, f"{path}.")
        elif isinstance(value, str) and any(n in value for n in NEEDLES):
            found.add(path)
    return found


def test_every_rpc_is_classified_by_reflection():
    """A new RPC must either name its run (and be planted below) or be listed as naming none."""
    names = {m.name for s in SERVICES for m in s.methods}
    with_run = {m.name for s in SERVICES for m in s.methods if names_a_run(m.input_type)}
    assert names - with_run == NO_RUN
    assert not with_run & NO_RUN


# -- the calls ---------------------------------------------------------------------------------------

class Caller:
    """Calls the RPCs over gRPC, recording which fields held a needle; `batched` sends every lease
    holder's write as a one-item WriteBatch (and checks the item's answer)."""

    def __init__(self, channel: grpc.aio.Channel, batched: bool, planted: dict[str, set[str]]) -> None:
        self.work = ws_grpc.WorkServiceStub(channel)
        self.runs = rs_grpc.RunServiceStub(channel)
        self.batched = batched
        self.planted = planted
        self.md = [("x-tenant-id", TENANT)]

    async def write(self, method: str, request: Message) -> Any:
        op = {m: o for o, m in WRITE_OPS.items()}.get(method)
        if not self.batched or op is None:  # SpawnChildren is no batch op
            self.planted.setdefault(method, set()).update(planted_in(request))
            return await getattr(self.work, method)(request)
        self.planted.setdefault(f"WriteBatch.{method}", set()).update(planted_in(request))
        answer = await self.work.WriteBatch(ws.WriteBatchRequest(items=[ws.WriteBatchItem(**{op: request})]))
        result = answer.results[0]
        assert result.WhichOneof("result") == op, result.error
        return getattr(result, op)

    async def run_call(self, method: str, request: Message) -> Any:
        self.planted.setdefault(method, set()).update(planted_in(request))
        return await getattr(self.runs, method)(request, metadata=self.md)

    async def work_call(self, method: str, request: Message) -> Any:
        self.planted.setdefault(method, set()).update(planted_in(request))
        return await getattr(self.work, method)(request)

    async def lease(self, agents: tuple[str, ...] = ("payer",)) -> ws.Lease:
        deadline = time.monotonic() + 20
        while True:
            reply = await self.work.ClaimWork(ws.ClaimWorkRequest(worker_id="w1", agents=list(agents), wait_ms=500))
            if reply.HasField("lease"):
                return reply.lease
            assert time.monotonic() < deadline, "no run to claim"


def said(text: str) -> str:
    """A free text quoting every needle."""
    return f"{text}: {CARD} / {PIN} / {OTP}"


def doc(label: str) -> str:
    """A JSON object quoting every needle."""
    return json.dumps({"said": said(label), "nested": [{"why": f"{label} {CARD}"}]})


def note() -> rs.AuditNote:
    return rs.AuditNote(reason=said("reason"), comment=said("comment"), ticket_id=said("ticket"))


def journal(seq: int) -> list[pb.JournalEntry]:
    return [pb.JournalEntry(seq=seq, kind="tool", step_key="s/j", node="n", tool="pay.charge",
                            detail_json=doc("journal"))]


async def register(work: ws_grpc.WorkServiceStub) -> None:
    await work.RegisterAgents(ws.RegisterAgentsRequest(worker_id="w1", ttl_ms=600_000, agents=[
        ws.AgentRegistration(name="payer", version="1", tool_names=["pay.charge"], input_schema_json=json.dumps(SCHEMA),
                             sensitive_json=json.dumps(SENSITIVE), signals_json=json.dumps(SIGNALS),
                             resume_input_schema_json=json.dumps(RESUME)),
        ws.AgentRegistration(name="kid", version="1")]))


async def one_run(call: Caller) -> str:
    """A payer run through every write that names a run, each with every text field holding a needle;
    it ends through a CompleteToolCall `end` (defect 1's path)."""
    submitted = await call.runs.SubmitRun(rs.SubmitRunRequest(
        agent_name="payer", input_json=json.dumps({"card": CARD, "amount": 5})), metadata=call.md)
    run_id = submitted.run.run_id
    lease = await call.lease()
    assert lease.run.run_id == run_id
    ref = lease_ref(lease)
    request1 = {"card": CARD, "amount": 5, "memo": said("memo")}
    saved = await call.write("SaveCheckpoint", ws.SaveCheckpointRequest(
        lease=ref, expected_version=0, schema_version=2, step_key="s1", event_id=eid(), event_type="agent.step",
        state_json=json.dumps(tool_state("s1", "pay.charge", request1, note=said("state"))),
        event_payload_json=doc("event"), journal=journal(1)))
    await call.write("BeginToolCall", ws.BeginToolCallRequest(
        lease=ref, expected_version=saved.version, step_key="s1", tool_name="pay.charge",
        idempotency_key=f"k1-{run_id}", request_json=json.dumps(request1), execution_id=eid(), event_id=eid()))
    request2 = {"card": CARD, "amount": 6}
    await call.write("CompleteAndBeginToolCall", ws.CompleteAndBeginToolCallRequest(
        lease=ref, expected_version=saved.version, step_key="s1", outcome=ws.TOOL_OUTCOME_SUCCEEDED,
        response_json=json.dumps({"token": f"t-{CARD}", "said": said("response")}),
        remote_resource_id=said("remote"), error_code=said("code"), schema_version=2, event_id=eid(),
        state_json=json.dumps(tool_state("s2", "pay.charge", request2, note=said("state2"))),
        evidence_json=doc("evidence"), journal=journal(2),
        next=ws.NextToolCall(step_key="s2", tool_name="pay.charge", idempotency_key=f"k2-{run_id}",
                           request_json=json.dumps(request2), execution_id=eid(), event_id=eid())))
    await call.write("MarkToolInDoubt", ws.MarkToolInDoubtRequest(
        lease=ref, step_key="s2", error_code=said("code"), detail=said("detail"), event_id=eid()))
    await call.run_call("ResolveToolExecution", rs.ResolveToolExecutionRequest(
        run_id=run_id, step_key="s2", outcome=rs.RESOLUTION_OUTCOME_SUCCEEDED, result_json=doc("result"),
        remote_resource_id=said("remote"), evidence_json=doc("evidence"), resolved_by=said("who"),
        rule_version=said("rule"), event_id=eid(), note=note()))
    lease = await call.lease()
    ref = lease_ref(lease)
    await call.write("FinishRun", ws.FinishRunRequest(
        lease=ref, expected_version=lease.run.version, outcome=ws.FINISH_OUTCOME_PAUSED_HUMAN,
        reason=said("pause"), result_json=doc("result"), error_class=said("class"), event_id=eid()))
    await call.run_call("ResumeRun", rs.ResumeRunRequest(
        run_id=run_id, decision=rs.RESUME_DECISION_INPUT, input_json=json.dumps({"otp": OTP, "said": said("in")}),
        operator=said("operator"), comment=said("comment"), note=note()))
    await call.run_call("SignalRun", rs.SignalRunRequest(
        run_id=run_id, name="approve", payload_json=json.dumps({"pin": PIN, "n": 1, "said": said("signal")}),
        request_id=eid()))
    lease = await call.lease()
    ref = lease_ref(lease)
    await call.write("Heartbeat", ws.HeartbeatRequest(lease=ref))
    await call.write("SpawnChildren", ws.SpawnChildrenRequest(
        lease=ref, spawn_key="kids", join=ws.JOIN_MODE_ALL, detach=True,
        children=[ws.ChildSpec(agent_name="kid", input_json=doc("child"), labels={"why": said("label")})]))
    request3 = {"card": CARD, "amount": 7}
    saved = await call.write("SaveCheckpoint", ws.SaveCheckpointRequest(
        lease=ref, expected_version=lease.run.version, schema_version=2, event_id=eid(),
        state_json=json.dumps(tool_state("s3", "pay.charge", request3, note=said("state3"))),
        journal=journal(lease.journal_length + 1)))
    await call.write("BeginToolCall", ws.BeginToolCallRequest(
        lease=ref, expected_version=saved.version, step_key="s3", tool_name="pay.charge",
        idempotency_key=f"k3-{run_id}", request_json=json.dumps(request3), execution_id=eid(), event_id=eid()))
    ended = await call.write("CompleteToolCall", ws.CompleteToolCallRequest(
        lease=ref, expected_version=saved.version, step_key="s3", outcome=ws.TOOL_OUTCOME_SUCCEEDED,
        response_json=json.dumps({"token": "t3", "said": said("response")}), remote_resource_id=said("remote"),
        error_code=said("code"), state_json=json.dumps({"cursor": "done", "said": said("state4")}), schema_version=2,
        evidence_json=doc("evidence"), event_id=eid(), journal=journal(lease.journal_length + 2),
        end=ws.RunEnd(outcome=ws.FINISH_OUTCOME_COMPLETED, reason=f"charged {CARD}", result_json=doc("end"),
                      error_class=said("class"), event_id=eid())))
    assert ended.status == pb.RUN_STATUS_COMPLETED
    # Reads that name the run: reveals (their notes are audited), the tree, the journal, the audit trail.
    for method, request in (("GetRun", rs.GetRunRequest(run_id=run_id, reveal=True, note=note())),
                            ("GetRunHistory", rs.GetRunHistoryRequest(run_id=run_id, reveal=True, note=note())),
                            ("GetRunTree", rs.GetRunTreeRequest(run_id=run_id)),
                            ("ListAuditEvents", rs.ListAuditEventsRequest(run_id=run_id))):
        await call.run_call(method, request)
    for method, request in (("ReadJournal", ws.ReadJournalRequest(lease=ref)),
                            ("GetToolResults", ws.GetToolResultsRequest(lease=ref, step_keys=["s1"]))):
        try:
            await call.work_call(method, request)
        except grpc.aio.AioRpcError as error:  # the lease is gone with the run's end
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    # And a cancel with a reason and a note, on a fresh run.
    other = await call.runs.SubmitRun(rs.SubmitRunRequest(
        agent_name="payer", input_json=json.dumps({"card": CARD, "amount": 1})), metadata=call.md)
    await call.run_call("CancelRun", rs.CancelRunRequest(run_id=other.run.run_id, reason=said("cancel"),
                                                         note=note()))
    # Started again: its sealed input is sealed again under the new run's own key, its note redacted.
    again = await call.run_call("RetryRun", rs.RetryRunRequest(run_id=other.run.run_id, note=note()))
    assert again.run.retry_of_run_id == other.run.run_id and "[redacted]" in again.run.input_json
    await call.runs.CancelRun(rs.CancelRunRequest(run_id=again.run.run_id), metadata=call.md)  # not claimed next
    return run_id


def coverage_gaps(planted: dict[str, set[str]]) -> dict[str, set[str]]:
    return {method: fields - planted.get(method, set()) for method, fields in required().items()
            if fields - planted.get(method, set())}


async def check_answers(call: Caller, run_id: str) -> None:
    shown = await call.runs.GetRun(rs.GetRunRequest(run_id=run_id), metadata=call.md)
    assert shown.terminal_reason == "[redacted]"
    history = await call.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=run_id), metadata=call.md)
    assert not any(n in str(history) or n in str(shown) for n in NEEDLES)
    revealed = await call.runs.GetRun(rs.GetRunRequest(run_id=run_id, reveal=True), metadata=call.md)
    assert json.loads(revealed.input_json)["card"] == CARD  # still opens for a reveal


async def scan_tables(db: Any) -> None:
    everything = await raw_tables(db)  # every table of the schema, from the catalog, as superuser
    leaked = [n for n in NEEDLES if n in everything]
    assert not leaked, [line[:300] for line in everything.splitlines() if any(n in line for n in leaked)][:5]
    assert "$sealed" in everything


async def test_a_run_ended_through_complete_tool_call_keeps_its_reason_sealed(db_url, db):
    """Defect 1's instance, in process: the `end` reason of a CompleteToolCall quoting the card."""
    async with scheduler_stack(db_url, encryption_keys=keyring()) as stack:
        await register(stack.work)
        run = await stack.runs.SubmitRun(rs.SubmitRunRequest(
            agent_name="payer", input_json=json.dumps({"card": CARD, "amount": 5})), metadata=stack.md())
        run_id = run.run.run_id
        for batched in (False, True):
            if batched:
                run_id = (await stack.runs.SubmitRun(rs.SubmitRunRequest(
                    agent_name="payer", input_json=json.dumps({"card": CARD, "amount": 6})),
                    metadata=stack.md())).run.run_id
            lease = await claim(stack, agents=("payer",))
            ref = lease_ref(lease)
            request = {"card": CARD, "amount": 5}
            call = Caller(stack.channel, batched, {})
            saved = await call.write("SaveCheckpoint", ws.SaveCheckpointRequest(
                lease=ref, expected_version=0, schema_version=1, event_id=eid(), step_key="s1",
                state_json=json.dumps(tool_state("s1", "pay.charge", request))))
            await call.write("BeginToolCall", ws.BeginToolCallRequest(
                lease=ref, expected_version=saved.version, step_key="s1", tool_name="pay.charge",
                idempotency_key=f"k-{run_id}", request_json=json.dumps(request), execution_id=eid(),
                event_id=eid()))
            await call.write("CompleteToolCall", ws.CompleteToolCallRequest(
                lease=ref, expected_version=saved.version, step_key="s1", outcome=ws.TOOL_OUTCOME_SUCCEEDED,
                response_json='{"ok": true}', state_json='{"cursor": "done"}', schema_version=1, event_id=eid(),
                end=ws.RunEnd(outcome=ws.FINISH_OUTCOME_COMPLETED, reason=f"charged {CARD}", event_id=eid())))
            stored = await db.fetchrow("SELECT status, terminal_reason FROM agent_runs WHERE id = $1::uuid", run_id)
            assert tuple(stored) == ("COMPLETED", "[redacted]")
            completed = await db.fetchval("SELECT payload::text FROM outbox WHERE run_id = $1::uuid AND "
                                          "event_type = 'agent.run_completed'", run_id)
            assert CARD not in completed
            await check_answers(call, run_id)
        await scan_tables(db)


@pytest.mark.kafka
async def test_every_text_field_of_every_rpc_naming_a_run_is_sealed_everywhere(db_url, db, tmp_path: Path):
    """The sweep: scheduler and relay as processes (DEBUG logs to files, spans and metrics to OTLP,
    events to Kafka); every RPC naming a run, direct and batched, with every text field planted."""
    logs = tmp_path / "logs"
    logs.mkdir()
    listen = f"127.0.0.1:{free_port()}"
    metrics = {name: f"127.0.0.1:{free_port()}" for name in ("scheduler", "relay")}
    services: list[Service] = []
    planted: dict[str, set[str]] = {}
    try:
        with kafka_for_tests(tmp_path / "tansu.log") as (bootstrap, _broker):
            async with OtlpReceiver() as receiver:
                env = env_for(db_url, bootstrap, receiver.grpc_endpoint)
                scheduler = Service("scheduler", ["scheduler"], {
                    **env, "AGENTRT_LISTEN_ADDR": listen, "AGENTRT_ENCRYPTION_KEYS": keyring(),
                    "AGENTRT_METRICS_ADDR": metrics["scheduler"], "AGENTRT_TRACE_SQL": "true"}, logs,
                    health_addr=listen)
                relay_health = f"127.0.0.1:{free_port()}"
                relay = Service("relay", ["relay"], {**env, "AGENTRT_HEALTH_ADDR": relay_health,
                                                     "AGENTRT_METRICS_ADDR": metrics["relay"]},
                                logs, health_addr=relay_health)
                for service in (scheduler, relay):
                    service.start()
                    services.append(service)
                    await service.wait_healthy(60)
                async with grpc.aio.insecure_channel(listen) as channel:
                    await register(ws_grpc.WorkServiceStub(channel))
                    ended = []
                    for batched in (False, True):
                        call = Caller(channel, batched, planted)
                        ended.append(await one_run(call))
                        await check_answers(call, ended[-1])
                assert not coverage_gaps(planted), coverage_gaps(planted)
                events = await db.fetchval("SELECT count(*) FROM outbox")

                async def published() -> bool:
                    return await db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0

                deadline = time.monotonic() + 60
                while not await published():
                    assert time.monotonic() < deadline, "the relay did not publish the outbox"
                    await asyncio.sleep(0.2)
                reader = await TopicReader(bootstrap, [TOPIC]).start()
                try:
                    await reader.read_until(lambda got: len(got) >= events, 60, "every event on Kafka")
                finally:
                    await reader.stop()
                scraped = [await scrape(addr) for addr in metrics.values()]
                spans, points = await stop_and_collect(services, receiver)
    finally:
        for service in services:
            await service.stop()
    assert spans and points and reader.records
    for needle in NEEDLES:
        raw = needle.encode()
        for span in spans:
            assert needle not in repr(span.attributes) and needle not in span.name, span.name
            assert needle not in repr(getattr(span, "events", "")), span.name
        for point in points:
            assert needle not in repr(point)
        for record in reader.records:
            assert raw not in (record.value or b"") and raw not in (record.key or b""), record.event.type
            assert all(raw not in (value or b"") for _, value in record.headers)
        for text in scraped:
            assert needle not in text
        for path in [*sorted(logs.glob("*.log")), tmp_path / "tansu.log"]:
            if path.exists():
                assert raw not in path.read_bytes(), path.name
    await scan_tables(db)


async def test_the_sweep_would_notice_an_unplanted_field():
    """The coverage check itself: a field no call planted is a gap."""
    planted = {method: set(fields) for method, fields in required().items()}
    assert not coverage_gaps(planted)
    planted["CompleteToolCall"].discard("end.reason")
    assert coverage_gaps(planted) == {"CompleteToolCall": {"end.reason"}}
    assert ("agentrt.v1.ChildSpec", "input_json") in _OTHER_RUNS  # planted too: sealed under the child's key


async def test_labels_given_at_creation_hold_no_marked_value(db_url, db):
    """SubmitRun and CreateSchedule/UpdateSchedule name no run the edge's filter could know: the labels
    they carry are redacted from the input's own marked values (runs, schedules, fired runs, events)."""
    async with scheduler_stack(db_url, encryption_keys=keyring()) as stack:
        await register(stack.work)
        run = await stack.runs.SubmitRun(rs.SubmitRunRequest(
            agent_name="payer", input_json=json.dumps({"card": CARD, "amount": 5}),
            labels={"order": "o-1", "note": f"card {CARD}"}), metadata=stack.md())
        assert dict(run.run.labels) == {"order": "o-1", "note": "[redacted]"}
        spec = rs.ScheduleSpec(agent_name="payer", input_json=json.dumps({"card": CARD, "amount": 1}),
                               labels={"who": f"holder of {CARD}", "team": "billing"}, interval_ms=1000)
        made = await stack.runs.CreateSchedule(rs.CreateScheduleRequest(name="charge-daily", spec=spec),
                                               metadata=stack.md())
        assert dict(made.schedule.spec.labels) == {"who": "[redacted]", "team": "billing"}
        spec.labels["again"] = CARD
        updated = await stack.runs.UpdateSchedule(rs.UpdateScheduleRequest(
            schedule_id=made.schedule.schedule_id, spec=spec), metadata=stack.md())
        assert dict(updated.spec.labels)["again"] == "[redacted]"
        listed = await stack.runs.ListRuns(rs.ListRunsRequest(), metadata=stack.md())
        assert not any(CARD in str(r) for r in listed.runs)
        await scan_tables(db)
