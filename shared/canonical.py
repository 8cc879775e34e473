"""Canonical JSON and the stable hashes taken over it.

Request hashes, idempotency keys and state hashes must not change when a
payload crosses a process, a protobuf message or a jsonb column. They are
taken over this module's canonical form only: keys sorted, no insignificant
whitespace, UTF-8, no NaN/Infinity, and numbers spelled as PostgreSQL's jsonb
spells them (so the text is a fixpoint through a jsonb column and back). Never
hash a google.protobuf.Struct (it turns 1 into 1.0).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from typing import Any

# Made once (json.dumps with options builds an encoder per call). No circular-reference
# bookkeeping: JSON values are trees, and a cyclic object fails anyway (RecursionError).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                              check_circular=False)


# Python spells some floats as jsonb (numeric_out) never does: 1e+16, 1.5e-07, -0.0 (repr's
# exponent has two digits at least). The C encoder's text is the answer unless it holds one.
_EXPONENT_HINT = re.compile(r"e[+-]\d\d")
_NEGATIVE_ZERO = re.compile(r"-0\.0(?!\d)")
# Starts only where a number starts, and never backtracks into one (a scan that did took twice as long).
_FLOAT_TO_REWRITE = re.compile(r"(?<![\d.-])(-?)(\d++)(?:\.(\d++))?+e([+-]\d+)|-0\.0(?!\d)")
# Canonical text holds no raw control character (the encoder escapes them), so these stand in
# for the two escapes that contain a quote or backslash while strings are set aside.
_ESCAPES_OUT = (("\\\\", "\x00"), ('\\"', "\x01"))
_ESCAPES_BACK = (("\x01", '\\"'), ("\x00", "\\\\"))


def canonical_json(value: Any) -> str:
    """The one text form of a JSON value that hashes are taken over."""
    text = _CANONICAL.encode(value)
    # Cheapest tests first: one character (memchr), then two, then a regex for a hit that may be
    # prose ("re-run"). Most text holds no float in exponent form and pays for the first two only.
    has_dash = "-" in text
    maybe_exponent = ("+" in text and "e+" in text) or (has_dash and "e-" in text)
    if (maybe_exponent and _EXPONENT_HINT.search(text)) or (
            has_dash and "-0.0" in text and _NEGATIVE_ZERO.search(text)):
        return _with_jsonb_numbers(text)
    return text


def _with_jsonb_numbers(text: str) -> str:
    """`text` with each float in exponent form, and -0.0, spelled as jsonb spells it; strings untouched."""
    escaped = "\\" in text
    if escaped:
        for escape, stand_in in _ESCAPES_OUT:
            text = text.replace(escape, stand_in)
    parts = text.split('"')  # now every quote opens or closes a string: outside, string, outside, ...
    # The outside parts hold no quote, so they are joined by one, rewritten in one pass, split again.
    parts[::2] = _FLOAT_TO_REWRITE.sub(_jsonb_number, '"'.join(parts[::2])).split('"')
    text = '"'.join(parts)
    if escaped:
        for stand_in, escape in _ESCAPES_BACK:
            text = text.replace(stand_in, escape)
    return text


def _jsonb_number(match: re.Match[str]) -> str:
    """A float's exponent form (or -0.0) as numeric_out prints the same literal.

    numeric_in keeps max(0, fractional digits - exponent) digits after the point and numeric_out
    prints them all: 1e+16 -> 10000000000000000, 1.5e-07 -> 0.00000015, 2.5e+20 ->
    250000000000000000000. This is that rule done on the digits (Decimal would give the same
    text, four times slower); float repr is the shortest text that reads back as the same
    float, so the plain text does too.
    """
    sign, whole, fraction, exponent = match.groups()
    if exponent is None:
        return "0.0"  # -0.0: numeric has no negative zero
    digits = whole + (fraction or "")
    point = len(whole) + int(exponent)  # where the decimal point falls in `digits`
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


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
