"""Which fields an agent marks sensitive: JSON-schema properties with "x-agentrt-sensitive": true.

Executors send the marked paths with their registration (AgentRegistration.sensitive_json); the
scheduler seals those values (scheduler/security/sealing.py).
"""

from __future__ import annotations

import json
from typing import Any

MARK = "x-agentrt-sensitive"
SEALED = "$sealed"  # {"$sealed": "<base64 of nonce + ciphertext>"}: a value the scheduler sealed
REDACTED = "[redacted]"


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


def declared_marks(declared: dict[str, Any]) -> dict[str, Any]:
    """The marks of declared signals and ResumeRun input ({"signals": {name: schema}, "resume": schema}):
    {"signals": {name: paths}, "resume": paths}, names without marks left out."""
    signals = {name: paths for name, schema in (declared.get("signals") or {}).items()
               if (paths := marked_paths(schema))}
    return {"signals": signals, "resume": marked_paths(declared.get("resume"))}


def redact_sealed(value: Any) -> Any:
    """`value` with every sealed object shown as "[redacted]"."""
    if isinstance(value, list):
        return [redact_sealed(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {SEALED} and isinstance(value[SEALED], str):
            return REDACTED
        return {k: redact_sealed(v) for k, v in value.items()}
    return value


def redact_sealed_text(text: str) -> str:
    """A JSON text with its sealed values as "[redacted]" (the same text when it holds none). Kafka
    events leave the relay this way: their readers hold no keys, and a sealed value is of no use to them."""
    if f'"{SEALED}"' not in text:
        return text
    return json.dumps(redact_sealed(json.loads(text)), separators=(",", ":"), sort_keys=True,
                      ensure_ascii=False)
