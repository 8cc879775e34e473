"""Canonical JSON and the stable hashes taken over it.

Request hashes, idempotency keys and state hashes must not change when a
payload crosses a process, a protobuf message or a jsonb column. They are
taken over this module's canonical form only: keys sorted, no insignificant
whitespace, UTF-8, no NaN/Infinity. Never hash a google.protobuf.Struct (it
turns 1 into 1.0).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from typing import Any

# Made once (json.dumps with options builds an encoder per call). No circular-reference
# bookkeeping: JSON values are trees, and a cyclic object fails anyway (RecursionError).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                              check_circular=False)


def canonical_json(value: Any) -> str:
    """The one text form of a JSON value that hashes are taken over."""
    return _CANONICAL.encode(value)


class CanonicalJson(str):
    """Text that is already `canonical_json` of a value: stored and hashed as is, never encoded again."""

    __slots__ = ()


def encode_json(value: Any) -> str:
    """jsonb/json codec encoder: canonical JSON, passing CanonicalJson text through unchanged."""
    return value if isinstance(value, CanonicalJson) else canonical_json(value)


def sha256_of(value: Any) -> bytes:
    if isinstance(value, CanonicalJson):
        return hashlib.sha256(value.encode("utf-8")).digest()
    return hashlib.sha256(canonical_json(value).encode("utf-8")).digest()


def request_hash(tool_name: str, request: Any) -> bytes:
    """Hash of a tool decision: the tool and its normalised arguments."""
    return sha256_of({"tool": tool_name, "request": request})


def idempotency_key(tenant_id: str, run_id: str, operation: str, step_key: str) -> str:
    """Stable key for one logical side effect.

    Never change this format: downstream services dedupe on it, and a changed
    format would make a recovered step look new to them.
    """
    digest = hashlib.sha256(f"{tenant_id}\x1f{run_id}\x1f{operation}\x1f{step_key}".encode()).hexdigest()
    return f"agentrt:{digest[:40]}"


def uuid7() -> uuid.UUID:
    """Time-ordered UUID (RFC 9562 version 7), so new rows land at the index's end."""
    unix_ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (unix_ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)
