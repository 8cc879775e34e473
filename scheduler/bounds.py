"""The one table of numeric bounds: every numeric field of every RPC request (docs/errors.md,
Numeric bounds), the ranges the numbers in runtime flow limits may take, and the storage ranges the
scheduler's settings are bounded by (scheduler/config.py).

A bound comes from what storage holds (a PostgreSQL integer column or parameter holds 2^31-1, a
bigint 2^63-1, a double precision only finite numbers) and from what makes sense (counts are not
negative, a page holds at most a few hundred rows, a wait is at most a year). Numbers outside it
were accepted before and failed later, where they were stored or used, as INTERNAL: a tool rate
of 99999999999999999999/s made every BeginToolCall of the tool fail.

`check_request` is called by the rpc wrapper (scheduler/api/rpc.py) before any handler runs, so a
number out of range is INVALID_ARGUMENT naming the field and its range, and nothing is read or
written. Rules between fields (sleep_ms only with SLEEP, exactly one of interval_ms and cron)
stay with their handlers. Every numeric field the request messages hold must have an entry here
(tests/unit/test_bounds.py walks the proto descriptors); one without is refused unless it is 0.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from shared.errors import InvalidArgument

INT4_MAX = 2**31 - 1  # PostgreSQL integer
INT8_MAX = 2**63 - 1  # PostgreSQL bigint
MAX_COUNT = 1_000_000_000  # a count a limit may hold (runs, calls, slots): well within integer
MAX_WAIT_MS = 366 * 24 * 3600 * 1000  # a sleep, an interval, a catch-up window: a year
MAX_PAGE_SIZE = 500
MAX_JOURNAL_PAGE_SIZE = 5000  # ReadJournal
MAX_TREE_RUNS = 10_000  # GetRunTree
MAX_MAX_ATTEMPTS = 1000
MAX_KEY_LIFETIME_S = 10 * 366 * 24 * 3600
MAX_BUDGET_STEPS = MAX_COUNT
MAX_BUDGET_TOKENS = 10**15
MAX_BUDGET_USD = 1e12
MIN_PRIORITY, MAX_PRIORITY = 1, 9
# A tenant's fair-share weight. Each run moves its tenant's pass by 1/weight: a weight near 0
# (1e-320) would move it by infinity.
MIN_WEIGHT, MAX_WEIGHT = 0.001, 1000.0
MAX_PAYLOAD_BYTES = 128 * 1024 * 1024  # a JSON field (jsonb holds < 256 MiB; gRPC's limit is 4x + 1 MiB)
# What datetime (and so a Timestamp the scheduler stores) can hold: 0001-01-01 .. 9999-12-31.
TIMESTAMP_SECONDS = (-62_135_596_800, 253_402_300_799)
TIMESTAMP = "google.protobuf.Timestamp"
DONE_BY_ITEM = frozenset({"agentrt.v1.WriteBatchRequest.items"})  # each item is checked as its own call


@dataclass(frozen=True)
class Bound:
    """low..high inclusive; `unset` says what 0 means when 0 is allowed outside low..high."""

    low: int | float
    high: int | float
    unset: str | None = None

    def allows(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return self.low <= value <= self.high or (value == 0 and self.unset is not None)

    def describe(self) -> str:
        text = f"must be between {self.low:g} and {self.high:g}" if isinstance(self.high, float) \
            else f"must be between {self.low} and {self.high}"
        return text + (f", or 0 ({self.unset})" if self.unset is not None else "")

    def check(self, field: str, value: Any) -> Any:
        if not self.allows(value):
            raise InvalidArgument(field, self.describe())
        return value


def _same(bound: Bound, *names: str) -> dict[str, Bound]:
    return dict.fromkeys(names, bound)


_V = "agentrt.v1."
_EXPECTED_VERSION = Bound(0, INT8_MAX - 1)  # the version the write makes (expected + 1) is a bigint too
# agent_checkpoints.schema_version integer; 0 where no checkpoint is written (NOT_EXECUTED), the
# handler requiring it where one is.
_SCHEMA_VERSION = Bound(1, INT4_MAX, "no checkpoint: NOT_EXECUTED")

# Every numeric field of every request message, by its full proto name.
RPC_FIELDS: dict[str, Bound] = {
    # RunService
    _V + "SubmitRunRequest.max_attempts": Bound(1, MAX_MAX_ATTEMPTS, "the server's default_max_attempts"),
    _V + "SubmitRunRequest.priority": Bound(MIN_PRIORITY, MAX_PRIORITY, "the agent's or the server's default"),
    **_same(Bound(MIN_PRIORITY, MAX_PRIORITY, "no bound"), _V + "ListRunsRequest.min_priority",
            _V + "ListRunsRequest.max_priority"),
    _V + "Budget.max_steps": Bound(0, MAX_BUDGET_STEPS),  # 0 = no limit; bigint column
    _V + "Budget.max_tokens": Bound(0, MAX_BUDGET_TOKENS),
    _V + "Budget.max_cost_usd": Bound(0, MAX_BUDGET_USD),  # double precision: finite only
    **_same(Bound(0, MAX_PAGE_SIZE), *(_V + f"{m}.page_size" for m in (
        "ListRunsRequest", "GetRunHistoryRequest", "ListAuditEventsRequest", "ListApiKeysRequest"))),
    _V + "GetRunTreeRequest.max_runs": Bound(0, MAX_TREE_RUNS),  # 0 = 1000
    _V + "CreateApiKeyRequest.expires_in_s": Bound(0, MAX_KEY_LIFETIME_S),  # 0 = never
    _V + "ScheduleSpec.interval_ms": Bound(1000, MAX_WAIT_MS, "a cron schedule"),
    _V + "ScheduleSpec.catch_up_window_ms": Bound(0, MAX_WAIT_MS),  # 0 = 60000
    _V + "ScheduleSpec.jitter_ms": Bound(0, 3_600_000),
    # WorkService
    _V + "LeaseRef.fencing_token": Bound(1, INT8_MAX),  # from ClaimWork; bigint
    **_same(_EXPECTED_VERSION, *(_V + f"{m}.expected_version" for m in (
        "SaveCheckpointRequest", "BeginToolCallRequest", "CompleteToolCallRequest",
        "CompleteAndBeginToolCallRequest", "FinishRunRequest"))),
    **_same(_SCHEMA_VERSION, *(_V + f"{m}.schema_version" for m in (
        "SaveCheckpointRequest", "CompleteToolCallRequest", "CompleteAndBeginToolCallRequest"))),
    _V + "SaveCheckpointRequest.consume_signal_seqs": Bound(1, INT8_MAX),  # run_signals.seq bigint
    _V + "JournalEntry.seq": Bound(1, INT8_MAX - 1),  # run_journal.seq bigint; the run's length + 1 too
    _V + "JournalEntry.run_version": Bound(0, INT8_MAX),  # read-only: ignored in requests
    _V + "FinishRunRequest.sleep_ms": Bound(1, MAX_WAIT_MS, "no sleep: only without SLEEP"),
    _V + "FinishRunRequest.signals_seen": Bound(0, INT8_MAX),  # a run_signals.seq
    _V + "ClaimWorkRequest.wait_ms": Bound(0, 3_600_000),  # then capped by max_claim_wait_ms
    _V + "RegisterAgentsRequest.ttl_ms": Bound(1000, 3_600_000),
    _V + "AgentRegistration.default_priority": Bound(MIN_PRIORITY, MAX_PRIORITY, "the server's default"),
    _V + "AgentRegistration.concurrency_max": Bound(1, MAX_COUNT, "no concurrency key"),  # integer column
    _V + "ReadJournalRequest.after_seq": Bound(0, INT8_MAX),
    _V + "ReadJournalRequest.page_size": Bound(0, MAX_JOURNAL_PAGE_SIZE),  # 0 = 1000
    # Timestamps: what the scheduler can turn into a datetime and store (reported as the timestamp field).
    TIMESTAMP + ".seconds": Bound(*TIMESTAMP_SECONDS),
    TIMESTAMP + ".nanos": Bound(0, 999_999_999),
}

NUMERIC_TYPES = frozenset({
    FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_SFIXED64, FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT})
_UNBOUNDED = Bound(0, 0)  # a numeric field missing from the table: only its default passes (fail closed)


def numeric_fields(message: Descriptor, _seen: frozenset[str] = frozenset()) -> set[str]:
    """The full names of every numeric field a message holds, at any depth (map entries included)."""
    if message.full_name in _seen:
        return set()
    found: set[str] = set()
    for field in message.fields:
        if field.type in NUMERIC_TYPES:
            found.add(field.full_name)
        elif field.message_type is not None and field.full_name not in DONE_BY_ITEM:
            found |= numeric_fields(field.message_type, _seen | {message.full_name})
    return found


_NUMBER, _ONE, _MANY, _MAP = range(4)
_PLANS: dict[str, tuple[tuple[int, str, Any, bool], ...]] = {}


def _plan(descriptor: Descriptor) -> tuple[tuple[int, str, Any, bool], ...]:
    """What check_request visits in a message of this type, worked out once per type: each numeric
    field with its bound, and each field holding messages that may hold numbers. Parts that hold
    none (text, ids, JSON) are never looked at: the check runs before every call."""
    plan = _PLANS.get(descriptor.full_name)
    if plan is not None:
        return plan
    steps: list[tuple[int, str, Any, bool]] = []
    for field in descriptor.fields:
        if field.type in NUMERIC_TYPES:
            steps.append((_NUMBER, field.name, RPC_FIELDS.get(field.full_name, _UNBOUNDED), field.is_repeated))
        elif field.message_type is not None and field.full_name not in DONE_BY_ITEM:
            held = field.message_type
            if not (numeric_fields(held) or held.full_name == TIMESTAMP):
                continue
            if held.GetOptions().map_entry:
                steps.append((_MAP, field.name, held, True))
            else:
                steps.append((_MANY if field.is_repeated else _ONE, field.name, None, field.is_repeated))
    _PLANS[descriptor.full_name] = plan = tuple(steps)
    return plan


def check_request(message: Any, path: str = "") -> None:
    """Every numeric field of `message` (and of the messages it holds) within its bound, or
    InvalidArgument naming the first that is not (`budget.max_steps`, `journal[2].seq`)."""
    descriptor = message.DESCRIPTOR
    if descriptor.full_name == TIMESTAMP:
        _check_timestamp(message, path)
        return
    for kind, name, extra, repeated in _plan(descriptor):
        if kind == _NUMBER:
            values = getattr(message, name)
            for value in values if repeated else (values,):
                if not extra.allows(value):
                    raise InvalidArgument(f"{path}.{name}" if path else name, extra.describe())
        elif kind == _ONE:
            if message.HasField(name):
                check_request(getattr(message, name), f"{path}.{name}" if path else name)
        elif kind == _MANY:
            for index, item in enumerate(getattr(message, name)):
                check_request(item, f"{path}.{name}[{index}]" if path else f"{name}[{index}]")
        else:
            _check_map(getattr(message, name), extra, f"{path}.{name}" if path else name)


def _check_map(entries: Any, entry: Descriptor, field: str) -> None:
    value = entry.fields_by_name["value"]
    for key in entries:
        item = entries[key]
        if value.type in NUMERIC_TYPES:
            RPC_FIELDS.get(value.full_name, _UNBOUNDED).check(f"{field}[{key}]", item)
        elif value.type == FieldDescriptor.TYPE_MESSAGE:
            check_request(item, f"{field}[{key}]")


def _check_timestamp(stamp: Any, field: str) -> None:
    seconds, nanos = RPC_FIELDS[TIMESTAMP + ".seconds"], RPC_FIELDS[TIMESTAMP + ".nanos"]
    if not (seconds.allows(stamp.seconds) and nanos.allows(stamp.nanos)):
        low, high = (dt.datetime.fromtimestamp(s, dt.UTC).date() for s in TIMESTAMP_SECONDS)
        raise InvalidArgument(field, f"is not a valid timestamp: {low} .. {high}, nanos 0 .. 999999999")
