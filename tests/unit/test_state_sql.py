"""The transition table governs the SQL: every status a statement writes into agent_runs is the
target of an operation that statement performs (scheduler/states.py TRANSITIONS).

A statement that sets a literal status is listed with its operations; one that takes the status
as a parameter is listed as such (its caller passes a TRANSITIONS target). A new statement that
sets agent_runs.status fails here until it is listed, so the table cannot drift from the SQL.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from scheduler.states import TRANSITIONS, Op, RunStatus, run_status
from scheduler.store.queries import Q
from scheduler.store.rows import ChildRow, RunRow

WRITES = {
    "claim_work": {Op.CLAIM, Op.CLAIM_EXPIRED},
    "claim_work_plain": {Op.CLAIM, Op.CLAIM_EXPIRED},
    "begin_tool_call": {Op.BEGIN_TOOL_CALL},
    "complete_tool_call": {Op.COMPLETE_TOOL_CALL},
    "tool_not_executed": {Op.TOOL_NOT_EXECUTED, Op.TOOL_NOT_EXECUTED_EXHAUSTED},
    "mark_tool_in_doubt": {Op.MARK_TOOL_IN_DOUBT},
    "finish_run": {Op.FINISH_COMPLETED, Op.FINISH_FAILED, Op.FINISH_PAUSED_HUMAN, Op.FINISH_RETRY,
                   Op.FINISH_SLEEP, Op.FINISH_RETRY_EXHAUSTED, Op.FINISH_RETRY_EXHAUSTED_PAUSE},
    "resume_run": {Op.RESUME},
    "freeze_run": {Op.FREEZE},
    "requeue_resolved": {Op.RESOLVE_SUCCEEDED, Op.RESOLVE_NOT_EXECUTED},
}
# Statements whose target status is a parameter the store computes from TRANSITIONS (a set form reads
# it from its element `i`, one per run's write).
PARAMETRIC = {"complete_tool_call_and_end", "end_run"}

_SET_STATUS = re.compile(r"UPDATE\s+agent_runs\b(?:\s+AS\s+\w+)?\s+SET\s+status\s*=\s*", re.I)


def _expression(sql: str, start: int) -> str:
    """The SET status expression from `start` to its top-level comma (CASE ... END and parens nest)."""
    depth, i = 0, start
    words = re.compile(r"\bCASE\b|\bEND\b|[(),]", re.I)
    for match in words.finditer(sql, start):
        token = match.group(0).upper()
        if token in ("CASE", "("):
            depth += 1
        elif token in ("END", ")"):
            depth -= 1
        elif depth == 0:
            return sql[start:match.start()]
        i = match.end()
    return sql[start:i]


def _writes() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name in list(Q):
        sql = Q[name]
        for match in _SET_STATUS.finditer(sql):
            found.setdefault(name, []).append(_expression(sql, match.end()))
    return found


def _targets(expression: str) -> set[str]:
    """The literals the expression can yield (conditions between WHEN and THEN left out)."""
    results = re.sub(r"\bWHEN\b.*?\bTHEN\b", " ", expression, flags=re.I | re.S)
    return set(re.findall(r"'([A-Z_]+)'", results))


def test_every_statement_that_writes_a_run_status_is_governed_by_the_table() -> None:
    writes = _writes()
    assert set(writes) == set(WRITES) | PARAMETRIC, "list the new statement in WRITES or PARAMETRIC"
    for name, expressions in writes.items():
        literal = set().union(*(_targets(e) for e in expressions))
        if name in PARAMETRIC:
            assert not literal and all(re.fullmatch(r"\$\d+|i\.\w+", e.strip()) for e in expressions), (
                name, expressions)
            continue
        allowed = {TRANSITIONS[key].value for key in TRANSITIONS if key[1] in WRITES[name]}
        assert literal, (name, expressions)
        assert literal <= allowed, f"{name} writes {sorted(literal - allowed)}, not a target of {WRITES[name]}"
        assert literal <= {s.value for s in RunStatus}


@pytest.mark.parametrize("expression, targets", [
    ("'WAITING_TOOL'", {"WAITING_TOOL"}),
    ("CASE WHEN r.status = 'QUEUED' THEN 'RUNNING' ELSE r.status END", {"RUNNING"}),
    ("CASE WHEN :mode = 'retry' THEN :x WHEN :mode IN ('retry', 'sleep') THEN 'QUEUED' ELSE :t END", {"QUEUED"}),
])
def test_targets_leave_the_conditions_out(expression: str, targets: set[str]) -> None:
    assert _targets(expression) == targets


class Record(dict[str, Any]):
    """Reads like an asyncpg Record: by name and by position."""

    def __getitem__(self, key: Any) -> Any:
        return list(self.values())[key] if isinstance(key, int) else super().__getitem__(key)


def test_rows_carry_the_status_as_the_enum() -> None:
    record = Record({f.name: None for f in dataclasses.fields(RunRow)})
    record.update(status="PAUSED_HUMAN", version=1)
    row = RunRow.of(record)
    assert row.status is RunStatus.PAUSED_HUMAN
    assert RunRow.of(record, pause_reason="x").status is RunStatus.PAUSED_HUMAN  # the overrides path too
    child = ChildRow.of(Record({"id": None, "agent_name": "a", "status": "COMPLETED", "result": None,
                                "terminal_reason": None, "spawn_index": 0}))
    assert child.status is RunStatus.COMPLETED
    with pytest.raises(KeyError):
        run_status("DONE")  # a value outside the vocabulary is not silently carried
