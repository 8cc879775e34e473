"""Fault-injection specs, parsed the same way by the executor and the relay (tests and acceptance only).

A spec names a point and, optionally, how it is armed:

    point[@key=value[,key=value...]]

    action       what happens at the point: sigkill (the process SIGKILLs itself),
                 sigstop (it SIGSTOPs itself and carries on after SIGCONT), exit
                 (os._exit(137)), raise (the executor abandons the run in-process)
    run          fire only while working on this run id
    occurrence   fire from the Nth matching hit on (default 1)
    probability  from then on, fire on each matching hit with this probability (default 1)
    times        fire at most this many times (default 1; 0 = no limit)
    seed         seed of the probability draws (reproducible chaos)

Examples: `after_checkpoint_commit`, `before_tool_send@run=0190…,occurrence=2,action=sigstop`,
`after_broker_ack_before_outbox_mark@probability=0.05,seed=7`. Unarmed points cost one set lookup.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

ACTIONS = ("sigkill", "sigstop", "exit", "raise")


@dataclass(frozen=True)
class FaultSpec:
    point: str
    action: str | None = None  # None: the component's default action
    run_id: str | None = None
    occurrence: int = 1
    probability: float = 1.0
    times: int = 1
    seed: int | None = None


def parse_fault_spec(text: str, known_points: Iterable[str], actions: Iterable[str] = ACTIONS,
                     default_occurrence: int = 1) -> FaultSpec:
    """Parses one spec; a ValueError names the unknown point or the bad option."""
    point, _, options = text.strip().partition("@")
    known = tuple(known_points)
    if point not in known:
        raise ValueError(f"unknown fault point {point!r}; known: {', '.join(sorted(known))}")
    values: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in options.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise ValueError(f"fault spec {text!r}: expected key=value, got {item!r}")
        values[key.strip()] = value.strip()
    unknown = set(values) - {"action", "run", "occurrence", "probability", "times", "seed"}
    if unknown:
        raise ValueError(f"fault spec {text!r}: unknown option(s) {', '.join(sorted(unknown))}")
    action = values.get("action")
    allowed = tuple(actions)
    if action is not None and action not in allowed:
        raise ValueError(f"fault spec {text!r}: action must be one of {', '.join(allowed)}")
    try:
        spec = FaultSpec(point=point, action=action, run_id=values.get("run"),
                         occurrence=int(values.get("occurrence", default_occurrence)),
                         probability=float(values.get("probability", 1.0)), times=int(values.get("times", 1)),
                         seed=int(values["seed"]) if "seed" in values else None)
    except ValueError:
        raise ValueError(f"fault spec {text!r}: occurrence, times and seed are integers, "
                         "probability a number") from None
    if spec.occurrence < 1 or spec.times < 0 or not 0.0 <= spec.probability <= 1.0:
        raise ValueError(f"fault spec {text!r}: occurrence >= 1, times >= 0, 0 <= probability <= 1")
    return spec


@dataclass
class FaultArm:
    """One armed spec and its counters (hits that matched, times it fired)."""

    spec: FaultSpec
    hits: int = 0
    fired: int = 0
    _random: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.spec.seed)

    def should_fire(self, run_id: str | None = None, occurrence: int | None = None) -> bool:
        """Counts a hit; `occurrence` replaces the hit count where the caller counts itself (relay rounds)."""
        spec = self.spec
        if spec.run_id is not None and run_id != spec.run_id:
            return False
        if spec.times and self.fired >= spec.times:
            return False
        self.hits += 1
        if (occurrence if occurrence is not None else self.hits) < spec.occurrence:
            return False
        if spec.probability < 1.0 and self._random.random() >= spec.probability:
            return False
        self.fired += 1
        return True


def act(action: str, point: str, what: str = "") -> None:
    """Carries out a process-level action (sigkill, sigstop, exit); `raise` is left to the caller."""
    suffix = f" ({what})" if what else ""
    if action == "sigstop":
        log.error("fault point %s%s: SIGSTOP self (pid %d)", point, suffix, os.getpid())
        _flush_logs()
        os.kill(os.getpid(), signal.SIGSTOP)
        log.error("fault point %s%s: resumed after SIGCONT", point, suffix)
    elif action == "sigkill":
        log.error("fault point %s%s: SIGKILL self (pid %d)", point, suffix, os.getpid())
        _flush_logs()
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "exit":
        log.error("fault point %s%s: exit 137 (pid %d)", point, suffix, os.getpid())
        _flush_logs()
        os._exit(137)


def _flush_logs() -> None:
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # a broken handler must not stop the fault
            handler.flush()
