"""Code-first agents (executor.sdk): definitions from decorators, typed tools, the python decider, module loading."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from code_first_agents import greet, greeter

from executor.agents import AgentCatalog, DefinitionError, PythonDecider, parse_definition
from executor.checkpoint import HistoryEntry
from executor.deciders import DeciderRegistry
from executor.deciders.python import PythonDeciderImpl
from executor.decisions import DecisionContext, Finish, Invalid, Sleep, ToolCall
from executor.sdk import Context, ToolCallContext, ToolRefused
from executor.steps import initial_state
from executor.tools import ToolRegistry

MODULE = "code_first_agents"  # pytest puts this folder (no __init__.py) on sys.path
CTX = ToolCallContext(run_id="r", tenant_id="t", step_key="hello@0/attempt-1", idempotency_key="k", fencing_token=3)


def test_an_agent_in_code_is_a_definition_with_a_python_decider_and_typed_tool_schemas() -> None:
    definition = greeter.definition
    assert (definition.name, definition.version, definition.budgets.max_steps) == ("greeter", "2", 5)
    assert definition.decider == PythonDecider(kind="python", callable=f"{MODULE}:greeter")
    [tool] = definition.tools
    assert tool.name == "greet" and tool.contract.idempotent and not tool.contract.lookup
    assert tool.input_schema["required"] == ["name"]
    assert tool.input_schema["properties"]["times"]["type"] == "integer"
    # The same definition through the YAML path: a code-first agent is an ordinary definition.
    again = parse_definition(definition.model_dump(mode="json"))
    assert again.decider == definition.decider and again.tools == definition.tools


def test_a_typed_tool_validates_its_arguments_and_answers_json() -> None:
    assert asyncio.run(greet({"name": "ada", "times": 2}, CTX)) == {"text": "hello ada hello ada"}
    with pytest.raises(ToolRefused, match="greet: times: Input should be a valid integer"):
        asyncio.run(greet({"name": "ada", "times": "often"}, CTX))


def test_the_executor_loads_agents_from_a_module_beside_files(tmp_path: Path) -> None:
    other = greeter.definition.model_dump(mode="json") | {"name": "from-yaml"}
    import yaml

    (tmp_path / "a.yaml").write_text(yaml.safe_dump(other))
    catalog = AgentCatalog.load(f"{tmp_path},{MODULE}")
    assert catalog.names() == ["from-yaml", "greeter"]
    assert catalog.get("greeter") is not None and catalog.get("greeter").source == f"{MODULE} (code)"


@pytest.mark.parametrize(("spec", "message"), [
    ("no_such_module_here", "no_such_module_here: (module): cannot import: ModuleNotFoundError"),
    ("json", "json: (module): defines no agent (use executor.sdk's @agent)"),
    ("./missing.yaml", "missing.yaml: (file): no such file or directory"),
])
def test_a_module_that_gives_no_agents_is_one_line(spec: str, message: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        AgentCatalog.load(spec)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def _context(**state_update: object) -> DecisionContext:
    state = initial_state(greeter.definition).model_copy(update=state_update)
    return DecisionContext(agent=greeter.definition, run_id="run-1", tenant_id="t", input={"name": "ada"},
                           state=state)


def test_the_python_decider_proposes_with_a_node_per_step_and_keeps_the_agents_state() -> None:
    decider = PythonDeciderImpl(greeter.definition.decider)  # type: ignore[arg-type]
    first = asyncio.run(decider.decide(_context()))
    assert first.decision == ToolCall("greet", {"name": "ada"}, node="hello") and first.node == "hello@0"
    entry = HistoryEntry(index=0, node="hello@0", step_key="hello@0/attempt-1", kind="tool", tool="greet")
    results = {"hello@0/attempt-1": {"status": "SUCCEEDED", "response": {"text": "hi"}}}
    second = asyncio.run(decider.decide(_context(step_index=1, history=[entry], tool_results=results)))
    assert second.decision == Sleep(10) and second.node == "nap@1" and second.agent_state == {"napped": True}
    third = asyncio.run(decider.decide(_context(step_index=2, history=[entry], tool_results=results,
                                                agent_state={"napped": True})))
    assert third.decision == Finish({"text": "hi"}) and third.agent_state is None


@pytest.mark.parametrize(("func", "kind", "detail"), [
    ("broken", "decider_error", "RuntimeError: no idea what to do"),
    ("not_a_decision", "parse_failure", "the decider returned dict, not a ToolCall"),
])
def test_a_decider_that_raises_or_returns_no_decision_is_an_invalid_decision(func: str, kind: str,
                                                                               detail: str) -> None:
    decider = PythonDeciderImpl(PythonDecider(kind="python", callable=f"{MODULE}:{func}"))
    proposal = asyncio.run(decider.decide(_context()))
    assert isinstance(proposal.decision, Invalid) and proposal.decision.kind == kind
    assert proposal.decision.detail.startswith(detail)


def test_an_async_decider_reports_usage() -> None:
    decider = PythonDeciderImpl(PythonDecider(kind="python", callable=f"{MODULE}:async_finish"))
    proposal = asyncio.run(decider.decide(_context(step_index=4)))
    assert proposal.decision == Finish({"step": 4}) and (proposal.tokens, proposal.cost_usd) == (12, 0.5)


def test_context_reads_results_by_node_and_the_last_input() -> None:
    entries = [HistoryEntry(index=0, node="hello@0", step_key="hello@0/attempt-1", kind="tool", tool="greet"),
               HistoryEntry(index=1, node="ask@1", step_key="ask@1/attempt-1", kind="input"),
               HistoryEntry(index=2, node="hello@2", step_key="hello@2/attempt-2", kind="tool", tool="greet")]
    results = {"hello@0/attempt-1": {"status": "SUCCEEDED", "response": 1},
               "hello@2/attempt-2": {"status": "FAILED", "error_code": "tool_refused", "detail": "no"}}
    ctx = Context.of(_context(history=entries, tool_results=results, inputs={"ask@1/attempt-1": {"ok": True}}))
    latest = ctx.result("hello")
    assert latest is not None and not latest.ok and latest.error_code == "tool_refused"
    assert ctx.result("nobody") is None and ctx.last_input() == {"ok": True}
    with pytest.raises(TypeError):
        ctx.input["name"] = "eve"  # type: ignore[index]


def _definition(decider_callable: str, tool_callable: str) -> dict[str, object]:
    return {"name": "checked", "version": "1", "decider": {"kind": "python", "callable": decider_callable},
            "tools": [{"name": "t", "kind": "python", "callable": tool_callable}]}


@pytest.mark.parametrize(("decider", "tool", "field", "problem"), [
    (f"{MODULE}:greeter", f"{MODULE}:wrong_signature", "tools.0.callable",
     f"{MODULE}:wrong_signature(args: 'dict[str, Any]') -> 'dict[str, Any]' cannot be called as "
     "(arguments, ToolCallContext): too many positional arguments"),
    (f"{MODULE}:takes_nothing", f"{MODULE}:greet", "decider.callable",
     f"{MODULE}:takes_nothing cannot be called with one argument (the Context): too many positional arguments"),
    (f"{MODULE}:nowhere", f"{MODULE}:greet", "decider.callable",
     f"cannot import: AttributeError: module '{MODULE}' has no attribute 'nowhere'"),
])
def test_callables_that_cannot_be_called_as_declared_stop_the_executor_at_start(
        decider: str, tool: str, field: str, problem: str) -> None:
    definition = parse_definition(_definition(decider, tool), "checked.yaml")

    async def build() -> None:
        async with aiohttp.ClientSession() as session:
            ToolRegistry([definition], session)
            DeciderRegistry([definition], session)

    with pytest.raises(DefinitionError) as caught:
        asyncio.run(build())
    assert (caught.value.field, caught.value.problem) == (field, problem)


def test_a_tool_call_without_a_node_is_named_after_its_tool_even_with_a_slash() -> None:
    decider = PythonDeciderImpl(PythonDecider(kind="python", callable=f"{MODULE}:slash_tool"))
    proposal = asyncio.run(decider.decide(_context(step_index=3)))
    assert proposal.decision == ToolCall("billing/refund", {"n": 1}) and proposal.node == "billing/refund@3"
    bad = asyncio.run(PythonDeciderImpl(PythonDecider(kind="python", callable=f"{MODULE}:bad_node"))
                      .decide(_context()))
    assert isinstance(bad.decision, Invalid) and bad.decision.detail.startswith("node 'not a node' must match")


def test_a_tool_that_is_not_the_module_attribute_is_refused_when_the_agent_is_declared(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    (tmp_path / "undecorated_tools.py").write_text(
        "from pydantic import BaseModel\n"
        "from executor.sdk import agent, tool, Finish\n"
        "class Args(BaseModel):\n    n: int\n"
        "def refund(args, ctx):\n    return {'n': args.n}\n"
        "refund_tool = tool('refund', Args)(refund)  # the module attribute 'refund' stays the bare function\n"
        "@agent(name='a', version='1', tools=[refund_tool])\n"
        "def decide(ctx):\n    return Finish(None)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DefinitionError) as caught:
        AgentCatalog.load("undecorated_tools")
    assert caught.value.problem == (
        "cannot import: ValueError: tool refund: undecorated_tools:refund is not the tool; declare it with "
        "@tool(...) on the function, so the module attribute is the tool")


def test_a_python_file_named_as_a_definition_file_says_how_to_name_a_module(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text("x = 1\n")
    with pytest.raises(DefinitionError) as caught:
        AgentCatalog.load(str(tmp_path / "mod.py"))
    assert caught.value.problem.startswith("not an agent definition file (*.yaml, *.yml, *.toml); a Python module "
                                           "is named by its dotted name (")


# Every way a python tool is declared (a YAML callable or lookup_callable, a @tool function or its
# lookup) is checked before the first call: a callable that cannot take the call's arguments never
# becomes an in-doubt run.
_BAD_TOOLS = {
    "code_tool": (
        "@tool('bad.one', A)\ndef one(args: A):\n    return {}\n",
        "tool bad.one: {m}:one(args: 'A') cannot be called as (args, ToolCallContext): "
        "too many positional arguments"),
    "code_tool_keyword_only": (
        "@tool('bad.one', A)\ndef one(args: A, ctx, *, extra):\n    return {}\n",
        "tool bad.one: {m}:one(args: 'A', ctx, *, extra) cannot be called as (args, ToolCallContext): "
        "missing a required argument: 'extra'"),
    "code_tool_lookup": (
        "def find(key):\n    return None\n"
        "@tool('bad.one', A, lookup=find)\ndef one(args: A, ctx):\n    return {}\n",
        "tool bad.one: {m}:one.lookup(key) cannot be called as (idempotency_key, ToolCallContext): "
        "too many positional arguments"),
}


@pytest.mark.parametrize("case", sorted(_BAD_TOOLS))
def test_a_code_first_tool_that_cannot_be_called_as_declared_is_refused_when_its_module_loads(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, problem = _BAD_TOOLS[case]
    module = f"bad_tools_{case}"
    (tmp_path / f"{module}.py").write_text(
        "from __future__ import annotations\nfrom pydantic import BaseModel\n"
        "from executor.sdk import ToolCall, agent, tool\n"
        "class A(BaseModel):\n    x: int = 0\n" + source
        + "@agent(name='bad', version='1', tools=[one])\ndef bad(ctx):\n    return ToolCall('bad.one', {})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DefinitionError) as caught:
        AgentCatalog.load(module)
    assert str(caught.value) == f"{module}: (module): cannot import: TypeError: {problem.format(m=module)}"


def test_a_yaml_lookup_callable_that_cannot_be_called_as_declared_stops_the_executor_at_start() -> None:
    data = _definition(f"{MODULE}:greeter", f"{MODULE}:greet")
    data["tools"][0].update(lookup_callable=f"{MODULE}:takes_nothing",  # type: ignore[index]
                            contract={"lookup": True})
    definition = parse_definition(data, "checked.yaml")

    async def build() -> None:
        async with aiohttp.ClientSession() as session:
            ToolRegistry([definition], session)

    with pytest.raises(DefinitionError) as caught:
        asyncio.run(build())
    assert caught.value.field == "tools.0.lookup_callable"
    assert "cannot be called as (idempotency_key, ToolCallContext)" in caught.value.problem


def test_a_call_that_does_not_bind_is_a_definite_failure_and_a_type_error_inside_is_unknown() -> None:
    from executor.agents import PythonTool
    from executor.errors import ErrorClass, classify
    from executor.sdk import CodeTool
    from executor.tools.base import signature_of
    from executor.tools.python import PythonToolAdapter

    ran: list[object] = []

    def takes_one(args: object) -> object:  # what a declaration check would refuse, reached past it
        ran.append(args)
        return {}

    definition = PythonTool(kind="python", name="late", input_schema={"type": "object"},
                            callable=f"{MODULE}:greet")
    unbound = CodeTool(takes_one, definition, None, None)
    with pytest.raises(Exception) as caught:
        asyncio.run(unbound({"x": 1}, CTX))
    assert type(caught.value).__name__ == "ToolNotCallable" and ran == []

    adapter = PythonToolAdapter(definition)
    adapter.func = unbound  # the object the executor calls: its call binds; the function inside does not
    outcome = asyncio.run(adapter.call({"x": 1}, CTX))
    assert (outcome.ok, outcome.error_code) == (False, "tool_not_callable") and ran == []
    assert classify(outcome.error_code) is ErrorClass.DEFINITE_NO_EFFECT

    def raises_type_error(args: object, ctx: object) -> object:  # it ran: a TypeError from inside is unknown
        ran.append(args)
        raise TypeError("inside the tool")

    adapter.func, adapter.signature = raises_type_error, signature_of(raises_type_error)
    outcome = asyncio.run(adapter.call({"x": 2}, CTX))
    assert (outcome.ok, outcome.error_code) == (False, "tool_crashed") and ran == [{"x": 2}]
    assert classify(outcome.error_code) is ErrorClass.UNKNOWN_OUTCOME
