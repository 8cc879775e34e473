"""Checkpoint schema 2 and the run's journal: what a step writes, and what a claim rebuilds (issue 12)."""

from __future__ import annotations

import json

from executor import journal
from executor.agents import parse_definition
from executor.checkpoint import JOURNALED, SCHEMA_VERSION, HistoryEntry
from executor.deciders.base import Invalid, Proposal, ToolCall
from executor.deciders.scripted import HistoryIndex, node_id
from executor.migrations import load_state
from executor.steps import (
    RunIds,
    decided_invalid,
    decided_tool,
    initial_state,
    next_attempt,
    tool_decision,
    tool_result,
)
from shared.canonical import canonical_json
from shared.gen.agentrt.v1 import common_pb2 as pb

AGENT = parse_definition({"name": "a", "version": "1",
                          "decider": {"kind": "scripted", "plan": [{"id": "x", "finish": 1}]},
                          "tools": [{"name": "t", "kind": "python", "callable": "executor_support:noop_tool"}]})
IDS = RunIds("tenant", "run")


def tool_step(state, node: str, answer, *, status: str = "SUCCEEDED", retry: bool = False):
    proposal = Proposal(ToolCall("t", {"node": node}), node=node)
    made = tool_decision(state, proposal, proposal.decision, IDS)
    state = decided_tool(state, proposal, made, needs_approval=False)
    return tool_result(state, made, status, response=answer, retry=retry), made


def rebuild(records, answers: dict[str, object]) -> journal.Rebuilt:
    rebuilt = journal.Rebuilt()
    for entry in journal.to_proto(records):
        rebuilt.add(entry)
    rows = [pb.ToolExecution(step_key=k, response_json=json.dumps(v)) for k, v in answers.items()]
    rebuilt.set_answers([r for r in rows if r.step_key in rebuilt.answers_needed(64)])
    return rebuilt


def test_the_checkpoint_stays_the_same_size_however_long_the_run():
    state = initial_state(AGENT)
    sizes = []
    for n in range(200):
        state, _ = tool_step(state, f"n{n % 3}@{n}", {"text": "x" * 1000})
        sizes.append(len(canonical_json(state.to_json_dict())))
    assert not JOURNALED & set(state.to_json_dict())
    assert max(sizes) < 2000 and max(sizes) - min(sizes) < 50, (min(sizes), max(sizes))
    assert state.journal_len == 400 and [r.seq for r in state.pending_journal] == list(range(1, 401))
    # The answers are not repeated in the journal: they are the ledger's.
    assert all("response" not in r.detail for r in state.pending_journal if r.kind == "result")


def test_the_journal_rebuilds_what_the_steps_built_in_memory():
    state = initial_state(AGENT)
    answers = {}
    for n in range(5):
        state, made = tool_step(state, f"n{n}", {"n": n})
        answers[made.step_key] = {"n": n}
    state, made = tool_step(state, "flaky", None, status="FAILED", retry=True)
    state, following = next_attempt(state, made, IDS)
    state = tool_result(state, following, "SUCCEEDED", response={"ok": True})
    answers[following.step_key] = {"ok": True}
    state = decided_invalid(state, Proposal(Invalid("parse_failure", "nope"), node="m"), Invalid("parse_failure",
                                                                                                  "nope"))
    rebuilt = rebuild(state.pending_journal, answers)
    assert rebuilt.history == state.history
    assert rebuilt.exceptions == state.exceptions
    # An answer that is None (a failure's) is simply absent until fetched: a decider reads None either way.
    assert {k: {f: v for f, v in r.items() if v is not None} for k, r in rebuilt.tool_results.items()} == {
        k: {f: v for f, v in r.items() if v is not None} for k, r in state.tool_results.items()}
    assert rebuilt.last_seq == state.journal_len
    assert [e.step_key for e in rebuilt.history if e.node == "flaky"] == ["flaky/attempt-2"]


def test_a_schema_1_checkpoint_becomes_journal_entries_once():
    entries = [HistoryEntry(index=i, node=f"n{i}", step_key=f"n{i}/attempt-1", kind="tool", tool="t").model_dump(
        mode="json") for i in range(3)]
    v1 = {**initial_state(AGENT).model_dump(mode="json", exclude_none=True, exclude={"journal_len",
                                                                                        "pending_journal",
                                                                                        "agent_state"}),
          "history": entries,
          "tool_results": {f"n{i}/attempt-1": {"status": "SUCCEEDED", "response": {"i": i}} for i in range(3)},
          "inputs": {"ask/attempt-1": "yes"}, "exceptions": [{"kind": "operator_response", "index": 1}]}
    state = load_state(v1, 1)
    assert SCHEMA_VERSION == 2 and len(state.history) == 3 and state.inputs == {"ask/attempt-1": "yes"}
    assert state.journal_len == 3 + 3 + 1 + 1 == len(state.pending_journal)
    rebuilt = rebuild(state.pending_journal, {})
    # Schema 1 kept answers inline: the migrated entries keep them, so nothing needs the ledger.
    assert rebuilt.tool_results == state.tool_results and rebuilt.history == state.history
    assert rebuilt.inputs == state.inputs and rebuilt.exceptions == state.exceptions
    assert not JOURNALED & set(state.to_json_dict())


def test_only_answers_a_decider_may_read_are_fetched():
    state = initial_state(AGENT)
    for n in range(300):
        state, _ = tool_step(state, f"node{n % 5}@{n}", {"n": n})
    rebuilt = journal.Rebuilt()
    for entry in journal.to_proto(state.pending_journal):
        rebuilt.add(entry)
    wanted = rebuilt.answers_needed(64)
    assert len(wanted) == 64  # each node's latest is among the last 64
    assert set(wanted) == {e.step_key for e in state.history[-64:]}


def test_the_scripted_index_matches_a_full_scan():
    history: list[HistoryEntry] = []
    index = HistoryIndex()
    for i, node in enumerate(["a", "b", "b", "c@2", "b@3", "b@4", "a"]):
        kind = "exception" if i == 3 else "tool"
        history = [*history, HistoryEntry(index=i, node=node, step_key=f"{node}/attempt-1", kind=kind, tool="t")]
        index = index.update(history)
        entries = [e for e in history if e.kind != "exception"]
        visits: dict[str, int] = {}
        for e in entries:
            visits[node_id(e.node)] = visits.get(node_id(e.node), 0) + 1
        trailing = 0
        for e in reversed(entries):
            if node_id(e.node) != node_id(entries[-1].node):
                break
            trailing += 1
        assert (index.visits, index.trailing, index.last) == (visits, trailing, entries[-1])
    replaced = [*history[:-1], history[-1].model_copy(update={"step_key": "a/attempt-2"})]
    assert index.update(replaced).latest_tool["a"] == "a/attempt-2"


def test_memory_keeps_only_the_answers_a_decider_may_read():
    state = initial_state(AGENT)
    for n in range(500):
        state, _ = tool_step(state, f"node{n % 7}@{n}", {"n": n})
        state = journal.trimmed(state, 64)
    assert len(state.tool_results) <= 128
    last = {e.node.split("@")[0]: e.step_key for e in state.history if e.kind == "tool"}
    assert set(last.values()) <= set(state.tool_results)  # each node's latest answer is still there
    assert {e.step_key for e in state.history[-64:]} <= set(state.tool_results)


async def test_a_decider_keeps_a_small_state_and_an_oversized_one_is_refused():
    from executor.advance import Advancer, Limits
    from executor.deciders.base import Finish

    class Stub:
        pure = False

        async def decide(self, ctx):
            raise AssertionError("not called")

        async def close(self):
            return None

    advancer = Advancer(AGENT, Stub(), IDS, {}, Limits(), 3, lambda: None)  # type: ignore[arg-type]
    state, _ = advancer.apply(initial_state(AGENT), Proposal(Finish(1), node="end", agent_state={"seen": 3}))
    assert state.to_json_dict()["agent_state"] == {"seen": 3}
    big = Proposal(Finish(1), node="end", agent_state={"blob": "x" * 20_000})
    refused, _ = advancer.apply(initial_state(AGENT), big)
    assert refused.agent_state == {} and refused.exceptions[-1]["kind"] == "agent_state_too_large"


async def test_read_all_reads_every_entry_once_in_order_with_pages_in_flight_at_once():
    """Gapless seqs let pages start where they will; a page cut short by bytes is continued."""
    import asyncio

    known, written = 12_345, 12_400  # 55 entries written after the claim said 12,345
    calls: list[tuple[int, int]] = []
    in_flight = peak = 0

    async def read(after_seq: int, page_size: int) -> tuple[list[journal.Item], bool]:
        nonlocal in_flight, peak
        calls.append((after_seq, page_size))
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)
        in_flight -= 1
        cut = min(page_size, 1 + after_seq % 3000)  # a byte budget: some pages come back short
        last = min(after_seq + cut, written)
        items = [[seq, "tool", f"s/{seq}", "n", "t", {}] for seq in range(after_seq + 1, last + 1)]
        return items, bool(items) and items[-1][0] < written

    pages = await journal.read_all(read, known, 5000)
    seqs = [item[0] for page in pages for item in page]
    assert seqs == list(range(1, written + 1))
    assert peak == 3  # pages starting at 0, 5000 and 10000 were asked for at once
    assert all(size <= 5000 for _, size in calls)


async def test_read_all_of_an_empty_journal_asks_once():
    calls = []

    async def read(after_seq: int, page_size: int) -> tuple[list[journal.Item], bool]:
        calls.append(after_seq)
        return [], False

    assert await journal.read_all(read, 0, 5000) == [] and calls == [0]
