"""Tool steps under a lease: Tx1 → send → Tx2, the error-class table, and WAITING_TOOL takeover.

Never a blind resend: once an intent is recorded, only its own holder (who
knows it has not sent yet) may send it; anyone else looks it up or freezes
(docs/design.md §tool-calls, §in-doubt). The run's version, status and open
step are read and moved through its RunLease (executor/runlease.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from executor.advance import Action, Advancer, EndRun, ExecuteTool
from executor.agents import AgentDefinition
from executor.checkpoint import SCHEMA_VERSION, State, ToolDecision
from executor.errors import Action as ErrorAction
from executor.errors import action_for, classify
from executor.runlease import RunLease, reason_digest, run_end
from executor.services import Services
from executor.shutdown import Stopped
from executor.steps import tool_result
from executor.tools.base import ToolCallContext, ToolOutcome
from shared.canonical import canonical_json
from shared.errors import AlreadyExists, DecisionNotCheckpointed, ResourceExhausted
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.logs import payload_digest
from shared.tracing import inject_metadata

log = logging.getLogger(__name__)
TAKEOVER_RULE = "executor-takeover/1"
Next = tuple[State, Action | None]


class ToolCalls:
    """The tool steps of one claimed run: they read and move its RunLease (version, status, open step)."""

    def __init__(self, lease: RunLease, services: Services, agent: AgentDefinition, advancer: Advancer,
                 fold: bool) -> None:
        self.lease = lease
        self.s = services
        self.agent = agent
        self.advancer = advancer
        # A pure decider's next decision is made before Tx2 and persisted in Tx2's checkpoint.
        self.fold = fold

    def context(self, step_key: str, idempotency_key: str) -> ToolCallContext:
        run = self.lease.run
        return ToolCallContext(run_id=run.run_id, tenant_id=run.tenant_id, step_key=step_key,
                               idempotency_key=idempotency_key, fencing_token=self.lease.fencing_token,
                               headers=dict(inject_metadata()))

    async def execute(self, state: State, decision: ToolDecision, *, intent_recorded: bool = False) -> Next | None:
        lease, s = self.lease, self.s
        if not intent_recorded:
            began = await self.begin_within_limits(decision)
            if began is None:
                return None  # lease lost or stopping while the tool's limit was full: nothing was sent
            if began.existing and not began.replayed:
                # A row this call did not write: never a licence to send.
                reason = (f"a ledger row for step {decision.step_key} already exists "
                          f"({pb.ToolExecutionStatus.Name(began.execution.status)}); not sending again")
                paused, action = self.advancer.end(state, "policy_refused", reason, policy_pause=True)
                return await lease.persist(paused), action
        # replayed: our own intent, whose commit we had not heard of; nothing was sent yet.
        # intent_recorded: this holder's CompleteAndBeginToolCall wrote the row; nothing was sent yet either.
        lease.intent_recorded(decision.step_key)
        s.faults.hit("after_outbound_intent_commit", lease.run.run_id)
        if not lease.alive():
            return None  # lapsed or lost: sending now could race the next holder
        s.faults.hit("before_tool_send", lease.run.run_id)
        adapter = s.tools.get(self.agent, decision.tool_name)
        assert adapter is not None  # every tool of a loaded definition has one
        outcome: ToolOutcome = await s.shutdown.race(
            adapter.call(decision.request, self.context(decision.step_key, decision.idempotency_key)),
            s.shutdown.hard_stop)
        s.faults.hit("after_tool_response_before_tx2_commit", lease.run.run_id)
        return await self.complete(state, decision, outcome)

    async def begin_within_limits(self, decision: ToolDecision) -> ws.BeginToolCallResponse | None:
        """Tx1; while the scheduler answers that the tool is at a rate or concurrency limit, waits the
        advised delay and asks again (no attempt, no budget step spent: nothing was written). None when
        the lease is gone or the executor stops meanwhile."""
        lease, s = self.lease, self.s
        while True:
            try:
                return await lease.client.begin_tool_call(lease.ref, lease.version, decision.step_key,
                                                          decision.tool_name, decision.idempotency_key,
                                                          decision.request, lease.give_up_at)
            except ResourceExhausted as held:
                s.counts.tool_calls_delayed += 1
                log.debug("run %s step %s: %s; trying again in %.3fs", lease.run.run_id, decision.step_key,
                          held.message, held.retry_after_s)
                try:
                    await s.shutdown.race(asyncio.sleep(min(max(held.retry_after_s, 0.001), 60.0)),
                                          s.shutdown.stopping)
                except Stopped:
                    return None
                if not lease.alive():
                    return None

    def _over_limit(self, outcome: ToolOutcome) -> ToolOutcome:
        """A successful answer larger than the scheduler's per-step limit becomes a definite failure."""
        claim = self.lease.claim
        limit = claim.limits.max_tool_response_bytes if claim.HasField("limits") else 0
        if not (outcome.ok and limit and outcome.response is not None):
            return outcome
        size = len(canonical_json(outcome.response).encode("utf-8"))
        if size <= limit:
            return outcome
        return ToolOutcome.failure(
            "response_too_large", f"the tool's answer is {size} bytes, over the {limit}-byte limit "
            "(max_tool_response_bytes); it was not stored")

    async def complete(self, state: State, decision: ToolDecision, outcome: ToolOutcome) -> Next | None:
        outcome = self._over_limit(outcome)
        if outcome.ok:
            after = tool_result(state, decision, "SUCCEEDED", response=outcome.response,
                                remote_resource_id=outcome.remote_resource_id)
            return await self.close(after, decision, ws.TOOL_OUTCOME_SUCCEEDED, outcome.response,
                                    outcome.remote_resource_id)
        code, error_class = outcome.error_code, classify(outcome.error_code).value
        action = action_for(code)
        detail = outcome.detail + (f" {json.dumps(outcome.evidence)}" if outcome.evidence else "")
        if action is ErrorAction.FREEZE_IN_DOUBT:
            await self.lease.mark_in_doubt(decision.step_key, code, detail)
            # The detail quotes the tool's answer and evidence: its size and digest only (shared/logs.py).
            log.warning("run %s step %s in doubt: %s (detail %s)", self.lease.run.run_id, decision.step_key, code,
                        payload_digest(detail))
            return None
        retry = action is ErrorAction.RETRY_WITH_BACKOFF
        after = tool_result(state, decision, "FAILED", error_code=code, detail=outcome.detail,
                            error_class=error_class, evidence=outcome.evidence or None, retry=retry)
        closed = await self.close(after, decision, ws.TOOL_OUTCOME_FAILED, None, None, error_code=code,
                                  fold=not retry)
        if not retry:
            return closed
        await self.lease.finish(ws.FINISH_OUTCOME_RETRY, f"tool {decision.tool_name} at {decision.step_key}: "
                                f"{code} {outcome.detail}".strip(), error_class=f"{error_class}:{code}",
                                pause_when_exhausted=self.agent.policy.pause_when_attempts_exhausted)
        return None

    async def close(self, after: State, decision: ToolDecision, outcome: ws.ToolOutcome, response: Any,
                    remote_resource_id: str | None, *, error_code: str = "", evidence: dict[str, Any] | None = None,
                    fold: bool = True) -> Next | None:
        """Tx2: the definite outcome, the next checkpoint and the event, in one transaction.

        When the folded next decision is itself a tool call, its Tx1 joins the
        same transaction (CompleteAndBeginToolCall): the checkpoint that records
        the decision and the intent row commit together, before any network I/O.
        When it is the run's end, the run ends in that transaction too (None is
        returned: nothing is left to do under this lease).
        """
        action: Action | None = None
        if fold and self.fold:
            after, action = await self.advancer.advance(after)
        data = after.to_json_dict()
        # Not while shutting down: no new step starts then, so the next intent is not recorded either.
        if (isinstance(action, ExecuteTool) and after.pending_tool == action.decision
                and not self.s.shutdown.stopping.is_set()):
            begun = await self.close_and_begin(after, data, decision, outcome, response, remote_resource_id,
                                               error_code, evidence, action.decision)
            if begun is not None:
                return begun
        lease = self.lease
        request = ws.CompleteToolCallRequest(
            lease=lease.ref, expected_version=lease.version, step_key=decision.step_key, outcome=outcome,
            response_json=canonical_json(response) if response is not None else "",
            remote_resource_id=remote_resource_id or "", error_code=error_code, state_json=canonical_json(data),
            schema_version=SCHEMA_VERSION, next_step_key=after.cursor,
            evidence_json=canonical_json(evidence) if evidence else "", journal=lease.unwritten(after))
        if isinstance(action, EndRun):
            # The checkpoint records the end, which has no side effect: the run ends in this transaction.
            request.end.CopyFrom(run_end(action.finished))
        reply = await lease.client.complete_tool_call(request, lease.give_up_at)
        after = lease.committed(reply.version, data, reply.status, after)
        if isinstance(action, EndRun):
            log.info("run %s -> %s%s", lease.run.run_id, pb.RunStatus.Name(reply.status),
                     reason_digest(action.finished.reason))
            return None
        return after, action

    async def close_and_begin(self, after: State, data: dict[str, Any], decision: ToolDecision,
                              outcome: ws.ToolOutcome, response: Any, remote_resource_id: str | None,
                              error_code: str, evidence: dict[str, Any] | None, following: ToolDecision) -> Next | None:
        """Tx2 of `decision` and Tx1 of `following` in one call; None when refused with nothing written
        for a reason the two-call path answers its own way (a ledger row already there, a decision the
        scheduler does not see in the checkpoint): the caller then writes Tx2 alone and Tx1 as usual."""
        lease = self.lease
        request = ws.CompleteAndBeginToolCallRequest(
            lease=lease.ref, expected_version=lease.version, step_key=decision.step_key, outcome=outcome,
            response_json=canonical_json(response) if response is not None else "",
            remote_resource_id=remote_resource_id or "", error_code=error_code, state_json=canonical_json(data),
            schema_version=SCHEMA_VERSION, evidence_json=canonical_json(evidence) if evidence else "",
            next=ws.NextToolCall(step_key=following.step_key, tool_name=following.tool_name,
                                 idempotency_key=following.idempotency_key,
                                 request_json=canonical_json(following.request)),
            journal=lease.unwritten(after))
        try:
            reply = await lease.client.complete_and_begin_tool_call(request, lease.give_up_at)
        except (AlreadyExists, DecisionNotCheckpointed) as exc:
            log.warning("run %s: combined Tx2 + Tx1 refused (%s), writing them one by one: %s",
                        lease.run.run_id, exc.reason, exc.message)
            return None
        except ResourceExhausted as held:
            # The next tool is at its limit: record this step's outcome now (Tx2 alone); Tx1 then waits.
            log.debug("run %s: next call held back (%s), writing Tx2 alone", lease.run.run_id, held.message)
            return None
        after = lease.committed(reply.version, data, pb.RUN_STATUS_WAITING_TOOL, after, open_step=following.step_key)
        return after, ExecuteTool(following, intent_recorded=True)

    async def freeze(self, step_key: str, code: str, detail: str) -> None:
        await self.lease.mark_in_doubt(step_key, code, detail)
        log.warning("run %s step %s frozen at takeover: %s", self.lease.run.run_id, step_key, code)

    async def take_over(self, state: State) -> Next | None:
        """A run claimed in WAITING_TOOL: the request may or may not have been sent. Look up, or freeze."""
        lease, s = self.lease, self.s
        if not lease.claim.HasField("pending_tool"):
            log.error("run %s claimed WAITING_TOOL without an open ledger row", lease.run.run_id)
            return None
        row = lease.claim.pending_tool
        decision = state.pending_tool
        tool = self.agent.tool(row.tool_name)
        if decision is None or decision.step_key != row.step_key:
            await self.freeze(row.step_key, "takeover_no_lookup", "the checkpoint does not hold this step's decision")
            return None
        if tool is None or not tool.contract.lookup:
            await self.freeze(row.step_key, "takeover_no_lookup",
                              f"tool {row.tool_name} has no lookup contract; the request may have been sent, "
                              "so it is not sent again")
            return None
        adapter = s.tools.get(self.agent, row.tool_name)
        assert adapter is not None
        found = await s.shutdown.race(adapter.lookup(self.context(row.step_key, row.idempotency_key)),
                                      s.shutdown.hard_stop)
        evidence = {"lookup": found.status, "response": found.evidence, "fencing_token": lease.fencing_token,
                    "rule": TAKEOVER_RULE, "worker_id": s.worker_id}
        if found.status == "found":
            after = tool_result(state, decision, "SUCCEEDED", response=found.response,
                                remote_resource_id=found.remote_resource_id, evidence=evidence)
            return await self.close(after, decision, ws.TOOL_OUTCOME_SUCCEEDED, found.response,
                                    found.remote_resource_id, evidence=evidence)
        if found.status == "not_found" and tool.contract.retry_after_not_found:
            await lease.client.complete_tool_call(ws.CompleteToolCallRequest(
                lease=lease.ref, expected_version=lease.version, step_key=row.step_key,
                outcome=ws.TOOL_OUTCOME_NOT_EXECUTED, error_code="not_executed",
                evidence_json=canonical_json(evidence)), lease.give_up_at)
            log.info("run %s step %s proven not executed; re-queued for its next attempt",
                     lease.run.run_id, row.step_key)
            return None
        code = "takeover_not_found_unfenced" if found.status == "not_found" else "takeover_lookup_unknown"
        await self.freeze(row.step_key, code, canonical_json(evidence))
        return None
