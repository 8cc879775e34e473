"""Concurrency key templates: checked at registration, rendered from a run's input at submit."""

import pytest

from executor.agents import Concurrency
from scheduler.admission import check_key_template, render_key
from scheduler.config import SchedulerSettings, ToolLimit, parse_rate
from shared.errors import InvalidArgument


def test_a_key_renders_each_placeholder_from_the_input():
    payload = {"customer_id": "c-7", "order": {"region": "eu", "n": 3}}
    assert render_key("${input.customer_id}", payload) == "c-7"
    assert render_key("${input.order.region}/${input.order.n}", payload) == "eu/3"
    assert render_key("global", payload) == "global"
    assert render_key("${input.order}", payload) == '{"n":3,"region":"eu"}'  # canonical JSON


def test_a_missing_field_names_the_input():
    with pytest.raises(InvalidArgument) as refused:
        render_key("${input.customer_id}", {"order": 1})
    assert refused.value.field == "input_json" and "customer_id" in refused.value.message


@pytest.mark.parametrize("template", ["${customer_id}", "${input.}", "${input.a b}", "x ${input.a", "${}"])
def test_bad_templates_are_refused_at_registration_and_in_the_definition(template):
    with pytest.raises(InvalidArgument):
        check_key_template("agents[0].concurrency_key", template)
    with pytest.raises(ValueError):
        Concurrency(key=template, max=1)


def test_good_templates_pass_both_checks():
    for template in ("${input.customer_id}", "tenant-wide", "${input.a.b}-${input.c}"):
        check_key_template("agents[0].concurrency_key", template)
        assert Concurrency(key=template, max=2).max == 2


def test_tool_rates_are_calls_per_window():
    assert parse_rate("100/min") == (100, 60_000)
    assert parse_rate("5/s") == (5, 1_000)
    assert parse_rate("1000 / h") == (1000, 3_600_000)
    assert ToolLimit(concurrency=5).rate_per_window == (0, 0)
    for bad in ("100", "0/s", "x/min", "5/day", "-1/s"):
        with pytest.raises(ValueError):
            parse_rate(bad)
    with pytest.raises(ValueError, match="rate"):
        SchedulerSettings(tool_limits={"t": {"rate": "fast"}})
    settings = SchedulerSettings(tool_limits={"t": {"rate": "1/s"}},
                                 tenant_tool_limits={"acme": {"u": {"concurrency": 2}}})
    assert settings.tool_limits_of("t") == (ToolLimit(rate="1/s"), False)
    assert settings.tool_limits_of("u") == (None, True)
    assert settings.tool_limits_of("v") == (None, False)


def test_a_tenants_fair_share_step_is_one_over_its_weight():
    settings = SchedulerSettings(tenant_limits={"gold": {"weight": 4}, "capped": {"max_running": 3}})
    assert settings.fair_step("gold") == 0.25
    assert settings.fair_step("capped") == 1.0  # no weight: 1
    assert settings.fair_step("anyone") == 1.0
    assert SchedulerSettings(fair_share=False, tenant_limits={"gold": {"weight": 4}}).fair_step("gold") == 0.0


@pytest.mark.parametrize("weight", [0, -1, 1_001])
def test_a_weight_must_be_positive_and_bounded(weight):
    with pytest.raises(ValueError, match="weight"):
        SchedulerSettings(tenant_limits={"t": {"weight": weight}})
