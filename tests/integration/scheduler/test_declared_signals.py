"""Declared signals (issue 24, defect 7): an agent declares its signals (name, payload schema, sensitive
marks) and ResumeRun's input as it declares its input. A declared signal that does not fit is
INVALID_ARGUMENT naming payload_json and writes nothing; marked fields of signals and of ResumeRun's
input are stored sealed, plain for the lease holder, redacted for readers; undeclared signals are
taken as before."""

from __future__ import annotations

import base64
import json
import os

import grpc
import pytest
from pydantic import BaseModel, Field
from sealing_support import raw_tables
from support import claim, eid, lease_ref, reason_of, rpc_error, scheduler_stack

from executor.agents import AgentCatalog
from executor.registration import registrations
from executor.sdk import agent
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration

PIN = "pin-DECLARED-signal-secret-2b7e"
OTP = "otp-DECLARED-resume-secret-c4a0"
KEYS = json.dumps({"current": "k1", "keys": {"k1": base64.b64encode(os.urandom(32)).decode()}})
SIGNALS = {"approve": {"type": "object", "required": ["n"], "additionalProperties": False,
                       "properties": {"pin": {"type": "string", "x-agentrt-sensitive": True},
                                      "n": {"type": "integer"}}}}
RESUME = {"type": "object", "properties": {"otp": {"type": "string", "x-agentrt-sensitive": True}}}


async def register(stack, **fields) -> None:
    await stack.work.RegisterAgents(ws.RegisterAgentsRequest(worker_id="w1", ttl_ms=60_000, agents=[
        ws.AgentRegistration(name="approver", version="1", **fields)]))


async def counts(db) -> tuple[int, int, int]:
    return (await db.fetchval("SELECT count(*) FROM run_signals"), await db.fetchval("SELECT count(*) FROM outbox"),
            await db.fetchval("SELECT coalesce(max(version), 0) FROM agent_runs"))


async def test_a_declared_signal_is_checked_and_its_marked_fields_sealed(db_url, db):
    async with scheduler_stack(db_url, encryption_keys=KEYS) as stack:
        # The agent marks nothing in its input: its declared signals alone give its runs a data key.
        await register(stack, signals_json=json.dumps(SIGNALS), resume_input_schema_json=json.dumps(RESUME))
        run_id = (await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="approver", input_json="{}"),
                                             metadata=stack.md())).run.run_id
        assert await db.fetchval("SELECT count(*) FROM run_data_keys WHERE run_id = $1::uuid", run_id) == 1

        before = await counts(db)
        for payload, problem in (({"n": "one"}, "payload_json: $.n: 'one' is not of type 'integer'"),
                                 ({"pin": PIN}, "payload_json: $: 'n' is a required property"),
                                 ([1], "payload_json: $: [1] is not of type 'object'")):
            refused = await rpc_error(stack.runs.SignalRun(rs.SignalRunRequest(
                run_id=run_id, name="approve", payload_json=json.dumps(payload)), metadata=stack.md()))
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and reason_of(refused) == "INVALID_ARGUMENT"
            assert refused.details().startswith(problem), refused.details()
            assert "schema of signal 'approve' of approver version 1" in refused.details()
        assert await counts(db) == before  # nothing written

        sent = await stack.runs.SignalRun(rs.SignalRunRequest(
            run_id=run_id, name="approve", payload_json=json.dumps({"pin": PIN, "n": 2})), metadata=stack.md())
        assert json.loads(sent.signal.payload_json) == {"pin": "[redacted]", "n": 2}
        stored = json.loads(await db.fetchval("SELECT payload::text FROM run_signals WHERE name = 'approve'"))
        assert stored["n"] == 2 and set(stored["pin"]) == {"$sealed"}
        # An undeclared signal is taken as before, whatever its payload.
        await stack.runs.SignalRun(rs.SignalRunRequest(run_id=run_id, name="poke", payload_json='"anything"'),
                                   metadata=stack.md())
        assert json.loads(await db.fetchval("SELECT payload::text FROM run_signals WHERE name = 'poke'")) == "anything"

        lease = await claim(stack, agents=("approver",))
        assert {s.name: json.loads(s.payload_json) for s in lease.signals} == {
            "approve": {"pin": PIN, "n": 2}, "poke": "anything"}  # the holder's copy is plain
        await stack.work.FinishRun(ws.FinishRunRequest(
            lease=lease_ref(lease), expected_version=lease.run.version, outcome=ws.FINISH_OUTCOME_PAUSED_HUMAN,
            reason="needs a code", event_id=eid()))
        await stack.runs.ResumeRun(rs.ResumeRunRequest(
            run_id=run_id, decision=rs.RESUME_DECISION_INPUT, input_json=json.dumps({"otp": OTP}),
            comment=f"code {OTP} given by phone"), metadata=stack.md())
        human = await db.fetchval("SELECT human_input::text FROM agent_runs WHERE id = $1::uuid", run_id)
        assert OTP not in human and "$sealed" in human
        lease = await claim(stack, agents=("approver",))
        human_input = json.loads(lease.run.human_input_json)
        assert human_input["input"] == {"otp": OTP} and human_input["comment"] == "[redacted]"
        shown = await stack.runs.GetRun(rs.GetRunRequest(run_id=run_id), metadata=stack.md())
        assert OTP not in str(shown) and PIN not in str(shown)
        everything = await raw_tables(db)
        assert PIN not in everything and OTP not in everything


async def test_undeclared_signals_of_an_agent_declaring_none_work_as_before(db_url, db):
    async with scheduler_stack(db_url) as stack:  # no keyring needed: nothing marked
        await register(stack)
        run_id = (await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="approver", input_json="{}"),
                                             metadata=stack.md())).run.run_id
        await stack.runs.SignalRun(rs.SignalRunRequest(run_id=run_id, name="approve", payload_json='{"n": "x"}'),
                                   metadata=stack.md())
        assert json.loads(await db.fetchval("SELECT payload::text FROM run_signals")) == {"n": "x"}
        assert await db.fetchval("SELECT count(*) FROM run_data_keys") == 0


@pytest.mark.parametrize(("fields", "field", "problem"), [
    ({"signals_json": "[1]"}, "agents[0].signals_json", "must be a JSON object"),
    ({"signals_json": '{"approve": 3}'}, "agents[0].signals_json", "approve: must be a JSON Schema object"),
    ({"signals_json": '{"approve": {"type": 7}}'}, "agents[0].signals_json", "is not a valid JSON Schema"),
    ({"signals_json": '{"bad name!": {}}'}, "agents[0].signals_json", ""),
    ({"resume_input_schema_json": '{"type": 7}'}, "agents[0].resume_input_schema_json", "is not a valid JSON Schema"),
])
async def test_a_bad_declaration_is_refused_naming_the_field(db_url, db, fields, field, problem):
    async with scheduler_stack(db_url) as stack:
        refused = await rpc_error(register(stack, **fields))
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.details().startswith(f"{field}: {problem}"), refused.details()
        assert await db.fetchval("SELECT count(*) FROM agent_registry") == 0


class Approval(BaseModel):
    pin: str = Field(json_schema_extra={"x-agentrt-sensitive": True})
    n: int


class Code(BaseModel):
    otp: str = Field(json_schema_extra={"x-agentrt-sensitive": True})


@agent(name="approver", version="1", signals={"approve": Approval}, resume_input=Code)
def decide(ctx):  # pragma: no cover - never run
    return None


def test_the_sdk_declares_signals_and_resume_input_in_the_registration():
    [registration] = registrations(AgentCatalog([decide.definition]))
    signals = json.loads(registration.signals_json)
    assert set(signals) == {"approve"} and signals["approve"]["properties"]["pin"]["x-agentrt-sensitive"] is True
    assert json.loads(registration.resume_input_schema_json)["properties"]["otp"]["x-agentrt-sensitive"] is True
