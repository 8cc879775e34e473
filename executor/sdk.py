"""Agents in code: the typed API of a `python` decider, and decorators that define agents and tools without YAML.

A decider is a function of a `Context` that returns one decision::

    from pydantic import BaseModel
    from executor.sdk import Context, Finish, ToolCall, agent, http_tool

    class Lookup(BaseModel):
        order_id: int

    orders = http_tool("orders.lookup", Lookup, url="http://orders.internal/lookup", idempotent=True)

    @agent(name="support", version="1", tools=[orders], max_steps=10)
    def support(ctx: Context) -> ToolCall | Finish:
        found = ctx.result("lookup")
        if found is None:
            return ToolCall("orders.lookup", {"order_id": ctx.input["order_id"]}, node="lookup")
        return Finish({"status": found.response["status"]})

`agentrt executor --agents mypkg.agents` loads every agent defined in that
module (comma-separated with files and directories). A YAML definition can
name the same function: `decider: {kind: python, callable: "mypkg.agents:support"}`.

The decider need not be deterministic: each decision is persisted in the
checkpoint before it acts (docs/design.md §invariants, rule 6), and after a
crash the persisted decision is carried out, never asked for again. A decider
may be called again only for a step whose decision was never persisted. It
may do I/O (call a model, read a cache); an exception it raises is recorded
as an invalid decision and retried up to the policy's max_decision_retries.

Decisions: `ToolCall(tool, args, node=...)`, `Finish(result)`, `Fail(reason)`,
`Sleep(ms)` (a durable timer), `WaitForInput(prompt)` (operator input,
given with `agentrt runs resume`), `SpawnChildren(children, join, timeout_ms)` (child runs, their
statuses and results in `ctx.inputs` under the wait's step key) and `WaitForSignal(name, timeout_ms)` (a
signal sent with `agentrt runs signal`; its answer is in `ctx.inputs` under
the wait's step key, and other signals arrive in `ctx.signals`). An approval is a property of a tool: a tool
declared with `requires_approval=True` parks the run for an operator before
its intent is recorded. Return `Step(decision, state=..., tokens=..., cost_usd=...)`
to keep a small state of the agent's own (at most 16 KiB of JSON) or to count
model usage against the run's budgets.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from executor.agents import (
    AgentDefinition,
    Budgets,
    HttpTool,
    Policy,
    PromptInfo,
    PythonDecider,
    PythonTool,
    ToolContract,
    ToolDefinition,
)
from executor.checkpoint import State
from executor.decisions import (
    Child,
    DecisionContext,
    Fail,
    Finish,
    Sleep,
    SpawnChildren,
    ToolCall,
    WaitForInput,
    WaitForSignal,
)
from executor.tools.base import (
    LookupOutcome,
    ToolCallContext,
    ToolOutcome,
    ToolRefused,
    ToolRetryLater,
    bind_or_refuse,
    signature_of,
)
from executor.tools.python import check_signature

__all__ = [
    "Child", "CodeAgent", "CodeTool", "Context", "Fail", "Finish", "HistoryItem", "LookupOutcome", "Sleep",
    "SpawnChildren", "Step",
    "ToolCall", "ToolCallContext", "ToolOutcome", "ToolRefused", "ToolResult", "ToolRetryLater", "Usage",
    "WaitForInput", "WaitForSignal", "agent", "http_tool", "tool",
]

Decision = ToolCall | Finish | Fail | Sleep | WaitForInput | WaitForSignal | SpawnChildren
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Step:
    """A decision with what goes along with it: the agent's own state, model usage, a node name."""

    decision: Decision
    state: dict[str, Any] | None = None  # replaces the agent's state (None: keep it)
    tokens: int = 0
    cost_usd: float = 0.0
    node: str = ""  # for waits, finish and fail; a ToolCall names its node itself


@dataclass(frozen=True)
class ToolResult:
    """A tool step's outcome: SUCCEEDED with its response, FAILED (definite) with an error code, or REJECTED."""

    step_key: str
    status: str
    response: Any = None
    error_code: str = ""
    detail: str = ""
    remote_resource_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "SUCCEEDED"


@dataclass(frozen=True)
class HistoryItem:
    """One entry of the run's history: a tool step, sleep, input, approval, exception, finish or fail."""

    index: int
    kind: str
    node: str
    step_key: str
    tool: str | None
    detail: Mapping[str, Any]


@dataclass(frozen=True)
class Usage:
    steps: int
    tokens: int
    cost_usd: float


@dataclass(frozen=True)
class Context:
    """What a decider sees. Built from the run's checkpoint and journal; reading it has no side effect.

    `history` holds every entry of the run; `results` holds the tool results a
    decider may read (each node's latest and the last 64), by step key.
    """

    run_id: str
    tenant_id: str
    agent: str
    agent_version: str
    input: Mapping[str, Any]
    step: int  # decisions taken so far
    history: Sequence[HistoryItem]
    results: Mapping[str, ToolResult]
    inputs: Mapping[str, Any]  # operator input, by the step key of the wait that asked for it
    usage: Usage
    budgets: Budgets
    state: Mapping[str, Any]  # the agent's own small state, as the last Step left it
    # Signals that arrived since the last decision, oldest first: {"name", "payload", "seq"} (a signal
    # wait's own answer is in `inputs` under the wait's step key instead).
    signals: Sequence[Mapping[str, Any]] = ()

    def result(self, node: str) -> ToolResult | None:
        """The latest result of the tool steps at `node` (the node a ToolCall named)."""
        for item in reversed(self.history):
            if item.kind == "tool" and _node_id(item.node) == node and item.step_key in self.results:
                return self.results[item.step_key]
        return None

    def last_input(self) -> Any:
        """The latest operator input, or None."""
        for item in reversed(self.history):
            if item.kind == "input" and item.step_key in self.inputs:
                return self.inputs[item.step_key]
        return None

    @classmethod
    def of(cls, ctx: DecisionContext) -> Context:
        state: State = ctx.state
        results = {key: ToolResult(step_key=key, status=str(r.get("status", "")), response=r.get("response"),
                                   error_code=str(r.get("error_code") or ""), detail=str(r.get("detail") or ""),
                                   remote_resource_id=r.get("remote_resource_id"))
                   for key, r in state.tool_results.items()}
        history = tuple(HistoryItem(index=e.index, kind=e.kind, node=e.node, step_key=e.step_key, tool=e.tool,
                                    detail=MappingProxyType(dict(e.detail))) for e in state.history)
        return cls(run_id=ctx.run_id, tenant_id=ctx.tenant_id, agent=ctx.agent.name,
                   agent_version=ctx.agent.version, input=MappingProxyType(dict(ctx.input)),
                   step=state.step_index, history=history, results=MappingProxyType(results),
                   inputs=MappingProxyType(dict(state.inputs)),
                   usage=Usage(state.usage.steps, state.usage.tokens, state.usage.cost_usd),
                   budgets=ctx.agent.budgets, state=MappingProxyType(dict(state.agent_state)),
                   signals=tuple(MappingProxyType(dict(s)) for s in ctx.signals))


def _node_id(node: str) -> str:
    return node.split("@", 1)[0]


def _path(func: Callable[..., Any]) -> str:
    """The import path a definition names; the object must be reachable as a module attribute."""
    if "<locals>" in func.__qualname__:
        raise ValueError(f"{func.__qualname__} is defined inside a function; define it at module level")
    return f"{func.__module__}:{func.__qualname__}"


def _schema(model: type[BaseModel] | None) -> dict[str, Any]:
    if model is None:
        return {"type": "object"}
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"tool arguments must be a pydantic model class, not {model!r}")
    return model.model_json_schema()


def _contract(idempotent: bool, lookup: bool, fenced: bool, requires_approval: bool) -> ToolContract:
    return ToolContract(idempotent=idempotent, lookup=lookup, fenced=fenced, requires_approval=requires_approval)


class CodeTool:
    """A python tool defined in code: arguments validated by its pydantic model, the result dumped as JSON.

    Calling it as the executor does, with (arguments, ToolCallContext), validates
    the arguments (a validation error is a definite failure: ToolRefused, nothing
    was done) and returns the function's result as JSON.
    """

    def __init__(self, func: Callable[..., Any], definition: PythonTool, args_model: type[BaseModel] | None,
                 lookup: Callable[..., Any] | None) -> None:
        self.func = func
        self.definition = definition
        self.args_model = args_model
        self.lookup_func = lookup
        self.signature = signature_of(func)
        self.lookup_signature = signature_of(lookup) if lookup is not None else None

    async def __call__(self, arguments: dict[str, Any], ctx: ToolCallContext) -> Any:
        value: Any = arguments
        if self.args_model is not None:
            try:
                value = self.args_model.model_validate(arguments)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "(arguments)"
                raise ToolRefused(f"{self.definition.name}: {where}: {first['msg']}") from None
        # The executor binds its own call to this object; the function inside is bound here, so a call
        # it cannot take is a definite failure (it never ran), not an exception from inside the tool.
        bind_or_refuse(self.definition.callable, self.signature, value, ctx)
        result = self.func(value, ctx)
        if inspect.isawaitable(result):
            result = await result
        return _jsonable(result)

    async def lookup(self, idempotency_key: str, ctx: ToolCallContext) -> LookupOutcome:
        assert self.lookup_func is not None
        bind_or_refuse(f"{self.definition.callable}.lookup", self.lookup_signature, idempotency_key, ctx)
        result = self.lookup_func(idempotency_key, ctx)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, LookupOutcome) and result.response is not None:
            return LookupOutcome(result.status, _jsonable(result.response), result.remote_resource_id,
                                 result.evidence)
        return result  # type: ignore[no-any-return]


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, ToolOutcome) and isinstance(value.response, BaseModel):
        return ToolOutcome(value.ok, value.response.model_dump(mode="json"), value.remote_resource_id,
                           value.error_code, value.detail, value.evidence)
    return value


def tool(name: str, args: type[BaseModel] | None = None, *, description: str = "", idempotent: bool = False,
         fenced: bool = False, requires_approval: bool = False, lookup: Callable[..., Any] | None = None,
         timeout_s: float = 30.0) -> Callable[[Callable[..., Any]], CodeTool]:
    """Declares a python tool: `func(args, ctx)` with `args` an instance of the pydantic model `args`.

    `lookup`, when given, is `lookup(idempotency_key, ctx) -> LookupOutcome`: it makes the
    tool's contract a lookup contract (a takeover asks it instead of freezing the run).
    Raise ToolRefused for a definite failure that did nothing, ToolRetryLater for a transient one.
    """
    def wrap(func: Callable[..., Any]) -> CodeTool:
        path = _path(func)
        # The executor calls the tool object, whose own signature always fits: the function inside is
        # checked here, when the module that declares it is imported (so at the executor's start).
        for problem in (check_signature(path, func, "(args, ToolCallContext)"),
                        check_signature(f"{path}.lookup", lookup, "(idempotency_key, ToolCallContext)")
                        if lookup is not None else None):
            if problem is not None:
                raise TypeError(f"tool {name}: {problem}")
        definition = PythonTool(
            kind="python", name=name, description=description or (inspect.getdoc(func) or "").split("\n")[0],
            input_schema=_schema(args), timeout_s=timeout_s, callable=path,
            lookup_callable=f"{path}.lookup" if lookup is not None else None,
            contract=_contract(idempotent, lookup is not None, fenced, requires_approval))
        return CodeTool(func, definition, args, lookup)
    return wrap


def http_tool(name: str, args: type[BaseModel] | None = None, *, url: str, lookup_url: str | None = None,
              description: str = "", idempotent: bool = False, fenced: bool = False,
              requires_approval: bool = False, timeout_s: float = 30.0, remote_id_field: str = "id",
              headers: dict[str, str] | None = None) -> HttpTool:
    """Declares an http tool (POST url with Idempotency-Key and X-Fencing-Token; GET lookup_url?key=...)."""
    return HttpTool(kind="http", name=name, description=description, input_schema=_schema(args), url=url,
                    lookup_url=lookup_url, timeout_s=timeout_s, remote_id_field=remote_id_field,
                    headers=headers or {},
                    contract=_contract(idempotent, lookup_url is not None, fenced, requires_approval))


def _check_reachable(code_tool: CodeTool) -> None:
    """The executor imports a tool by its path: that path must lead to this CodeTool, not to the bare
    function (which would get a dict, not the model, and fail as an unknown outcome)."""
    module_name, _, attr = code_tool.definition.callable.partition(":")
    target: Any = sys.modules.get(module_name)
    for part in attr.split("."):
        target = getattr(target, part, None)
    if target is not code_tool:
        raise ValueError(f"tool {code_tool.definition.name}: {code_tool.definition.callable} is not the tool; "
                         "declare it with @tool(...) on the function, so the module attribute is the tool")


class CodeAgent:
    """An agent defined in code: its definition (decider kind python) and the decide function."""

    def __init__(self, func: Callable[[Context], Decision | Step | Awaitable[Decision | Step]],
                 definition: AgentDefinition) -> None:
        self.func = func
        self.definition = definition

    def __call__(self, ctx: Context) -> Any:
        return self.func(ctx)


def agent(*, name: str, version: str, tools: Sequence[CodeTool | ToolDefinition] = (), description: str = "",
          input: type[BaseModel] | None = None,
          max_steps: int = 0, max_tokens: int = 0, max_cost_usd: float = 0.0, deadline_s: float = 0.0,
          policy: Policy | None = None, prompt_version: str = "", pure: bool = False,
          signals: Mapping[str, type[BaseModel]] | None = None, resume_input: type[BaseModel] | None = None,
          ) -> Callable[[Callable[[Context], Any]], CodeAgent]:
    """Declares an agent whose decider is the decorated function (see the module's docstring).

    `input`, a pydantic model, declares the run's input: its JSON Schema is registered with the
    scheduler, which refuses a submit whose input does not match (INVALID_ARGUMENT with the path).
    `signals` declares the signals the agent takes (name -> pydantic model of the payload), and
    `resume_input` the input a human gives ResumeRun: a signal of a declared name that does not fit
    its schema is refused (INVALID_ARGUMENT), and fields marked `json_schema_extra={"x-agentrt-sensitive":
    True}` are sealed as marked input is. Undeclared signals are taken as they are.
    `pure=True` promises the function is deterministic and does no I/O: the executor may then
    decide the next step before a tool result commits and save both in one transaction.
    """
    def wrap(func: Callable[[Context], Any]) -> CodeAgent:
        for code_tool in tools:
            if isinstance(code_tool, CodeTool):
                _check_reachable(code_tool)
        definitions = [t.definition if isinstance(t, CodeTool) else t for t in tools]
        data = {"name": name, "version": version, "description": description or (inspect.getdoc(func) or ""),
                "input_schema": _schema(input) if input is not None else None,
                "signals": {n: _schema(model) for n, model in (signals or {}).items()},
                "resume_input_schema": _schema(resume_input) if resume_input is not None else None,
                "decider": PythonDecider(kind="python", callable=_path(func), pure=pure), "tools": definitions,
                "budgets": Budgets(max_steps=max_steps, max_tokens=max_tokens, max_cost_usd=max_cost_usd,
                                   deadline_s=deadline_s),
                "policy": policy or Policy(), "prompt": PromptInfo(version=prompt_version)}
        definition = AgentDefinition.model_validate(data)
        definition._source = f"{func.__module__} (code)"
        return CodeAgent(func, definition)
    return wrap
