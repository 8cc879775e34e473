"""Signals at the executor (docs/design.md §signals): what a claim delivers, taken into the state.

A claim carries the run's pending signals. They are recorded in the state as
journal entries (`answer` entries: a signal wait's answer under the wait's step
key, every other signal under "signal/<seq>") and consumed by the very
SaveCheckpoint that writes those entries (RunLease.consume): committed
together or not at all, so a signal is consumed exactly once and a crash in
between leaves it pending for the next claim. Pure functions; no I/O here.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from executor.checkpoint import State
from executor.journal import answer_record, journaled
from shared.gen.agentrt.v1 import common_pb2 as pb


def signal_item(signal: pb.Signal) -> dict[str, Any]:
    """What a decider sees of a signal."""
    return {"name": signal.name, "payload": json.loads(signal.payload_json) if signal.payload_json else None,
            "seq": signal.seq}


def signal_key(signal: pb.Signal) -> str:
    return f"signal/{signal.seq}"


def take_in(state: State, signals: Sequence[pb.Signal]) -> State:
    """`state` with each signal recorded under "signal/<seq>" (journaled; consumed with that checkpoint)."""
    if not signals:
        return state
    items = {signal_key(s): signal_item(s) for s in signals}
    makers = [lambda seq, key=key, item=item: answer_record(seq, key, item) for key, item in items.items()]
    return journaled(state, {"inputs": {**state.inputs, **items}}, *makers)


def end_wait(state: State, signals: Sequence[pb.Signal], now: dt.datetime,
             started: dt.datetime) -> tuple[State, list[pb.Signal]] | None:
    """A signal wait seen at claim: the state once it ends, with the delivered signals other than its
    answer (taken in as well: every delivered signal is consumed with it); None while it goes on.

    It ends when a signal of its name was delivered (the oldest one answers it;
    every other delivered signal is taken in too), or when its timeout has
    passed since `started` (the waiting checkpoint's time, database clock).
    """
    waiting = state.waiting
    assert waiting is not None and waiting.kind == "signal"
    match = next((s for s in signals if s.name == waiting.signal), None)
    timed_out = match is None and now >= started + dt.timedelta(milliseconds=waiting.sleep_ms or 0)
    if match is None and not timed_out:
        return None
    others = [s for s in signals if s is not match]
    return take_in(answered(state, match), others), others


def unanswered(state: State, name: str) -> pb.Signal | None:
    """The oldest signal of `name` taken into the state (shown to a decision) that no signal wait has
    answered yet. Several signals may come in one claim (a run that was not claimed for a while): the
    next waits are answered by them in turn, from the state alone, so a takeover after the checkpoint
    that consumed them answers the same way."""
    used = {item.get("seq") for key, item in state.inputs.items()
            if not key.startswith("signal/") and isinstance(item, dict) and "timed_out" in item}
    taken = sorted((int(key.partition("/")[2]), item) for key, item in state.inputs.items()
                   if key.startswith("signal/") and isinstance(item, dict) and item.get("name") == name)
    for seq, item in taken:
        if seq not in used:
            payload = item.get("payload")
            return pb.Signal(seq=seq, name=name, payload_json="" if payload is None else json.dumps(payload))
    return None


def answered(state: State, signal: pb.Signal | None) -> State:
    """The signal wait in `state` ended: by `signal`, or (None) by its timeout. Recorded as its answer."""
    waiting = state.waiting
    assert waiting is not None and waiting.kind == "signal"
    answer: dict[str, Any] = (
        {**signal_item(signal), "timed_out": False} if signal is not None
        else {"name": waiting.signal, "payload": None, "seq": 0, "timed_out": True})
    return journaled(state, {"waiting": None, "inputs": {**state.inputs, waiting.step_key: answer}},
                     lambda seq: answer_record(seq, waiting.step_key, answer))
