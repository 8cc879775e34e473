"""Numbers at their extremes through a real scheduler and PostgreSQL (issue 24, defect 3).

Every numeric field of every request of both services (found by walking the proto descriptors,
WriteBatch items included), and the numbers SetLimit takes as text, get 0, negatives, 2^31,
2^63-1, 2^64-1 where the type carries them, 1e300, NaN and ±infinity for doubles, first every
one of them and then what hypothesis draws. The answer is never INTERNAL (or UNKNOWN); a refusal
writes nothing (every table, read as the superuser, is compared before and after). A limit that
is accepted never makes a later call fail: the call it governs is made after it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc
import pytest
from db_snapshot import snapshot_all
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proto_paths import SERVICES, TYPE_RANGE, extremes, path_to, set_path
from support import TENANT, scheduler_stack
from test_bad_input import ITEM_OPS, S2, SETTINGS, TOOL, World, base_request, build_world

from scheduler.bounds import MAX_COUNT, numeric_fields
from shared.errors import error_info
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration
F = FieldDescriptor
BROKEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
# No claim waits: ClaimWork with a large wait_ms answers at once (its bound is checked, not waited out).
STACK_SETTINGS = {**SETTINGS, "max_claim_wait_ms": 0}


@dataclass(frozen=True)
class Target:
    """One numeric field of one RPC's request; `batched`: sent as that write's WriteBatch item."""

    rpc: str
    path: str
    field: FieldDescriptor
    batched: bool = False

    @property
    def id(self) -> str:
        return f"{'WriteBatch item ' if self.batched else ''}{self.rpc}.{self.path}"


def targets() -> list[Target]:
    found = []
    for service in SERVICES:
        for method in service.methods:
            for full_name in sorted(numeric_fields(method.input_type)):
                for path, field in path_to(method.input_type, full_name):
                    found.append(Target(method.name, path, field))
                    if method.name in ITEM_OPS:
                        found.append(Target(method.name, path, field, batched=True))
    return found


TARGETS = targets()


def values_of(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    low, high = TYPE_RANGE[field.type]
    if field.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return st.sampled_from(extremes(field)) | st.floats(allow_nan=True, allow_infinity=True)
    return st.sampled_from(extremes(field)) | st.integers(min_value=int(low), max_value=int(high))


class Sweep:
    """One scheduler and one set of runs for every call; the last snapshot of every table."""

    def __init__(self, loop: asyncio.AbstractEventLoop, url: str, stack: Any, world: World) -> None:
        self.loop, self.url, self.stack, self.world = loop, url, stack, world
        self.rows = self.run(snapshot_all(url))
        self.calls = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _call(self, rpc: str, request: Message) -> tuple[grpc.StatusCode, str | None, str]:
        stub = self.stack.runs if hasattr(self.stack.runs, rpc) else self.stack.work
        try:
            await getattr(stub, rpc)(request, metadata=[("x-tenant-id", TENANT)], timeout=30)
        except grpc.aio.AioRpcError as error:
            info = error_info(error)
            return error.code(), info.metadata.get("field") if info else None, error.details() or ""
        return grpc.StatusCode.OK, None, ""

    def call(self, rpc: str, request: Message, what: str) -> tuple[grpc.StatusCode, str | None]:
        """The call's code and refused field; asserts it is not INTERNAL and that a refusal wrote nothing."""
        self.calls += 1
        code, field, details = self.run(self._call(rpc, request))
        assert code not in BROKEN, (what, code, details)
        after = self.run(snapshot_all(self.url))
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            assert after == self.rows, f"{what}: refused ({details}) but changed rows"
        self.rows = after
        return code, field

    def send(self, target: Target, value: Any) -> None:
        request = base_request(target.rpc, self.world)
        named = set_path(request, target.path, target.field, value)
        what = f"{target.id} = {value!r}"
        if not target.batched:
            code, field = self.call(target.rpc, request, what)
            if code == grpc.StatusCode.INVALID_ARGUMENT and field is not None and field.split(".")[-1] in (
                    target.field.name, "deadline", "since", "until", "created_at"):
                assert field == named, (what, field)
            return
        item = ws.WriteBatchItem()
        getattr(item, ITEM_OPS[target.rpc]).CopyFrom(request)
        reply = self.run(self.stack.work.WriteBatch(ws.WriteBatchRequest(items=[item]), timeout=30))
        self.calls += 1
        result = reply.results[0]
        if result.WhichOneof("result") == "error":
            assert result.error.code not in {code.value[0] for code in BROKEN}, (what, result.error.message)
            after = self.run(snapshot_all(self.url))
            if result.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]:
                assert after == self.rows, f"{what}: refused ({result.error.message}) but changed rows"
            self.rows = after
        else:
            self.rows = self.run(snapshot_all(self.url))


@pytest.fixture
def sweep(db_url: str) -> Iterator[Sweep]:
    loop = asyncio.new_event_loop()
    context = scheduler_stack(db_url, **STACK_SETTINGS)
    stack = loop.run_until_complete(context.__aenter__())
    try:
        world = loop.run_until_complete(build_world(stack))
        yield Sweep(loop, db_url, stack, world)
    finally:
        loop.run_until_complete(context.__aexit__(None, None, None))
        loop.close()


def test_the_sweep_reaches_every_numeric_field_of_both_services():
    rpcs = {target.rpc for target in TARGETS}
    assert {"SubmitRun", "SaveCheckpoint", "FinishRun", "CreateSchedule", "ListAuditEvents", "SpawnChildren",
            "RegisterAgents"} <= rpcs
    assert any(t.batched for t in TARGETS) and any(t.path == "children.budget.max_cost_usd" for t in TARGETS)


def test_every_extreme_of_every_numeric_field_is_answered_and_a_refusal_writes_nothing(sweep):
    for target in TARGETS:
        for value in extremes(target.field):
            sweep.send(target, value)
    assert sweep.calls >= len(TARGETS) * 5


def test_numeric_fields_at_random_never_answer_internal(sweep):
    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data: st.DataObject) -> None:
        target = data.draw(st.sampled_from(TARGETS), label="target")
        sweep.send(target, data.draw(values_of(target.field), label="value"))

    check()


# ---------------------------------------------------------------------- numbers in SetLimit's text

NUMBERS = ["0", "1", "-1", str(2**31), str(2**31 - 1), str(2**63 - 1), str(2**63), str(2**64 - 1), str(MAX_COUNT),
           str(MAX_COUNT + 1), "99999999999999999999", "1e300", "1.5", "-0", "nan", "inf", "-inf", "1e-320", "²",
           "0.001", "1000"]
LIMITS = [("tool", "rate", {"subject": TOOL}), ("tool", "concurrency", {"subject": TOOL}),
          ("tool", "rate", {"subject": TOOL, "tenant_id": TENANT}),
          ("tenant", "weight", {"tenant_id": TENANT}), ("tenant", "max_queued_runs", {"tenant_id": "*"}),
          ("tenant", "max_submits_per_s", {"tenant_id": TENANT}), ("tenant", "max_running", {"tenant_id": TENANT}),
          ("agent", "max_running", {"subject": "bi-queued"})]


def limit_texts() -> st.SearchStrategy[str]:
    number = st.sampled_from(NUMBERS) | st.integers(min_value=-2**70, max_value=2**70).map(str) \
        | st.floats(allow_nan=True, allow_infinity=True).map(repr)
    return st.tuples(number, st.sampled_from(["", "/s", "/min", "/h", "/fortnight"])).map("".join)


def governed_calls(sweep: Sweep, scope: str) -> None:
    """The calls a limit of `scope` is read by: none may fail because of what SetLimit accepted."""
    if scope == "tool":
        request = base_request("BeginToolCall", sweep.world)
        request.step_key, request.idempotency_key = S2, f"k-{uuid.uuid4()}"
        sweep.call("BeginToolCall", request, "BeginToolCall under the limit")
    else:
        sweep.call("SubmitRun", rs.SubmitRunRequest(agent_name="bi-queued"), "SubmitRun under the limit")
        sweep.call("ClaimWork", ws.ClaimWorkRequest(worker_id="w-limits", agents=["bi-none"], wait_ms=0),
                   "ClaimWork under the limit")
        sweep.call("GetStats", rs.GetStatsRequest(), "GetStats under the limit")


def set_limit(sweep: Sweep, scope: str, name: str, where: dict[str, str], text: str) -> grpc.StatusCode:
    request = rs.SetLimitRequest(scope=scope, name=name, value=text, note=rs.AuditNote(reason="sweep"), **where)
    code, field = sweep.call("SetLimit", request, f"SetLimit {scope} {name} = {text!r}")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert field == "value", (scope, name, text, field)
    governed_calls(sweep, scope)
    return code


def test_setlimit_refuses_numbers_it_cannot_store_and_an_accepted_one_fails_nothing(sweep):
    accepted = set()
    for scope, name, where in LIMITS:
        for number in NUMBERS:
            for unit in (["/s", "/h", ""] if name == "rate" else [""]):
                if set_limit(sweep, scope, name, where, number + unit) == grpc.StatusCode.OK:
                    accepted.add((name, number + unit))
    assert ("rate", f"{MAX_COUNT}/s") in accepted and ("rate", "99999999999999999999/s") not in accepted
    assert ("weight", "1000") in accepted and ("weight", "1e-320") not in accepted

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(LIMITS), limit_texts())
    def check(limit: tuple[str, str, dict[str, str]], text: str) -> None:
        set_limit(sweep, *limit, text)

    check()


async def test_the_reported_rate_is_refused_naming_its_range_and_the_tool_keeps_working(db_url):
    """The issue's case: rate 99999999999999999999/s answered OK, then every BeginToolCall was INTERNAL."""
    async with scheduler_stack(db_url, **STACK_SETTINGS) as stack:
        world = await build_world(stack)
        before = await snapshot_all(db_url)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stack.runs.SetLimit(rs.SetLimitRequest(scope="tool", subject=TOOL, name="rate",
                                                         value="99999999999999999999/s"), metadata=stack.md())
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(refused.value).metadata["field"] == "value"
        assert f"1 to {MAX_COUNT} calls per window" in refused.value.details()
        assert await snapshot_all(db_url) == before
        request = base_request("BeginToolCall", world)
        reply = await stack.work.BeginToolCall(request, timeout=30)
        assert reply.execution.step_key == S2


async def test_a_stored_limit_out_of_range_is_skipped_not_failing_every_call(db_url):
    """A row written before its bound existed (by an older version) is logged and left out."""
    async with scheduler_stack(db_url, **STACK_SETTINGS, limits_refresh_ms=0) as stack:
        world = await build_world(stack)
        conn = await asyncpg.connect(db_url)
        try:
            await conn.execute("INSERT INTO flow_limits (scope, tenant_id, subject, limit_name, value, updated_by) "
                               "VALUES ('tool', '', $1, 'rate', '99999999999999999999/s', 'older version')", TOOL)
        finally:
            await conn.close()
        reply = await stack.work.BeginToolCall(base_request("BeginToolCall", world), timeout=30)
        assert reply.execution.step_key == S2
        listed = await stack.runs.ListLimits(rs.ListLimitsRequest(), metadata=stack.md())
        assert [limit.value for limit in listed.limits] == ["99999999999999999999/s"]  # shown, to be cleared
