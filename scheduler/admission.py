"""Admission by the agent registry (docs/design.md §agents): is a submitted agent served, and does its input fit?

SubmitRun for an agent or version that no live executor serves is refused
with AGENT_NOT_REGISTERED (FAILED_PRECONDITION) unless the caller queues it
anyway (`allow_unregistered`, or the scheduler's require_registered_agents
off); an input that does not match the served version's input schema is
INVALID_ARGUMENT naming the JSON path. A submit without a version is checked
against the version executors would pick: the last in natural order.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import jsonschema

from shared.canonical import canonical_json
from shared.errors import AgentNotRegistered, InvalidArgument

_VALIDATORS: dict[str, Any] = {}  # by canonical schema text: schemas are few and change rarely
_MAX_VALIDATORS = 1024


class LiveVersion(NamedTuple):
    """What the registry says about one served agent version (its latest registration)."""

    input_schema: dict[str, Any] | None
    default_priority: int | None = None  # None: the scheduler's default_priority
    concurrency_key: str | None = None  # the key template, e.g. "${input.customer_id}"
    concurrency_max: int | None = None
    # The marked paths (shared/sensitive.py), and under "declared" the schemas of the declared signals and
    # ResumeRun input ({"signals": {name: schema}, "resume": schema}); None: nothing marked or declared.
    sensitive: dict[str, Any] | None = None

    def signal_schema(self, name: str) -> dict[str, Any] | None:
        """The JSON Schema of signal `name` (None: undeclared, any JSON payload is taken)."""
        signals = ((self.sensitive or {}).get("declared") or {}).get("signals") or {}
        schema = signals.get(name)
        return schema if isinstance(schema, dict) else None


_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
_PATH = re.compile(r"input(\.[A-Za-z0-9_-]+)+")


def check_key_template(field: str, template: str) -> None:
    """INVALID_ARGUMENT unless `template` is text whose placeholders are all ${input.a.b}."""
    paths = _PLACEHOLDER.findall(template)
    if any(not _PATH.fullmatch(p) for p in paths) or "${" in _PLACEHOLDER.sub("", template):
        raise InvalidArgument(field, "must hold ${input.<field>[.<field>...]} placeholders, e.g. ${input.customer_id}")


def render_key(template: str, input_value: Any) -> str:
    """The concurrency key of a run: each ${input.a.b} replaced by that field of the input (a string as it
    is, any other JSON value as canonical JSON). A missing field is INVALID_ARGUMENT on input_json."""

    def value_of(match: re.Match[str]) -> str:
        node = input_value
        for part in match.group(1).split(".")[1:]:
            if not isinstance(node, dict) or part not in node:
                raise InvalidArgument("input_json", f"has no {match.group(1).removeprefix('input')[1:]}, which "
                                                    f"the agent's concurrency key {template} needs")
            node = node[part]
        return node if isinstance(node, str) else canonical_json(node)

    key = _PLACEHOLDER.sub(value_of, template)
    if len(key) > 500:
        raise InvalidArgument("input_json", f"renders a concurrency key of {len(key)} characters (at most 500)")
    return key


def natural_key(text: str) -> list[Any]:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text)]


def json_path(path: Any) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def check_input(schema: dict[str, Any], value: Any, agent: str, version: str, *, field: str = "input_json",
                what: str = "input schema") -> None:
    """INVALID_ARGUMENT naming the JSON path of the first mismatch (the shallowest, then in path order)."""
    key = canonical_json(schema)
    validator = _VALIDATORS.get(key)
    if validator is None:
        if len(_VALIDATORS) >= _MAX_VALIDATORS:
            _VALIDATORS.clear()
        validator = _VALIDATORS[key] = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: (len(e.path), [str(p) for p in e.path]))
    if errors:
        first = errors[0]
        raise InvalidArgument(field, f"{json_path(first.path)}: {first.message} (the {what} of {agent} version "
                                     f"{version})")


def serving(versions: dict[str, LiveVersion], agent_version: str) -> LiveVersion | None:
    """The registration a run of `agent_version` ("" = the latest in natural order) is served by."""
    if agent_version:
        return versions.get(agent_version)
    return versions[max(versions, key=natural_key)] if versions else None


def check_signal(versions: dict[str, LiveVersion], agent: str, agent_version: str, name: str, payload: Any) -> None:
    """INVALID_ARGUMENT (payload_json, naming the path) unless a signal the run's agent declares fits its
    schema; an undeclared signal (or an agent no live executor serves) is taken with any JSON payload."""
    live = serving(versions, agent_version)
    schema = live.signal_schema(name) if live is not None else None
    if schema is not None:
        check_input(schema, payload, agent, agent_version or max(versions, key=natural_key), field="payload_json",
                    what=f"schema of signal {name!r}")


def admit(versions: dict[str, LiveVersion], agent_name: str, agent_version: str, input_value: Any,
          *, allow_unregistered: bool) -> LiveVersion | None:
    """Raises unless a submit of `agent_name` (`agent_version`, or the latest) may create a run.

    Returns the registration of the version the run will be served by (None: not served, admitted anyway)."""
    if agent_version and agent_version not in versions:
        if allow_unregistered:
            return None
        serving = ", ".join(sorted(versions, key=natural_key)) or "none"
        raise AgentNotRegistered(
            f"no live executor serves version {agent_version!r} of agent {agent_name!r} (versions served: "
            f"{serving}); deploy it, {AgentNotRegistered.API_HINT}",
            agent_name=agent_name, agent_version=agent_version)
    if not versions:
        if allow_unregistered:
            return None
        raise AgentNotRegistered(f"no live executor serves agent {agent_name!r}; deploy it, "
                                 f"{AgentNotRegistered.API_HINT}", agent_name=agent_name)
    chosen = agent_version or max(versions, key=natural_key)
    live = versions[chosen]
    if live.input_schema is not None:
        check_input(live.input_schema, input_value, agent_name, chosen)
    return live
