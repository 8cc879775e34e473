"""Runtime flow limits over the settings (scheduler/flow_limits.py): a row wins field by field,
"0" lifts a limit the config file sets, and '*' is every tenant's default."""

from __future__ import annotations

import pytest

from scheduler.config import SchedulerSettings
from scheduler.flow_limits import LimitKey, LimitRow, check_key, check_value, limits_of_tenant, overlay
from shared.errors import InvalidArgument


def row(scope: str, tenant: str, subject: str, name: str, value: str) -> LimitRow:
    return LimitRow(LimitKey(scope, tenant, subject, name), value)


def base() -> SchedulerSettings:
    return SchedulerSettings(tool_limits={"chat": {"rate": "100/min", "concurrency": 5}},
                             tenant_limits={"acme": {"max_running": 3}}, max_queued_runs_per_tenant=7)


def test_rows_override_field_by_field_and_leave_the_settings_alone():
    settings = base()
    flow = overlay(settings, [row("tool", "", "chat", "rate", "50/s"), row("tenant", "acme", "", "weight", "2.0"),
                              row("tenant", "*", "", "max_running", "9"),
                              row("agent", "", "refunds", "max_running", "4"),
                              row("tool", "acme", "chat", "concurrency", "1")])
    assert flow.tool_limits["chat"].rate == "50/s" and flow.tool_limits["chat"].concurrency == 5
    assert flow.tenant_tool_limits["acme"]["chat"].concurrency == 1
    assert flow.concurrency.of_tenant("acme") == 3 and flow.concurrency.of_tenant("other") == 9
    assert flow.concurrency.of_agent("refunds") == 4
    assert flow.fair_step("acme") == 0.5 and flow.fair_step("other") == 1.0
    assert flow.submit_quota("other").max_queued_runs == 7
    assert settings.tool_limits["chat"].rate == "100/min" and settings.max_running_per_tenant == 0
    shown = limits_of_tenant(flow, "acme")
    assert shown["weight"] == "2.0" and shown["tool chat rate"] == "50/s" and shown["agent refunds max_running"] == "4"


def test_zero_lifts_a_limit_of_the_config_file():
    flow = overlay(base(), [row("tool", "", "chat", "rate", "0"), row("tool", "", "chat", "concurrency", "0")])
    assert "chat" not in flow.tool_limits
    assert flow.tool_limits_of("chat") == (None, False)


@pytest.mark.parametrize(("key", "value", "stored"), [
    (("tenant", "acme", "", "weight"), " 2 ", "2.0"), (("tool", "", "chat", "rate"), "100 / min", "100/min"),
    (("tenant", "*", "", "max_queued_runs"), "0010", "10"),
])
def test_values_are_stored_in_one_form(key, value, stored):
    assert check_value(check_key(*key), value) == stored


@pytest.mark.parametrize(("key", "field"), [
    (("agents", "", "a", "max_running"), "scope"), (("agent", "", "a", "weight"), "name"),
    (("tenant", "", "", "max_running"), "tenant_id"), (("tool", "*", "chat", "rate"), "tenant_id"),
])
def test_a_bad_key_names_its_field(key, field):
    with pytest.raises(InvalidArgument) as refused:
        check_key(*key)
    assert refused.value.field == field
