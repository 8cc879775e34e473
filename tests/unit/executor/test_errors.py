from executor.errors import ACTIONS, ERROR_CODES, Action, ErrorClass, action_for, classify


def test_every_class_has_exactly_one_action():
    assert set(ACTIONS) == set(ErrorClass)
    assert ACTIONS[ErrorClass.UNKNOWN_OUTCOME] is Action.FREEZE_IN_DOUBT
    assert ACTIONS[ErrorClass.RETRYABLE_TRANSIENT] is Action.RETRY_WITH_BACKOFF
    assert ACTIONS[ErrorClass.DEFINITE_NO_EFFECT] is Action.RECORD_FAILED
    assert ACTIONS[ErrorClass.PERMANENT] is Action.END_RUN


def test_reference_examples_land_in_their_class():
    assert classify("invalid_arguments") is ErrorClass.DEFINITE_NO_EFFECT
    assert classify("refused") is ErrorClass.DEFINITE_NO_EFFECT
    assert classify("rate_limited") is ErrorClass.RETRYABLE_TRANSIENT
    for code in ("timeout", "connection_reset", "server_error", "takeover_no_lookup"):
        assert classify(code) is ErrorClass.UNKNOWN_OUTCOME
    for code in ("budget_exhausted", "policy_refused", "approval_rejected"):
        assert classify(code) is ErrorClass.PERMANENT


def test_an_unlisted_code_is_treated_as_unknown_outcome():
    assert "never-heard-of-it" not in ERROR_CODES
    assert action_for("never-heard-of-it") is Action.FREEZE_IN_DOUBT
