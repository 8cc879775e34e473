"""Hostile input to scheduler/api/validate.py: nesting depth, NUL deep inside, the tenant header given twice.

The integration side (the same through the gRPC server, nothing written) is
tests/integration/scheduler/test_hostile_input.py.
"""

import json
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.api.validate import (
    MAX_JSON_DEPTH,
    TENANT_HEADER,
    _has_nul,
    _nests_deeper_than,
    parse_json_canonical,
    tenant_from_metadata,
)
from shared.errors import InvalidArgument

BIG = 1 << 24


def nested(depth: int, leaf: str = "1") -> str:
    """An object of `depth` levels: {"a":[[...[leaf]...]]}."""
    return '{"a":' + "[" * (depth - 1) + leaf + "]" * (depth - 1) + "}"


def refusal(text: str) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as refused:
        parse_json_canonical("input_json", text, BIG)
    assert refused.value.field == "input_json"
    return refused.value


def test_the_limit_is_well_below_the_recursion_limit():
    assert MAX_JSON_DEPTH == 128 and MAX_JSON_DEPTH * 4 < sys.getrecursionlimit()


def test_nesting_at_the_limit_is_accepted_and_one_deeper_refused():
    _, canonical = parse_json_canonical("input_json", nested(MAX_JSON_DEPTH), BIG)
    assert canonical == nested(MAX_JSON_DEPTH)
    assert refusal(nested(MAX_JSON_DEPTH + 1)).message == "input_json: nests deeper than 128 levels"


@pytest.mark.parametrize("depth", [980, 5_000, 200_000])
def test_deep_nesting_is_refused_not_a_recursion_error(depth):
    assert "nests deeper than 128 levels" in refusal(nested(depth)).message
    assert "nests deeper" in refusal("[" * depth + "]" * depth).message  # arrays, and invalid JSON alike
    assert "nests deeper" in refusal('{"a":' * depth + "1" + "}" * depth).message


@pytest.mark.parametrize("depth", [129, 400, 980])
def test_nul_deep_inside_is_refused_without_recursion(depth):
    assert "nests deeper" in refusal(nested(depth, '"x\\u0000"')).message


def test_nul_within_the_limit_is_refused_as_nul():
    assert "NUL" in refusal(nested(MAX_JSON_DEPTH, '"x\\u0000"')).message


def test_has_nul_walks_any_depth_without_recursion():
    value: object = "x\x00"
    for _ in range(100_000):
        value = [{"k": value}]
    assert _has_nul(value)
    assert not _has_nul([{"k": [1, "a", None, {"b": 2.5}]}] * 3)
    assert _has_nul({"a\x00": 1})


def test_brackets_inside_strings_do_not_count():
    text = json.dumps({"s": "[" * 5_000, "t": "{" * 5_000, "q": '"[[[\\' * 500, "deep": json.loads(nested(100))})
    value, _ = parse_json_canonical("input_json", text, BIG)
    assert value["s"] == "[" * 5_000
    # Strings of closing brackets (or quotes) do not hide nesting either.
    hidden = json.dumps({"s": "]" * 5_000 + '"', "deep": json.loads(nested(MAX_JSON_DEPTH))})
    assert "nests deeper" in refusal(hidden).message


def reference_depth(text: str) -> int:
    """Nesting depth of JSON text, one character at a time (slow, obviously right)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


TRICKY = st.text(alphabet='[]{}"\\/ax\u00e9\u2603\n', max_size=8)
values = st.recursive(st.none() | st.integers() | TRICKY,
                      lambda children: st.lists(children, max_size=3) | st.dictionaries(TRICKY, children, max_size=3),
                      max_leaves=30)


@given(values, st.booleans())
def test_depth_matches_a_character_by_character_reading(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only)
    depth = reference_depth(text)
    for limit in range(0, 8):
        assert _nests_deeper_than(text, limit) == (depth > limit), (text, limit, depth)


def test_tenant_header_given_twice_is_refused():
    for values in (["tenant-a", "tenant-b"], ["tenant-a", "tenant-a"]):
        with pytest.raises(InvalidArgument) as refused:
            tenant_from_metadata([(TENANT_HEADER, value) for value in values])
        assert refused.value.field == TENANT_HEADER
        assert "must be given once" in refused.value.message
    assert tenant_from_metadata([("other", "x"), (TENANT_HEADER, "tenant-a")]) == "tenant-a"
