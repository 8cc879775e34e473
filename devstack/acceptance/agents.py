"""Agent definitions the experiments and the soak run: scripted plans over the mock tool server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# Tool contracts, by what docs/design.md §leases-and-fencing and §acceptance-and-evidence distinguish.
NON_IDEMPOTENT = {"idempotent": False, "lookup": False, "fenced": False}  # no lookup, no idempotency contract
IDEMPOTENT = {"idempotent": True, "lookup": False, "fenced": True}
LOOKUP = {"idempotent": True, "lookup": True, "fenced": True}  # answers "did key K run?" and refuses old fences


def http_tool(mock_url: str, name: str, contract: dict[str, bool], timeout_s: float = 5.0) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": name, "kind": "http", "url": f"{mock_url}/tools/{name}", "timeout_s": timeout_s,
                            "contract": dict(contract), "input_schema": {"type": "object"}}
    if contract.get("lookup"):
        tool["lookup_url"] = f"{mock_url}/lookup/{name}"
    return tool


def tool_step(node: str, tool: str, **args: Any) -> dict[str, Any]:
    return {"id": node, "tool": tool, "args": {"run": "${run.id}", "node": node, **args}}


def scripted(name: str, plan: list[dict[str, Any]], tools: list[dict[str, Any]], version: str = "1",
             **extra: Any) -> dict[str, Any]:
    return {"name": name, "version": version, "decider": {"kind": "scripted", "plan": plan}, "tools": tools, **extra}


def write_agents(directory: Path, *definitions: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for definition in definitions:
        path = directory / f"{definition['name'].replace('/', '_')}-{definition['version']}.yaml"
        path.write_text(yaml.safe_dump(definition, sort_keys=False))
    return directory


def three_step(name: str, mock_url: str, contract: dict[str, bool], *, sleep_ms: int = 0,
               tool_prefix: str | None = None) -> dict[str, Any]:
    """a → (sleep) → b → c → finish with the three results: the workhorse of experiments 1, 7, 8 and the soak."""
    prefix = tool_prefix or name
    tools = [http_tool(mock_url, f"{prefix}.{step}", contract) for step in ("a", "b", "c")]
    plan: list[dict[str, Any]] = [tool_step("a", f"{prefix}.a")]
    if sleep_ms:
        plan.append({"id": "nap", "sleep_ms": sleep_ms})
    plan += [tool_step("b", f"{prefix}.b"), tool_step("c", f"{prefix}.c"),
             {"id": "done", "finish": {"a": "${results.a.response.id}", "b": "${results.b.response.id}",
                                       "c": "${results.c.response.id}"}}]
    return scripted(name, plan, tools)


def long_run(name: str, mock_url: str, steps: int) -> dict[str, Any]:
    """One node repeating a looked-up, fenced tool `steps` times, then finish: the soak's long runs."""
    tool = http_tool(mock_url, f"{name}.step", LOOKUP)
    plan: list[dict[str, Any]] = [{**tool_step("step", f"{name}.step"), "repeat": steps},
                                  {"id": "done", "finish": {"last": "${results.step.response.id}"}}]
    return scripted(name, plan, [tool])
