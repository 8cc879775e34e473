"""Runtime flow limits (migration 0015): rows of flow_limits that override the scheduler's settings
for every replica, their checks, and the settings they make (docs/flow-control.md).

A row names one setting: (scope, tenant_id, subject, limit_name) = value.

| scope  | tenant_id                  | subject | limit_name                                             |
|--------|----------------------------|---------|--------------------------------------------------------|
| tenant | a tenant, or `*` (default) | —       | weight, max_queued_runs, max_submits_per_s, max_running |
| agent  | —                          | agent   | max_running                                            |
| tool   | — (all tenants) or tenant  | tool    | rate, concurrency                                      |

Values are text as in the config file, within scheduler/bounds.py's ranges: counts 0 .. 10^9
(0 = no limit), a weight 0.001 .. 1000, a rate such as `50/s` (1 .. 10^9 calls per window)
(`0` = no rate limit). A row wins over the config file; clearing it gives the config's value back.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from scheduler.bounds import MAX_COUNT, MAX_WEIGHT, MIN_WEIGHT
from scheduler.config import AgentLimits, SchedulerSettings, TenantLimits, ToolLimit, parse_rate
from shared.errors import InvalidArgument

SCOPES = ("tenant", "agent", "tool")
NAMES = {"tenant": ("weight", "max_queued_runs", "max_submits_per_s", "max_running"),
         "agent": ("max_running",), "tool": ("rate", "concurrency")}
EVERY_TENANT = "*"
log = logging.getLogger(__name__)
_DEFAULT_SETTING = {"max_queued_runs": "max_queued_runs_per_tenant",
                    "max_submits_per_s": "max_submits_per_s_per_tenant", "max_running": "max_running_per_tenant"}


@dataclass(frozen=True)
class LimitKey:
    scope: str
    tenant_id: str  # '' when the limit is not a tenant's
    subject: str  # agent or tool name; '' for tenant limits
    name: str

    @property
    def deployment_wide(self) -> bool:
        """Not one tenant's: an agent's, a tool's over every tenant, or the default of every tenant."""
        return self.tenant_id in ("", EVERY_TENANT)


@dataclass(frozen=True)
class LimitRow:
    key: LimitKey
    value: str
    updated_at: Any = None
    updated_by: str = ""

    @classmethod
    def of(cls, row: Any) -> LimitRow:
        return cls(LimitKey(row["scope"], row["tenant_id"], row["subject"], row["limit_name"]), row["value"],
                   row["updated_at"], row["updated_by"])


def _name_text(field: str, value: str) -> str:
    if not value or len(value) > 200 or any(ch.isspace() or not ch.isprintable() for ch in value):
        raise InvalidArgument(field, "must be 1..200 printable characters without spaces")
    return value


def check_key(scope: str, tenant_id: str, subject: str, name: str) -> LimitKey:
    """The row key a request names, or InvalidArgument naming the field at fault."""
    if scope not in SCOPES:
        raise InvalidArgument("scope", f"must be one of {', '.join(SCOPES)}")
    if name not in NAMES[scope]:
        raise InvalidArgument("name", f"a {scope} limit is one of {', '.join(NAMES[scope])}")
    if scope == "tenant":
        if subject:
            raise InvalidArgument("subject", "a tenant limit names no subject")
        _name_text("tenant_id", tenant_id)
        if tenant_id == EVERY_TENANT and name == "weight":
            raise InvalidArgument("tenant_id", "weight is per tenant ('*' has none: tenants weigh 1 by default)")
    else:
        _name_text("subject", subject)
        if scope == "agent" and tenant_id:
            raise InvalidArgument("tenant_id", "an agent limit counts every tenant's runs: leave tenant_id empty")
        if tenant_id:
            _name_text("tenant_id", tenant_id)
            if tenant_id == EVERY_TENANT:
                raise InvalidArgument("tenant_id", "a tool limit over every tenant leaves tenant_id empty")
    return LimitKey(scope, tenant_id, subject, name)


def check_value(key: LimitKey, value: str) -> str:
    """The value in its stored form, or InvalidArgument("value")."""
    text = value.strip()
    if not text or len(text) > 40:
        raise InvalidArgument("value", "must be 1..40 characters")
    if key.name == "weight":
        try:
            weight = float(text)
        except ValueError:
            raise InvalidArgument("value", f"a weight is a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}") from None
        if not (math.isfinite(weight) and MIN_WEIGHT <= weight <= MAX_WEIGHT):
            raise InvalidArgument("value", f"a weight is a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}")
        return repr(weight)
    if key.name == "rate":
        if text == "0":
            return text
        try:
            parse_rate(text)
        except ValueError as exc:
            raise InvalidArgument("value", f"{exc} (or 0: no rate limit)") from None
        return text.replace(" ", "")
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_COUNT:  # int() refuses "²", isdigit not
        raise InvalidArgument("value", f"{key.name} is a whole number from 0 (no limit) to {MAX_COUNT}")
    return str(int(text))


def overlay(settings: SchedulerSettings, rows: Iterable[LimitRow]) -> SchedulerSettings:
    """The settings with every row applied (a new object; `settings` is left as it is)."""
    rows = [row for row in rows if _applicable(row)]
    if not rows:
        return settings
    update: dict[str, Any] = {}
    tenants = {t: own.model_dump() for t, own in settings.tenant_limits.items()}
    agents = {a: own.model_dump() for a, own in settings.agent_limits.items()}
    tools = {t: own.model_dump() for t, own in settings.tool_limits.items()}
    tenant_tools = {t: {tool: own.model_dump() for tool, own in per.items()}
                    for t, per in settings.tenant_tool_limits.items()}
    for row in rows:
        key, value = row.key, row.value
        if key.scope == "tenant" and key.tenant_id == EVERY_TENANT:
            update[_DEFAULT_SETTING[key.name]] = int(value)
        elif key.scope == "tenant":
            tenants.setdefault(key.tenant_id, {})[key.name] = float(value) if key.name == "weight" else int(value)
        elif key.scope == "agent":
            agents.setdefault(key.subject, {})[key.name] = int(value)
        else:
            target = tools if not key.tenant_id else tenant_tools.setdefault(key.tenant_id, {})
            field = target.setdefault(key.subject, {})
            if key.name == "rate":
                field["rate"] = None if value == "0" else value
            else:
                field["concurrency"] = int(value) or None
    update["tenant_limits"] = {t: TenantLimits(**own) for t, own in tenants.items()}
    update["agent_limits"] = {a: AgentLimits(**own) for a, own in agents.items()}
    update["tool_limits"] = {t: ToolLimit(**own) for t, own in tools.items()
                             if own.get("rate") or own.get("concurrency")}
    update["tenant_tool_limits"] = {
        t: kept for t, per in tenant_tools.items()
        if (kept := {tool: ToolLimit(**own) for tool, own in per.items() if own.get("rate") or own.get("concurrency")})}
    return settings.model_copy(update=update)


def _applicable(row: LimitRow) -> bool:
    """A stored row this version would accept from SetLimit. One written before its bound existed
    (a rate of 99999999999999999999/s) is left out, and logged, rather than failing every call it
    would govern: clear it, or set it again within its range."""
    try:
        check_key(row.key.scope, row.key.tenant_id, row.key.subject, row.key.name)
        check_value(row.key, row.value)
    except InvalidArgument as error:
        log.warning("flow limit %s/%s/%s/%s = %r is out of range and not applied: %s", row.key.scope,
                    row.key.tenant_id, row.key.subject, row.key.name, row.value[:60], error.message)
        return False
    return True


def limits_of_tenant(settings: SchedulerSettings, tenant: str) -> dict[str, str]:
    """The limits that apply to `tenant`'s runs and calls, as `agentrt status` prints them ("" = none)."""
    quota = settings.submit_quota(tenant)
    own = settings.tenant_limits.get(tenant)
    out = {"weight": repr(own.weight if own and own.weight else 1.0),
           "max_queued_runs": str(quota.max_queued_runs), "max_submits_per_s": str(quota.max_submits_per_s),
           "max_running": str(settings.concurrency.of_tenant(tenant))}
    for agent, agent_limit in sorted(settings.agent_limits.items()):
        if agent_limit.max_running:
            out[f"agent {agent} max_running"] = str(agent_limit.max_running)
    for tool, limit in sorted(settings.tool_limits.items()):
        out.update(_tool_text(f"tool {tool}", limit))
    for tool, limit in sorted(settings.tenant_tool_limits.get(tenant, {}).items()):
        out.update(_tool_text(f"tool {tool} (this tenant)", limit))
    return out


def _tool_text(label: str, limit: ToolLimit) -> dict[str, str]:
    out = {}
    if limit.rate:
        out[f"{label} rate"] = limit.rate
    if limit.concurrency:
        out[f"{label} concurrency"] = str(limit.concurrency)
    return out
