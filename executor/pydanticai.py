"""pydantic-ai agents on agentrt: each model request and each tool call a journaled, fenced step.

    from pydantic_ai import Agent
    from executor.pydanticai import durable_agent

    shop = Agent("openai:gpt-5", output_type=Receipt)

    @shop.tool_plain
    def place_order(item: str, qty: int) -> dict: ...

    shop_on_agentrt = durable_agent(shop, name="shop", version="1")   # `agentrt executor --agents mypkg.agents`

The run's input field `prompt` (or `prompt_field`) is the user prompt. The adapter is a `python` decider
that replays the pydantic-ai run on every decision through a capability (`_Replay`):

* A model request already journaled (node `model-<n>`) is answered from the journal; the first one that
  is not is sent to the model, and its response is journaled as a step of the `pydantic_ai.model` tool
  (which only echoes it) before the run goes on. The decision holding the response is checkpointed
  before that step starts, so a successor never asks the model again for it.
* A function tool call already journaled (node `tool-<n>-<i>`: the i-th call of the n-th response) is
  answered from the journal; the first one that is not becomes a ToolCall: a ledgered step (intent
  before the call, the answer with the next checkpoint, in doubt when its outcome is unknown) of a
  `python` tool that runs the function. Inside it, `current_call()` gives the step's idempotency key and
  fencing token; `lookups={tool: fn}` declares how to find a call's outcome by key.
* The run's output (structured output included) becomes the run's result.

The agent's own function tools are served (`tool_plain`, and `tool`, whose RunContext in the tool step
carries `deps` and the model but not the conversation); toolsets other than those are not.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from pydantic_core import to_jsonable_python

from executor.agents import AgentDefinition, Budgets, PromptInfo, PythonDecider, PythonTool, ToolContract
from executor.sdk import Context, Finish, Step, ToolCall
from executor.tools.base import LookupOutcome, ToolCallContext

MODEL_TOOL = "pydantic_ai.model"
# Import paths of what durable_agent makes: "executor.pydanticai:DECIDERS.<key>", "...:TOOLS.<key>".
DECIDERS = SimpleNamespace()
TOOLS = SimpleNamespace()
_CURRENT: contextvars.ContextVar[ToolCallContext | None] = contextvars.ContextVar("agentrt_pydantic_ai_call",
                                                                                    default=None)


def current_call() -> ToolCallContext:
    """The ledger's context of the tool step running now (idempotency key, fencing token, run, step)."""
    ctx = _CURRENT.get()
    if ctx is None:
        raise RuntimeError("current_call() is only available inside a tool run by agentrt")
    return ctx


class _Suspend(Exception):
    """Leaves the replayed run at its first step that is not journaled yet, with the decision for it."""

    def __init__(self, step: Step) -> None:
        super().__init__("suspended")
        self.step = step


def _node(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:100]


def _dump_response(response: Any) -> Any:
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    return ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]


def _load_response(data: Any) -> Any:
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    return ModelMessagesTypeAdapter.validate_python([data])[0]


def _replay_capability(ctx: Context) -> Any:
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.exceptions import ModelRetry
    from pydantic_ai.messages import ToolCallPart

    @dataclass
    class _Replay(AbstractCapability[Any]):
        """Answers from the run's journal what it holds; suspends at the first step it does not."""

        journal: Context
        model_requests: int = 0
        nodes: dict[str, str] = field(default_factory=dict)  # tool_call_id -> node

        async def wrap_model_request(self, run_ctx: Any, *, request_context: Any, handler: Any) -> Any:
            index, self.model_requests = self.model_requests, self.model_requests + 1
            node = f"model-{index}"
            recorded = self.journal.result(node)
            if recorded is None or not recorded.ok or not isinstance(recorded.response, dict):
                response = await handler(request_context)
                usage = response.usage
                raise _Suspend(Step(ToolCall(MODEL_TOOL, {"response": _dump_response(response)}, node=node),
                                    tokens=int(usage.input_tokens + usage.output_tokens)))
            response = _load_response(recorded.response["response"])
            calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
            for position, part in enumerate(calls):
                self.nodes[part.tool_call_id] = f"tool-{index}-{position}"
            return response

        async def wrap_tool_execute(self, run_ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any) -> Any:
            if tool_def.kind != "function":
                return await handler(args)
            node = self.nodes.get(call.tool_call_id) or _node(f"tool-{call.tool_call_id}")
            recorded = self.journal.result(node)
            if recorded is None:
                raise _Suspend(Step(ToolCall(tool_def.name, to_jsonable_python(args), node=node)))
            if recorded.ok:
                return recorded.response
            raise ModelRetry(f"{recorded.error_code}: {recorded.detail}".strip(": "))

    return _Replay(ctx)


def _suspensions(exc: BaseException, seen: set[int] | None = None) -> list[_Suspend]:
    """Every _Suspend in `exc`, its groups and its causes (parallel tool calls run in tasks of their own)."""
    seen = seen if seen is not None else set()
    if id(exc) in seen:
        return []
    seen.add(id(exc))
    if isinstance(exc, _Suspend):
        return [exc]
    found: list[_Suspend] = []
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found.extend(_suspensions(inner, seen))
    for linked in (exc.__cause__, exc.__context__):
        if linked is not None:
            found.extend(_suspensions(linked, seen))
    return found


def _first(suspended: list[_Suspend]) -> _Suspend:
    """The step that comes first (tool-<n>-<i> in order), whichever task raised first."""
    def order(item: _Suspend) -> list[Any]:
        node = item.step.decision.node if isinstance(item.step.decision, ToolCall) else ""
        return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", node)]

    return min(suspended, key=order)


def _decider(agent: Any, prompt_field: str, deps: Callable[[], Any] | None) -> Callable[[Context], Any]:
    async def decide(ctx: Context) -> Step | Finish:
        prompt = ctx.input.get(prompt_field)
        if not isinstance(prompt, str):
            raise ValueError(f"the run's input needs a string {prompt_field!r} (the user prompt)")
        try:
            result = await agent.run(prompt, deps=deps() if deps else None, capabilities=[_replay_capability(ctx)])
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # a _Suspend may arrive wrapped (parallel tool calls run in tasks)
            suspended = _suspensions(exc)
            if not suspended:
                raise
            return _first(suspended).step
        return Finish(to_jsonable_python(result.output))

    return decide


def _runner(agent: Any, name: str, tool: Any, deps: Callable[[], Any] | None) -> Callable[..., Any]:
    async def run(arguments: dict[str, Any], call: ToolCallContext) -> Any:
        token = _CURRENT.set(call)
        try:
            if tool.takes_ctx:
                from pydantic_ai import RunContext
                from pydantic_ai.usage import RunUsage

                run_ctx = RunContext(deps=deps() if deps else None, model=agent.model, usage=RunUsage(), agent=agent,
                                     tool_name=name)
                result = tool.function(run_ctx, **arguments)
            else:
                result = tool.function(**arguments)
            if inspect.isawaitable(result):
                result = await result
        finally:
            _CURRENT.reset(token)
        return to_jsonable_python(result)

    return run


def echo_model_response(arguments: dict[str, Any], call: ToolCallContext) -> dict[str, Any]:
    """The `pydantic_ai.model` step: the response was made when the decision was; the step journals it."""
    return {"response": arguments["response"]}


def model_response_not_sent(idempotency_key: str, call: ToolCallContext) -> LookupOutcome:
    """A model-response step acts on nothing outside the run: at a takeover it is sent again from the
    checkpointed decision (the model is not asked again)."""
    return LookupOutcome("not_found", evidence={"reason": "a journaling step has no outside effect"})


@dataclass(frozen=True)
class DurableAgent:
    """A pydantic-ai Agent served by agentrt; `definition` is what the executor loads."""

    agent: Any
    definition: AgentDefinition


def durable_agent(agent: Any, *, name: str, version: str, prompt_field: str = "prompt",
                  lookups: Mapping[str, Callable[[str, ToolCallContext], LookupOutcome]] | None = None,
                  fenced: Sequence[str] = (), idempotent: Sequence[str] = (), requires_approval: Sequence[str] = (),
                  budgets: Budgets | None = None, description: str = "",
                  deps: Callable[[], Any] | None = None) -> DurableAgent:
    """Serves `agent` (a pydantic_ai.Agent) as the agentrt agent `name` `version`.

    `lookups`: per tool, a function (idempotency_key, ToolCallContext) -> LookupOutcome that says whether
    a call took effect (the in-doubt lookup); `fenced`: tools whose downstream refuses a stale fencing
    token; `idempotent`, `requires_approval`: the ledger's contract flags, per tool name; `deps`: makes the
    run's dependencies (for each replay, and for each tool step, whose RunContext carries them).
    """
    key = re.sub(r"\W", "_", f"{name}__{version}")
    setattr(DECIDERS, key, _decider(agent, prompt_field, deps))
    tools: list[PythonTool] = [PythonTool(
        kind="python", name=MODEL_TOOL, description="journals one model response of the pydantic-ai run",
        input_schema={"type": "object", "properties": {"response": {"type": "object"}}, "required": ["response"]},
        callable=f"{__name__}:echo_model_response", lookup_callable=f"{__name__}:model_response_not_sent",
        contract=ToolContract(idempotent=True, lookup=True, fenced=True))]
    lookups = dict(lookups or {})
    for tool_name, tool in agent._function_toolset.tools.items():
        tool_key = key + "__" + re.sub(r"\W", "_", tool_name)
        setattr(TOOLS, tool_key, _runner(agent, tool_name, tool, deps))
        lookup_path = None
        if tool_name in lookups:
            setattr(TOOLS, f"{tool_key}__lookup", lookups.pop(tool_name))
            lookup_path = f"{__name__}:TOOLS.{tool_key}__lookup"
        tools.append(PythonTool(
            kind="python", name=tool_name, description=tool.description or "",
            input_schema=tool.tool_def.parameters_json_schema, callable=f"{__name__}:TOOLS.{tool_key}",
            lookup_callable=lookup_path,
            contract=ToolContract(idempotent=tool_name in idempotent, lookup=lookup_path is not None,
                                  fenced=tool_name in fenced, requires_approval=tool_name in requires_approval)))
    if lookups:
        raise ValueError(f"lookups name tools the agent does not have: {sorted(lookups)}")
    definition = AgentDefinition(
        name=name, version=version, description=description, tools=tools,
        decider=PythonDecider(kind="python", callable=f"{__name__}:DECIDERS.{key}"),
        budgets=budgets or Budgets(), prompt=PromptInfo(version=version))
    return DurableAgent(agent, definition)
