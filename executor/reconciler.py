"""The reconciler: resolves PAUSED_INDOUBT ledger rows whose tool has a lookup contract.

For each in-doubt row it asks the downstream by idempotency key, then calls
ResolveToolExecution with the evidence, the rule version and the time:
found → SUCCEEDED with the found result (the run continues from a checkpoint
holding it); provably not executed and the contract allows a retry (lookup +
fenced) → NOT_EXECUTED (the row is kept, the run re-queued for its next
attempt); anything else → UNKNOWN with the evidence recorded: the run stays
paused for a person, and is counted.

The lookup carries X-Fencing-Token = the run's fence + 1, the fence its next
holder will get, so a fenced downstream refuses any late send from the last
holder. RunService is tenant-scoped: the reconciler sweeps the tenants it is
configured with.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import grpc

from executor.agents import AgentCatalog, AgentDefinition
from executor.tools import ToolCallContext, ToolRegistry
from shared.canonical import canonical_json, uuid7
from shared.errors import AgentrtError, from_rpc_error
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc
from shared.tracing import inject_metadata

log = logging.getLogger(__name__)
RULE_VERSION = "reconciler/1"
TENANT_HEADER = "x-tenant-id"


@dataclass
class SweepReport:
    succeeded: int = 0
    not_executed: int = 0
    undecided: int = 0  # stayed paused: lookup unknown, or not found without a fence
    no_lookup: int = 0  # stayed paused: the tool has no lookup contract (a person decides)
    errors: int = 0
    resolved_steps: list[str] = field(default_factory=list)


class Reconciler:
    def __init__(self, catalog: AgentCatalog, tools: ToolRegistry, channel: grpc.aio.Channel,
                 tenants: list[str], resolved_by: str = "agentrt-reconciler", page_size: int = 100,
                 api_key: str | None = None) -> None:
        self.catalog = catalog
        self.tools = tools
        self.runs = rs_grpc.RunServiceStub(channel)
        self.tenants = tenants
        self.resolved_by = resolved_by
        self.page_size = page_size
        self.totals = SweepReport()
        self._auth = [("authorization", f"Bearer {api_key}")] if api_key else []

    async def sweep(self) -> SweepReport:
        report = SweepReport()
        for tenant in self.tenants:
            for agent_name in self.catalog.names():
                async for run in self._paused_runs(tenant, agent_name):
                    try:
                        await self._reconcile_run(tenant, run, report)
                    except AgentrtError as exc:  # e.g. resolved concurrently by an operator
                        report.errors += 1
                        log.warning("reconcile run %s: %s: %s", run.run_id, exc.reason, exc.message)
        for name in ("succeeded", "not_executed", "undecided", "no_lookup", "errors"):
            setattr(self.totals, name, getattr(self.totals, name) + getattr(report, name))
        if report.undecided or report.no_lookup:
            log.warning("reconciler: %d in-doubt rows stay paused (%d without a lookup contract)",
                        report.undecided + report.no_lookup, report.no_lookup)
        return report

    async def run_forever(self, interval_s: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sweep()
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except TimeoutError:
                pass

    async def _call(self, method: Any, request: Any, tenant: str) -> Any:
        try:
            return await method(request, metadata=inject_metadata([(TENANT_HEADER, tenant), *self._auth]), timeout=30)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None

    async def _paused_runs(self, tenant: str, agent_name: str) -> Any:
        token = ""
        while True:
            page = await self._call(self.runs.ListRuns, rs.ListRunsRequest(
                statuses=[pb.RUN_STATUS_PAUSED_INDOUBT], agent_name=agent_name, page_size=self.page_size,
                page_token=token), tenant)
            for run in page.runs:
                yield run
            token = page.next_page_token
            if not token:
                return

    def _agent(self, run: pb.Run, hist: rs.RunHistory) -> AgentDefinition | None:
        version = run.agent_version
        if not version and hist.checkpoints:
            version = json.loads(hist.checkpoints[-1].state_json).get("versions", {}).get("agent_version", "")
        return self.catalog.get(run.agent_name, version)

    async def _reconcile_run(self, tenant: str, run: pb.Run, report: SweepReport) -> None:
        hist = await self._call(self.runs.GetRunHistory, rs.GetRunHistoryRequest(run_id=run.run_id), tenant)
        agent = self._agent(run, hist)
        for row in hist.tool_executions:
            if row.status != pb.TOOL_EXECUTION_STATUS_IN_DOUBT:
                continue
            tool = agent.tool(row.tool_name) if agent else None
            if agent is None or tool is None or not tool.contract.lookup:
                report.no_lookup += 1
                continue
            await self._reconcile_row(tenant, hist.run, agent, row, tool.contract.retry_after_not_found, report)

    async def _reconcile_row(self, tenant: str, run: pb.Run, agent: AgentDefinition, row: pb.ToolExecution,
                             retry_allowed: bool, report: SweepReport) -> None:
        adapter = self.tools.get(agent, row.tool_name)
        assert adapter is not None  # every tool of a loaded definition has one
        ctx = ToolCallContext(run_id=run.run_id, tenant_id=tenant, step_key=row.step_key,
                              idempotency_key=row.idempotency_key, fencing_token=run.fencing_token + 1,
                              headers=dict(inject_metadata()))
        found = await adapter.lookup(ctx)
        evidence = {"lookup": found.status, "response": found.evidence, "checked_fence": ctx.fencing_token,
                    "checked_at": dt.datetime.now(dt.UTC).isoformat(), "tool": row.tool_name,
                    "idempotency_key": row.idempotency_key}
        request = rs.ResolveToolExecutionRequest(
            run_id=run.run_id, step_key=row.step_key, evidence_json=canonical_json(evidence),
            resolved_by=self.resolved_by, rule_version=RULE_VERSION, event_id=str(uuid7()))
        if found.status == "found":
            request.outcome, counter = rs.RESOLUTION_OUTCOME_SUCCEEDED, "succeeded"
            request.result_json = canonical_json(found.response)
            request.remote_resource_id = found.remote_resource_id or ""
        elif found.status == "not_found" and retry_allowed:
            request.outcome, counter = rs.RESOLUTION_OUTCOME_NOT_EXECUTED, "not_executed"
        else:
            request.outcome, counter = rs.RESOLUTION_OUTCOME_UNKNOWN, "undecided"
        await self._call(self.runs.ResolveToolExecution, request, tenant)
        setattr(report, counter, getattr(report, counter) + 1)
        if counter != "undecided":
            report.resolved_steps.append(f"{run.run_id}/{row.step_key}")
        log.info("reconciled run %s step %s: %s", run.run_id, row.step_key,
                 rs.ResolutionOutcome.Name(request.outcome))
