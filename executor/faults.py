"""Fault injection points (docs/design.md §acceptance-and-evidence), for tests and the acceptance suite only.

Each configured entry is a spec (shared.faults): a point name, optionally armed
for one run, one occurrence or a probability, with its own action. By default
an entry fires once per process with the executor's `fault_action`: `raise`
abandons the run in-process (its lease is left to lapse, like a crash); `exit`
ends the process at once with status 137; `sigkill` SIGKILLs it; `sigstop`
pauses it until someone sends SIGCONT, then it carries on from the point.
"""

from __future__ import annotations

import logging

from shared.faults import ACTIONS, FaultArm, act, parse_fault_spec

log = logging.getLogger(__name__)

POINTS = frozenset({
    "before_claim",  # a claimer is about to ask for work (`raise` ends that claimer: the supervision test)
    "before_registration_refresh",  # the registration refresh task starts (`raise` ends that task)
    "after_claim_commit",  # a lease was granted, nothing done under it yet
    "before_heartbeat",  # a heartbeat is due and not yet sent
    "before_signal_consume_commit",  # signals taken into the state, the checkpoint consuming them not yet sent
    "after_checkpoint_commit",  # a decision is saved, Tx1 not yet begun
    "before_spawn_send",  # the spawn's checkpoint is saved, SpawnChildren not yet sent
    "after_spawn_commit",  # SpawnChildren committed the children, the run not yet parked on their join
    "after_outbound_intent_commit",  # Tx1 committed, nothing sent
    "before_tool_send",  # Tx1 committed and the lease checked: the request goes out next
    "after_tool_response_before_tx2_commit",  # the tool answered, Tx2 not yet written
    "before_finish",  # the final checkpoint is saved, FinishRun not yet sent
})


class InjectedCrash(Exception):
    pass


class Faults:
    def __init__(self, points: list[str] | None = None, action: str = "raise") -> None:
        self.arms = [FaultArm(parse_fault_spec(text, POINTS, ACTIONS)) for text in points or ()]
        self.armed = {arm.spec.point for arm in self.arms}
        self.action = action
        self.fired: list[str] = []

    def hit(self, point: str, run_id: str | None = None) -> None:
        if point not in self.armed:
            return
        for arm in self.arms:
            if arm.spec.point != point or not arm.should_fire(run_id):
                continue
            self.armed = {a.spec.point for a in self.arms if not a.spec.times or a.fired < a.spec.times}
            self.fired.append(point)
            action = arm.spec.action or self.action
            log.error("fault injected at %s (%s)%s", point, action, f" on run {run_id}" if run_id else "")
            if action == "raise":
                raise InjectedCrash(point)
            act(action, point, f"run {run_id}" if run_id else "")
            return


NO_FAULTS = Faults()
