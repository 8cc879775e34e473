"""Sealing primitives: the keyring wraps and unwraps, values seal deterministically per run and
open only with that run's key, and the marks are found in nested schemas."""

from __future__ import annotations

import base64
import json
import os
import uuid

import pytest

from scheduler.security.sealing import KeyError_, Keyring, RunKey, Sensitivity, check_sensitivity, parse_keyring
from shared.sensitive import redact_sealed_text, sensitivity_of


def test_marks_are_found_at_any_depth_and_unmarked_tools_are_left_out():
    schema = {"type": "object", "properties": {
        "card": {"type": "string", "x-agentrt-sensitive": True},
        "owner": {"type": "object", "properties": {"ssn": {"x-agentrt-sensitive": True}, "name": {}}}}}
    spec = sensitivity_of(schema, [("a", {"properties": {"pin": {"x-agentrt-sensitive": True}}}, None),
                                   ("b", {"type": "object"}, None)])
    assert spec == {"input": [["card"], ["owner", "ssn"]], "tools": {"a": {"input": [["pin"]], "output": []}}}
    assert check_sensitivity(spec) is None
    assert check_sensitivity({"input": "card"}) is not None


def test_a_keyring_opens_what_it_wrapped_and_refuses_other_keys():
    ring = Keyring("k1", {"k1": os.urandom(32)})
    key_id, wrapped = ring.wrap(b"d" * 32)
    assert key_id == "k1" and ring.unwrap("k1", wrapped) == b"d" * 32
    with pytest.raises(KeyError_):
        Keyring("k1", {"k1": os.urandom(32)}).unwrap("k1", wrapped)
    with pytest.raises(KeyError_):
        ring.unwrap("k0", wrapped)
    with pytest.raises(ValueError, match="not 32 bytes"):
        parse_keyring(json.dumps({"current": "a", "keys": {"a": base64.b64encode(b"x").decode()}}), "env")


def test_sealed_values_are_deterministic_per_run_and_bound_to_it():
    data_key = os.urandom(32)
    key = RunKey(uuid.uuid4(), data_key, Sensitivity())
    value = {"card": "4111", "n": 1}
    sealed = key.seal_paths(value, [("card",)])
    assert sealed["n"] == 1 and "4111" not in json.dumps(sealed)
    assert key.seal_paths(value, [("card",)]) == sealed and key.seal_paths(sealed, [("card",)]) == sealed
    assert key.unseal(sealed) == value
    other = RunKey(uuid.uuid4(), data_key, Sensitivity())  # same key bytes, another run: does not open
    with pytest.raises(Exception):  # noqa: B017  (cryptography's InvalidTag)
        other.unseal(sealed)
    assert json.loads(redact_sealed_text(json.dumps(sealed))) == {"card": "[redacted]", "n": 1}
    state = key.seal_strings({"raw": ["charge 4111 now", "other"]}, {"4111"})
    assert state["raw"][1] == "other" and key.unseal(state) == {"raw": ["charge 4111 now", "other"]}
