"""Pure state transitions of the checkpoint: what each decision or outcome does to the state.

No I/O here. The driver persists each new state (SaveCheckpoint, or as Tx2's
checkpoint) before it acts on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from executor.agents import AgentDefinition
from executor.checkpoint import (
    Finished,
    HistoryEntry,
    State,
    ToolDecision,
    Usage,
    Versions,
    Waiting,
)
from executor.deciders.base import Invalid, Proposal, ToolCall
from executor.journal import exception_record, history_record, journaled, result_record, retry_record
from shared.canonical import idempotency_key, request_hash


@dataclass(frozen=True)
class RunIds:
    tenant_id: str
    run_id: str


def initial_state(agent: AgentDefinition) -> State:
    return State(versions=Versions(
        agent=agent.name, agent_version=agent.version, decider=agent.decider.kind,
        model=":".join(p for p in (agent.model.provider, agent.model.name, agent.model.version) if p),
        prompt=agent.prompt.version, policy=agent.policy.version, tool_schemas=agent.tool_schemas_hash(),
    ))


def step_key_for(node: str, attempt: int) -> str:
    """Stable: workflow node id plus logical iteration, never a random id."""
    return f"{node}/attempt-{attempt}"


def _used(state: State, proposal: Proposal) -> Usage:
    usage = state.usage
    return Usage(steps=usage.steps + 1, tokens=usage.tokens + proposal.tokens,
                 cost_usd=round(usage.cost_usd + proposal.cost_usd, 10))


def _entry(state: State, proposal: Proposal, step_key: str, entry_kind: Any, **detail: Any) -> HistoryEntry:
    tool = proposal.decision.tool if isinstance(proposal.decision, ToolCall) else None
    # A model decider's running summary made for this decision (executor/deciders/llm.py): in the journal.
    detail["summary"] = proposal.extra.get("summary")
    return HistoryEntry(index=state.step_index, node=proposal.node, step_key=step_key, kind=entry_kind, tool=tool,
                        detail={k: v for k, v in detail.items() if v is not None})


def tool_decision(state: State, proposal: Proposal, call: ToolCall, ids: RunIds, attempt: int = 1,
                  ) -> ToolDecision:
    key = step_key_for(proposal.node, attempt)
    return ToolDecision(
        step_key=key, tool_name=call.tool, request_hash=request_hash(call.tool, call.args).hex(),
        request=call.args, idempotency_key=idempotency_key(ids.tenant_id, ids.run_id, call.tool, key),
        node=proposal.node, attempt=attempt, decision_index=state.step_index, raw=proposal.raw,
    )


def decided_tool(state: State, proposal: Proposal, decision: ToolDecision, *, needs_approval: bool) -> State:
    """The validated decision goes into the checkpoint before Tx1 (docs/design.md §invariants, rule 6)."""
    entry = _entry(state, proposal, decision.step_key, "tool", args=decision.request, model=proposal.model or None)
    update: dict[str, Any] = {
        "cursor": decision.step_key, "step_index": state.step_index + 1, "usage": _used(state, proposal),
        "history": [*state.history, entry], "invalid_streak": 0,
    }
    if needs_approval:
        update["waiting"] = Waiting(kind="approval", step_key=decision.step_key, node=decision.node,
                                    prompt=f"approve {decision.tool_name} at step {decision.step_key}",
                                    tool=decision)
    else:
        update["pending_tool"] = decision
    return journaled(state, update, lambda seq: history_record(seq, entry))


def decided_wait(state: State, proposal: Proposal, waiting: Waiting) -> State:
    # A signal wait is an input whose answer comes from a signal: history kind "input".
    kind = "input" if waiting.kind in ("signal", "children") else waiting.kind
    entry = _entry(state, proposal, waiting.step_key, kind, prompt=waiting.prompt,
                   sleep_ms=waiting.sleep_ms if waiting.kind == "sleep" else None, signal=waiting.signal,
                   timeout_ms=waiting.sleep_ms if waiting.kind in ("signal", "children") else None)
    return journaled(state, {
        "cursor": waiting.step_key, "step_index": state.step_index + 1, "usage": _used(state, proposal),
        "history": [*state.history, entry], "waiting": waiting, "invalid_streak": 0,
    }, lambda seq: history_record(seq, entry))


def decided_finish(state: State, proposal: Proposal, finished: Finished) -> State:
    key = step_key_for(proposal.node, 1)
    kind = "finish" if finished.outcome == "COMPLETED" else "fail"
    entry = _entry(state, proposal, key, kind, reason=finished.reason or None)
    return journaled(state, {
        "cursor": key, "step_index": state.step_index + 1, "usage": _used(state, proposal),
        "history": [*state.history, entry], "finished": finished, "invalid_streak": 0,
    }, lambda seq: history_record(seq, entry))


def decided_invalid(state: State, proposal: Proposal, invalid: Invalid) -> State:
    """A parse failure, refusal, filter or bad arguments: recorded, never guessed around."""
    key = step_key_for(f"{proposal.node}.invalid{state.step_index}", 1)
    record = {"index": state.step_index, "kind": invalid.kind, "detail": invalid.detail[:2000],
              "raw": proposal.raw, "model": proposal.model}
    entry = _entry(state, proposal, key, "exception", kind=invalid.kind, detail=invalid.detail[:2000],
                   raw=proposal.raw)
    return journaled(state, {
        "step_index": state.step_index + 1, "usage": _used(state, proposal),
        "history": [*state.history, entry], "exceptions": [*state.exceptions, record],
        "invalid_streak": state.invalid_streak + 1,
    }, lambda seq: history_record(seq, entry), lambda seq: exception_record(seq, record))


def finished_without_decision(state: State, finished: Finished) -> State:
    """Ends the run on the executor's own account (budget, policy), not a decider's proposal."""
    return state.model_copy(update={"finished": finished})


def paused(state: State, reason: str) -> State:
    """Parks the run PAUSED_HUMAN until an operator resumes (APPROVE continues, REJECT ends it)."""
    key = step_key_for(f"pause{state.step_index}", 1)
    return state.model_copy(update={"waiting": Waiting(kind="resume", step_key=key, node="pause", prompt=reason)})


def tool_result(state: State, decision: ToolDecision, status: str, *, response: Any = None,
                remote_resource_id: str | None = None, error_code: str = "", detail: str = "",
                error_class: str = "", evidence: dict[str, Any] | None = None,
                retry: bool = False) -> State:
    """Tx2's checkpoint: the outcome under tool_results[step_key] and no pending_tool."""
    # The same shape the scheduler's ResolveToolExecution writes (the tool is in the history entry).
    result: dict[str, Any] = {"status": status, "response": response}
    if remote_resource_id is not None:
        result["remote_resource_id"] = remote_resource_id
    if error_code:
        result.update(error_code=error_code, error_class=error_class, detail=detail)
    if evidence:
        result["evidence"] = evidence
    return journaled(state, {
        "pending_tool": None, "retry_tool": decision if retry else None, "cursor": decision.step_key,
        "tool_results": {**state.tool_results, decision.step_key: result},
    }, lambda seq: result_record(seq, decision.step_key, result))


def next_attempt(state: State, decision: ToolDecision, ids: RunIds) -> tuple[State, ToolDecision]:
    """The same persisted decision under the next attempt's step key (and so a new idempotency key)."""
    attempt = decision.attempt + 1
    key = step_key_for(decision.node, attempt)
    following = decision.model_copy(update={
        "step_key": key, "attempt": attempt,
        "idempotency_key": idempotency_key(ids.tenant_id, ids.run_id, decision.tool_name, key),
    })
    history = list(state.history)
    attempts = [decision.step_key, key]
    for index in range(len(history) - 1, -1, -1):
        if history[index].step_key == decision.step_key:
            entry = history[index]
            attempts = [*entry.detail.get("attempts", [decision.step_key]), key]
            history[index] = entry.model_copy(update={"step_key": key,
                                                      "detail": {**entry.detail, "attempts": attempts}})
            break
    # In memory the decision moves to its new step key; in the journal a retry entry says so.
    return journaled(state, {"pending_tool": following, "retry_tool": None, "cursor": key, "history": history},
                     lambda seq: retry_record(seq, decision.step_key, key, attempts)), following


def operator_response(state: State, human: dict[str, Any]) -> dict[str, Any]:
    """The exception record an operator's response leaves in the checkpoint."""
    return {"index": state.step_index, "kind": "operator_response", "decision": human.get("decision"),
            "operator": human.get("operator"), "comment": human.get("comment")}
