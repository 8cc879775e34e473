import json

import pytest
from support import claim, eid, lease_ref, scheduler_stack, submit, tool_state

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration


async def test_claim_checkpoint_tool_finish(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack, payload={"order": 1})
        assert run.status == pb.RUN_STATUS_QUEUED
        lease = await claim(stack)
        assert lease is not None and lease.run.fencing_token == 1 and lease.run.status == pb.RUN_STATUS_RUNNING
        ref = lease_ref(lease)
        state = tool_state("read_order/attempt-1", "orders.get", {"id": 1})
        saved = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=ref, expected_version=0, state_json=json.dumps(state), schema_version=1,
            step_key="read_order/attempt-1", event_id=eid()))
        assert saved.version == 1
        began = await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=ref, expected_version=1, step_key="read_order/attempt-1", tool_name="orders.get",
            idempotency_key="k1", request_json=json.dumps({"id": 1}), execution_id=eid(), event_id=eid()))
        assert began.execution.status == pb.TOOL_EXECUTION_STATUS_OUTBOUND_INTENT and not began.existing
        done = await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
            lease=ref, expected_version=1, step_key="read_order/attempt-1", outcome=ws.TOOL_OUTCOME_SUCCEEDED,
            response_json='{"ok": true}', state_json='{"cursor": "next"}', schema_version=1, event_id=eid()))
        assert done.version == 2
        fin = await stack.work.FinishRun(ws.FinishRunRequest(
            lease=ref, expected_version=2, outcome=ws.FINISH_OUTCOME_COMPLETED, result_json='{"r": 1}',
            event_id=eid()))
        assert fin.status == pb.RUN_STATUS_COMPLETED
        row = await db.fetchrow("SELECT * FROM agent_runs")
        assert row["status"] == "COMPLETED" and row["lease_owner"] is None and row["result"] == {"r": 1}
        assert await db.fetchval("SELECT count(*) FROM outbox") == 5
