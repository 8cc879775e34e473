"""Who may do what: the one table of verbs per role, and the verb of every RPC
(docs/design.md §security). docs/keys-and-tls.md prints this table (`python -m scheduler.security.rbac`).

Roles are cumulative: each grants its own verbs and every verb of the roles
before it. A role without a call's verb is refused PERMISSION_DENIED
(ROLE_FORBIDS) before the handler reads or writes anything.
"""

from __future__ import annotations

from types import MappingProxyType

ROLE_ORDER = ("viewer", "submitter", "operator", "admin")

# verb -> what it allows
VERBS = MappingProxyType({
    "runs.read": "get and list runs, read their history",
    "stats.read": "the tenant's stats (agentrt status)",
    "agents.read": "list the agents live executors serve",
    "limits.read": "list the runtime flow limits that apply to the tenant",
    "runs.submit": "submit runs, and retry a FAILED or CANCELLED run as a new one",
    "runs.cancel": "cancel the tenant's runs",
    "runs.signal": "send signals to the tenant's runs",
    "schedules.manage": "create, update, pause and delete the tenant's schedules",
    "runs.resume": "approve, reject or answer a run paused for a human",
    "tools.resolve": "resolve IN_DOUBT tool executions with evidence",
    "runs.export": "export a run's whole history (GetRunHistory with export; audited)",
    "runs.reveal": "see the values an agent marks sensitive (GetRun, GetRunHistory with reveal; audited)",
    "keys.manage": "create, list and revoke API keys",
    "audit.read": "read the audit trail",
    "tenants.several": "hold a credential for several tenants and choose one with x-tenant-id",
    "limits.manage": "set and clear runtime flow limits (needs a credential for every tenant, '*'; audited)",
})

_OWN = {
    "viewer": ("runs.read", "stats.read", "agents.read", "limits.read"),
    "submitter": ("runs.submit", "runs.cancel", "runs.signal", "schedules.manage"),
    "operator": ("runs.resume", "tools.resolve", "runs.export", "runs.reveal"),
    "admin": ("keys.manage", "audit.read", "tenants.several", "limits.manage"),
}


def _cumulative() -> dict[str, frozenset[str]]:
    table: dict[str, frozenset[str]] = {}
    granted: set[str] = set()
    for role in ROLE_ORDER:
        granted.update(_OWN[role])
        table[role] = frozenset(granted)
    return table


ROLES = MappingProxyType(_cumulative())

# RPC method name -> the verb it needs (RunService; WorkService is for executors only).
RPC_VERBS = MappingProxyType({
    "SubmitRun": "runs.submit",
    "GetRun": "runs.read",
    "ListRuns": "runs.read",
    "GetRunHistory": "runs.read",
    "GetRunTree": "runs.read",
    "CancelRun": "runs.cancel",
    "RetryRun": "runs.submit",
    "SignalRun": "runs.signal",
    "CreateSchedule": "schedules.manage",
    "UpdateSchedule": "schedules.manage",
    "PauseSchedule": "schedules.manage",
    "DeleteSchedule": "schedules.manage",
    "ListSchedules": "runs.read",
    "ResumeRun": "runs.resume",
    "ResolveToolExecution": "tools.resolve",
    "GetStats": "stats.read",
    "ListAgents": "agents.read",
    "ListAuditEvents": "audit.read",
    "CreateApiKey": "keys.manage",
    "ListApiKeys": "keys.manage",
    "RevokeApiKey": "keys.manage",
    "SetLimit": "limits.manage",
    "ClearLimit": "limits.manage",
    "ListLimits": "limits.read",
})


AUTH_MODES = frozenset({"none", "api_key", "jwt"})


def parse_auth_mode(value: str) -> frozenset[str]:
    modes = frozenset(part.strip() for part in value.split(",") if part.strip())
    unknown = modes - AUTH_MODES
    if not modes or unknown:
        raise ValueError(f"auth_mode: {value!r}: use none, api_key, jwt or api_key,jwt")
    if "none" in modes and len(modes) > 1:
        raise ValueError("auth_mode: none cannot be combined with another mode")
    return modes


def verbs_of(roles: tuple[str, ...] | list[str]) -> frozenset[str]:
    """Every verb granted by any of `roles`; unknown role names grant nothing."""
    granted: set[str] = set()
    for role in roles:
        granted |= ROLES.get(role, frozenset())
    return frozenset(granted)


def markdown_table() -> str:
    """The role table of docs/keys-and-tls.md: one row per verb, a column per role."""
    lines = ["| verb | allows | " + " | ".join(ROLE_ORDER) + " |",
             "|---|---|" + "---|" * len(ROLE_ORDER)]
    for verb, text in VERBS.items():
        marks = " | ".join("✓" if verb in ROLES[role] else "" for role in ROLE_ORDER)
        lines.append(f"| `{verb}` | {text} | {marks} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
