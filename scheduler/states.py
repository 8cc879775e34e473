"""The run state machine: one table of allowed transitions, one function that checks it.

Every write that moves a run names an operation; the scheduler refuses any
(status, operation) pair that is not in TRANSITIONS. The SQL that performs the
operation also only matches rows whose status is one of `sources(op)`, so the
table and the database agree by construction.
"""

from __future__ import annotations

from enum import StrEnum

from shared.errors import InvalidTransition


class RunStatus(StrEnum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    WAITING_TOOL = "WAITING_TOOL"
    PAUSED_INDOUBT = "PAUSED_INDOUBT"
    PAUSED_HUMAN = "PAUSED_HUMAN"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


_BY_VALUE = {status.value: status for status in RunStatus}


def run_status(value: str) -> RunStatus:
    """The RunStatus of a database value (a dict lookup: rows are read on the hot path)."""
    return _BY_VALUE[value]


LEASED = frozenset({RunStatus.RUNNING, RunStatus.WAITING_TOOL})
TERMINAL = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


class Op(StrEnum):
    CLAIM = "claim"  # QUEUED, due
    CLAIM_EXPIRED = "claim_expired"  # leased, lease lapsed: same status, new fence
    HEARTBEAT = "heartbeat"
    SAVE_CHECKPOINT = "save_checkpoint"
    BEGIN_TOOL_CALL = "begin_tool_call"  # Tx1
    COMPLETE_TOOL_CALL = "complete_tool_call"  # Tx2, definite success or failure
    # Tx2 whose checkpoint records the run's end: the run ends in the same transaction.
    COMPLETE_TOOL_CALL_AND_COMPLETE = "complete_tool_call_and_complete"
    COMPLETE_TOOL_CALL_AND_FAIL = "complete_tool_call_and_fail"
    # Tx2 of one step and Tx1 of the next in one transaction: stays WAITING_TOOL, on the next step.
    COMPLETE_AND_BEGIN_TOOL_CALL = "complete_and_begin_tool_call"
    TOOL_NOT_EXECUTED = "tool_not_executed"  # takeover lookup proved not executed
    TOOL_NOT_EXECUTED_EXHAUSTED = "tool_not_executed_exhausted"  # ... at max_attempts
    MARK_TOOL_IN_DOUBT = "mark_tool_in_doubt"
    FINISH_COMPLETED = "finish_completed"
    FINISH_FAILED = "finish_failed"
    FINISH_PAUSED_HUMAN = "finish_paused_human"
    FINISH_RETRY = "finish_retry"  # QUEUED with backoff
    FINISH_RETRY_EXHAUSTED = "finish_retry_exhausted"  # FAILED at max_attempts
    FINISH_RETRY_EXHAUSTED_PAUSE = "finish_retry_exhausted_pause"  # PAUSED_HUMAN at max_attempts
    FINISH_SLEEP = "finish_sleep"  # durable timer
    CANCEL = "cancel"  # not leased: ends at once
    REQUEST_CANCEL = "request_cancel"  # leased: flag, ends at the holder's next write
    APPLY_CANCEL = "apply_cancel"  # the holder's write (or a claim) ends a flagged run
    EXPIRE_DEADLINE = "expire_deadline"  # claimed past its deadline
    RESUME = "resume"
    RESOLVE_SUCCEEDED = "resolve_succeeded"
    RESOLVE_NOT_EXECUTED = "resolve_not_executed"
    RESOLVE_UNKNOWN = "resolve_unknown"
    FREEZE = "freeze"  # commit-unknown found half a write


S = RunStatus
TRANSITIONS: dict[tuple[RunStatus, Op], RunStatus] = {
    (S.QUEUED, Op.CLAIM): S.RUNNING,
    (S.QUEUED, Op.CANCEL): S.CANCELLED,
    (S.RUNNING, Op.CLAIM_EXPIRED): S.RUNNING,
    (S.RUNNING, Op.HEARTBEAT): S.RUNNING,
    (S.RUNNING, Op.SAVE_CHECKPOINT): S.RUNNING,
    (S.RUNNING, Op.BEGIN_TOOL_CALL): S.WAITING_TOOL,
    (S.RUNNING, Op.FINISH_COMPLETED): S.COMPLETED,
    (S.RUNNING, Op.FINISH_FAILED): S.FAILED,
    (S.RUNNING, Op.FINISH_PAUSED_HUMAN): S.PAUSED_HUMAN,
    (S.RUNNING, Op.FINISH_RETRY): S.QUEUED,
    (S.RUNNING, Op.FINISH_RETRY_EXHAUSTED): S.FAILED,
    (S.RUNNING, Op.FINISH_RETRY_EXHAUSTED_PAUSE): S.PAUSED_HUMAN,
    (S.RUNNING, Op.FINISH_SLEEP): S.QUEUED,
    (S.RUNNING, Op.REQUEST_CANCEL): S.RUNNING,
    (S.RUNNING, Op.APPLY_CANCEL): S.CANCELLED,
    (S.RUNNING, Op.EXPIRE_DEADLINE): S.FAILED,
    (S.RUNNING, Op.FREEZE): S.PAUSED_INDOUBT,
    # A WAITING_TOOL run taken over stays WAITING_TOOL: the new holder may only
    # look the request up or freeze the run, never resend.
    (S.WAITING_TOOL, Op.CLAIM_EXPIRED): S.WAITING_TOOL,
    (S.WAITING_TOOL, Op.HEARTBEAT): S.WAITING_TOOL,
    (S.WAITING_TOOL, Op.COMPLETE_TOOL_CALL): S.RUNNING,
    (S.WAITING_TOOL, Op.COMPLETE_TOOL_CALL_AND_COMPLETE): S.COMPLETED,
    (S.WAITING_TOOL, Op.COMPLETE_TOOL_CALL_AND_FAIL): S.FAILED,
    (S.WAITING_TOOL, Op.COMPLETE_AND_BEGIN_TOOL_CALL): S.WAITING_TOOL,
    (S.WAITING_TOOL, Op.TOOL_NOT_EXECUTED): S.QUEUED,
    (S.WAITING_TOOL, Op.TOOL_NOT_EXECUTED_EXHAUSTED): S.FAILED,
    (S.WAITING_TOOL, Op.MARK_TOOL_IN_DOUBT): S.PAUSED_INDOUBT,
    (S.WAITING_TOOL, Op.REQUEST_CANCEL): S.WAITING_TOOL,
    (S.WAITING_TOOL, Op.APPLY_CANCEL): S.CANCELLED,
    (S.WAITING_TOOL, Op.EXPIRE_DEADLINE): S.FAILED,
    (S.WAITING_TOOL, Op.FREEZE): S.PAUSED_INDOUBT,
    (S.PAUSED_INDOUBT, Op.RESOLVE_SUCCEEDED): S.QUEUED,
    (S.PAUSED_INDOUBT, Op.RESOLVE_NOT_EXECUTED): S.QUEUED,
    (S.PAUSED_INDOUBT, Op.RESOLVE_UNKNOWN): S.PAUSED_INDOUBT,
    (S.PAUSED_INDOUBT, Op.CANCEL): S.CANCELLED,
    (S.PAUSED_HUMAN, Op.RESUME): S.QUEUED,
    (S.PAUSED_HUMAN, Op.CANCEL): S.CANCELLED,
}
del S


def transition(status: RunStatus | str, op: Op) -> RunStatus:
    """The status `op` leads to from `status`, or InvalidTransition."""
    current = RunStatus(status)
    try:
        return TRANSITIONS[(current, op)]
    except KeyError:
        raise InvalidTransition(f"{op.value} is not allowed from {current.value}", status=current.value,
                                operation=op.value) from None


def sources(op: Op) -> list[str]:
    """Statuses `op` may start from (the SQL's `status = ANY(...)` argument)."""
    return list(_SOURCES[op])


_SOURCES: dict[Op, tuple[str, ...]] = {
    op: tuple(sorted(status.value for (status, candidate) in TRANSITIONS if candidate is op)) for op in Op}
