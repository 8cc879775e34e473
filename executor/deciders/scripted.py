"""The `scripted` decider: a deterministic plan or graph, for workflows without an LLM, tests and demos.

The position in the plan is derived from the checkpoint's history only, so the
same checkpoint always yields the same next step. Arguments may reference
`${input.x}`, `${results.<node>.response.y}`, `${inputs.<node>}`, `${run.id}` and `${run.tenant}`.
A node with `when:` is entered only if its condition holds on the same scope,
else skipped as if absent; that too depends on the checkpoint (and the input) only.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from executor.agents import Condition, PlanNode, ScriptedDecider, SpawnChild, SpawnNode
from executor.checkpoint import HistoryEntry, State
from executor.deciders.base import (
    Decision,
    DecisionContext,
    Fail,
    Finish,
    Invalid,
    Proposal,
    Sleep,
    SpawnChildren,
    ToolCall,
    WaitForInput,
    WaitForSignal,
)
from executor.decisions import Child

_WHOLE = re.compile(r"^\$\{([^}]+)\}$")
_PART = re.compile(r"\$\{([^}]+)\}")
FAILED_STATUSES = frozenset({"FAILED", "REJECTED"})
MAX_INDEXED_RUNS = 4096


class TemplateError(Exception):
    pass


def node_id(node_key: str) -> str:
    return node_key.split("@", 1)[0]


def _lookup(scope: dict[str, Any], path: str) -> Any:
    value: Any = scope
    for part in path.strip().split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise TemplateError(f"${{{path}}} does not resolve (no {part!r})")
    return value


def render(value: Any, scope: dict[str, Any]) -> Any:
    if isinstance(value, str):
        whole = _WHOLE.match(value)
        if whole:
            return _lookup(scope, whole.group(1))
        return _PART.sub(lambda m: str(_lookup(scope, m.group(1))), value)
    if isinstance(value, dict):
        return {k: render(v, scope) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, scope) for v in value]
    return value


def holds(condition: Condition, scope: dict[str, Any]) -> bool:
    value = render(condition.value, scope)
    [(operator, reference)] = condition.operators().items()
    if operator in ("eq", "ne"):
        return (value == reference) == (operator == "eq")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TemplateError(f"when: {operator} needs a number, got {value!r}")
    assert reference is not None
    return {"gt": value > reference, "ge": value >= reference, "lt": value < reference,
            "le": value <= reference}[operator]


class HistoryIndex:
    """What the plan reads of a run's history, kept up to date as entries are appended (O(new entries)
    per decision, not O(history)): visits per node, each node's latest tool and input step, and the
    trailing run of the last node. Rebuilt only when an entry it has seen was replaced (a retry)."""

    def __init__(self) -> None:
        self.count = 0
        self.last_seen: HistoryEntry | None = None
        self.visits: dict[str, int] = {}
        self.latest_tool: dict[str, str] = {}
        self.latest_input: dict[str, str] = {}
        self.last: HistoryEntry | None = None  # the last entry that is not an exception
        self.trailing = 0

    def update(self, history: list[HistoryEntry]) -> HistoryIndex:
        if self.count > len(history) or (self.count and history[self.count - 1] is not self.last_seen):
            return HistoryIndex().update(history)
        for entry in history[self.count:]:
            if entry.kind == "exception":
                continue
            node = node_id(entry.node)
            self.visits[node] = self.visits.get(node, 0) + 1
            if entry.kind == "tool":
                self.latest_tool[node] = entry.step_key
            elif entry.kind == "input":
                self.latest_input[node] = entry.step_key
            same = self.last is not None and node_id(self.last.node) == node
            self.trailing = self.trailing + 1 if same else 1
            self.last = entry
        self.count = len(history)
        self.last_seen = history[-1] if history else None
        return self


def _scope(ctx: DecisionContext, index: HistoryIndex) -> dict[str, Any]:
    state = ctx.state
    results = {node: state.tool_results[key] for node, key in index.latest_tool.items() if key in state.tool_results}
    inputs = {node: state.inputs[key] for node, key in index.latest_input.items() if key in state.inputs}
    return {"input": ctx.input, "results": results, "inputs": inputs,
            "run": {"id": ctx.run_id, "tenant": ctx.tenant_id}}


class ScriptedDeciderImpl:
    pure = True

    def __init__(self, definition: ScriptedDecider) -> None:
        self.plan = definition.plan
        self.by_id = {node.id: node for node in self.plan}
        self.order = {node.id: index for index, node in enumerate(self.plan)}
        self._indexes: OrderedDict[str, HistoryIndex] = OrderedDict()  # by run id, most recent last

    def index(self, ctx: DecisionContext) -> HistoryIndex:
        index = self._indexes.pop(ctx.run_id, None) or HistoryIndex()
        self._indexes[ctx.run_id] = index = index.update(ctx.state.history)
        while len(self._indexes) > MAX_INDEXED_RUNS:
            self._indexes.popitem(last=False)
        return index

    async def decide(self, ctx: DecisionContext) -> Proposal:
        index = self.index(ctx)
        scope = _scope(ctx, index)
        try:
            target = self._next(ctx.state, scope, index)
        except TemplateError as exc:
            return Proposal(Fail(f"plan: {exc}"), node="end")
        if isinstance(target, Fail):
            return Proposal(target, node="end")
        if target is None:
            return Proposal(Finish(None), node="end")
        visits = index.visits.get(target.id, 0)
        key = target.id if visits == 0 else f"{target.id}@{visits + 1}"
        try:
            decision = self._decision(target, scope)
        except TemplateError as exc:
            decision = Invalid("invalid_arguments", f"plan node {target.id}: {exc}")
        return Proposal(decision, node=key, raw={"plan_node": target.id})

    def _decision(self, node: PlanNode, scope: dict[str, Any]) -> Decision:
        if node.tool is not None:
            return ToolCall(node.tool, render(node.args, scope))
        if node.sleep_ms is not None:
            return Sleep(node.sleep_ms)
        if node.wait_for_input is not None:
            return WaitForInput(str(render(node.wait_for_input, scope)))
        if node.wait_for_signal is not None:
            return WaitForSignal(str(render(node.wait_for_signal, scope)), node.timeout_ms)
        if node.spawn is not None:
            return self._spawn(node.spawn, node.timeout_ms, scope)
        if node.fail is not None:
            return Fail(str(render(node.fail, scope)))
        return Finish(render(node.finish, scope))

    @staticmethod
    def _spawn(spawn: SpawnNode, timeout_ms: int, scope: dict[str, Any]) -> SpawnChildren:
        templates: list[tuple[SpawnChild, dict[str, Any]]] = [(c, scope) for c in spawn.children]
        if spawn.for_each is not None and spawn.child is not None:
            items = render(spawn.for_each, scope)
            if not isinstance(items, list):
                raise TemplateError(f"spawn for_each renders to {type(items).__name__}, not a list")
            templates += [(spawn.child, {**scope, "item": item}) for item in items]
        children = tuple(Child(agent=str(render(c.agent, s)), input=render(c.input, s), labels=render(c.labels, s),
                               budget=dict(c.budget), version=c.version) for c, s in templates)
        return SpawnChildren(children=children, join=spawn.join, timeout_ms=timeout_ms, detach=spawn.detach,
                             share_budget=spawn.share_budget)

    def _following(self, node: PlanNode) -> PlanNode | None:
        if node.next is not None:
            return self.by_id[node.next]
        index = self.order[node.id] + 1
        return self.plan[index] if index < len(self.plan) else None

    def _enter(self, node: PlanNode | None, scope: dict[str, Any]) -> PlanNode | None:
        """`node`, or the first node after it whose `when` holds."""
        skipped: set[str] = set()
        while node is not None and node.when is not None and not holds(node.when, scope):
            if node.id in skipped:
                raise TemplateError(f"node {node.id}: the plan loops through nodes whose `when` does not hold")
            skipped.add(node.id)
            node = self._following(node)
        return node

    def _next(self, state: State, scope: dict[str, Any], index: HistoryIndex) -> PlanNode | Fail | None:
        last = index.last
        if last is None:
            return self._enter(self.plan[0], scope)
        node = self.by_id.get(node_id(last.node))
        if node is None:
            return Fail(f"checkpoint names plan node {last.node!r}, which this plan does not have")
        result = state.tool_results.get(last.step_key) if last.kind == "tool" else None
        if result is not None and result.get("status") in FAILED_STATUSES:
            if node.on_failure == "fail":
                error = result.get("error_code") or result.get("status")
                return Fail(f"tool {last.tool} failed at step {last.step_key}: {error} {result.get('detail', '')}"
                            .strip())
            if node.on_failure != "continue":
                return self._enter(self.by_id[node.on_failure], scope)
        if index.trailing < node.repeat:
            return node
        return self._enter(self._following(node), scope)

    async def close(self) -> None:
        return None
