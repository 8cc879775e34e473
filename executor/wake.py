"""Ending a durable wait: the timer elapsed, or an operator answered through ResumeRun.

The operator's response (`run.human_input_json`: decision APPROVE | REJECT |
INPUT, input, operator, comment) is recorded among the checkpoint's exceptions.
An APPROVE may carry `{"args": {...}}` to edit the tool arguments; the edit is
validated against the tool's schema like any decision and recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from executor.checkpoint import Finished, State
from executor.deciders.base import ToolCall
from executor.errors import ErrorClass
from executor.journal import answer_record, exception_record, journaled, result_record
from executor.steps import operator_response
from shared.canonical import request_hash

if TYPE_CHECKING:
    from executor.advance import Advancer


def _rejected(state: State, what: str, human: dict[str, Any], advancer: Advancer) -> State:
    reason = f"{what} rejected by {human.get('operator') or 'an operator'}"
    if human.get("comment"):
        reason += f": {human['comment']}"
    if advancer.agent.policy.on_approval_rejected == "continue" and state.waiting is not None:
        waiting = state.waiting
        result = {"status": "REJECTED", "tool": waiting.tool.tool_name if waiting.tool else None,
                  "response": None, "operator": human.get("operator"), "comment": human.get("comment")}
        return journaled(state, {"waiting": None, "tool_results": {**state.tool_results, waiting.step_key: result}},
                         lambda seq: result_record(seq, waiting.step_key, result))
    finished = Finished(outcome="FAILED", reason=reason, error_class=f"{ErrorClass.PERMANENT.value}:approval_rejected")
    return state.model_copy(update={"waiting": None, "finished": finished})


def wake(state: State, human: dict[str, Any], advancer: Advancer) -> State:
    waiting = state.waiting
    assert waiting is not None
    if waiting.kind == "sleep":
        return state.model_copy(update={"waiting": None})
    decision = str(human.get("decision") or "").upper()
    response = operator_response(state, human)
    recorded = journaled(state, {"exceptions": [*state.exceptions, response]},
                         lambda seq: exception_record(seq, response))
    if waiting.kind == "resume":
        if decision == "REJECT":
            return _rejected(recorded, "continuing", human, advancer)
        return recorded.model_copy(update={"waiting": None, "invalid_streak": 0})
    if waiting.kind == "input":
        if decision == "REJECT":
            return _rejected(recorded, "input request", human, advancer)
        return journaled(recorded, {"waiting": None, "inputs": {**state.inputs, waiting.step_key: human.get("input")}},
                         lambda seq: answer_record(seq, waiting.step_key, human.get("input")))
    # approval
    if decision == "REJECT":
        return _rejected(recorded, "approval", human, advancer)
    if decision != "APPROVE" or waiting.tool is None:
        return state  # not an answer to this question: stay parked
    tool = waiting.tool
    approval = {k: human.get(k) for k in ("operator", "comment")}
    edit = human.get("input")
    if isinstance(edit, dict) and isinstance(edit.get("args"), dict):
        invalid = advancer.validate(ToolCall(tool.tool_name, edit["args"]))
        if invalid is not None:
            note = {"index": state.step_index, "kind": "operator_edit_invalid", "detail": invalid.detail}
            return journaled(recorded, {"exceptions": [*recorded.exceptions, note]},
                             lambda seq: exception_record(seq, note))
        tool = tool.model_copy(update={"request": edit["args"],
                                       "request_hash": request_hash(tool.tool_name, edit["args"]).hex()})
        note = {"index": state.step_index, "kind": "operator_edit", "operator": human.get("operator"),
                "args": edit["args"]}
        recorded = journaled(recorded, {"exceptions": [*recorded.exceptions, note]},
                             lambda seq, note=note: exception_record(seq, note))
    return recorded.model_copy(update={"waiting": None, "pending_tool": tool.model_copy(update={"approval": approval})})
