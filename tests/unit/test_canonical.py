import json
import uuid

from hypothesis import given
from hypothesis import strategies as st

from scheduler.validate import parse_json_canonical
from shared.canonical import CanonicalJson, canonical_json, encode_json, idempotency_key, request_hash, sha256_of, uuid7

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_canonical_form_survives_a_round_trip(value):
    text = canonical_json(value)
    assert canonical_json(json.loads(text)) == text


def test_key_order_and_whitespace_do_not_change_the_hash():
    assert sha256_of(json.loads('{"b": 1, "a": [1, 2]}')) == sha256_of(json.loads('{"a":[1,2],"b":1}'))


def test_integers_are_not_turned_into_floats():
    # google.protobuf.Struct would make 1 into 1.0; the canonical form must not.
    assert canonical_json({"n": 1}) == '{"n":1}'
    assert request_hash("t", {"n": 1}) != request_hash("t", {"n": 1.5})


def test_request_hash_depends_on_tool_and_request():
    assert request_hash("a", {"x": 1}) != request_hash("b", {"x": 1})
    assert len(request_hash("a", {})) == 32


def test_idempotency_key_is_stable_and_distinct_per_step():
    key = idempotency_key("t1", "run", "label.create", "label/attempt-1")
    # Never change this format: downstream services dedupe on it.
    assert key == idempotency_key("t1", "run", "label.create", "label/attempt-1")
    assert key.startswith("agentrt:") and len(key) == len("agentrt:") + 40
    assert key != idempotency_key("t1", "run", "label.create", "label/attempt-2")
    assert key != idempotency_key("t2", "run", "label.create", "label/attempt-1")


def test_uuid7_is_version_7_and_time_ordered():
    ids = [uuid7() for _ in range(200)]
    assert all(isinstance(i, uuid.UUID) and i.version == 7 for i in ids)
    stamps = [i.int >> 80 for i in ids]
    assert stamps == sorted(stamps)


@given(json_values.filter(lambda v: isinstance(v, dict)))
def test_parsed_once_canonical_text_stores_and_hashes_like_the_value(value):
    text = json.dumps(value, ensure_ascii=True)  # any spelling a client may send
    if "\\u0000" in text:
        return  # refused (NUL), covered by the bad-input tests
    parsed, canonical = parse_json_canonical("state_json", text, 1 << 20)
    assert parsed == value and isinstance(canonical, CanonicalJson)
    assert canonical == canonical_json(value)
    assert encode_json(canonical) is canonical  # the jsonb codec passes it through, never re-encodes
    assert encode_json("text") == '"text"'  # a plain str is still a JSON string value
    assert sha256_of(canonical) == sha256_of(value)
