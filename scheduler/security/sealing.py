"""Sensitive values (docs/design.md §security): envelope encryption of the fields an agent marks.

An agent definition marks a JSON-schema property with "x-agentrt-sensitive": true in its input
schema or in a tool's input or output schema. The scheduler seals each marked value with the
run's data key (AES-256-GCM, a fresh 32-byte key per run); the data key is stored only wrapped by
a key-encryption key (KEK), with the KEK's id (run_data_keys). A sealed value is the JSON object
{"$sealed": "<base64>"}: nonce (12 bytes) + ciphertext, the run id as associated data. The nonce
is an HMAC of the plain value under the data key (the SIV construction), so one value seals to one
text within a run and replayed writes still compare equal.

KEKs come from a KeyProvider; the one here is a keyring (id -> 32-byte key, one of them current)
read from a file or an environment variable. A KMS fits behind the same three methods.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from shared.canonical import canonical_json
from shared.sensitive import MARK, REDACTED, SEALED, marked_paths  # noqa: F401  (re-exported)

_NONCE = 12

Path_ = tuple[str, ...]


class Unopened(Exception):
    """A sealed value that does not open under the key tried (the caller names the field: SealedValueInvalid)."""


class KeyError_(Exception):
    """A wrapped data key no KEK of the keyring opens (unknown key id, or the wrong key)."""


class KeyProvider(Protocol):
    """Where KEKs live: wraps a data key under the current KEK, unwraps one under the KEK it names."""

    def current_key_id(self) -> str: ...

    def wrap(self, data_key: bytes) -> tuple[str, bytes]: ...

    def unwrap(self, key_id: str, wrapped: bytes) -> bytes: ...


@dataclass(frozen=True)
class Keyring:
    """KEKs by id; `current` wraps new data keys, every other id still unwraps (until rotated away)."""

    current: str
    keys: Mapping[str, bytes]

    def current_key_id(self) -> str:
        return self.current

    def wrap(self, data_key: bytes) -> tuple[str, bytes]:
        nonce = os.urandom(_NONCE)
        return self.current, nonce + AESGCM(self.keys[self.current]).encrypt(nonce, data_key, self.current.encode())

    def unwrap(self, key_id: str, wrapped: bytes) -> bytes:
        kek = self.keys.get(key_id)
        if kek is None:
            raise KeyError_(f"no key-encryption key {key_id!r} in the keyring")
        try:
            return AESGCM(kek).decrypt(wrapped[:_NONCE], wrapped[_NONCE:], key_id.encode())
        except Exception:  # InvalidTag: another key under the same id
            raise KeyError_(f"key-encryption key {key_id!r} does not open this data key") from None


def parse_keyring(text: str, where: str) -> Keyring:
    """{"current": "k2", "keys": {"k1": "<base64 of 32 bytes>", "k2": "..."}}."""
    try:
        data = json.loads(text)
        current = data["current"]
        keys = {str(k): base64.b64decode(v, validate=True) for k, v in data["keys"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{where}: not a keyring ({{\"current\": id, \"keys\": {{id: base64}}}}): {exc}") from None
    if current not in keys:
        raise ValueError(f"{where}: current key {current!r} is not among its keys")
    short = [k for k, v in keys.items() if len(v) != 32]
    if short:
        raise ValueError(f"{where}: key {short[0]!r} is not 32 bytes (AES-256)")
    return Keyring(current, keys)


def load_keyring(path: str | None, env_value: str | None) -> Keyring | None:
    """The keyring from a file (encryption_keys_file) or the variable's text; None: encryption is off."""
    if path:
        return parse_keyring(Path(path).read_text(), path)
    if env_value:
        return parse_keyring(env_value, "AGENTRT_ENCRYPTION_KEYS")
    return None


# -- which fields are marked -------------------------------------------------------------------

@dataclass(frozen=True)
class Sensitivity:
    """The marked paths of one agent version: its input, each tool's input and output, each declared
    signal's payload, and the input a human gives ResumeRun."""

    input: tuple[Path_, ...] = ()
    tools: Mapping[str, tuple[tuple[Path_, ...], tuple[Path_, ...]]] = field(default_factory=dict)
    signals: Mapping[str, tuple[Path_, ...]] = field(default_factory=dict)
    resume: tuple[Path_, ...] = ()

    @property
    def any(self) -> bool:
        return (bool(self.input) or any(i or o for i, o in self.tools.values()) or any(self.signals.values())
                or bool(self.resume))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "input": [list(p) for p in self.input],
            "tools": {name: {"input": [list(p) for p in i], "output": [list(p) for p in o]}
                      for name, (i, o) in self.tools.items()}}
        if self.signals:  # only when declared: an agent that declares no signals stores no signal key
            data["signals"] = {name: [list(p) for p in paths] for name, paths in self.signals.items()}
        if self.resume:
            data["resume"] = [list(p) for p in self.resume]
        return data

    @classmethod
    def of_json(cls, data: Any) -> Sensitivity:
        if not isinstance(data, dict):
            return cls()
        tools = {str(name): (tuple(tuple(p) for p in spec.get("input", [])),
                             tuple(tuple(p) for p in spec.get("output", [])))
                 for name, spec in (data.get("tools") or {}).items()}
        signals = {str(name): tuple(tuple(p) for p in paths) for name, paths in (data.get("signals") or {}).items()}
        return cls(tuple(tuple(p) for p in data.get("input", [])), tools, signals,
                   tuple(tuple(p) for p in data.get("resume", [])))

    def tool_input(self, tool: str) -> tuple[Path_, ...]:
        return self.tools.get(tool, ((), ()))[0]

    def tool_output(self, tool: str) -> tuple[Path_, ...]:
        return self.tools.get(tool, ((), ()))[1]

    def all_tool_outputs(self) -> tuple[Path_, ...]:
        return tuple(p for _, output in self.tools.values() for p in output)

    def signal(self, name: str) -> tuple[Path_, ...]:
        return self.signals.get(name, ())


def check_sensitivity(data: Any) -> str | None:
    """What is wrong with a registration's sensitive_json (None: fine)."""
    if not isinstance(data, dict) or set(data) - {"input", "tools", "signals", "resume"}:
        return "must be an object with input (paths), tools ({name: {input, output}}), signals ({name: paths}) " \
               "and resume (paths)"

    def paths_ok(value: Any) -> bool:
        return isinstance(value, list) and all(
            isinstance(p, list) and p and all(isinstance(s, str) for s in p) for p in value)

    if not paths_ok(data.get("input", [])):
        return "input must be a list of paths (lists of property names)"
    tools = data.get("tools", {})
    if not isinstance(tools, dict) or not all(
            isinstance(s, dict) and not set(s) - {"input", "output"} and paths_ok(s.get("input", []))
            and paths_ok(s.get("output", [])) for s in tools.values()):
        return "tools must map tool names to {input: paths, output: paths}"
    signals = data.get("signals", {})
    if not isinstance(signals, dict) or not all(paths_ok(p) for p in signals.values()):
        return "signals must map signal names to paths"
    if not paths_ok(data.get("resume", [])):
        return "resume must be a list of paths"
    return None


# -- sealing --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunKey:
    """A run's plain data key, with what its agent marked."""

    run_id: uuid.UUID
    data_key: bytes
    sensitivity: Sensitivity
    # The plain texts of the run's marked values this process knows (its input's, and the tool values
    # sealed through it): a string holding one is sealed wherever the executor copies it (seal_strings).
    secrets: set[str] = field(default_factory=set, compare=False)

    def seal(self, value: Any) -> dict[str, str]:
        plain = canonical_json(value).encode()
        nonce = hmac.new(self.data_key, plain, hashlib.sha256).digest()[:_NONCE]
        sealed = nonce + AESGCM(self.data_key).encrypt(nonce, plain, self.run_id.bytes)
        return {SEALED: base64.b64encode(sealed).decode()}

    def open(self, sealed: str) -> Any:
        """The plain value; Unopened when `sealed` is not a value sealed under this key for this run."""
        try:
            raw = base64.b64decode(sealed, validate=True)
            return json.loads(AESGCM(self.data_key).decrypt(raw[:_NONCE], raw[_NONCE:], self.run_id.bytes))
        except (InvalidTag, ValueError, TypeError) as exc:  # another run's (or key's) value, altered, not base64
            raise Unopened(type(exc).__name__) from None

    def seal_paths(self, value: Any, paths: Iterable[Path_]) -> Any:
        """`value` with each marked path's value sealed (paths absent from it are skipped)."""
        for path in paths:
            value = _replace(value, path, self.seal)
        return value

    def seal_strings(self, value: Any, secrets: Iterable[str]) -> Any:
        """`value` with every string that holds one of `secrets` sealed (a checkpoint's state, journal
        entries, event payloads: the marked values travel there as the decider copied them)."""
        needles = [s for s in secrets if s]
        if not needles:
            return value

        def walk(node: Any) -> Any:
            if isinstance(node, str):
                return self.seal(node) if any(n in node for n in needles) else node
            if isinstance(node, list):
                return [walk(v) for v in node]
            if isinstance(node, dict):
                if set(node) == {SEALED}:
                    return node
                return {k: walk(v) for k, v in node.items()}
            return node

        return walk(value)

    def unseal(self, value: Any) -> Any:
        return transform(value, self.open)


def _replace(value: Any, path: Path_, fn: Any) -> Any:
    if not path:
        if isinstance(value, dict) and set(value) == {SEALED}:
            return value
        return fn(value)
    if not isinstance(value, dict) or path[0] not in value:
        return value
    return {**value, path[0]: _replace(value[path[0]], path[1:], fn)}


def redact_labels(labels: dict[str, str], secrets: Iterable[str]) -> dict[str, str]:
    """Labels are free text shown wherever a run is listed (ListRuns, events, the CLI): a label whose value
    holds a marked value is kept as "[redacted]", as other free text is."""
    needles = [s for s in secrets if s]
    if not needles:
        return labels
    return {k: (REDACTED if any(n in v for n in needles) else v) for k, v in labels.items()}


def plain_values(value: Any, paths: Iterable[Path_]) -> list[str]:
    """The texts of the values at `paths` (strings as they are, others as canonical JSON)."""
    out: list[str] = []
    for path in paths:
        node = value
        for part in path:
            if not isinstance(node, dict) or part not in node:
                node = None
                break
            node = node[part]
        if node is not None:
            out.append(node if isinstance(node, str) else canonical_json(node))
    return out


def transform(value: Any, fn: Any) -> Any:
    """`value` with every sealed object replaced by fn(its text)."""
    if isinstance(value, list):
        return [transform(v, fn) for v in value]
    if isinstance(value, dict):
        if set(value) == {SEALED} and isinstance(value[SEALED], str):
            return fn(value[SEALED])
        return {k: transform(v, fn) for k, v in value.items()}
    return value


def redact(value: Any) -> Any:
    return transform(value, lambda _text: REDACTED)


def has_sealed(text: str) -> bool:
    return f'"{SEALED}"' in text


def redact_text(text: str) -> str:
    """A JSON text with its sealed values redacted (unchanged when it holds none)."""
    if not text or not has_sealed(text):
        return text
    return canonical_json(redact(json.loads(text)))


def unseal_text(text: str, key: RunKey | None) -> str:
    if not text or not has_sealed(text):
        return text
    value = json.loads(text)
    return canonical_json(key.unseal(value) if key is not None else redact(value))
