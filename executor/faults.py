"""Fault injection points (reference 13.1), for tests and the acceptance suite only.

Each configured point fires once per process: `raise` abandons the run
in-process (its lease is left to lapse, like a crash); `exit` ends the
process at once with status 137, like SIGKILL.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

POINTS = frozenset({
    "after_checkpoint_commit",  # a decision is saved, Tx1 not yet begun
    "after_outbound_intent_commit",  # Tx1 committed, nothing sent
    "after_tool_response_before_tx2_commit",  # the tool answered, Tx2 not yet written
    "before_finish",  # the final checkpoint is saved, FinishRun not yet sent
})


class InjectedCrash(Exception):
    pass


class Faults:
    def __init__(self, points: list[str] | None = None, action: str = "raise") -> None:
        unknown = set(points or ()) - POINTS
        if unknown:
            raise ValueError(f"unknown fault points: {', '.join(sorted(unknown))}")
        self.armed = set(points or ())
        self.action = action
        self.fired: list[str] = []

    def hit(self, point: str) -> None:
        if point not in self.armed:
            return
        self.armed.discard(point)
        self.fired.append(point)
        log.error("fault injected at %s (%s)", point, self.action)
        if self.action == "exit":
            os._exit(137)
        raise InjectedCrash(point)


NO_FAULTS = Faults()
