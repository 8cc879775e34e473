"""The checkpoint an executor writes: an explicit, versioned schema.

What a checkpoint holds (docs/design.md §checkpoints): the cursor and step index,
the validated decision (raw and schema result), tool name, normalised arguments
and their hash, the step key and idempotency key, completed tool results, budget
used, model / prompt / tool-schema / policy versions, and exceptions (parse
failures, refusals, filters, operator responses).

`pending_tool` carries the three keys the scheduler's Tx1 checks (step_key,
tool_name, request_hash). `tool_results[step_key]` is where Tx2 and the
scheduler's ResolveToolExecution record a step's outcome.

Reading a checkpoint of another schema version goes through a registered (executor/migrations.py)
migration or is refused (`UnsupportedCheckpoint`); it is never parsed into
zero values.

Schema 2 (long runs at flat cost): the checkpoint holds only what is current
(cursor, step index, pending or retried decision, waiting, finished, usage,
versions, invalid streak, a small agent-owned state) and `journal_len`, the
number of history entries the run's journal holds. The history, tool results,
operator inputs and exceptions are append-only journal entries (executor/journal.py)
written with the checkpoint that records them; tool answers stay in the ledger.
In memory a State still carries those collections, rebuilt from the journal at
claim (`pending_journal` holds the entries not yet written).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)
SCHEMA_VERSION = 2
# Fields a schema-2 checkpoint never stores: they live in the run's journal (and the ledger).
JOURNALED = frozenset({"history", "tool_results", "inputs", "exceptions", "pending_journal"})
MAX_AGENT_STATE_BYTES = 16 * 1024


class UnsupportedCheckpoint(Exception):
    """A checkpoint this executor must not interpret; the run is paused with str(self) as reason."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolDecision(_Model):
    """A validated tool call, persisted before Tx1 (docs/design.md §invariants, rule 6)."""

    step_key: str
    tool_name: str
    request_hash: str  # hex of shared.canonical.request_hash(tool_name, request)
    request: dict[str, Any]
    idempotency_key: str
    node: str  # workflow node id (with its visit, e.g. poll@2)
    attempt: int = Field(ge=1)
    decision_index: int = Field(ge=0)
    raw: Any = None  # the decider's raw proposal
    schema_valid: bool = True
    approval: dict[str, Any] | None = None  # operator's APPROVE, when the tool requires one


class Waiting(_Model):
    """A durable wait the run is parked on: a timer, operator input, an approval, or an
    operator's decision after a pause (`resume`: budget exhausted, decisions kept failing...)."""

    kind: Literal["sleep", "input", "approval", "resume", "signal", "children"]
    step_key: str
    node: str
    prompt: str | None = None  # input: the question; approval / resume: the reason shown
    sleep_ms: int | None = None  # sleep: the timer; signal: the wait's timeout
    signal: str | None = None  # signal: the name waited for
    tool: ToolDecision | None = None  # approval: the decision awaiting it
    # children: the spawn ({"children": [{"agent", "version", "input", "labels", "budget"}], "join": "all" |
    # "any", "detach"}), repeated as it is after a takeover (the scheduler finds the children it made).
    spawn: dict[str, Any] | None = None


class Finished(_Model):
    """The run's final decision, recorded before FinishRun so a takeover repeats it exactly."""

    outcome: Literal["COMPLETED", "FAILED"]
    reason: str = ""
    result: Any = None
    error_class: str = ""


class HistoryEntry(_Model):
    index: int
    node: str
    step_key: str
    kind: Literal["tool", "sleep", "input", "approval", "finish", "fail", "exception"]
    tool: str | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


class Usage(_Model):
    steps: int = 0
    tokens: int = 0
    cost_usd: float = 0.0


class Versions(_Model):
    agent: str
    agent_version: str
    decider: str
    model: str = ""
    prompt: str = ""
    policy: str = ""
    tool_schemas: str = ""


class JournalRecord(_Model):
    """One journal entry as the executor writes it (seq is the run's journal position)."""

    seq: int = Field(ge=1)
    kind: Literal["tool", "sleep", "input", "approval", "finish", "fail", "exception", "result", "answer", "retry"]
    step_key: str = ""
    node: str = ""
    tool: str = ""
    detail: dict[str, Any] = Field(default_factory=dict)


class State(_Model):
    cursor: str = ""  # the step key being worked on (or last finished)
    step_index: int = 0  # decisions taken so far
    versions: Versions
    pending_tool: ToolDecision | None = None
    retry_tool: ToolDecision | None = None  # transient failure: re-send as the next attempt
    tool_results: dict[str, dict[str, Any]] = Field(default_factory=dict)
    inputs: dict[str, Any] = Field(default_factory=dict)  # operator input by step key
    history: list[HistoryEntry] = Field(default_factory=list)
    waiting: Waiting | None = None
    finished: Finished | None = None
    usage: Usage = Usage()
    exceptions: list[dict[str, Any]] = Field(default_factory=list)
    invalid_streak: int = 0  # consecutive invalid decisions
    agent_state: dict[str, Any] = Field(default_factory=dict)  # the decider's own small state
    journal_len: int = 0  # journal entries of the run, the pending ones included
    pending_journal: list[JournalRecord] = Field(default_factory=list)  # not yet written

    def to_json_dict(self) -> dict[str, Any]:
        """The schema-2 checkpoint: current state only, never the history or tool answers."""
        return self.model_dump(mode="json", exclude_none=True, exclude=set(JOURNALED))
