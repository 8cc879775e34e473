"""The binding of every fenced write is a contract with the past: it is persisted on the write's outbox
rows, and a retry after a restart or an upgrade replays only when it computes the same digest again.

The digests below were computed by the code before the writes took request objects
(scheduler/store/fenced.py); any change to a field's name or to how a value is hashed breaks a retry in
flight across that upgrade and must fail here.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from scheduler.store import fenced
from scheduler.store.types import Journal, LeaseRef, RunEnd, ToolIntent
from shared.canonical import CanonicalJson, canonical_json

LEASE = LeaseRef(uuid.UUID("11111111-1111-4111-8111-111111111111"), "worker-a", 42)
E1 = uuid.UUID("22222222-2222-4222-8222-222222222222")
E2 = uuid.UUID("33333333-3333-4333-8333-333333333333")
X = uuid.UUID("44444444-4444-4444-8444-444444444444")
STATE = {"step": 3, "pending_tool": {"step_key": "s4", "tool_name": "t", "request_hash": "ab"}, "x": [1, 2.5, "é"]}
JOURNAL = Journal.of([(4, "tool_result", "s3", "n1", "t", '{"a":1}'), (5, "decision", "s4", "n1", "t", "{}")])
DIGEST = bytes.fromhex("abcd")
INTENT = ToolIntent("s4", "t", "idem", {"q": 1}, X, E2)

CASES = {
    "save": (fenced.CheckpointWrite(expected_version=7, state=STATE, schema_version=2, step_key="s3", event_id=E1,
                             event_payload={"k": 1}, journal=JOURNAL, consume_signal_seqs=(1, 2)).binding(LEASE),
             "e26304b02a2e7563ad7c37b0d7ff984869e993a512418d26864fa6a5e05881ab"),
    "save_plain": (fenced.CheckpointWrite(expected_version=7, state=STATE, schema_version=1,
                                   event_id=E1).binding(LEASE),
                   "116ede6ff9ff0d68d9c5244b12a4c2e1faea5390f7ea100eab9b413141ec7197"),
    "begin": (fenced.BeginCall(expected_version=7,
                        intent=ToolIntent("s4", "t", "idem", {"q": 1}, X, E1)).binding(LEASE, DIGEST),
              "701ba305664f7a5afe0eba1f3d8d87615195104ec7b987fa96e568cf24d0dbca"),
    "tx2": (fenced.CompleteCall(expected_version=7, step_key="s3", succeeded=True, next_step_key="s4", state=STATE,
                         schema_version=2, response={"r": 1}, remote_resource_id="rid", evidence={"e": 1},
                         event_id=E1, journal=JOURNAL).binding(LEASE),
            "2612cdadc24ca4182223f7778953b15d99958f0ab19f84b38a0862ee65067757"),
    "tx2_end": (fenced.CompleteCall(expected_version=7, step_key="s3", succeeded=False, state=STATE, schema_version=1,
                             response=None, error_code="E", event_id=E1,
                             end=RunEnd("FAILED", "why", {"res": 1}, "Err", E2)).binding(LEASE),
                "bd1d1fb87542cec448cee5c5c370e7268b75d281fe2dfd46f617b6852d439682"),
    "chain": (fenced.CompleteAndBegin(expected_version=7, step_key="s3", succeeded=True, state=STATE, schema_version=2,
                               response={"r": 1}, event_id=E1, intent=INTENT, journal=JOURNAL).binding(LEASE, DIGEST),
              "883fa2f2247f7a7fb839e19480d4152d74d1cae45a6f21808666cc8d9906a293"),
    "not_executed": (fenced.NotExecuted(expected_version=7, step_key="s3", error_code="E", evidence={"why": "x"},
                                 event_id=E1).binding(LEASE),
                     "731f6064eb27c380d14cb7594304ba0cd55625cbee1655b8e12c7f941b20e37c"),
    "in_doubt": (fenced.InDoubt(step_key="s3", error_code="TIMEOUT", detail="d", event_id=E1).binding(LEASE),
                 "71f46b636f9aa4e575f29a16d9e9180ad3d79edc0bf9725570ed8afaa4e28484"),
    "finish": (fenced.RunFinish(expected_version=7, outcome="SLEEP", reason="r", result={"a": 1}, sleep_ms=500,
                         pause_when_exhausted=True, event_id=E1, wait_signal="go", signals_seen=3).binding(LEASE),
               "ed57f175d99558ff18a71c003dde07ece8bde118079843177da28eb8f2e6d6a0"),
    "finish_children": (fenced.RunFinish(expected_version=7, outcome="SLEEP", sleep_ms=500, event_id=E1,
                                  wait_children=True).binding(LEASE),
                        "70fa74d55b8342459094c22c22f4ad6b9f0e61468f92337d74cee486d3bf43c9"),
    "finish_plain": (fenced.RunFinish(expected_version=7, outcome="COMPLETED", event_id=E1).binding(LEASE),
                     "03adc89f1456e2bedcb445bf046b8a1f0e849da2971553ef59581e98b1a11a77"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_binding_digests_are_those_retries_in_flight_carry(case: str) -> None:
    binding, digest = CASES[case]
    assert binding.digest.hex() == digest


def test_stored_state_text_hashes_like_the_state_it_encodes() -> None:
    """The handler passes the canonical text it parsed; the hash must be that of the value."""
    text = CanonicalJson(canonical_json(STATE))
    with_text = fenced.CheckpointWrite(expected_version=7, state=STATE, schema_version=1, event_id=E1, state_text=text)
    assert with_text.stored is text
    assert with_text.binding(LEASE) == CASES["save_plain"][0]


def test_every_field_of_a_write_moves_its_binding() -> None:
    """A field left out of the binding would let a retry with other content replay the first write."""
    base = fenced.CompleteCall(expected_version=7, step_key="s3", succeeded=True, next_step_key="s4", state=STATE,
                        schema_version=2, response={"r": 1}, remote_resource_id="rid", evidence={"e": 1},
                        event_id=E1, journal=JOURNAL, end=RunEnd("COMPLETED", "", None, "", E2))
    other = {"expected_version": 8, "step_key": "s9", "succeeded": False, "response": {"r": 2}, "state": {"n": 1},
             "schema_version": 3, "event_id": X, "remote_resource_id": "other", "error_code": "E",
             "evidence": {"e": 2}, "journal": Journal.of([(4, "tool_result", "s3", "n1", "t", "{}")]),
             "next_step_key": "s5", "end": RunEnd("FAILED", "", None, "", E2)}
    fields = {f.name for f in dataclasses.fields(fenced.CompleteCall)} - {"state_text"}
    assert fields == set(other)
    for name, value in other.items():
        changed = dataclasses.replace(base, **{name: value})
        assert changed.binding(LEASE) != base.binding(LEASE), name


def test_every_fenced_write_is_a_request_with_a_binding() -> None:
    requests = [getattr(fenced, name) for name in fenced.__all__]
    assert all(dataclasses.is_dataclass(cls) for cls in requests)
    assert all(cls.__dataclass_params__.frozen for cls in requests)
    assert {cls.__name__ for cls in requests if hasattr(cls, "binding")} == set(fenced.__all__) - {"ToolOutcome"}
