"""Canonical JSON and the stable hashes taken over it.

Two forms, for two jobs:

- `canonical_json`: the text a value is *stored and answered* in: keys sorted,
  no insignificant whitespace, UTF-8, no NaN/Infinity, and numbers spelled as
  PostgreSQL's jsonb spells them (so the text is a fixpoint through a jsonb
  column and back; `1` stays `1`, `1.0` stays `1.0`).
- `jcs_json`: RFC 8785 (the JSON Canonicalization Scheme), the text every hash
  a client may recompute is taken over (`request_hash`, the SubmitRun and
  SignalRun payload hashes): numbers as IEEE doubles written as ECMAScript
  writes them (`80`, `80.0` and `8e1` are one value, `80`), keys sorted by
  UTF-16 code units. Any language with a JCS library gets the same bytes.

Never hash a google.protobuf.Struct (it turns 1 into 1.0).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
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
    return _rewrite_outside_strings(text, _FLOAT_TO_REWRITE, _jsonb_number)


def _rewrite_outside_strings(text: str, pattern: re.Pattern[str], rewrite: Any) -> str:
    """`text` (as the encoder wrote it) with `pattern`'s matches outside strings replaced by `rewrite`."""
    escaped = "\\" in text
    if escaped:
        for escape, stand_in in _ESCAPES_OUT:
            text = text.replace(escape, stand_in)
    parts = text.split('"')  # now every quote opens or closes a string: outside, string, outside, ...
    # The outside parts hold no quote, so they are joined by one, rewritten in one pass, split again.
    parts[::2] = pattern.sub(rewrite, '"'.join(parts[::2])).split('"')
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


# RFC 8785 --------------------------------------------------------------------------------------------

# Number tokens outside strings that JCS spells differently from Python's encoder: any float
# (a point or an exponent) and any integer past 2**53 (JCS numbers are doubles). A cheap test
# first: a digit before a point or exponent, or sixteen digits in a row (it may be in a string).
_JCS_MAYBE = re.compile(r"\d[.eE]|\d{16}")
_JCS_NUMBER = re.compile(r"(?<![\w.+-])-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_SAFE_INTEGER = 2**53


def es_number(value: float) -> str:
    """A finite double as ECMAScript's Number::toString writes it (RFC 8785 §3.2.2.3).

    repr() gives the shortest digits that read back as the same double, which is what
    ECMAScript picks too; only where the point goes and when to use an exponent differ.
    """
    if value == 0:
        return "0"  # and -0 is 0
    text = repr(value)
    sign = "-" if text[0] == "-" else ""
    mantissa, _, exponent = text.lstrip("-").partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + int(exponent or 0)  # the decimal point falls after `point` digits
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k, n = len(digits), point
    if k <= n <= 21:
        return f"{sign}{digits}{'0' * (n - k)}"
    if 0 < n <= 21:
        return f"{sign}{digits[:n]}.{digits[n:]}"
    if -6 < n <= 0:
        return f"{sign}0.{'0' * -n}{digits}"
    e = n - 1
    mark = "+" if e >= 0 else "-"
    head = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
    return f"{sign}{head}e{mark}{abs(e)}"


def _jcs_token(match: re.Match[str]) -> str:
    token = match.group(0)
    if "." not in token and "e" not in token and "E" not in token:
        number = int(token)
        if -_SAFE_INTEGER <= number <= _SAFE_INTEGER:
            return token
        try:
            return es_number(float(number))
        except OverflowError:
            raise ValueError(f"the number {token[:20]}... is past what an IEEE double holds (RFC 8785)") from None
    return es_number(float(token))


def _utf16_key(key: str) -> bytes:
    return key.encode("utf-16-be")


def _jcs_slow(value: Any) -> str:
    """JCS by walking the value: only for keys outside the BMP, where UTF-16 order differs."""
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda item: _utf16_key(item[0]))
        return "{" + ",".join(f"{_CANONICAL.encode(k)}:{_jcs_slow(v)}" for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_jcs_slow(v) for v in value) + "]"
    if isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)):
        return _rewrite_outside_strings(_CANONICAL.encode(value), _JCS_NUMBER, _jcs_token)
    return _CANONICAL.encode(value)


def jcs_json(value: Any) -> str:
    """RFC 8785 canonical text of a JSON value: what hashes that clients recompute are taken over."""
    text = _CANONICAL.encode(value)
    if not text.isascii() and any(ord(ch) > 0xFFFF for ch in text):
        return _jcs_slow(value)  # a key outside the BMP may sort differently by UTF-16 code units
    if _JCS_MAYBE.search(text):
        return _rewrite_outside_strings(text, _JCS_NUMBER, _jcs_token)
    return text


def jcs_sha256(value: Any) -> bytes:
    return hashlib.sha256(jcs_json(value).encode("utf-8")).digest()


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
    """Hash of a tool decision: SHA-256 of the RFC 8785 text of {"request": ..., "tool": ...}.

    Never change this format without accepting the old one too: checkpoints hold it, and a
    decision recorded before an upgrade must still match its Tx1 (see legacy_request_hash).
    """
    return jcs_sha256({"tool": tool_name, "request": request})


def request_hashes(tool_name: str, request: Any) -> tuple[bytes, bytes]:
    """(request_hash, legacy_request_hash): what a checkpoint's pending decision may hold."""
    return request_hash(tool_name, request), legacy_request_hash(tool_name, request)


def content_hash(value: Any) -> bytes:
    """SHA-256 of a payload's RFC 8785 text: what a retried request is compared by (a submit's
    client_request_id, a signal's request_id), so a client in any language sends the same value."""
    return jcs_sha256(value)


def content_hash_matches(stored: bytes, value: Any) -> bool:
    """A stored content hash against a value: the RFC 8785 hash, or the canonical_json hash that
    releases before it stored (a request retried across the upgrade is still the same request)."""
    return stored == jcs_sha256(value) or stored == sha256_of(value)


def legacy_request_hash(tool_name: str, request: Any) -> bytes:
    """The request hash of releases before RFC 8785 (over canonical_json), accepted beside the new
    one where a stored hash is compared, so runs decided by an older executor still go on."""
    return sha256_of({"tool": tool_name, "request": request})


def idempotency_key(tenant_id: str, run_id: str, operation: str, step_key: str) -> str:
    """Stable key for one logical side effect.

    Never change this format: downstream services dedupe on it, and a changed
    format would make a recovered step look new to them.
    """
    digest = hashlib.sha256(f"{tenant_id}\x1f{run_id}\x1f{operation}\x1f{step_key}".encode()).hexdigest()
    return f"agentrt:{digest[:40]}"


_ENTROPY_BLOCK = 10 * 256  # random bytes read at once: 256 ids per getrandom call, not one
_entropy = bytearray()
_entropy_lock = threading.Lock()


def _forget_entropy() -> None:
    global _entropy_lock
    _entropy_lock = threading.Lock()  # the parent's may have been held by another thread at the fork
    _entropy.clear()  # a forked child must not hand out the ids its parent will


os.register_at_fork(after_in_child=_forget_entropy)


def _random_80() -> int:
    with _entropy_lock:  # two threads must never take the same bytes
        if not _entropy:
            _entropy.extend(os.urandom(_ENTROPY_BLOCK))
        chunk = _entropy[-10:]
        del _entropy[-10:]
    return int.from_bytes(chunk, "big")


def uuid7() -> uuid.UUID:
    """Time-ordered UUID (RFC 9562 version 7), so new rows land at the index's end. Its 74 random
    bits come from the operating system's generator, read in blocks (a system call per id was a
    few percent of an executor's CPU per step)."""
    unix_ms = time.time_ns() // 1_000_000
    rand = _random_80()
    value = (unix_ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)
