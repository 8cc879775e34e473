import json
import uuid
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.api.validate import parse_json_canonical
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


def test_uuid7_ids_are_unique_across_threads_and_a_fork():
    """The random bits are read in blocks: no two callers (threads, or a forked child and its
    parent) may ever be handed the same bytes, or two events would share an id."""
    import os
    import threading

    per_thread: list[list[uuid.UUID]] = [[] for _ in range(8)]

    def make(into: list[uuid.UUID]) -> None:
        into.extend(uuid7() for _ in range(5000))

    threads = [threading.Thread(target=make, args=(ids,)) for ids in per_thread]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for ids in per_thread for i in ids]
    assert len(set(every)) == len(every) == 40_000
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in every)
    assert len({i.int & ((1 << 62) - 1) for i in every}) == 40_000  # the random part alone differs too

    uuid7()  # the parent holds a block it has started on
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, b"".join(uuid7().bytes for _ in range(100)))
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 1600)
    os.close(read)
    os.close(write)
    parent = b"".join(uuid7().bytes for _ in range(100))
    tails = lambda blob: {blob[i + 8:i + 16] for i in range(0, len(blob), 16)}  # noqa: E731
    assert not tails(child) & tails(parent)


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


# ---------------------------------------------------------------------- numbers as jsonb writes them
# jsonb keeps a number as numeric: numeric_in keeps max(0, fractional digits - exponent) digits after
# the point and numeric_out writes them all, with no exponent and no negative zero. The canonical
# text must already be in that form, or a hash taken over it stops matching the stored value
# (tests/integration/scheduler/test_json_numbers.py checks the same against PostgreSQL itself).

FINITE = st.floats(allow_nan=False, allow_infinity=False)  # the whole range: subnormals, -0.0, 1.8e308
NUMBER_LIKE_TEXT = st.text(alphabet='0123456789.e+-E"\\[]{},: x\u00e9', max_size=12)
numeric_values = st.recursive(
    st.none() | st.booleans() | st.integers() | FINITE | NUMBER_LIKE_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(NUMBER_LIKE_TEXT, children, max_size=4),
    max_leaves=25,
)


def numeric_out(literal: str) -> str:
    """numeric_out(numeric_in(literal)), done with Decimal: the oracle for one number."""
    number = Decimal(literal)
    exponent = number.as_tuple().exponent
    assert isinstance(exponent, int)
    text = format(number, f".{max(0, -exponent)}f")
    return text.lstrip("-") if number.is_zero() else text


def float_literal(text: str) -> float:
    """parse_float hook: every float literal of canonical text has jsonb's form."""
    number = float(text)
    assert "e" not in text.lower(), text
    assert number or not text.startswith("-"), text  # no negative zero
    return number


@pytest.mark.parametrize(("value", "text"), [
    (1e16, "10000000000000000"), (-0.0, "0.0"), (1e-7, "0.0000001"), (1.5e-07, "0.00000015"),
    (1e-05, "0.00001"), (-1e-5, "-0.00001"), (2.5e+20, "250000000000000000000"), (1e22, "10000000000000000000000"),
    (1.0, "1.0"), (0.1, "0.1"), (123.456, "123.456"), (-1.7976931348623157e+308, "-17976931348623157" + "0" * 292),
    (5e-324, "0." + "0" * 323 + "5"), (123456789012345678901234567890, "123456789012345678901234567890"),
])
def test_floats_are_written_as_jsonb_writes_them(value, text):
    assert canonical_json(value) == text
    assert canonical_json({"x": [value]}) == f'{{"x":[{text}]}}'


@given(FINITE | st.integers())
def test_every_number_is_written_as_numeric_out_writes_its_literal(number):
    assert canonical_json(number) == numeric_out(repr(number))


@given(numeric_values)
def test_canonical_text_is_a_fixpoint_and_keeps_the_value(value):
    text = canonical_json(value)
    parsed = json.loads(text, parse_float=float_literal)
    assert canonical_json(parsed) == text
    assert same_value(parsed, value)


def same_value(parsed, value) -> bool:
    """`parsed` reads back `value`: strings exactly, floats as the same float (1e16 reads back as an int)."""
    if isinstance(value, float):
        return isinstance(parsed, int | float) and not isinstance(parsed, bool) and float(parsed) == value
    if isinstance(value, list):
        return isinstance(parsed, list) and len(parsed) == len(value) and all(map(same_value, parsed, value))
    if isinstance(value, dict):
        return isinstance(parsed, dict) and parsed.keys() == value.keys() and all(
            same_value(parsed[key], value[key]) for key in value)
    return type(parsed) is type(value) and parsed == value


def test_strings_and_keys_that_look_like_numbers_are_left_alone():
    value = {"1e+16": ["-0.0", "x\"1e+16\\", 1e16], "\\": -0.0, "a\\\"b": "\\\\1e-07\"", "-0.0": 1.5e-07}
    assert canonical_json(value) == (
        '{"-0.0":0.00000015,"1e+16":["-0.0","x\\"1e+16\\\\",10000000000000000],"\\\\":0.0,'
        '"a\\\\\\"b":"\\\\\\\\1e-07\\""}')
    assert json.loads(canonical_json(value)) == value


def test_text_without_exponent_or_negative_zero_is_the_encoders_text():
    value = {"note": "one-time re-run, see e-mail", "n": [-0.05, -10.0, 0.0001, 1234567890123456.0]}
    assert canonical_json(value) == json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# RFC 8785 (JCS): the form hashes a client recomputes are taken over -----------------------------------

from shared.canonical import es_number, jcs_json, legacy_request_hash  # noqa: E402

# Inside the domain rfc8785 (an independent implementation) accepts: |integers| below 2**53.
jcs_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@given(jcs_values)
def test_jcs_text_is_what_an_independent_rfc8785_implementation_writes(value):
    import rfc8785
    assert jcs_json(value).encode("utf-8") == rfc8785.dumps(value)


@pytest.mark.parametrize(("number", "text"), [
    # RFC 8785 Appendix B's sample numbers (IEEE 754 hex → ECMAScript text)
    (0.0, "0"), (-0.0, "0"), (5e-324, "5e-324"), (-5e-324, "-5e-324"),
    (1.7976931348623157e308, "1.7976931348623157e+308"), (9007199254740992.0, "9007199254740992"),
    (9007199254740994.0, "9007199254740994"), (295147905179352830000.0, "295147905179352830000"),
    (1e21, "1e+21"), (9.999999999999997e22, "9.999999999999997e+22"), (999999999999999900000.0,
                                                                       "999999999999999900000"),
    (1e-7, "1e-7"), (0.000001, "0.000001"), (333333333.3333333, "333333333.3333333"), (80.0, "80"),
    (1e16, "10000000000000000"), (-1.5e300, "-1.5e+300"), (1.5e-7, "1.5e-7"),
])
def test_jcs_numbers_are_written_as_ecmascript_writes_them(number, text):
    assert es_number(number) == text and jcs_json(number) == text


def test_jcs_makes_80_and_80_point_0_one_value_and_sorts_keys_by_utf16():
    # The client example's input (docs/python-client.md) as Python writes it and as JSON.stringify writes it hash alike.
    assert request_hash("t", json.loads('{"amount": 80.0}')) == request_hash("t", json.loads('{"amount": 80}'))
    assert jcs_json(json.loads('{"amount": 8e1, "n": 1E-7}')) == '{"amount":80,"n":1e-7}'
    # U+1F600 is D83D DE00 in UTF-16, before U+FB01 (code point order would put it after).
    assert jcs_json({"\ufb01": 1, "\U0001f600": 2}) == '{"\U0001f600":2,"\ufb01":1}'
    # Integers past 2**53 are the doubles they round to, as JavaScript reads them.
    assert jcs_json(2**60) == "1152921504606847000"
    with pytest.raises(ValueError, match="IEEE double"):
        jcs_json(10**400)


def test_the_legacy_request_hash_is_the_old_canonical_form_and_differs_only_where_numbers_do():
    assert legacy_request_hash("t", {"a": 1, "s": "x"}) == request_hash("t", {"a": 1, "s": "x"})
    assert legacy_request_hash("t", {"a": 80.0}) == sha256_of({"tool": "t", "request": {"a": 80.0}})
    assert legacy_request_hash("t", {"a": 80.0}) != request_hash("t", {"a": 80.0})
