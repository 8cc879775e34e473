"""What the templates show, shaped from RunService's messages (no HTML here: the templates escape)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

import jinja2
from markupsafe import escape as _escape

from console.api import STATUSES, Api, status_name, tool_status_name
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs

# The ledger's words for a tool call's state (the journal's step joined with its ledger row).
LEDGER_WORDS = {"OUTBOUND_INTENT": "intent (sent, answer not yet recorded)", "SUCCEEDED": "succeeded",
                "FAILED": "failed", "IN_DOUBT": "in doubt", "NOT_EXECUTED": "not executed"}


def escape(text: str) -> str:
    return str(_escape(text))


def counts(stats: rs.RunStats) -> list[tuple[str, int]]:
    by_status = dict(stats.runs_by_status)
    return [(s, int(by_status.get(s, 0))) for s in STATUSES]


def when(stamp: Any) -> str:
    """A Timestamp (set) as UTC to the second, else ""."""
    if stamp is None or (not stamp.seconds and not stamp.nanos):
        return ""
    return stamp.ToDatetime(tzinfo=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def pretty(text: str) -> str:
    """JSON text indented for reading; other text as it is."""
    if not text:
        return ""
    try:
        return json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False)
    except ValueError:
        return text


@dataclass
class Step:
    seq: int
    kind: str
    step_key: str
    node: str
    tool: str
    detail: str
    at: str
    run_version: int
    ledger: pb.ToolExecution | None = None

    @property
    def ledger_state(self) -> str:
        return tool_status_name(self.ledger.status) if self.ledger is not None else ""


@dataclass
class LiveRun:
    run: pb.Run
    status: str
    steps: list[Step] = field(default_factory=list)
    more: bool = False
    checkpoints: list[pb.Checkpoint] = field(default_factory=list)
    events: list[pb.OutboxEvent] = field(default_factory=list)


def live_run(run: pb.Run, history: rs.RunHistory, more: bool) -> LiveRun:
    """The run's timeline: its journal in order, each tool step with its ledger row; ledger rows
    the journal does not name yet (an in-doubt call, a call in flight) come last."""
    ledger = {row.step_key: row for row in history.tool_executions}
    steps: list[Step] = []
    for entry in history.journal:
        row = ledger.pop(entry.step_key, None) if entry.step_key else None
        steps.append(Step(entry.seq, entry.kind, entry.step_key, entry.node, entry.tool, entry.detail_json,
                          when(entry.created_at), entry.run_version, row))
    for row in ledger.values():
        steps.append(Step(0, "tool_call", row.step_key, "", row.tool_name, pretty(row.request_json),
                          when(row.outbound_intent_at), 0, row))
    return LiveRun(run=run, status=status_name(run.status), steps=steps, more=more,
                   checkpoints=list(history.checkpoints), events=list(history.events))


@dataclass
class TreeNode:
    depth: int
    run: pb.Run
    status: str


def tree(reply: rs.GetRunTreeResponse) -> list[TreeNode]:
    return [TreeNode(node.depth, node.run, status_name(node.run.status)) for node in reply.nodes]


def in_doubt(history: rs.RunHistory) -> list[pb.ToolExecution]:
    return [row for row in history.tool_executions if row.status == pb.TOOL_EXECUTION_STATUS_IN_DOUBT]


async def oldest_first(api: Api, status: str, limit: int = 500) -> list[pb.Run]:
    """Runs in `status`, oldest first (ListRuns answers newest first: read up to `limit` and turn it)."""
    runs: list[pb.Run] = []
    token = ""
    while len(runs) < limit:
        reply = await api.list_runs(statuses=[status], agent="", page_size=min(500, limit), page_token=token)
        runs.extend(reply.runs)
        token = reply.next_page_token
        if not token:
            break
    return list(reversed(runs[:limit]))


def register_filters(env: jinja2.Environment) -> None:
    env.filters["when"] = when
    env.filters["pretty"] = pretty
    env.filters["status_name"] = status_name
    env.filters["tool_status_name"] = tool_status_name
    env.globals["ledger_words"] = LEDGER_WORDS
