"""The run's journal: append-only history entries, and the in-memory view rebuilt from them.

A step writes only its own data: the checkpoint (current state, schema 2) and
the journal entries it records, in one transaction under the same fence and
version check (WorkService's `journal` fields); tool answers are written once,
to the ledger. Nothing committed is rewritten: a retried step's new attempt is
a `retry` entry, not an edit of the decision entry.

Entry kinds and what they rebuild in memory (State):
  tool, sleep, input, approval, finish, fail, exception (with "index")
                       → history (HistoryEntry)
  exception (with "record")   → exceptions (operator responses, invalid decisions)
  result               → tool_results[step_key] (the answer itself comes from the ledger)
  answer               → inputs[step_key] (an operator's input)
  retry                → the decision entry's step key moves to the next attempt's
"""

from __future__ import annotations

import asyncio
import json
import typing
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from executor.checkpoint import HistoryEntry, JournalRecord, State
from shared.gen.agentrt.v1 import common_pb2 as pb

HISTORY_KINDS = frozenset({"tool", "sleep", "input", "approval", "finish", "fail", "exception"})
# Results whose answer is a ledger row's (fetched by step key); others carry everything in the entry.
LEDGER_STATUSES = frozenset({"SUCCEEDED", "FAILED"})
_KINDS = frozenset(typing.get_args(JournalRecord.model_fields["kind"].annotation))


def _record(seq: int, kind: str, step_key: str = "", node: str = "", tool: str | None = None,
            detail: dict[str, Any] | None = None) -> JournalRecord:
    # Built from this module's own values, one or two per step: not validated again (the scheduler
    # checks every entry it is sent, scheduler/api/validate.py require_journal).
    assert seq >= 1 and kind in _KINDS, (seq, kind)
    return JournalRecord.model_construct(seq=seq, kind=kind,  # type: ignore[arg-type]
                                         step_key=step_key, node=node, tool=tool or "",
                                         detail=detail or {})


def history_record(seq: int, entry: HistoryEntry) -> JournalRecord:
    return _record(seq, entry.kind, entry.step_key, entry.node, entry.tool,
                   {"index": entry.index, "detail": entry.detail})


def result_record(seq: int, step_key: str, result: dict[str, Any]) -> JournalRecord:
    """The outcome's metadata; a SUCCEEDED/FAILED answer is the ledger row's, not repeated here."""
    detail = {k: v for k, v in result.items() if k != "response" or result.get("status") not in LEDGER_STATUSES}
    return _record(seq, "result", step_key, detail=detail)


def answer_record(seq: int, step_key: str, value: Any) -> JournalRecord:
    return _record(seq, "answer", step_key, detail={"input": value})


def exception_record(seq: int, record: dict[str, Any]) -> JournalRecord:
    return _record(seq, "exception", detail={"record": record})


def retry_record(seq: int, previous: str, step_key: str, attempts: list[str]) -> JournalRecord:
    return _record(seq, "retry", step_key, detail={"previous": previous, "attempts": attempts})


def journaled(state: State, update: dict[str, Any], *makers: Any) -> State:
    """`state` with `update` applied and the journal entries that record it appended (pending until written).

    Each maker is a callable taking the entry's seq and returning a JournalRecord.
    """
    seq = state.journal_len
    records = []
    for make in makers:
        seq += 1
        records.append(make(seq))
    return state.model_copy(update={**update, "journal_len": seq,
                                    "pending_journal": [*state.pending_journal, *records]})


def records_from_schema_1(data: dict[str, Any]) -> list[dict[str, Any]]:
    """A schema-1 checkpoint's inline history, tool results, inputs and exceptions as journal entries."""
    out: list[JournalRecord] = []

    def add(make: Any) -> None:
        out.append(make(len(out) + 1))

    for raw in data.get("history") or []:
        entry = HistoryEntry.model_validate(raw)
        add(lambda seq, entry=entry: history_record(seq, entry))
    for step_key, result in (data.get("tool_results") or {}).items():
        # Schema 1 kept the answer in the checkpoint: keep it in the entry (the ledger has it too,
        # except for a rejected approval's result, which never had a ledger row).
        add(lambda seq, k=step_key, r=result: _record(seq, "result", k, detail=dict(r)))
    for step_key, value in (data.get("inputs") or {}).items():
        add(lambda seq, k=step_key, v=value: answer_record(seq, k, v))
    for record in data.get("exceptions") or []:
        add(lambda seq, r=record: exception_record(seq, r))
    return [r.model_dump(mode="json") for r in out]


def to_proto(records: Iterable[JournalRecord]) -> list[pb.JournalEntry]:
    return [pb.JournalEntry(seq=r.seq, kind=r.kind, step_key=r.step_key, node=r.node, tool=r.tool,
                            detail_json=json.dumps(r.detail, sort_keys=True, separators=(",", ":")))
            for r in records]


# A compact entry (ReadJournal with compact set): [seq, kind, step_key, node, tool, detail].
Item = list[Any]
ReadPage = Callable[[int, int], Awaitable[tuple[list[Item], bool]]]


async def read_all(read: ReadPage, known: int, page_size: int) -> list[list[Item]]:
    """Every entry of a journal known to hold `known` entries (seqs 1..known, gapless), as pages in seq order.

    `read(after_seq, page_size)` answers one page of compact entries and whether more follow. Seqs have no gaps, so
    the pages' starts are known in advance and are read at once; a page cut short by its byte
    budget is continued from its last entry. Entries past `known` (written since) follow too.
    """
    starts = list(range(0, max(known, 1), page_size))

    async def span(start: int, end: int | None) -> list[list[Item]]:
        pages: list[list[Item]] = []
        after = start
        for _ in range((known + 1) * 2 + 2):  # bounded: each page holds one entry at least
            size = page_size if end is None else min(page_size, end - after)
            entries, more = await read(after, size)
            if entries:
                pages.append(entries)
                after = entries[-1][0]
            if not more or not entries or (end is not None and after >= end):
                return pages
        raise RuntimeError(f"journal read after seq {start} did not end")

    ends: list[int | None] = [*starts[1:], None]
    spans = await asyncio.gather(*(span(s, e) for s, e in zip(starts, ends, strict=True)))
    return [page for pages in spans for page in pages]


class Rebuilt:
    """The in-memory collections of a State, rebuilt from journal entries read in seq order."""

    def __init__(self) -> None:
        self.history: list[HistoryEntry] = []
        self.tool_results: dict[str, dict[str, Any]] = {}
        self.inputs: dict[str, Any] = {}
        self.exceptions: list[dict[str, Any]] = []
        self.last_seq = 0
        self._by_step: dict[str, int] = {}  # step key -> index in history (for retry entries)

    def add(self, entry: pb.JournalEntry) -> None:
        detail = json.loads(entry.detail_json) if entry.detail_json else {}
        self.add_item([entry.seq, entry.kind, entry.step_key, entry.node, entry.tool, detail])

    def add_item(self, item: Item) -> None:
        """One compact entry, in seq order."""
        seq, kind, step_key, node, tool, detail = item
        detail = detail or {}
        self.last_seq = seq
        if kind == "exception" and "record" in detail:
            self.exceptions.append(detail["record"])
        elif kind in HISTORY_KINDS:
            self._by_step[step_key] = len(self.history)
            self.history.append(HistoryEntry(index=detail.get("index", 0), node=node,
                                             step_key=step_key, kind=kind,  # type: ignore[arg-type]
                                             tool=tool or None, detail=detail.get("detail", {})))
        elif kind == "result":
            self.tool_results[step_key] = detail
        elif kind == "answer":
            self.inputs[step_key] = detail.get("input")
        elif kind == "retry":
            index = self._by_step.pop(detail.get("previous", ""), None)
            if index is not None:
                old = self.history[index]
                self.history[index] = old.model_copy(update={
                    "step_key": step_key, "detail": {**old.detail, "attempts": detail.get("attempts", [])}})
                self._by_step[step_key] = index

    def answers_needed(self, window: int) -> list[str]:
        """Step keys whose ledger answers a decider may read: the latest tool step of each node and the last
        `window` tool steps (bounded, whatever the run's length)."""
        latest: dict[str, str] = {}
        recent: list[str] = []
        for entry in self.history:
            if entry.kind == "tool":
                latest[entry.node.split("@", 1)[0]] = entry.step_key
                recent.append(entry.step_key)
        wanted = dict.fromkeys([*latest.values(), *recent[-window:]])
        return [k for k in wanted if self.tool_results.get(k, {}).get("status") in LEDGER_STATUSES
                and "response" not in self.tool_results[k]]

    def set_answers(self, rows: Iterable[pb.ToolExecution]) -> None:
        for row in rows:
            result = self.tool_results.get(row.step_key)
            if result is not None:
                result["response"] = json.loads(row.response_json) if row.response_json else None

    def apply(self, state: State) -> State:
        return state.model_copy(update={"history": self.history, "tool_results": self.tool_results,
                                        "inputs": self.inputs, "exceptions": self.exceptions,
                                        "journal_len": max(state.journal_len, self.last_seq),
                                        "pending_journal": []})


def trimmed(state: State, window: int) -> State:
    """`state` with only the tool answers a decider may read kept in memory (each node's latest and the
    last `window` tool steps), so an executor's memory stays flat however long the run; the journal and
    the ledger keep everything."""
    if len(state.tool_results) <= 2 * window:
        return state
    latest: dict[str, str] = {}
    recent: list[str] = []
    for entry in state.history:
        if entry.kind == "tool":
            latest[entry.node.split("@", 1)[0]] = entry.step_key
            recent.append(entry.step_key)
    keep = set(latest.values()) | set(recent[-window:])
    return state.model_copy(update={"tool_results": {k: v for k, v in state.tool_results.items() if k in keep}})
