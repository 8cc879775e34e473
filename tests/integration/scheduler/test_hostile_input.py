"""Hostile input through the real gRPC server and PostgreSQL (issue 11).

JSON nested deeper than the one depth limit (validate.MAX_JSON_DEPTH), bytes
that are no protobuf message, a message over gRPC's receive limit, and the
tenant header given twice. Each is refused with a definite status naming what
was wrong (never INTERNAL or UNKNOWN), and nothing is written.
tests/integration/scheduler/test_bad_input.py sends the depth cases to every JSON field.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import asyncpg
import grpc
import pytest
from support import claim, eid, lease_ref, scheduler_stack, submit

from scheduler.api.service import RunServicer, WorkServicer
from scheduler.api.validate import MAX_JSON_DEPTH
from scheduler.config import SchedulerSettings
from scheduler.server import max_receive_bytes
from shared.errors import error_info
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration

INVALID = grpc.StatusCode.INVALID_ARGUMENT
TABLES = ("agent_runs", "agent_checkpoints", "tool_executions", "outbox")
CORRUPT = b"\x0a\xff\xff\xff\xff\x0f"  # field 1 claims a length far past the end of the message
RUN_RPCS = {"SubmitRun", "GetRun", "ListRuns", "CancelRun", "ResumeRun", "ResolveToolExecution", "GetRunHistory",
            "GetStats"}
WORK_RPCS = {"ClaimWork", "Heartbeat", "SaveCheckpoint", "BeginToolCall", "CompleteToolCall", "MarkToolInDoubt",
             "FinishRun", "CompleteAndBeginToolCall", "WriteBatch"}


def nested(depth: int, leaf: str = "1") -> str:
    """An object of `depth` levels: {"a":[[...[leaf]...]]}."""
    return '{"a":' + "[" * (depth - 1) + leaf + "]" * (depth - 1) + "}"


TOO_DEEP = {
    "one level too deep": nested(MAX_JSON_DEPTH + 1),
    "980 deep": nested(980),
    "NUL 400 deep": nested(400, '"x\\u0000"'),
}


async def snapshot(db: asyncpg.Connection) -> dict[str, list[dict[str, Any]]]:
    return {table: [dict(r) for r in await db.fetch(f"SELECT * FROM {table} ORDER BY 1, 2")] for table in TABLES}


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    return error.value


def assert_invalid(error: grpc.aio.AioRpcError, field: str, words: str) -> None:
    assert error.code() == INVALID, (error.code(), error.details())
    info = error_info(error)
    assert info is not None and (info.reason, info.metadata["field"]) == ("INVALID_ARGUMENT", field)
    assert words in (error.details() or ""), error.details()


def is_canonical_and_hashed(checkpoint: Any, text: str) -> bool:
    return checkpoint.state_json == text and checkpoint.state_hash == hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------- JSON nesting depth


async def test_input_json_nested_to_the_limit_is_kept_and_deeper_is_refused(db_url, db):
    at_limit = nested(MAX_JSON_DEPTH)
    async with scheduler_stack(db_url) as stack:
        reply = await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json=at_limit),
                                           metadata=stack.md())
        run = await stack.runs.GetRun(rs.GetRunRequest(run_id=reply.run.run_id), metadata=stack.md())
        assert reply.run.input_json == run.input_json == at_limit
        before = await snapshot(db)
        for text in TOO_DEEP.values():
            error = await refused(stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json=text),
                                                       metadata=stack.md()))
            assert_invalid(error, "input_json", f"input_json: nests deeper than {MAX_JSON_DEPTH} levels")
        assert await snapshot(db) == before, "a refused submit wrote rows"


async def test_state_json_nested_to_the_limit_is_kept_and_deeper_is_refused(db_url, db):
    at_limit = nested(MAX_JSON_DEPTH)
    async with scheduler_stack(db_url) as stack:
        await submit(stack)
        lease = await claim(stack)
        assert lease is not None
        ref = lease_ref(lease)
        before = await snapshot(db)
        for text in TOO_DEEP.values():
            request = ws.SaveCheckpointRequest(lease=ref, expected_version=0, state_json=text, schema_version=1,
                                               event_id=eid())
            error = await refused(stack.work.SaveCheckpoint(request))
            assert_invalid(error, "state_json", f"state_json: nests deeper than {MAX_JSON_DEPTH} levels")
            item = ws.WriteBatchItem(save_checkpoint=request)
            batch = await stack.work.WriteBatch(ws.WriteBatchRequest(items=[item]))
            item = batch.results[0].error
            assert (item.code, item.metadata["field"]) == (INVALID.value[0], "state_json"), item.message
        assert await snapshot(db) == before, "a refused checkpoint wrote rows"
        saved = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=ref, expected_version=0, state_json=at_limit, schema_version=1, event_id=eid()))
        history = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=lease.run.run_id),
                                                 metadata=stack.md())
        assert saved.version == 1 and is_canonical_and_hashed(history.checkpoints[-1], at_limit)


# ---------------------------------------------------------------------- bytes that are no message


def served_methods() -> list[tuple[str, str]]:
    """(service, method) of every method a servicer implements (the @rpc ones)."""
    methods = [("agentrt.v1.RunService", name) for name in dir(RunServicer)
               if hasattr(getattr(RunServicer, name), "core")]
    methods += [("agentrt.v1.WorkService", name) for name in dir(WorkServicer)
                if hasattr(getattr(WorkServicer, name), "core")]
    assert {name for _, name in methods} >= RUN_RPCS | WORK_RPCS
    return methods


def raw(stack: Any, path: str) -> Any:
    return stack.channel.unary_unary(path, request_serializer=None, response_deserializer=None)


@pytest.mark.parametrize(("service", "method"), served_methods(), ids=lambda part: part.rpartition(".")[2])
async def test_bytes_that_are_no_message_are_invalid_argument(db_url, db, service, method):
    async with scheduler_stack(db_url) as stack:
        await submit(stack)
        before = await snapshot(db)
        for garbage in (CORRUPT, b"\xff" * 64, b"\x0a\x05ab"):  # bad length, bad tag, truncated string
            error = await refused(raw(stack, f"/{service}/{method}")(garbage, metadata=stack.md(), timeout=30))
            message_type = f"agentrt.v1.{method}Request"
            assert_invalid(error, "request", f"request: is not a valid {message_type} message")
            assert "Traceback" not in (error.debug_error_string() or "")
        assert await snapshot(db) == before


async def test_executor_token_is_checked_before_the_bytes(db_url):
    async with scheduler_stack(db_url, work_token="s3cret") as stack:
        call = raw(stack, "/agentrt.v1.WorkService/FinishRun")
        error = await refused(call(CORRUPT, timeout=30))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        error = await refused(call(CORRUPT, metadata=[("authorization", "Bearer s3cret")], timeout=30))
        assert_invalid(error, "request", "agentrt.v1.FinishRunRequest")


async def test_message_over_the_receive_limit_is_resource_exhausted(db_url, db):
    settings = {"max_payload_bytes": 1024}
    limit = max_receive_bytes(SchedulerSettings(database_url=db_url, **settings))
    assert limit == 1024 * 4 + (1 << 20)  # docs/errors.md's table states this formula
    async with scheduler_stack(db_url, **settings) as stack:
        before = await snapshot(db)
        submit_run = raw(stack, "/agentrt.v1.RunService/SubmitRun")
        error = await refused(submit_run(CORRUPT.ljust(limit + 1, b"\x00"), metadata=stack.md(), timeout=30))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
        # At the limit the message reaches the scheduler: malformed, then too big a field.
        error = await refused(submit_run(CORRUPT.ljust(limit, b"\x00"), metadata=stack.md(), timeout=30))
        assert_invalid(error, "request", "agentrt.v1.SubmitRunRequest")
        big = rs.SubmitRunRequest(agent_name="demo", input_json=json.dumps({"blob": "x" * (limit - 64)}))
        assert len(big.SerializeToString()) <= limit
        error = await refused(stack.runs.SubmitRun(big, metadata=stack.md(), timeout=30))
        assert_invalid(error, "input_json", "payload limit")
        bigger = rs.SubmitRunRequest(agent_name="demo", input_json=json.dumps({"blob": "x" * limit}))
        error = await refused(stack.runs.SubmitRun(bigger, metadata=stack.md(), timeout=30))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await snapshot(db) == before


# ---------------------------------------------------------------------- the tenant header


@pytest.mark.parametrize("tenants", [("tenant-a", "tenant-b"), ("tenant-a", "tenant-a")], ids=["differ", "same"])
async def test_tenant_header_given_twice_is_refused(db_url, db, tenants):
    metadata = [("x-tenant-id", tenant) for tenant in tenants]
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack)
        before = await snapshot(db)
        for call in (stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json="{}"), metadata=metadata),
                     stack.runs.GetRun(rs.GetRunRequest(run_id=run.run_id), metadata=metadata),
                     stack.runs.CancelRun(rs.CancelRunRequest(run_id=run.run_id), metadata=metadata)):
            assert_invalid(await refused(call), "x-tenant-id", "must be given once")
        assert await snapshot(db) == before
