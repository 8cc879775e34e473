"""Which fields an agent marks sensitive: JSON-schema properties with "x-agentrt-sensitive": true.

Executors send the marked paths with their registration (AgentRegistration.sensitive_json); the
scheduler seals those values (scheduler/sealing.py).
"""

from __future__ import annotations

from typing import Any

MARK = "x-agentrt-sensitive"


def marked_paths(schema: Any) -> list[list[str]]:
    """Paths (property names from the root) of every property marked sensitive in a JSON schema."""
    found: list[list[str]] = []

    def walk(node: Any, at: list[str]) -> None:
        if not isinstance(node, dict):
            return
        if node.get(MARK) is True and at:
            found.append(at)
            return
        props = node.get("properties")
        if isinstance(props, dict):
            for name, sub in props.items():
                walk(sub, [*at, str(name)])

    walk(schema, [])
    return found


def sensitivity_of(input_schema: Any, tools: list[tuple[str, Any, Any]]) -> dict[str, Any]:
    """{"input": paths, "tools": {name: {"input": paths, "output": paths}}}; tools without marks left out."""
    spec: dict[str, Any] = {"input": marked_paths(input_schema), "tools": {}}
    for name, tool_input, tool_output in tools:
        marks = {"input": marked_paths(tool_input), "output": marked_paths(tool_output)}
        if marks["input"] or marks["output"]:
            spec["tools"][name] = marks
    return spec
