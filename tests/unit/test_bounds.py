"""The one table of numeric bounds (scheduler/bounds.py, issue 24 defect 3): every numeric field of
every request message has a bound that its storage can hold, found by walking the proto
descriptors (a new field without one fails here); every numeric setting is bounded on both sides
and refuses the extremes; the numbers in runtime flow limits are bounded the same way."""

from __future__ import annotations

import math
import types
import typing
from typing import Any

import annotated_types
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor
from proto_paths import TYPE_RANGE, F, every_numeric_field, extremes, path_to, request_types, set_path
from pydantic import BaseModel, ValidationError

from scheduler import bounds
from scheduler.bounds import INT4_MAX, INT8_MAX, MAX_COUNT, RPC_FIELDS, Bound, check_request, numeric_fields
from scheduler.config import AgentLimits, SchedulerSettings, TenantLimits, ToolLimit, parse_rate
from scheduler.flow_limits import LimitKey, check_value
from shared.errors import InvalidArgument


def test_every_numeric_field_of_every_request_has_a_bound_and_none_is_stale():
    fields = every_numeric_field()
    assert len(fields) > 30  # the walk found them (budget, lease, journal, schedule spec, timestamps, ...)
    missing = sorted(set(fields) - set(RPC_FIELDS))
    assert not missing, f"numeric request fields without a bound in scheduler/bounds.py: {missing}"
    stale = sorted(set(RPC_FIELDS) - set(fields))
    assert not stale, f"bounds for fields no request holds: {stale}"


def test_every_bound_fits_its_wire_type_and_its_storage():
    for name, field in every_numeric_field().items():
        bound = RPC_FIELDS[name]
        low, high = TYPE_RANGE[field.type]
        assert low <= bound.low <= bound.high <= high, name
        assert math.isfinite(bound.low) and math.isfinite(bound.high), name
        if field.type not in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
            assert bound.high <= INT8_MAX, name  # PostgreSQL bigint at most
            if field.type in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
                assert bound.high <= INT4_MAX, name


def valid_request(message: Descriptor) -> Any:
    """The request with every numeric field it can reach set inside its bound (its lowest value)."""
    request = message_factory.GetMessageClass(message)()
    for full_name in sorted(numeric_fields(message)):
        for path, field in path_to(message, full_name):
            set_path(request, path, field, RPC_FIELDS[full_name].low)
    return request


@pytest.mark.parametrize("message", request_types(), ids=lambda m: m.name)
def test_the_edge_check_refuses_every_extreme_outside_the_bound_and_names_the_field(message):
    check_request(valid_request(message))
    for full_name in sorted(numeric_fields(message)):
        bound = RPC_FIELDS[full_name]
        for path, field in path_to(message, full_name):
            for value in extremes(field):
                request = valid_request(message)
                expected = set_path(request, path, field, value)
                if bound.allows(value):
                    check_request(request)
                    continue
                with pytest.raises(InvalidArgument) as refused:
                    check_request(request)
                assert refused.value.field == expected, (path, value)
                words = "valid timestamp" if field.containing_type.full_name == bounds.TIMESTAMP else "between"
                assert words in refused.value.message, refused.value.message


def test_a_bound_with_an_unset_zero_says_what_zero_means():
    bound = RPC_FIELDS["agentrt.v1.ScheduleSpec.interval_ms"]
    assert bound.allows(0) and bound.allows(1000) and not bound.allows(999)
    assert "or 0 (a cron schedule)" in bound.describe()
    assert not Bound(0, 1.0).allows(math.nan) and not Bound(0, 1.0).allows(math.inf)


# ---------------------------------------------------------------------- settings


def _numeric(annotation: Any) -> bool:
    options = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    return any(option in (int, float) for option in options)


def numeric_settings() -> list[tuple[type[BaseModel], str]]:
    models: list[type[BaseModel]] = [SchedulerSettings, TenantLimits, ToolLimit, AgentLimits]
    return [(model, name) for model in models for name, info in model.model_fields.items()
            if _numeric(info.annotation)]


def limits_of(model: type[BaseModel], name: str) -> tuple[float | None, float | None, bool]:
    low = high = None
    finite = False
    for item in model.model_fields[name].metadata:
        if isinstance(item, annotated_types.Ge | annotated_types.Gt):
            low = item.ge if isinstance(item, annotated_types.Ge) else item.gt
        elif isinstance(item, annotated_types.Le | annotated_types.Lt):
            high = item.le if isinstance(item, annotated_types.Le) else item.lt
        elif getattr(item, "allow_inf_nan", True) is False:
            finite = True
    return low, high, finite


def test_every_numeric_setting_is_bounded_on_both_sides_within_storage():
    found = numeric_settings()
    assert len(found) > 40
    unbounded = [f"{m.__name__}.{n}" for m, n in found if None in limits_of(m, n)[:2]]
    assert not unbounded, f"settings without a lower and an upper bound: {unbounded}"
    for model, name in found:
        _, high, finite = limits_of(model, name)
        assert high is not None and high <= INT8_MAX, name
        annotation = model.model_fields[name].annotation
        if float in (*typing.get_args(annotation), annotation):
            assert finite, f"{model.__name__}.{name}: a float setting must refuse NaN and infinity"


def build(model: type[BaseModel], name: str, value: Any) -> Any:
    if model is SchedulerSettings:
        return SchedulerSettings(**{name: value})
    return model(**{name: value})


@pytest.mark.parametrize(("model", "name"), numeric_settings(), ids=lambda x: getattr(x, "__name__", x))
def test_a_setting_refuses_values_past_its_bounds_and_non_finite_ones(model, name):
    low, high, _ = limits_of(model, name)
    assert low is not None and high is not None
    refused = [high + 1, 2**63, 2**64, -2**63 - 1, 1e300, -1e300, math.nan, math.inf, -math.inf]
    refused.append(low - 1 if low >= 1 else -1)
    for value in refused:
        with pytest.raises(ValidationError):
            build(model, name, value)


def test_every_setting_comes_with_its_default_inside_its_bounds():
    settings = SchedulerSettings()
    for model, name in numeric_settings():
        if model is not SchedulerSettings:
            continue
        value = getattr(settings, name)
        low, high, _ = limits_of(model, name)
        assert value is None or low <= value <= high, name


# ---------------------------------------------------------------------- numbers in runtime flow limits

TOOL_RATE = LimitKey("tool", "", "charge", "rate")
COUNT = LimitKey("tenant", "acme", "", "max_queued_runs")
WEIGHT = LimitKey("tenant", "acme", "", "weight")


@pytest.mark.parametrize("text", ["99999999999999999999/s", f"{MAX_COUNT + 1}/s", "-1/s", "0/min", "1.5/s",
                                  "²/s", "1e3/s", "nan/s", "5/fortnight", f"{2**63}/h"])
def test_a_rate_outside_its_range_is_refused_by_setlimit_and_by_the_settings(text):
    with pytest.raises(InvalidArgument) as refused:
        check_value(TOOL_RATE, text)
    assert refused.value.field == "value"
    with pytest.raises(ValidationError):
        ToolLimit(rate=text)


def test_the_largest_rate_is_kept():
    assert check_value(TOOL_RATE, f"{MAX_COUNT}/s") == f"{MAX_COUNT}/s"
    assert parse_rate(f"{MAX_COUNT}/h") == (MAX_COUNT, 3_600_000)


@pytest.mark.parametrize(("key", "text"), [
    (COUNT, str(2**31)), (COUNT, str(2**63)), (COUNT, "-1"), (COUNT, "²"), (COUNT, "١٢"), (COUNT, "1e9"),
    (WEIGHT, "nan"), (WEIGHT, "inf"), (WEIGHT, "1e300"), (WEIGHT, "1e-320"), (WEIGHT, "0"), (WEIGHT, "-0"),
    (WEIGHT, "1000.5"),
])
def test_counts_and_weights_outside_their_ranges_are_refused(key, text):
    with pytest.raises(InvalidArgument) as refused:
        check_value(key, text)
    assert refused.value.field == "value"
    assert str(MAX_COUNT) in refused.value.message or "1000" in refused.value.message
