"""Where sensitive values are sealed and opened at the scheduler's edge (scheduler/sealing.py).

Inbound, before the store writes: a run's input at submit (its marked paths), a tool call's
request (the tool's marked input paths) and answer (marked output paths), and every string of a
checkpoint's state, journal entries, event payloads and run result that holds a known marked
value. Outbound: the executor's lease and ledger answers are opened (tools get plain values);
RunService answers are redacted, or opened for a caller with runs.reveal who asked.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any, TypeVar

from google.protobuf.message import Message

from scheduler.sealing import REDACTED, RunKey, Sensitivity, has_sealed, plain_values, redact_text, unseal_text
from scheduler.store import Journal, Store
from scheduler.store_types import SealedSubmit
from shared.canonical import CanonicalJson, canonical_json, uuid7

M = TypeVar("M", bound=Message)


def _walk_json_fields(message: Message, fn: Any) -> None:
    for desc, value in message.ListFields():
        repeated = desc.is_repeated
        if desc.message_type is not None:
            if repeated:
                if desc.message_type.GetOptions().map_entry:
                    continue
                for item in value:
                    _walk_json_fields(item, fn)
            else:
                _walk_json_fields(value, fn)
        elif desc.name.endswith("_json") and not repeated and isinstance(value, str):
            if has_sealed(value):
                setattr(message, desc.name, fn(value))


def redact_message(message: M) -> M:
    """Every sealed value in the message's *_json fields shown as "[redacted]"."""
    _walk_json_fields(message, redact_text)
    return message


def open_message(message: M, key: RunKey | None) -> M:
    """Every sealed value in the message's *_json fields opened with `key` (redacted without one)."""
    _walk_json_fields(message, lambda text: unseal_text(text, key))
    return message


class Shield:
    def __init__(self, store: Store) -> None:
        self.store = store

    # -- submit --------------------------------------------------------------------------------
    def seal_submit(self, sensitive: dict[str, Any] | None, payload: dict[str, Any]) -> SealedSubmit | None:
        sensitivity = Sensitivity.of_json(sensitive)
        if not sensitivity.any:
            return None
        run_id = uuid7()
        made = self.store.new_run_key(run_id, sensitivity)
        made.key.secrets.update(plain_values(payload, sensitivity.input))
        return SealedSubmit(run_id=run_id, input=made.key.seal_paths(payload, sensitivity.input),
                            key_id=made.key_id, wrapped_key=made.wrapped, sensitive=sensitivity.to_json())

    # -- the lease holder's writes ---------------------------------------------------------------
    async def tool_request(self, run_id: uuid.UUID, tool: str, request: Any) -> Any:
        """The request as the ledger stores it (None: as it is)."""
        key = await self.store.run_key(run_id)
        if key is None:
            return None
        paths = key.sensitivity.tool_input(tool)
        key.secrets.update(plain_values(request, paths))
        return key.seal_strings(key.seal_paths(request, paths), key.secrets)

    async def tool_response(self, run_id: uuid.UUID, response: Any) -> Any:
        """An answer with the marked output fields of every tool of the agent sealed (the write does not
        name its tool; a field another tool marks is sealed too, never the other way round)."""
        key = await self.store.run_key(run_id)
        if key is None:
            return response
        for _, output in key.sensitivity.tools.values():
            key.secrets.update(plain_values(response, output))
            response = key.seal_paths(response, output)
        return key.seal_strings(response, key.secrets)

    async def value(self, run_id: uuid.UUID, value: Any) -> Any:
        """Any other payload (event payload, run result, evidence): known marked values sealed."""
        key = await self.store.run_key(run_id)
        return value if key is None else key.seal_strings(value, key.secrets)

    async def text(self, run_id: uuid.UUID, text: str) -> str:
        """A free text (an error's detail, a reason): "[redacted]" when it holds a known marked value."""
        key = await self.store.run_key(run_id)
        return REDACTED if key is not None and any(s in text for s in key.secrets if s) else text

    async def state(self, run_id: uuid.UUID, state: Any, text: CanonicalJson) -> tuple[Any, CanonicalJson]:
        key = await self.store.run_key(run_id)
        if key is None or not any(s in text for s in key.secrets if s):
            return state, text
        sealed = key.seal_strings(state, key.secrets)
        return sealed, CanonicalJson(canonical_json(sealed))

    async def journal(self, run_id: uuid.UUID, journal: Journal) -> Journal:
        key = await self.store.run_key(run_id)
        if key is None or not journal.details or not any(s in d for d in journal.details for s in key.secrets if s):
            return journal
        details = tuple(canonical_json(key.seal_strings(json.loads(d), key.secrets)) for d in journal.details)
        return dataclasses.replace(journal, details=details)

    # -- answers ---------------------------------------------------------------------------------
    async def opened(self, run_id: uuid.UUID, message: M) -> M:
        """For the lease holder: plain values."""
        key = await self.store.run_key(run_id)
        return open_message(message, key) if key is not None else message


__all__ = ["REDACTED", "Shield", "open_message", "redact_message"]
