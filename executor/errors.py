"""Error classes (docs/design.md §in-doubt): one explicit table from error code to class to action.

Whether to retry is decided by whether the error proves that no side effect
happened, never by habit. Codes not in the table are treated as the most
cautious class, an unknown outcome.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorClass(StrEnum):
    DEFINITE_NO_EFFECT = "definite_no_effect"
    RETRYABLE_TRANSIENT = "retryable_transient"
    UNKNOWN_OUTCOME = "unknown_outcome"
    PERMANENT = "permanent"


class Action(StrEnum):
    # Tx2 with outcome FAILED: the ledger row closes FAILED and the decider sees
    # the error (a corrected retry, the plan's on_failure, or the run fails).
    RECORD_FAILED = "record_failed"
    # Tx2 FAILED, then FinishRun RETRY: QUEUED with database-computed backoff;
    # the same decision is sent again under the next attempt's step key.
    RETRY_WITH_BACKOFF = "retry_with_backoff"
    # MarkToolInDoubt: PAUSED_INDOUBT until a lookup or an operator decides.
    FREEZE_IN_DOUBT = "freeze_in_doubt"
    # FinishRun FAILED (or PAUSED_HUMAN when the agent's policy says so).
    END_RUN = "end_run"


ACTIONS: dict[ErrorClass, Action] = {
    ErrorClass.DEFINITE_NO_EFFECT: Action.RECORD_FAILED,
    ErrorClass.RETRYABLE_TRANSIENT: Action.RETRY_WITH_BACKOFF,
    ErrorClass.UNKNOWN_OUTCOME: Action.FREEZE_IN_DOUBT,
    ErrorClass.PERMANENT: Action.END_RUN,
}

E = ErrorClass
ERROR_CODES: dict[str, ErrorClass] = {
    # Definite, no side effect: refused locally or by a downstream whose contract
    # guarantees the request did not run.
    "invalid_arguments": E.DEFINITE_NO_EFFECT,  # JSON Schema validation before Tx1
    "unknown_tool": E.DEFINITE_NO_EFFECT,
    "refused": E.DEFINITE_NO_EFFECT,  # HTTP 4xx (not 408/429): the downstream did nothing
    "stale_fence": E.DEFINITE_NO_EFFECT,  # a fenced downstream refused an older fencing token
    "tool_refused": E.DEFINITE_NO_EFFECT,  # a python tool raised ToolRefused
    # A python tool's arguments did not bind to its function's signature: the call never started.
    "tool_not_callable": E.DEFINITE_NO_EFFECT,
    # The tool answered, but its answer is over the scheduler's max_tool_response_bytes: the step is
    # recorded as a definite failure (the decider sees why; never in doubt, never a stuck run).
    "response_too_large": E.DEFINITE_NO_EFFECT,
    # An MCP tool answered with isError: it says it failed (executor/tools/mcp.py); the decider sees why.
    "tool_error": E.DEFINITE_NO_EFFECT,
    # Retryable transient: nothing was accepted; try again later with backoff.
    "rate_limited": E.RETRYABLE_TRANSIENT,  # HTTP 429 before acceptance
    "connect_failed": E.RETRYABLE_TRANSIENT,  # no connection, so no byte of the request was sent
    "tool_busy": E.RETRYABLE_TRANSIENT,  # a python tool raised ToolRetryLater
    "scheduler_unavailable": E.RETRYABLE_TRANSIENT,  # retried with the same event id (client.py)
    "model_unavailable": E.RETRYABLE_TRANSIENT,
    # An idempotent tool's unknown outcome (an MCP tool with readOnlyHint or idempotentHint): sending it
    # again has no further effect, so it is retried rather than frozen.
    "retried_unknown": E.RETRYABLE_TRANSIENT,  # the decider's endpoint failed: inference has no side effect
    # Unknown outcome: the request may have taken effect. Freeze, then reconcile.
    "timeout": E.UNKNOWN_OUTCOME,
    "connection_reset": E.UNKNOWN_OUTCOME,
    "server_error": E.UNKNOWN_OUTCOME,  # ambiguous 5xx
    "bad_response": E.UNKNOWN_OUTCOME,  # 2xx whose body cannot be read: it ran, result unknown
    "tool_crashed": E.UNKNOWN_OUTCOME,  # a python tool raised anything else
    "takeover_no_lookup": E.UNKNOWN_OUTCOME,  # WAITING_TOOL taken over; nothing to ask
    "takeover_lookup_unknown": E.UNKNOWN_OUTCOME,
    "takeover_not_found_unfenced": E.UNKNOWN_OUTCOME,  # "not found" cannot rule out a late send
    # Permanent: no retry can succeed without a person or a new run.
    "budget_exhausted": E.PERMANENT,
    "policy_refused": E.PERMANENT,
    "approval_rejected": E.PERMANENT,
    "decision_retries_exhausted": E.PERMANENT,
    "attempts_exhausted": E.PERMANENT,
    "checkpoint_unsupported": E.PERMANENT,
    "agent_not_served": E.PERMANENT,
    "plan_failed": E.PERMANENT,  # a scripted plan's fail node, or a tool failure it does not handle
}
del E


def classify(code: str) -> ErrorClass:
    return ERROR_CODES.get(code, ErrorClass.UNKNOWN_OUTCOME)


def action_for(code: str) -> Action:
    return ACTIONS[classify(code)]
