"""ListRuns' server-side filters (labels, priority range, tenant for a '*' admin, creation time) with
keyset pages bound to them, CancelRun's keep_children, and RetryRun (a new run from a FAILED or
CANCELLED one: idempotent by request_id, audited, its sealed input sealed again under its own key)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg
import grpc
import pytest
from auth_support import make_key
from google.protobuf.timestamp_pb2 import Timestamp
from sealing_support import K1, SECRET, keyring, raw_tables, register
from support import TENANT, Stack, claim, eid, lease_ref, reason_of, rpc_error, scheduler_stack, submit

from shared.errors import error_info
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration
INVALID = grpc.StatusCode.INVALID_ARGUMENT


async def list_all(stack: Stack, size: int, metadata: Any = None, **filters: Any) -> tuple[list[str], int]:
    """Every run the filters match, page by page: (ids, pages)."""
    ids: list[str] = []
    token, pages = "", 0
    while True:
        reply = await stack.runs.ListRuns(rs.ListRunsRequest(page_size=size, page_token=token, **filters),
                                          metadata=stack.md() if metadata is None else metadata)
        ids += [r.run_id for r in reply.runs]
        pages += 1
        token = reply.next_page_token
        if not token:
            return ids, pages


def field_of(error: grpc.aio.AioRpcError) -> str | None:
    info = error_info(error)
    return info.metadata.get("field") if info else None


def stamp(value: Any) -> Timestamp:
    result = Timestamp()
    result.FromDatetime(value)
    return result


async def newest_first(db: asyncpg.Connection, where: str = "true") -> list[str]:
    return [r["id"] for r in await db.fetch(
        f"SELECT id::text FROM agent_runs WHERE tenant_id = 'tenant-a' AND {where} ORDER BY created_at DESC, id DESC")]


async def test_each_filter_and_their_combination_page_through_matching_runs_only(db_url, db):
    async with scheduler_stack(db_url) as stack:
        made = []
        for i in range(12):
            labels = {"team": "a" if i % 2 else "b", "env": "prod" if i % 3 else "dev"}
            made.append(await submit(stack, labels=labels, priority=1 + i % 9))
        await submit(stack, labels={"team": "a", "env": "prod"}, tenant="tenant-b")  # never listed
        middle = await db.fetchval("SELECT created_at FROM agent_runs WHERE id = $1::uuid", made[6].run_id)

        ids, pages = await list_all(stack, 2, labels={"team": "a"})
        assert ids == await newest_first(db, "labels @> '{\"team\": \"a\"}'") and len(ids) == 6 and pages == 3
        ids, _ = await list_all(stack, 2, labels={"team": "a", "env": "dev"})
        assert ids == await newest_first(db, "labels @> '{\"team\": \"a\", \"env\": \"dev\"}'") and len(ids) == 2
        assert (await list_all(stack, 5, labels={"team": "c"}))[0] == []
        ids, _ = await list_all(stack, 3, min_priority=4, max_priority=6)
        assert ids == await newest_first(db, "priority BETWEEN 4 AND 6") and len(ids) == 3
        assert (await list_all(stack, 3, min_priority=9))[0] == await newest_first(db, "priority >= 9")
        assert (await list_all(stack, 3, max_priority=2))[0] == await newest_first(db, "priority <= 2")
        ids, _ = await list_all(stack, 4, created_after=stamp(middle))
        assert ids == await newest_first(db, f"created_at >= '{middle.isoformat()}'") and len(ids) == 6
        ids, _ = await list_all(stack, 4, created_before=stamp(middle))
        assert ids == await newest_first(db, f"created_at < '{middle.isoformat()}'") and len(ids) == 6
        # Every filter at once, with a status and an agent, across pages of one.
        ids, pages = await list_all(stack, 1, labels={"team": "a"}, min_priority=3, max_priority=9,
                                    created_after=stamp(middle), statuses=[pb.RUN_STATUS_QUEUED], agent_name="demo")
        expected = await newest_first(
            db, f"labels @> '{{\"team\": \"a\"}}' AND priority >= 3 AND created_at >= '{middle.isoformat()}'")
        assert ids == expected and expected and pages == len(expected)


async def test_a_page_token_continues_only_the_listing_it_was_issued_for(db_url):
    async with scheduler_stack(db_url) as stack:
        for i in range(4):
            await submit(stack, labels={"team": "a"}, priority=5 + i % 2)
        first = await stack.runs.ListRuns(rs.ListRunsRequest(page_size=1, labels={"team": "a"}, min_priority=5),
                                          metadata=stack.md())
        assert first.next_page_token
        again = await stack.runs.ListRuns(rs.ListRunsRequest(
            page_size=1, labels={"team": "a"}, min_priority=5, page_token=first.next_page_token), metadata=stack.md())
        assert again.runs[0].run_id != first.runs[0].run_id
        for other in ({"labels": {"team": "b"}, "min_priority": 5}, {"labels": {"team": "a"}},
                      {"labels": {"team": "a"}, "min_priority": 5, "max_priority": 9},
                      {"labels": {"team": "a"}, "min_priority": 5, "created_after": Timestamp(seconds=1)}):
            error = await rpc_error(stack.runs.ListRuns(rs.ListRunsRequest(
                page_size=1, page_token=first.next_page_token, **other), metadata=stack.md()))
            assert (error.code(), field_of(error)) == (INVALID, "page_token"), other
            assert "different filter" in error.details()


@pytest.mark.parametrize(("request_fields", "field"), [
    ({"min_priority": 7, "max_priority": 2}, "min_priority"),
    ({"min_priority": 10}, "min_priority"),
    ({"max_priority": -3}, "max_priority"),
    ({"created_after": Timestamp(seconds=1_800_000_000), "created_before": Timestamp(seconds=1_700_000_000)},
     "created_before"),
    ({"created_after": Timestamp(seconds=10**12)}, "created_after"),
    ({"labels": {"k" * 101: "v"}}, "labels"),
    ({"tenant_id": "not a tenant"}, "tenant_id"),
], ids=["min above max", "min too high", "max negative", "after not before before", "after out of range",
        "label key too long", "tenant_id malformed"])
async def test_bad_filters_are_invalid_argument_naming_the_field(db_url, request_fields, field):
    async with scheduler_stack(db_url) as stack:
        error = await rpc_error(stack.runs.ListRuns(rs.ListRunsRequest(**request_fields), metadata=stack.md()))
        assert (error.code(), field_of(error)) == (INVALID, field), error.details()


async def test_tenant_id_lists_another_tenant_for_an_admin_of_every_tenant_only(db_url):
    async with scheduler_stack(db_url) as open_stack:
        theirs = [(await submit(open_stack, tenant="globex", labels={"team": "a"})).run_id for _ in range(3)]
        await submit(open_stack, tenant=TENANT, labels={"team": "a"})
    _, every = await make_key(db_url, role="admin", tenants=["*"])
    _, two = await make_key(db_url, role="admin", tenants=[TENANT, "globex"])
    _, viewer = await make_key(db_url, role="viewer", tenants=[TENANT])
    async with scheduler_stack(db_url, auth_mode="api_key", work_token="w-secret") as stack:
        def bearer(secret: str, tenant: str | None = None) -> list[tuple[str, str]]:
            return [("authorization", f"Bearer {secret}")] + ([("x-tenant-id", tenant)] if tenant else [])

        ids, pages = await list_all(stack, 2, bearer(every), tenant_id="globex", labels={"team": "a"})
        assert sorted(ids) == sorted(theirs) and pages == 2
        # Without tenant_id a '*' admin names the tenant as before; the token is bound to the tenant listed.
        page = await stack.runs.ListRuns(rs.ListRunsRequest(page_size=1, tenant_id="globex"), metadata=bearer(every))
        error = await rpc_error(stack.runs.ListRuns(rs.ListRunsRequest(page_size=1, page_token=page.next_page_token),
                                                    metadata=bearer(every, TENANT)))
        assert (error.code(), field_of(error)) == (INVALID, "page_token")
        for secret in (two, viewer):
            error = await rpc_error(stack.runs.ListRuns(rs.ListRunsRequest(tenant_id="globex"),
                                                        metadata=bearer(secret, TENANT)))
            assert (error.code(), reason_of(error)) == (grpc.StatusCode.PERMISSION_DENIED, "TENANT_NOT_ALLOWED")
        mine = await stack.runs.ListRuns(rs.ListRunsRequest(), metadata=bearer(viewer))
        assert [r.tenant_id for r in mine.runs] == [TENANT]


# ---------------------------------------------------------------------- CancelRun keep_children


async def parent_with_children(stack: Stack, count: int = 2) -> tuple[str, list[str]]:
    parent = await submit(stack, agent="parent")
    lease = await claim(stack, agents=("parent",))
    assert lease is not None and lease.run.run_id == parent.run_id
    spawned = await stack.work.SpawnChildren(ws.SpawnChildrenRequest(
        lease=lease_ref(lease), spawn_key="fan/attempt-1", join=ws.JOIN_MODE_ALL,
        children=[ws.ChildSpec(agent_name="kid", input_json="{}") for _ in range(count)]))
    return parent.run_id, [c.run_id for c in spawned.children]


async def statuses(stack: Stack, run_ids: list[str]) -> list[int]:
    return [(await stack.runs.GetRun(rs.GetRunRequest(run_id=r), metadata=stack.md())).status for r in run_ids]


async def test_cancel_with_keep_children_cancels_the_run_alone(db_url, db):
    async with scheduler_stack(db_url) as stack:
        parent, children = await parent_with_children(stack)
        flagged = await stack.runs.CancelRun(rs.CancelRunRequest(run_id=parent, reason="stop", keep_children=True,
                                                                 request_id="c-1"), metadata=stack.md())
        assert flagged.cancel_requested
        assert await statuses(stack, children) == [pb.RUN_STATUS_QUEUED] * 2
        # The same request_id with children taken along is another request.
        error = await rpc_error(stack.runs.CancelRun(rs.CancelRunRequest(run_id=parent, reason="stop",
                                                                         request_id="c-1"), metadata=stack.md()))
        assert error.code() == grpc.StatusCode.ALREADY_EXISTS
        assert await statuses(stack, children) == [pb.RUN_STATUS_QUEUED] * 2
        # Without keep_children (the default) the children go with their parent, as before.
        other, kids = await parent_with_children(stack)
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=other, reason="stop"), metadata=stack.md())
        assert await statuses(stack, kids) == [pb.RUN_STATUS_CANCELLED] * 2
        audit = await db.fetch("SELECT run_id::text FROM audit_log WHERE action = 'run.cancel' ORDER BY id")
        assert [a["run_id"] for a in audit] == [parent, other]


# ---------------------------------------------------------------------- RetryRun


async def failed_run(stack: Stack, **fields: Any) -> pb.Run:
    run = await submit(stack, agent="flaky", payload={"order": 7, "amount": 80.5}, **fields)
    lease = await claim(stack, agents=("flaky",))
    assert lease is not None
    await stack.work.FinishRun(ws.FinishRunRequest(lease=lease_ref(lease), expected_version=0,
                                                   outcome=ws.FINISH_OUTCOME_FAILED, reason="boom", event_id=eid()))
    return run


async def test_retry_starts_a_new_run_once_per_request_id_and_audits_it(db_url, db):
    async with scheduler_stack(db_url) as stack:
        old = await failed_run(stack, labels={"team": "a"}, priority=7, max_attempts=4,
                               budget=pb.Budget(max_steps=9))
        request = rs.RetryRunRequest(run_id=old.run_id, request_id="again-1", note=rs.AuditNote(reason="fixed"))
        reply = await stack.runs.RetryRun(request, metadata=stack.md())
        new = reply.run
        assert reply.created and new.run_id != old.run_id and new.status == pb.RUN_STATUS_QUEUED
        assert (new.agent_name, new.agent_version, json.loads(new.input_json), dict(new.labels), new.priority,
                new.max_attempts, new.budget.max_steps, new.tenant_id) == (
            "flaky", "", {"order": 7, "amount": 80.5}, {"team": "a"}, 7, 4, 9, TENANT)
        assert new.retry_of_run_id == old.run_id and new.attempt_count == 0
        rows = await db.fetchval("SELECT count(*) FROM agent_runs")
        again = await stack.runs.RetryRun(request, metadata=stack.md())
        assert (again.run.run_id, again.created) == (new.run_id, False)
        assert await db.fetchval("SELECT count(*) FROM agent_runs") == rows
        audit = await db.fetch("SELECT run_id::text, reason, request_id, state_after, principal FROM audit_log "
                               "WHERE action = 'run.retry'")
        assert len(audit) == 1 and audit[0]["run_id"] == old.run_id and audit[0]["reason"] == "fixed"
        assert audit[0]["request_id"] == "again-1" and audit[0]["state_after"]["retry_run_id"] == new.run_id
        events = [r["event_type"] for r in await db.fetch(
            "SELECT event_type FROM outbox WHERE run_id IN ($1::uuid, $2::uuid) ORDER BY id", old.run_id, new.run_id)]
        assert events[-2:] == ["agent.run_submitted", "agent.audit.run.retry"]
        # Without a request_id each call is a new run; the new run is claimed like any other.
        other = await stack.runs.RetryRun(rs.RetryRunRequest(run_id=old.run_id), metadata=stack.md())
        assert other.created and other.run.run_id not in (new.run_id, old.run_id)
        assert (await claim(stack, agents=("flaky",))).run.run_id == new.run_id  # priority 7, first in


async def test_retry_of_a_run_that_has_not_failed_or_been_cancelled_is_refused(db_url, db):
    async with scheduler_stack(db_url) as stack:
        queued = await submit(stack, agent="q")
        done = await submit(stack, agent="done")
        lease = await claim(stack, agents=("done",))
        await stack.work.FinishRun(ws.FinishRunRequest(lease=lease_ref(lease), expected_version=0,
                                                       outcome=ws.FINISH_OUTCOME_COMPLETED, event_id=eid()))
        rows = await db.fetchval("SELECT count(*) FROM agent_runs")
        for run_id in (queued.run_id, done.run_id):
            error = await rpc_error(stack.runs.RetryRun(rs.RetryRunRequest(run_id=run_id, request_id="r"),
                                                        metadata=stack.md()))
            assert (error.code(), reason_of(error)) == (grpc.StatusCode.FAILED_PRECONDITION, "INVALID_TRANSITION")
        error = await rpc_error(stack.runs.RetryRun(rs.RetryRunRequest(run_id=str(uuid.uuid4())),
                                                    metadata=stack.md()))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        cancelled = await submit(stack, agent="q", tenant="tenant-b")
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=cancelled.run_id), metadata=stack.md("tenant-b"))
        error = await rpc_error(stack.runs.RetryRun(rs.RetryRunRequest(run_id=cancelled.run_id),
                                                    metadata=stack.md()))
        assert error.code() == grpc.StatusCode.NOT_FOUND  # another tenant's run
        assert await db.fetchval("SELECT count(*) FROM agent_runs") == rows + 1
        assert await db.fetchval("SELECT count(*) FROM audit_log WHERE action = 'run.retry'") == 0


async def test_a_retried_runs_sealed_input_is_sealed_again_under_its_own_key(db_url, db):
    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1)) as stack:
        await register(stack)
        submitted = await stack.runs.SubmitRun(rs.SubmitRunRequest(
            agent_name="payer", input_json=json.dumps({"card": SECRET, "amount": 12})), metadata=stack.md())
        old = submitted.run.run_id
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=old), metadata=stack.md())
        reply = await stack.runs.RetryRun(rs.RetryRunRequest(run_id=old, request_id="r-1"), metadata=stack.md())
        new = reply.run.run_id
        assert json.loads(reply.run.input_json) == {"amount": 12, "card": "[redacted]"}
        stored = {r["id"]: r for r in await db.fetch(
            "SELECT id::text, input::text AS input, k.wrapped_key FROM agent_runs JOIN run_data_keys AS k "
            "ON k.run_id = agent_runs.id WHERE id IN ($1::uuid, $2::uuid)", old, new)}
        assert SECRET not in stored[new]["input"] and "$sealed" in stored[new]["input"]
        assert json.loads(stored[new]["input"])["card"] != json.loads(stored[old]["input"])["card"]
        assert stored[new]["wrapped_key"] != stored[old]["wrapped_key"]
        assert SECRET not in await raw_tables(db)
    # Another process (nothing cached) opens it for the new run's lease holder with the new run's key alone.
    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1)) as stack:
        lease = await claim(stack, agents=("payer",))
        assert lease is not None and lease.run.run_id == new
        assert json.loads(lease.run.input_json) == {"amount": 12, "card": SECRET}
