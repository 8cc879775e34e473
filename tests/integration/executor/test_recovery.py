"""Recovery: a persisted decision runs after a crash without re-asking; WAITING_TOOL takeover; old schemas."""

import json

import pytest
from executor_support import (
    executor,
    history,
    http_tool,
    latest_state,
    mock_tool,
    scripted_agent,
    wait_for,
    wait_status,
    write_agent,
)
from openai_stub import OpenAIStub, tool_call
from support import claim, eid, lease_ref, scheduler_stack, submit, tool_state

from executor.faults import Faults
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration
END = (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED, pb.RUN_STATUS_PAUSED_INDOUBT, pb.RUN_STATUS_PAUSED_HUMAN)
LEASE_MS = 1000


async def crash_then_recover(stack, agents, fault, run_id):
    """Executor A dies at `fault` (its lease left to lapse); executor B takes the run over."""
    faults = Faults([fault])
    async with executor(stack, agents, faults=faults):
        await wait_for(lambda: _true(faults.fired), 10, f"the fault {fault}")
    async with executor(stack, agents):
        return await wait_status(stack, run_id, *END)


async def _true(value):
    return bool(value)


def two_step_agent(url, **tool_options):
    plan = [{"id": "label", "tool": "labels.create", "args": {"order": "${input.order}"}},
            {"id": "done", "finish": {"label": "${results.label.response.id}"}}]
    return scripted_agent("labels", plan, [http_tool(url, "labels.create", **tool_options)])


async def test_a_persisted_decision_is_executed_after_a_crash_without_asking_the_model_again(db_url, tmp_path):
    stub = OpenAIStub([tool_call("crm_update", {"customer": 7, "tier": "gold"}),
                       tool_call("agentrt_finish", {"result": {"ok": True}})])
    async with stub, mock_tool(tmp_path) as mock, scheduler_stack(db_url, lease_duration_ms=LEASE_MS) as stack:
        write_agent(tmp_path / "agents", {
            "name": "crm", "version": "1", "decider": {"kind": "openai", "base_url": stub.url, "model": "m"},
            "tools": [http_tool(mock.url, "crm.update")]})
        run = await submit(stack, agent="crm", payload={"task": "upgrade customer 7"})
        final = await crash_then_recover(stack, tmp_path / "agents", "after_checkpoint_commit", run.run_id)
        assert final.status == pb.RUN_STATUS_COMPLETED and json.loads(final.result_json) == {"ok": True}
        assert len(stub.requests) == 2  # the recovered step was not re-sampled
        hist = await history(stack, run.run_id)
        [row] = hist.tool_executions
        assert row.fencing_token == 2  # sent by the executor that took over
        assert json.loads(row.request_json) == {"customer": 7, "tier": "gold"}
        assert list(mock.calls_by_key().values()) == [1]
        # The decision was in the checkpoint before any ledger row existed.
        first = json.loads(hist.checkpoints[0].state_json)
        assert first["pending_tool"]["request"] == {"customer": 7, "tier": "gold"}
        assert first["pending_tool"]["raw"]["tool_calls"][0]["function"]["name"] == "crm_update"


async def test_takeover_after_the_tool_answered_finds_the_result_by_lookup(db_url, tmp_path):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url, lease_duration_ms=LEASE_MS) as stack:
        write_agent(tmp_path / "agents", two_step_agent(mock.url))
        run = await submit(stack, agent="labels", payload={"order": 5})
        final = await crash_then_recover(stack, tmp_path / "agents", "after_tool_response_before_tx2_commit",
                                         run.run_id)
        assert final.status == pb.RUN_STATUS_COMPLETED
        [row] = (await history(stack, run.run_id)).tool_executions
        assert row.status == pb.TOOL_EXECUTION_STATUS_SUCCEEDED
        evidence = json.loads(row.reconciliation_evidence_json)
        assert evidence["lookup"] == "found" and evidence["fencing_token"] == 2
        assert json.loads(final.result_json) == {"label": json.loads(row.response_json)["id"]}
        assert mock.calls_by_key() == {row.idempotency_key: 1}  # looked up, never resent
        assert mock.rows("SELECT count(*) FROM requests WHERE kind = 'lookup'") == [(1,)]


async def test_takeover_before_sending_proves_not_executed_and_retries_as_attempt_2(db_url, tmp_path):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url, lease_duration_ms=LEASE_MS) as stack:
        write_agent(tmp_path / "agents", two_step_agent(mock.url))
        run = await submit(stack, agent="labels", payload={"order": 5})
        final = await crash_then_recover(stack, tmp_path / "agents", "after_outbound_intent_commit", run.run_id)
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason
        first, second = (await history(stack, run.run_id)).tool_executions
        assert (first.step_key, first.status) == ("label/attempt-1", pb.TOOL_EXECUTION_STATUS_NOT_EXECUTED)
        assert json.loads(first.reconciliation_evidence_json)["lookup"] == "not_found"  # kept, with evidence
        assert (second.step_key, second.status) == ("label/attempt-2", pb.TOOL_EXECUTION_STATUS_SUCCEEDED)
        assert mock.calls_by_key() == {second.idempotency_key: 1}


@pytest.mark.parametrize(("options", "code"), [({"lookup": False}, "takeover_no_lookup"),
                                               ({"fenced": False}, "takeover_not_found_unfenced")])
async def test_takeover_without_a_usable_lookup_freezes_in_doubt(db_url, tmp_path, options, code):
    # Without a fence, "not found" cannot rule out a late send, even when nothing was sent.
    fault = "after_outbound_intent_commit" if "fenced" in options else "after_tool_response_before_tx2_commit"
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url, lease_duration_ms=LEASE_MS) as stack:
        write_agent(tmp_path / "agents", two_step_agent(mock.url, **options))
        run = await submit(stack, agent="labels", payload={"order": 5})
        final = await crash_then_recover(stack, tmp_path / "agents", fault, run.run_id)
        assert final.status == pb.RUN_STATUS_PAUSED_INDOUBT
        assert final.pause_reason.startswith(f"tool outcome unknown: {code}")
        [row] = (await history(stack, run.run_id)).tool_executions
        assert row.status == pb.TOOL_EXECUTION_STATUS_IN_DOUBT and row.error_code == code
        assert sum(mock.calls_by_key().values()) == (1 if fault.startswith("after_tool") else 0)  # never resent


async def test_a_checkpoint_of_an_unknown_schema_version_is_refused(db_url, tmp_path):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", two_step_agent(mock.url))
        run = await submit(stack, agent="labels", payload={"order": 5})
        lease = await claim(stack, agents=("labels",))
        future = {"cursor": "x", "something_new": {"shape": "unknown to this executor"}}
        await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=lease_ref(lease), expected_version=0, state_json=json.dumps(future), schema_version=99,
            event_id=eid()))
        await stack.work.FinishRun(ws.FinishRunRequest(lease=lease_ref(lease), expected_version=1,
                                                       outcome=ws.FINISH_OUTCOME_RETRY, event_id=eid()))
        async with executor(stack, tmp_path / "agents"):
            final = await wait_status(stack, run.run_id, *END)
        assert final.status == pb.RUN_STATUS_PAUSED_HUMAN
        assert final.pause_reason.startswith("checkpoint schema version 99 is not supported by this executor")
        hist = await history(stack, run.run_id)
        assert len(hist.checkpoints) == 1 and latest_state(hist) == future  # never rewritten from zero values
        assert list(hist.tool_executions) == [] and mock.calls_by_key() == {}


async def test_a_waiting_tool_run_with_an_unknown_checkpoint_is_frozen_not_guessed(db_url, tmp_path):
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url, lease_duration_ms=LEASE_MS) as stack:
        write_agent(tmp_path / "agents", two_step_agent(mock.url))
        run = await submit(stack, agent="labels", payload={"order": 5})
        lease = await claim(stack, agents=("labels",))
        state = tool_state("label/attempt-1", "labels.create", {"order": 5})
        await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=lease_ref(lease), expected_version=0, state_json=json.dumps(state), schema_version=7,
            event_id=eid()))
        await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=lease_ref(lease), expected_version=1, step_key="label/attempt-1", tool_name="labels.create",
            idempotency_key="k-1", request_json=json.dumps({"order": 5}), execution_id=eid(), event_id=eid()))
        async with executor(stack, tmp_path / "agents"):
            final = await wait_status(stack, run.run_id, *END)
        assert final.status == pb.RUN_STATUS_PAUSED_INDOUBT
        assert final.pause_reason.startswith(
            "tool outcome unknown: checkpoint_unsupported: checkpoint schema version 7 is not supported")
        [event] = [e for e in (await history(stack, run.run_id)).events if e.event_type == "agent.tool_in_doubt"]
        assert "checkpoint schema version 7 is not supported" in json.loads(event.payload_json)["detail"]
        assert mock.calls_by_key() == {}
