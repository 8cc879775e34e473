"""Numeric fields of request messages, found by walking the proto descriptors: their paths inside a
request, how to set one, and the extreme values a sweep sends (tests/unit/test_bounds.py,
tests/integration/scheduler/test_numeric_bounds.py)."""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from scheduler import bounds
from scheduler.bounds import numeric_fields
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

SERVICES = (rs.DESCRIPTOR.services_by_name["RunService"], ws.DESCRIPTOR.services_by_name["WorkService"])
F = FieldDescriptor
# What each proto type can carry on the wire: the table's bounds must lie inside it.
TYPE_RANGE = {
    F.TYPE_INT32: (-2**31, 2**31 - 1), F.TYPE_SINT32: (-2**31, 2**31 - 1), F.TYPE_SFIXED32: (-2**31, 2**31 - 1),
    F.TYPE_INT64: (-2**63, 2**63 - 1), F.TYPE_SINT64: (-2**63, 2**63 - 1), F.TYPE_SFIXED64: (-2**63, 2**63 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1), F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1), F.TYPE_FIXED64: (0, 2**64 - 1),
    F.TYPE_DOUBLE: (-math.inf, math.inf), F.TYPE_FLOAT: (-math.inf, math.inf),
}


def request_types() -> list[Descriptor]:
    return [method.input_type for service in SERVICES for method in service.methods]


def every_numeric_field() -> dict[str, FieldDescriptor]:
    """Every numeric field any request holds, at any depth, by full name."""
    names = {name for message in request_types() for name in numeric_fields(message)}
    return {name: rs.DESCRIPTOR.pool.FindFieldByName(name) for name in names}


def extremes(field: FieldDescriptor) -> list[Any]:
    low, high = TYPE_RANGE[field.type]
    if field.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return [0.0, -1.0, -0.0, 2.0**31, 2.0**63, 1e300, -1e300, math.nan, math.inf, -math.inf, 5e-324]
    return sorted({v for v in (0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**64 - 1, low, high) if low <= v <= high})


def path_to(message: Descriptor, target: str, prefix: str = "") -> list[tuple[str, FieldDescriptor]]:
    """Every way down from `message` to the field `target` (singular message fields only)."""
    paths = []
    for field in message.fields:
        name = f"{prefix}.{field.name}" if prefix else field.name
        if field.full_name == target:
            paths.append((name, field))
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry \
                and field.full_name not in bounds.DONE_BY_ITEM and name.count(".") < 4:
            paths += path_to(field.message_type, target, name)
    return paths


def set_path(request: Any, path: str, field: FieldDescriptor, value: Any) -> str:
    """Sets the field at `path` (index 0 of repeated messages); the field name the refusal should give."""
    *parents, leaf = path.split(".")
    target, named = request, []
    for part in parents:
        container = getattr(target, part)
        descriptor = target.DESCRIPTOR.fields_by_name[part]
        if descriptor.is_repeated:
            target = container[0] if len(container) else container.add()
            named.append(f"{part}[0]")
        else:
            target = container
            named.append(part)
    if field.is_repeated:
        del getattr(target, leaf)[:]
        getattr(target, leaf).append(value)
    else:
        setattr(target, leaf, value)
    if target.DESCRIPTOR.full_name == bounds.TIMESTAMP:
        return ".".join(named)  # a timestamp is refused as a whole
    return ".".join([*named, leaf])
