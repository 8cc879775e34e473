"""The generated API reference (docs/proto-reference.md, proto/reference.py): current with the protos, and
every RPC, message, field and enum value in it with the comment the proto gives it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor

from shared.gen.agentrt.v1 import common_pb2, run_service_pb2, work_service_pb2

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "proto-reference.md"


def _reference_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("proto_reference", ROOT / "proto" / "reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_page_is_what_the_protos_say_now() -> None:
    result = subprocess.run([sys.executable, "proto/reference.py", "--check"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_every_element_is_listed_with_a_comment() -> None:
    text = PAGE.read_text()
    modules = (common_pb2, run_service_pb2, work_service_pb2)
    for module in modules:
        for service in module.DESCRIPTOR.services_by_name.values():
            assert f"### service {service.name}" in text
            for method in service.methods:
                assert f"| `{method.name}` | `{method.input_type.name}` → `{method.output_type.name}` |" in text

        def walk(message: descriptor.Descriptor, prefix: str) -> None:
            if message.GetOptions().map_entry:
                return
            assert f"### {prefix}{message.name}\n" in text, message.full_name
            for field in message.fields:
                assert f"| `{field.name}` | {field.number} |" in text, field.full_name
            for nested in message.nested_types:
                walk(nested, f"{prefix}{message.name}.")

        for message in module.DESCRIPTOR.message_types_by_name.values():
            walk(message, "")
    for value in common_pb2.RunStatus.DESCRIPTOR.values:
        assert f"| `{value.name}` | {value.number} |" in text
    # The COMMENTS lint gives every element a comment; none is lost on the way, and no buf directive shows.
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) > 300 and not [row for row in rows if row.rstrip().endswith("|  |")]
    assert "buf:lint" not in text


def test_a_comment_with_table_or_markup_characters_stays_in_its_cell() -> None:
    cell = _reference_module()._cell
    assert cell("a | b <script>") == "a \\| b &lt;script&gt;"
