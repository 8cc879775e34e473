"""Concurrency key templates: checked at registration, rendered from a run's input at submit."""

import pytest

from executor.agents import Concurrency
from scheduler.registry import check_key_template, render_key
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
