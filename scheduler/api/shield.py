"""Where sensitive values are sealed and opened at the scheduler's edge (scheduler/security/sealing.py).

Inbound, the one sealing filter (`Shield.seal_request`, run by scheduler/api/rpc.py for every call and
every WriteBatch item before its handler): for a request about a run that holds a data key, the
values its agent marks are sealed (a tool request's marked input paths, a tool answer's marked output
paths, a declared signal's and ResumeRun's marked paths), every string of every *_json field that
holds a known marked value is sealed, and every free-text field (reasons, details, error codes,
notes, comments) that holds one becomes "[redacted]". Only identifiers (run, step, tool, event ids
and names, IDENTIFIER_FIELDS) are left as they are: the protocol matches on them. So no handler
and no store write sees a marked value in the clear, whatever path it takes (an end folded into a
tool completion, a batch item, an operator's note). SubmitRun seals its input under a new run key
(`seal_submit`), and a spawned child's input under the child's own (`carried`).

Outbound: the executor's lease and ledger answers are opened (tools get plain values); RunService
answers are redacted, or opened for a caller with runs.reveal who asked. A sealed value that does
not open is SealedValueInvalid naming its field (logged and counted), never INTERNAL.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from scheduler.security.sealing import (
    REDACTED,
    SEALED,
    Path_,
    RunKey,
    Sensitivity,
    Unopened,
    has_sealed,
    plain_values,
    redact_labels,
    redact_text,
    transform,
)
from scheduler.store import Store
from scheduler.store.types import SealedSubmit
from shared.canonical import canonical_json, uuid7

M = TypeVar("M", bound=Message)

# String fields that identify rather than say something: the protocol looks them up or compares them
# (a run, step, tool, event, signal, agent, page), so the filter never rewrites them. An agent must not
# put a marked value in one (docs/encryption.md). Every other string field is free text or JSON.
IDENTIFIER_FIELDS = frozenset({
    "run_id", "worker_id", "step_key", "next_step_key", "step_keys", "tool_name", "idempotency_key", "execution_id",
    "event_id", "event_type", "spawn_key", "agent_name", "agent_version", "name", "wait_signal", "request_id",
    "client_request_id", "page_token", "schedule_id", "key_id", "kind", "node", "tool", "tenant_id", "scope",
    "subject", "agents", "tenants", "version", "tool_names", "concurrency_key", "cron", "time_zone", "action",
    "principal",
})
# JSON fields the filter leaves to another run's key: a child's input is sealed under the child's own
# data key at spawn (`Shield.carried`, scheduler/store/children.py).
_OTHER_RUNS = frozenset({("agentrt.v1.ChildSpec", "input_json")})


def _field_path(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


_TEXT, _ONE, _MANY = range(3)
_JSON_PLANS: dict[str, tuple[tuple[int, str], ...]] = {}


def _json_plan(descriptor: Any, seen: frozenset[str] = frozenset()) -> tuple[tuple[int, str], ...]:
    """The fields of a message type the walk below visits, worked out once per type: its *_json text
    fields, and the fields holding messages that have some (maps are not walked)."""
    plan = _JSON_PLANS.get(descriptor.full_name)
    if plan is not None:
        return plan
    steps: list[tuple[int, str]] = []
    for desc in descriptor.fields:
        held = desc.message_type
        if held is not None:
            if held.GetOptions().map_entry:
                continue
            # A type met again on the way down is walked (its own plan is made when it is reached).
            if held.full_name in seen | {descriptor.full_name} or _json_plan(held, seen | {descriptor.full_name}):
                steps.append((_MANY if desc.is_repeated else _ONE, desc.name))
        elif desc.name.endswith("_json") and not desc.is_repeated and desc.type == FieldDescriptor.TYPE_STRING:
            steps.append((_TEXT, desc.name))
    plan = tuple(steps)
    if not seen:  # a plan made inside a cycle may lack the fields that lead back: not kept
        _JSON_PLANS[descriptor.full_name] = plan
    return plan


def _walk_json_fields(message: Message, fn: Callable[[str, str], str], prefix: str = "") -> None:
    """Calls `fn(text, path)` on each *_json text holding a sealed value, at any depth, and stores what
    it returns in the field."""
    for kind, name in _json_plan(message.DESCRIPTOR):
        if kind == _TEXT:
            value = getattr(message, name)
            if value and has_sealed(value):
                setattr(message, name, fn(value, _field_path(prefix, name)))
        elif kind == _ONE:
            if message.HasField(name):
                _walk_json_fields(getattr(message, name), fn, _field_path(prefix, name))
        else:
            for index, item in enumerate(getattr(message, name)):
                _walk_json_fields(item, fn, f"{_field_path(prefix, name)}[{index}]")


def redact_message(message: M) -> M:
    """Every sealed value in the message's *_json fields shown as "[redacted]"."""
    _walk_json_fields(message, lambda text, _path: redact_text(text))
    return message


def _marks(message: Any, name: str, marks: Sensitivity) -> tuple[Path_, ...]:
    """The paths of a request's JSON field that its run's agent marks (a write introduces these values)."""
    kind = message.DESCRIPTOR.full_name
    if name == "request_json" and "tool_name" in message.DESCRIPTOR.fields_by_name:
        return marks.tool_input(message.tool_name)
    if name == "response_json" or (kind == "agentrt.v1.ResolveToolExecutionRequest" and name == "result_json"):
        # The write does not name its tool: a field another tool marks is sealed too, never the other way.
        return marks.all_tool_outputs()
    if kind == "agentrt.v1.SignalRunRequest" and name == "payload_json":
        return marks.signal(message.name)
    if kind == "agentrt.v1.ResumeRunRequest" and name == "input_json":
        return marks.resume
    return ()


_FILTERED: dict[str, bool] = {}


def _has_text(descriptor: Any, seen: frozenset[str] = frozenset()) -> bool:
    """Whether a message type holds any field the filter may rewrite (by type, cached)."""
    cached = _FILTERED.get(descriptor.full_name)
    if cached is not None:
        return cached
    found = False
    for desc in descriptor.fields:
        if desc.message_type is not None:
            if desc.message_type.GetOptions().map_entry:
                found = found or desc.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_STRING
            elif desc.message_type.full_name not in seen and not desc.message_type.full_name.startswith("google."):
                found = found or _has_text(desc.message_type, seen | {descriptor.full_name})
        elif desc.type == FieldDescriptor.TYPE_STRING and desc.name not in IDENTIFIER_FIELDS:
            found = True
    _FILTERED[descriptor.full_name] = found
    return found


def _says_something(message: Message) -> bool:
    """Whether a request sets any field the filter may rewrite (most reads and heartbeats set none:
    no data key is looked up for them)."""
    for desc, value in message.ListFields():
        if desc.message_type is not None:
            if desc.message_type.GetOptions().map_entry:
                if desc.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_STRING and value:
                    return True
            elif any(_says_something(item) for item in (value if desc.is_repeated else (value,))):
                return True
        elif desc.type == FieldDescriptor.TYPE_STRING and desc.name not in IDENTIFIER_FIELDS and value:
            return True
    return False


def run_of(request: Any) -> uuid.UUID | None:
    """The run a request writes or reads: its lease's, or its run_id (None: no run, or not a UUID yet)."""
    fields = request.DESCRIPTOR.fields_by_name
    if "lease" in fields:
        text = request.lease.run_id
    elif "run_id" in fields:
        text = request.run_id
    else:
        return None
    try:
        return uuid.UUID(text) if text else None
    except ValueError:
        return None


class _Sealer:
    """One request's pass: learn the marked values it introduces, then seal or redact every field."""

    def __init__(self, key: RunKey) -> None:
        self.key = key

    def learn(self, message: Message) -> None:
        for desc, value in message.ListFields():
            if desc.message_type is not None:
                if not desc.message_type.GetOptions().map_entry:
                    for item in (value if desc.is_repeated else (value,)):
                        self.learn(item)
            elif desc.name.endswith("_json") and isinstance(value, str) and value:
                paths = _marks(message, desc.name, self.key.sensitivity)
                if paths and (parsed := _loads(value)) is not None:
                    self.key.secrets.update(plain_values(parsed, paths))

    def seal(self, message: Message) -> None:
        kind = message.DESCRIPTOR.full_name
        for desc, value in message.ListFields():
            if desc.message_type is not None:
                if desc.message_type.GetOptions().map_entry:
                    if desc.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_STRING:
                        for k in list(value):
                            value[k] = self.text(value[k])
                else:
                    for item in (value if desc.is_repeated else (value,)):
                        self.seal(item)
            elif desc.type != FieldDescriptor.TYPE_STRING or desc.name in IDENTIFIER_FIELDS:
                continue
            elif desc.name.endswith("_json"):
                if (kind, desc.name) not in _OTHER_RUNS:
                    setattr(message, desc.name, self.json(value, _marks(message, desc.name, self.key.sensitivity)))
            elif desc.is_repeated:
                value[:] = [self.text(v) for v in value]
            else:
                setattr(message, desc.name, self.text(value))

    def holds(self, text: str) -> bool:
        return any(s in text for s in self.key.secrets if s)

    def text(self, text: str) -> str:
        return REDACTED if self.holds(text) else text

    def json(self, text: str, paths: tuple[Path_, ...]) -> str:
        if not text or not (paths or self.holds(text)):
            return text
        parsed = _loads(text)
        if parsed is None:
            return REDACTED if self.holds(text) else text  # not JSON: its handler refuses it, naming the field
        sealed = self.key.seal_strings(self.key.seal_paths(parsed, paths), self.key.secrets)
        return text if sealed == parsed else canonical_json(sealed)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


class Shield:
    def __init__(self, store: Store) -> None:
        self.store = store

    # -- inbound: the one filter ---------------------------------------------------------------
    async def seal_request(self, request: Message) -> None:
        """Seals (in place) every marked or known marked value of a request about a run with a data key."""
        if not _has_text(request.DESCRIPTOR):
            return
        run_id = run_of(request)
        # A run known to hold no data key has nothing to seal: answered from the key cache before the
        # request is walked (the common case on the work path: most agents mark nothing).
        if run_id is None or self.store.keys.keyless(run_id) or not _says_something(request):
            return
        key = await self.store.keys.run_key(run_id)
        if key is None:
            return
        sealer = _Sealer(key)
        sealer.learn(request)
        sealer.seal(request)

    # -- submit and spawn: a new run's own key ----------------------------------------------------
    def seal_submit(self, sensitive: dict[str, Any] | None, payload: dict[str, Any]) -> SealedSubmit | None:
        sensitivity = Sensitivity.of_json(sensitive)
        if not sensitivity.any:
            return None
        run_id = uuid7()
        made = self.store.keys.new_run_key(run_id, sensitivity)
        made.key.secrets.update(plain_values(payload, sensitivity.input))
        return SealedSubmit(run_id=run_id, input=made.key.seal_paths(payload, sensitivity.input),
                            key_id=made.key_id, wrapped_key=made.wrapped, sensitive=sensitivity.to_json())

    @staticmethod
    def submit_labels(sensitive: dict[str, Any] | None, payload: Any, labels: dict[str, str]) -> dict[str, str]:
        """A submit's labels with any value holding one of its input's marked values redacted: the run
        has no key yet when the edge's filter runs, so its marked values are known only from here."""
        paths = Sensitivity.of_json(sensitive).input
        return redact_labels(labels, plain_values(payload, paths)) if paths else labels

    async def carried(self, parent: uuid.UUID, payload: Any) -> tuple[str, ...]:
        """The parent's marked values a child's input carries: sealed under the child's own key at spawn."""
        key = await self.store.keys.run_key(parent)
        if key is None:
            return ()
        text = canonical_json(payload)
        return tuple(sorted(s for s in key.secrets if s and s in text))

    # -- answers ---------------------------------------------------------------------------------
    async def opened(self, run_id: uuid.UUID, message: M) -> M:
        """For the lease holder, or a reveal: plain values (SealedValueInvalid naming the field of one
        that does not open under the run's key)."""
        key = await self.store.keys.run_key(run_id)
        if key is None:
            return redact_message(message)
        store = self.store

        def opened_text(text: str, path: str) -> str:
            def open_one(sealed: str) -> Any:
                try:
                    return key.open(sealed)
                except Unopened:
                    raise store.keys.integrity_failure(path, f"run {run_id}") from None
            return canonical_json(transform(json.loads(text), open_one))

        _walk_json_fields(message, opened_text)
        return message


__all__ = ["IDENTIFIER_FIELDS", "REDACTED", "SEALED", "Shield", "redact_message", "run_of"]
