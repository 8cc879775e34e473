"""The suite's client of the scheduler: RunService as a tenant, WorkService as a (stale) executor would call it."""

from __future__ import annotations

import json
import uuid
from typing import Any

import grpc

from shared.errors import error_info
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.gen.agentrt.v1 import work_service_pb2_grpc as ws_grpc

STATUS = pb.RunStatus.Name
TERMINAL: set[int] = {pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED, pb.RUN_STATUS_CANCELLED}
PAUSED: set[int] = {pb.RUN_STATUS_PAUSED_HUMAN, pb.RUN_STATUS_PAUSED_INDOUBT}
SETTLED: set[int] = TERMINAL | PAUSED


def reason_of(error: grpc.aio.AioRpcError) -> str:
    info = error_info(error)
    return info.reason if info is not None else error.code().name


class Api:
    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.channel = grpc.aio.insecure_channel(addr)
        self.runs = rs_grpc.RunServiceStub(self.channel)
        self.work = ws_grpc.WorkServiceStub(self.channel)
        # tenant -> its API key, for a scheduler that authenticates (experiment 6); none = auth_mode none
        self.keys: dict[str, str] = {}

    async def close(self) -> None:
        await self.channel.close()

    def md(self, tenant: str) -> list[tuple[str, str]]:
        key = self.keys.get(tenant)
        return [("x-tenant-id", tenant), *([("authorization", f"Bearer {key}")] if key else [])]

    async def submit(self, tenant: str, agent: str, payload: dict[str, Any] | None = None,
                     client_request_id: str = "", max_attempts: int = 0) -> pb.Run:
        reply = await self.runs.SubmitRun(
            rs.SubmitRunRequest(agent_name=agent, input_json=json.dumps(payload or {}),
                                client_request_id=client_request_id, max_attempts=max_attempts),
            metadata=self.md(tenant), timeout=15)
        return reply.run

    async def get(self, tenant: str, run_id: str) -> pb.Run:
        return await self.runs.GetRun(rs.GetRunRequest(run_id=run_id), metadata=self.md(tenant), timeout=15)

    async def history(self, tenant: str, run_id: str) -> rs.RunHistory:
        """The whole history, every page of it merged."""
        merged = rs.RunHistory()
        token = ""
        for _ in range(10_000):
            page = await self.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=run_id, page_size=500,
                                                                         page_token=token),
                                                 metadata=self.md(tenant), timeout=15)
            merged.run.CopyFrom(page.run)
            merged.checkpoints.extend(page.checkpoints)
            merged.tool_executions.extend(page.tool_executions)
            merged.events.extend(page.events)
            token = page.next_page_token
            if not token:
                return merged
        raise RuntimeError(f"history of run {run_id} did not end within 10,000 pages")

    async def resume(self, tenant: str, run_id: str, decision: rs.ResumeDecision = rs.RESUME_DECISION_INPUT,
                     payload: Any = None, operator: str = "acceptance") -> pb.Run:
        return await self.runs.ResumeRun(rs.ResumeRunRequest(
            run_id=run_id, decision=decision, input_json=json.dumps(payload) if payload is not None else "",
            operator=operator, comment="acceptance suite"), metadata=self.md(tenant), timeout=15)

    async def status(self, tenant: str, run_id: str) -> int:
        return (await self.get(tenant, run_id)).status

    async def settled(self, tenant: str, run_id: str, statuses: set[int] = SETTLED) -> pb.Run | None:
        """The run once it is in one of `statuses` (a probe for wait_until), else None."""
        try:
            run = await self.get(tenant, run_id)
        except grpc.aio.AioRpcError:
            return None  # the scheduler may be restarting; ask again
        return run if run.status in statuses else None

    async def stale_write(self, run_id: str, worker_id: str, fence: int, expected_version: int,
                          step_key: str = "") -> dict[str, str]:
        """What a holder of (worker, fence) gets for each fenced write now: the error reason, or "ACCEPTED"."""
        lease = ws.LeaseRef(run_id=run_id, worker_id=worker_id, fencing_token=fence)
        calls: dict[str, Any] = {
            "Heartbeat": (self.work.Heartbeat, ws.HeartbeatRequest(lease=lease)),
            "SaveCheckpoint": (self.work.SaveCheckpoint, ws.SaveCheckpointRequest(
                lease=lease, expected_version=expected_version, state_json=json.dumps({"cursor": "stale-write"}),
                schema_version=1, step_key="stale-write", event_id=str(uuid.uuid4()))),
            "FinishRun": (self.work.FinishRun, ws.FinishRunRequest(
                lease=lease, expected_version=expected_version, outcome=ws.FINISH_OUTCOME_COMPLETED,
                reason="stale holder", event_id=str(uuid.uuid4()))),
        }
        if step_key:
            calls["CompleteToolCall"] = (self.work.CompleteToolCall, ws.CompleteToolCallRequest(
                lease=lease, expected_version=expected_version, step_key=step_key,
                outcome=ws.TOOL_OUTCOME_SUCCEEDED, response_json=json.dumps({"stale": True}),
                state_json=json.dumps({"cursor": "stale-write"}), schema_version=1, event_id=str(uuid.uuid4())))
            calls["MarkToolInDoubt"] = (self.work.MarkToolInDoubt, ws.MarkToolInDoubtRequest(
                lease=lease, step_key=step_key, error_code="stale", detail="stale holder",
                event_id=str(uuid.uuid4())))
        answers: dict[str, str] = {}
        for name, (method, request) in calls.items():
            try:
                await method(request, timeout=15)
                answers[name] = "ACCEPTED"
            except grpc.aio.AioRpcError as exc:
                answers[name] = reason_of(exc)
        return answers
