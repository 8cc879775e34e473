"""Request validation: every refusal names the field (INVALID_ARGUMENT) and happens before any write."""

from __future__ import annotations

import json
import math
import operator
import re
import uuid
from collections.abc import Mapping
from itertools import accumulate, count
from typing import Any

from shared.canonical import CanonicalJson, canonical_json
from shared.errors import InvalidArgument, Unauthenticated

_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_STEP_KEY = re.compile(r"^[^\x00-\x1f]{1,400}$")
TENANT_HEADER = "x-tenant-id"
# Deepest nesting of arrays and objects a *_json field may have. Far below the interpreter's
# recursion limit (~1000), which the C JSON encoder and decoder recurse against: deeper text
# would fail as RecursionError (INTERNAL) instead of being refused.
MAX_JSON_DEPTH = 128
_NOT_STRUCTURE = bytes(byte for byte in range(256) if byte not in b'[]{}"')
_ONE_BRACKET_KIND = bytes.maketrans(b"{}", b"[]")


def is_tenant(value: object) -> bool:
    return isinstance(value, str) and _TENANT.match(value) is not None


def require_tenant(field: str, tenant: str) -> str:
    if not _TENANT.match(tenant):
        raise InvalidArgument(field, "must be 1-128 characters of letters, digits, . _ : -")
    return tenant


def tenant_values(metadata: Any) -> list[Any]:
    return [value for key, value in (metadata or ()) if key == TENANT_HEADER]


def tenant_from_metadata(metadata: Any) -> str:
    values = tenant_values(metadata)
    if not values:
        raise Unauthenticated(f"call metadata must name the tenant in {TENANT_HEADER}")
    if len(values) > 1:  # picking one would let a proxy and the scheduler disagree on the tenant
        raise InvalidArgument(TENANT_HEADER, f"must be given once, not {len(values)} times")
    tenant = values[0]
    if isinstance(tenant, bytes) or not _TENANT.match(tenant):
        raise InvalidArgument(TENANT_HEADER, "must be 1-128 characters of letters, digits, . _ : -")
    return tenant


def require_uuid(field: str, value: str) -> uuid.UUID:
    if not value:
        raise InvalidArgument(field, "is required")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(field, f"is not a UUID: {value[:64]!r}") from None


def optional_uuid(field: str, value: str) -> uuid.UUID | None:
    return require_uuid(field, value) if value else None


def require_text(field: str, value: str, *, max_len: int = 200, pattern: re.Pattern[str] | None = None) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value) > max_len:
        raise InvalidArgument(field, f"is longer than {max_len} characters")
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL characters (PostgreSQL text refuses them)")
    if pattern is not None and not pattern.match(value):
        raise InvalidArgument(field, "has characters that are not allowed")
    return value


def require_name(field: str, value: str) -> str:
    return require_text(field, value, pattern=_NAME)


def require_step_key(field: str, value: str) -> str:
    return require_text(field, value, max_len=400, pattern=_STEP_KEY)


def optional_text(field: str, value: str, *, max_len: int = 2000) -> str | None:
    if not value:
        return None
    if len(value) > max_len:
        raise InvalidArgument(field, f"is longer than {max_len} characters")
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL characters (PostgreSQL text refuses them)")
    return value


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)  # made once, not per call


def parse_json(field: str, text: str, limit: int, *, required: bool = False,
               object_only: bool = True, default: Any = None) -> Any:
    """Parses a *_json field. Oversized, invalid, NaN/Infinity, or (by default) non-object → INVALID_ARGUMENT."""
    return parse_json_canonical(field, text, limit, required=required, object_only=object_only,
                                default=default)[0]


def parse_json_canonical(field: str, text: str, limit: int, *, required: bool = False,
                         object_only: bool = True, default: Any = None) -> tuple[Any, CanonicalJson | None]:
    """`parse_json`, plus the value's canonical text (None for an empty field).

    The canonical text is made once here (the check below needs it anyway);
    passed on as CanonicalJson it is stored and hashed without encoding again.
    """
    if not text:
        if required:
            raise InvalidArgument(field, "is required")
        return default, None
    # At most 4 UTF-8 bytes per character: short text needs no encoding to be measured.
    if len(text) > limit // 4 and len(text.encode("utf-8")) > limit:
        raise InvalidArgument(field, f"is larger than the {limit}-byte payload limit")
    if _nests_deeper_than(text, MAX_JSON_DEPTH):
        raise InvalidArgument(field, f"nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(field, f"is not valid JSON ({str(exc)[:120]})") from None
    if object_only and not isinstance(value, dict):
        raise InvalidArgument(field, "must be a JSON object")
    # JSON text can only carry NUL as the escape \u0000 (a raw control character is invalid
    # JSON): without one in the text there is none in the value, and no need to walk it.
    if "\\u0000" in text and _has_nul(value):
        raise InvalidArgument(field, "must not contain NUL characters (PostgreSQL jsonb refuses them)")
    try:  # 1e400 parses as inf and "\ud800" as a lone surrogate: neither can be stored or hashed
        canonical = canonical_json(value)
        size = len(canonical.encode("utf-8"))
    except ValueError:
        raise InvalidArgument(field, "must hold finite numbers and valid Unicode text only") from None
    if size > limit:  # numbers are written out as jsonb writes them: 1e300 is 301 digits
        raise InvalidArgument(field, f"is larger than the {limit}-byte payload limit once its numbers are "
                                     "written out in full, as stored")
    return value, CanonicalJson(canonical)


def _nests_deeper_than(text: str, limit: int) -> bool:
    """Whether arrays and objects in JSON text nest deeper than `limit`, found without recursion.

    Brackets inside strings do not count. Only C-level passes over the text run, no loop per
    character: escapes out, all but brackets and quotes out (text with few brackets stops
    there), strings out, innermost pairs out a few times, then a running maximum over what
    is left. Exact for valid JSON. Up to its first syntax error text is read here as the
    decoder reads it, so the decoder never nests deeper than measured; beyond an error the
    depth may be overestimated, which only changes the words of the refusal.
    """
    if len(text) <= limit:
        return False
    data = text.encode("ascii", "ignore")  # structure is ASCII; anything else is string content
    if b"\\" in data:  # escaped backslashes and quotes: string content that would end strings below
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    data = data.translate(_ONE_BRACKET_KIND, _NOT_STRUCTURE)
    if data.count(b"[") <= limit:  # every opener, those in strings too: a bound from above
        return False
    data = data.replace(b'""', b"")  # strings without brackets
    if b'"' in data:
        data = b"".join(data.split(b'"')[::2])  # quotes pair up: the odd parts are inside strings
    # One pass takes every innermost pair away, and with them one level: most of a large
    # document's brackets go in the first passes, in C, before the running maximum below.
    levels = 0
    while levels < 4 and b"[]" in data:
        data = data.replace(b"[]", b"")
        levels += 1
    if levels + data.count(b"[") <= limit:
        return False
    # Depth just before the k-th "]" is the number of "[" up to it less k.
    return levels + max(map(operator.sub, accumulate(map(len, data.split(b"]"))), count())) > limit


def _has_nul(value: Any) -> bool:
    pending = [value]  # a work list, not recursion: depth is bounded, but need not be trusted
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            if any("\x00" in key for key in item):
                return True
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def require_enum(field: str, value: int, allowed: Mapping[Any, str]) -> str:
    if value not in allowed:
        raise InvalidArgument(field, f"must be one of {', '.join(sorted(allowed.values()))}")
    return allowed[value]


def require_positive(field: str, value: int) -> int:
    if value <= 0:
        raise InvalidArgument(field, "must be positive")
    return value


MIN_PRIORITY, MAX_PRIORITY = 1, 9


def optional_priority(field: str, value: int) -> int | None:
    """A run priority, 1 (lowest) .. 9 (highest); 0 = unset (None)."""
    if value == 0:
        return None
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidArgument(field, f"must be between {MIN_PRIORITY} and {MAX_PRIORITY} (0 = the default)")
    return value


def require_non_negative(field: str, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise InvalidArgument(field, "must be a finite number, not negative")
    return value


def require_lease(lease: Any) -> tuple[uuid.UUID, str, int]:
    run_id = require_uuid("lease.run_id", lease.run_id)
    worker = require_text("lease.worker_id", lease.worker_id)
    if lease.fencing_token <= 0:
        raise InvalidArgument("lease.fencing_token", "must be positive (from ClaimWork)")
    return run_id, worker, lease.fencing_token


# ---------------------------------------------------------------------- journal entries and per-field limits

JOURNAL_KINDS = ("tool", "sleep", "input", "approval", "finish", "fail", "exception", "result", "answer", "retry")
_JOURNAL_KINDS = frozenset(JOURNAL_KINDS)
_EMPTY_OBJECT = CanonicalJson("{}")


def require_size(field: str, text: str, limit: int, setting: str) -> None:
    """Refuses JSON text over a per-field limit, naming the field, the setting and both sizes."""
    # At most 4 UTF-8 bytes per character: short text needs no encoding to be measured.
    if len(text) > limit // 4:
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise InvalidArgument(field, f"is {size} bytes, over the {limit}-byte limit ({setting})")


def require_journal(entries: Any, limit: int, max_entries: int,
                    setting: str = "max_journal_entry_bytes") -> list[tuple[int, str, str, str, str, CanonicalJson]]:
    """A request's journal entries, checked: (seq, kind, step_key, node, tool, canonical detail) each.

    At most `max_entries`; seqs positive and consecutive (whether they continue the
    run's journal is the write's own check); kind one of JOURNAL_KINDS; step_key a
    step key when given; node and tool short text; detail_json a JSON object of at
    most `limit` bytes (empty = {}). The read-only fields (run_version, created_at)
    are ignored.
    """
    if len(entries) > max_entries:
        raise InvalidArgument("journal", f"at most {max_entries} entries per call, not {len(entries)}")
    checked: list[tuple[int, str, str, str, str, CanonicalJson]] = []
    for index, entry in enumerate(entries):
        name = f"journal[{index}]"
        if entry.seq <= 0:
            raise InvalidArgument(f"{name}.seq", "must be positive")
        if checked and entry.seq != checked[-1][0] + 1:
            raise InvalidArgument(f"{name}.seq", f"must be {checked[-1][0] + 1}: the entries' seqs are consecutive")
        if entry.kind not in _JOURNAL_KINDS:
            raise InvalidArgument(f"{name}.kind", f"must be one of {', '.join(JOURNAL_KINDS)}")
        step_key = require_step_key(f"{name}.step_key", entry.step_key) if entry.step_key else ""
        node = optional_text(f"{name}.node", entry.node, max_len=200) or ""
        tool = optional_text(f"{name}.tool", entry.tool, max_len=200) or ""
        require_size(f"{name}.detail_json", entry.detail_json, limit, setting)
        _, detail = parse_json_canonical(f"{name}.detail_json", entry.detail_json, limit)
        checked.append((entry.seq, entry.kind, step_key, node, tool, detail or _EMPTY_OBJECT))
    return checked
