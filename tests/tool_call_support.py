"""One step's tool call set up through WorkService: a run waiting on S1 (Tx1 done) and the request that
completes S1 and begins S2 in one write (CompleteAndBeginToolCall). Shared by the scheduler's and the
relay's tests of that write."""

from __future__ import annotations

import json
from typing import Any

from support import claim, eid, lease_ref, submit, tool_state

from shared.gen.agentrt.v1 import work_service_pb2 as ws

S1, S2 = "refund.create/attempt-1", "refund.notify/attempt-1"
TOOL, TOOL2 = "payments.refund", "mail.send"
REQ1, REQ2 = {"order": 1, "amount": 10}, {"order": 1, "to": "customer"}


async def waiting_on_s1(stack: Any, worker: str = "w1", agent: str = "demo") -> tuple[str, ws.LeaseRef]:
    """A run WAITING_TOOL on S1 at version 1, its ledger row open (Tx1 done)."""
    run = await submit(stack, agent=agent)
    lease = await claim(stack, worker, agents=(agent,))
    assert lease is not None and lease.run.run_id == run.run_id
    ref = lease_ref(lease)
    await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=ref, expected_version=0, state_json=json.dumps(tool_state(S1, TOOL, REQ1)), schema_version=1,
        step_key=S1, event_id=eid()))
    began = await stack.work.BeginToolCall(ws.BeginToolCallRequest(
        lease=ref, expected_version=1, step_key=S1, tool_name=TOOL, idempotency_key=f"k1-{run.run_id}",
        request_json=json.dumps(REQ1), execution_id=eid(), event_id=eid()))
    assert not began.existing
    return run.run_id, ref


def next_state(step_key: str = S2, tool: str = TOOL2, request: Any = None) -> dict[str, Any]:
    """Tx2's checkpoint with the next decision recorded: S1's result, and pending_tool for the next call."""
    return tool_state(step_key, tool, REQ2 if request is None else request,
                      tool_results={S1: {"status": "SUCCEEDED", "response": {"refund": "r-1"}}})


def combined(ref: ws.LeaseRef, expected: int = 1, *, event_id: str | None = None, next_event_id: str | None = None,
             execution_id: str | None = None, state: dict[str, Any] | None = None, next_step: str = S2,
             next_tool: str = TOOL2, next_request: Any = None, key: str | None = None,
             outcome: int = ws.TOOL_OUTCOME_SUCCEEDED, **fields: Any) -> ws.CompleteAndBeginToolCallRequest:
    return ws.CompleteAndBeginToolCallRequest(
        lease=ref, expected_version=expected, step_key=S1, outcome=outcome,
        response_json='{"refund": "r-1"}' if outcome == ws.TOOL_OUTCOME_SUCCEEDED else "",
        remote_resource_id="r-1" if outcome == ws.TOOL_OUTCOME_SUCCEEDED else "",
        state_json=json.dumps(next_state() if state is None else state), schema_version=1,
        event_id=event_id or eid(),
        next=ws.NextToolCall(step_key=next_step, tool_name=next_tool,
                             idempotency_key=key or f"k2-{ref.run_id}",
                             request_json=json.dumps(REQ2 if next_request is None else next_request),
                             execution_id=execution_id or eid(), event_id=next_event_id or eid()),
        **fields)
