"""Fault specs (shared.faults): parsing, and arming by run, occurrence, probability and count."""

import pytest

from executor.faults import Faults, InjectedCrash
from relay.config import RelaySettings
from shared.faults import FaultArm, parse_fault_spec

POINTS = ("after_checkpoint_commit", "before_tool_send")


def test_a_bare_point_fires_once_on_its_first_hit():
    arm = FaultArm(parse_fault_spec("after_checkpoint_commit", POINTS))
    assert [arm.should_fire() for _ in range(3)] == [True, False, False]


def test_options_parse_into_the_spec():
    spec = parse_fault_spec("before_tool_send@run=r1, occurrence=2,action=sigstop,times=0,probability=0.5,seed=3",
                            POINTS)
    assert (spec.point, spec.run_id, spec.occurrence, spec.action, spec.times, spec.probability, spec.seed) == (
        "before_tool_send", "r1", 2, "sigstop", 0, 0.5, 3)


@pytest.mark.parametrize(("text", "message"), [
    ("before_lunch", "unknown fault point 'before_lunch'"),
    ("before_tool_send@when=now", "unknown option(s) when"),
    ("before_tool_send@action=explode", "action must be one of"),
    ("before_tool_send@occurrence=0", "occurrence >= 1"),
    ("before_tool_send@probability=2", "0 <= probability <= 1"),
    ("before_tool_send@occurrence=two", "are integers"),
    ("before_tool_send@run", "expected key=value"),
])
def test_bad_specs_are_refused_with_the_reason(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_fault_spec(text, POINTS)


def test_a_run_filter_counts_only_that_runs_hits():
    arm = FaultArm(parse_fault_spec("before_tool_send@run=r2,occurrence=2", POINTS))
    assert [arm.should_fire(run) for run in ("r1", "r2", "r1", "r2", "r2")] == [False, False, False, True, False]


def test_probability_is_reproducible_with_a_seed_and_unlimited_times():
    spec = parse_fault_spec("before_tool_send@probability=0.3,times=0,seed=11", POINTS)
    arm_a, arm_b = FaultArm(spec), FaultArm(spec)
    draws_a = [arm_a.should_fire() for _ in range(200)]
    draws_b = [arm_b.should_fire() for _ in range(200)]
    assert draws_a == draws_b
    assert 30 < sum(draws_a) < 90


def test_a_caller_counted_occurrence_replaces_the_hit_count():
    arm = FaultArm(parse_fault_spec("after_checkpoint_commit", POINTS, default_occurrence=3))
    assert [arm.should_fire(occurrence=n) for n in (1, 2, 4, 5)] == [False, False, True, False]


def test_the_executor_raises_for_its_run_only():
    faults = Faults(["after_checkpoint_commit@run=r9"])
    faults.hit("after_checkpoint_commit", "r1")
    faults.hit("before_finish", "r9")
    with pytest.raises(InjectedCrash):
        faults.hit("after_checkpoint_commit", "r9")
    faults.hit("after_checkpoint_commit", "r9")  # fired once: disarmed
    assert faults.fired == ["after_checkpoint_commit"] and faults.armed == set()


def test_the_relay_validates_its_spec_at_startup():
    settings = RelaySettings(fault_point="after_broker_ack_before_outbox_mark@probability=0.1,action=sigstop")
    assert settings.fault_point is not None
    with pytest.raises(ValueError, match="action must be one of sigkill, sigstop"):
        RelaySettings(fault_point="mid_batch_send@action=raise")
