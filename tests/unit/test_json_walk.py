"""The edge's filter walks every *_json text of a message at any depth (scheduler/api/shield.py). It
walks by a plan made once per message type; this sweep holds it to the plain walk over every set
field that it replaced, for every message type of the API, nested and repeated parts filled."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from scheduler.api.shield import _walk_json_fields
from shared.gen.agentrt.v1 import common_pb2, run_service_pb2, work_service_pb2
from shared.sensitive import SEALED

SEALED_TEXT = f'{{"{SEALED}": "c2VhbGVk"}}'


def _reference_walk(message: Message, seen: list[str], prefix: str = "") -> None:
    """The walk before plans: every set field, by ListFields."""
    for desc, value in message.ListFields():
        path = f"{prefix}.{desc.name}" if prefix else desc.name
        if desc.message_type is not None:
            if desc.is_repeated:
                if desc.message_type.GetOptions().map_entry:
                    continue
                for index, item in enumerate(value):
                    _reference_walk(item, seen, f"{path}[{index}]")
            else:
                _reference_walk(value, seen, path)
        elif desc.name.endswith("_json") and not desc.is_repeated and isinstance(value, str) and SEALED in value:
            seen.append(path)


def _fill(message: Message, depth: int = 0) -> None:
    """Every *_json text sealed-looking, every other text set, messages nested 3 deep, 2 of each repeated."""
    for desc in message.DESCRIPTOR.fields:
        if desc.containing_oneof is not None and message.WhichOneof(desc.containing_oneof.name):
            continue  # one member of a oneof only (the first)
        if desc.message_type is not None:
            if desc.message_type.GetOptions().map_entry or depth >= 3:
                continue
            if desc.message_type.full_name.startswith("google.protobuf"):
                continue
            if desc.is_repeated:
                for _ in range(2):
                    _fill(getattr(message, desc.name).add(), depth + 1)
            else:
                _fill(getattr(message, desc.name), depth + 1)
        elif desc.type == FieldDescriptor.TYPE_STRING and not desc.is_repeated:
            setattr(message, desc.name, SEALED_TEXT if desc.name.endswith("_json") else "text")


def _message_types() -> list[Any]:
    found = []
    for module in (common_pb2, run_service_pb2, work_service_pb2):
        found.extend(module.DESCRIPTOR.message_types_by_name.values())
    return found


@pytest.mark.parametrize("descriptor", _message_types(), ids=lambda d: d.name)
def test_the_planned_walk_visits_what_the_field_by_field_walk_did(descriptor: Any) -> None:
    cls = {**common_pb2.__dict__, **run_service_pb2.__dict__, **work_service_pb2.__dict__}[descriptor.name]
    message = cls()
    _fill(message)
    expected: list[str] = []
    _reference_walk(message, expected)
    visited: list[str] = []

    def note(text: str, path: str) -> str:
        visited.append(path)
        return text

    _walk_json_fields(message, note)
    assert sorted(visited) == sorted(expected)


def test_the_sweep_reaches_nested_and_repeated_json() -> None:
    """The sweep above cannot pass by walking nothing: it reaches JSON in repeated parts and two
    levels down."""
    paths: list[str] = []
    for descriptor in _message_types():
        message = {**common_pb2.__dict__, **run_service_pb2.__dict__, **work_service_pb2.__dict__}[descriptor.name]()
        _fill(message)
        _reference_walk(message, paths)
    assert any("[1]." in path for path in paths)
    assert any(path.count(".") >= 2 for path in paths)
