"""The audit trail: every operator action writes exactly one row naming the authenticated principal,
in the action's transaction (a refused or failed action writes none), mirrored as an outbox event;
the table is append-only; ListAuditEvents pages and filters it."""

from __future__ import annotations

import json
import uuid

import asyncpg
import grpc
import pytest
from auth_support import make_key
from support import TENANT, eid, scheduler_stack, submit
from test_bad_input import S1, World, build_world

from shared.db import init_connection
from shared.gen.agentrt.v1 import run_service_pb2 as rs

pytestmark = pytest.mark.integration
SETTINGS = {"auth_mode": "api_key", "api_key_cache_ttl_ms": 0, "work_token": "w-secret"}


def bearer(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


async def audit_rows(db_url: str) -> list[dict]:
    conn = await asyncpg.connect(db_url)
    await init_connection(conn)
    try:
        return [dict(r) for r in await conn.fetch("SELECT * FROM audit_log ORDER BY id")]
    finally:
        await conn.close()


async def audit_events(db_url: str) -> list[dict]:
    conn = await asyncpg.connect(db_url)
    await init_connection(conn)
    try:
        rows = await conn.fetch("SELECT event_type, run_id, payload FROM outbox WHERE event_type LIKE 'agent.audit.%' "
                                "ORDER BY id")
        return [{"event_type": r["event_type"], "run_id": r["run_id"], "payload": r["payload"]}
                for r in rows]
    finally:
        await conn.close()


async def world_of(db_url: str) -> World:
    async with scheduler_stack(db_url) as open_stack:
        return await build_world(open_stack)


async def test_each_audited_action_writes_one_row_naming_the_principal(db_url):
    world = await world_of(db_url)
    baseline = len(await audit_rows(db_url))  # build_world made a key (audited as anonymous)
    operator_id, operator = await make_key(db_url, role="operator", tenants=[TENANT], name="ops-alice")
    admin_id, admin = await make_key(db_url, role="admin", tenants=[TENANT], name="ops-admin")
    after_setup = await audit_rows(db_url)
    assert [r["action"] for r in after_setup[baseline:]] == ["key.create", "key.create"]
    assert {r["principal"] for r in after_setup[baseline:]} == {"local:tests"}
    async with scheduler_stack(db_url, **SETTINGS) as stack:
        note = rs.AuditNote(reason="customer asked", ticket_id="SUP-7", comment="by phone")
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=world.queued, reason="withdrawn", note=note),
                                   metadata=bearer(operator))
        await stack.runs.ResumeRun(rs.ResumeRunRequest(
            run_id=world.paused_human, decision=rs.RESUME_DECISION_REJECT, operator="mallory",
            note=rs.AuditNote(reason="refund too large", ticket_id="SUP-8")), metadata=bearer(operator))
        await stack.runs.ResolveToolExecution(rs.ResolveToolExecutionRequest(
            run_id=world.in_doubt, step_key=S1, outcome=rs.RESOLUTION_OUTCOME_NOT_EXECUTED,
            evidence_json='{"ledger": "no charge found"}', resolved_by="alice", event_id=eid(),
            note=rs.AuditNote(ticket_id="SUP-9")), metadata=bearer(operator))
        created = await stack.runs.CreateApiKey(rs.CreateApiKeyRequest(
            name="ci", role=rs.API_KEY_ROLE_VIEWER, note=rs.AuditNote(reason="ci reads")), metadata=bearer(admin))
        await stack.runs.RevokeApiKey(rs.RevokeApiKeyRequest(key_id=created.key.key_id), metadata=bearer(admin))
        rows = (await audit_rows(db_url))[len(after_setup):]
        assert [r["action"] for r in rows] == ["run.cancel", "run.reject", "tool.resolve", "key.create", "key.revoke"]
        assert [r["principal"] for r in rows] == [f"key:{operator_id}"] * 3 + [f"key:{admin_id}"] * 2
        assert all(r["principal_kind"] == "api_key" and r["tenant_id"] == TENANT for r in rows)
        cancel, reject, resolve, create, revoke = rows
        assert (cancel["reason"], cancel["ticket_id"], cancel["comment"]) == ("customer asked", "SUP-7", "by phone")
        assert cancel["state_before"]["status"] == "QUEUED" and cancel["state_after"]["status"] == "CANCELLED"
        assert str(cancel["run_id"]) == world.queued and cancel["request_id"]
        # The self-declared operator is a comment; the recorded one is the key.
        assert "operator: mallory" in reject["comment"] and reject["ticket_id"] == "SUP-8"
        assert (reject["state_before"]["status"], reject["state_after"]["status"]) == ("PAUSED_HUMAN", "QUEUED")
        assert resolve["step_key"] == S1 and resolve["evidence"]["outcome"] == "NOT_EXECUTED"
        assert resolve["evidence"]["evidence"]["ledger"] == "no charge found"
        assert (resolve["state_before"]["execution"], resolve["state_after"]["execution"]) == (
            "IN_DOUBT", "NOT_EXECUTED")
        assert "resolved_by: alice" in resolve["comment"]
        assert create["state_after"]["role"] == "viewer" and create["run_id"] is None
        assert revoke["state_before"]["revoked"] is False and revoke["state_after"]["revoked"] is True
        # The ledger row names the authenticated resolver too.
        history = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=world.in_doubt),
                                                 metadata=bearer(operator))
        evidence = json.loads(history.tool_executions[0].reconciliation_evidence_json)
        assert evidence["resolved_by"] == f"key:{operator_id}"
        # Each audit row is also an outbox event, on the run's stream (or the key's).
        events = (await audit_events(db_url))[-5:]
        assert [e["event_type"] for e in events] == [f"agent.audit.{r['action']}" for r in rows]
        assert [str(e["run_id"]) for e in events[:3]] == [world.queued, world.paused_human, world.in_doubt]
        assert str(events[3]["run_id"]) == created.key.key_id == str(events[4]["run_id"])
        assert all(e["payload"]["principal"] == r["principal"] for e, r in zip(events, rows, strict=True))
        assert "no charge found" not in json.dumps(events[2]["payload"])  # evidence travels as a hash only


async def test_a_refused_or_failed_action_writes_no_audit_row(db_url):
    world = await world_of(db_url)
    _, viewer = await make_key(db_url, role="viewer", tenants=[TENANT])
    _, operator = await make_key(db_url, role="operator", tenants=[TENANT])
    before = await audit_rows(db_url)
    async with scheduler_stack(db_url, **SETTINGS) as stack:
        attempts = [
            (stack.runs.CancelRun, rs.CancelRunRequest(run_id=world.queued), viewer),  # role refuses
            (stack.runs.CancelRun, rs.CancelRunRequest(run_id=str(uuid.uuid4())), operator),  # no such run
            (stack.runs.ResumeRun, rs.ResumeRunRequest(run_id=world.queued, decision=rs.RESUME_DECISION_APPROVE),
             operator),  # not paused: the transition table refuses
            (stack.runs.ResolveToolExecution, rs.ResolveToolExecutionRequest(
                run_id=world.queued, step_key="x", outcome=rs.RESOLUTION_OUTCOME_UNKNOWN, evidence_json="{}",
                resolved_by="a"), operator),
            (stack.runs.RevokeApiKey, rs.RevokeApiKeyRequest(key_id=str(uuid.uuid4())), operator),  # role refuses
        ]
        codes = []
        for method, request, key in attempts:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await method(request, metadata=bearer(key))
            codes.append(refused.value.code())
        assert codes == [grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND,
                         grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.FAILED_PRECONDITION,
                         grpc.StatusCode.PERMISSION_DENIED]
        # A repeated cancel changes nothing and is not audited again.
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=world.queued), metadata=bearer(operator))
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=world.queued), metadata=bearer(operator))
    rows = await audit_rows(db_url)
    assert [r["action"] for r in rows[len(before):]] == ["run.cancel"]


async def test_the_audit_log_is_append_only(db_url):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack, tenant=TENANT)
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run.run_id), metadata=stack.md(TENANT))
    conn = await asyncpg.connect(db_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM audit_log") == 1
        for statement in ("UPDATE audit_log SET principal = 'someone else'", "DELETE FROM audit_log",
                          "TRUNCATE audit_log"):
            with pytest.raises(asyncpg.PostgresError, match="append-only"):
                await conn.execute(statement)
        assert await conn.fetchval("SELECT principal FROM audit_log") == "anonymous"
    finally:
        await conn.close()


async def test_list_audit_events_filters_and_pages(db_url):
    _, admin = await make_key(db_url, role="admin", tenants=[TENANT])
    _, other_admin = await make_key(db_url, role="admin", tenants=["globex"])
    async with scheduler_stack(db_url, **SETTINGS) as stack:
        runs = [await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo"), metadata=bearer(admin))
                for _ in range(5)]
        for reply in runs:
            await stack.runs.CancelRun(rs.CancelRunRequest(run_id=reply.run.run_id, reason="cleanup"),
                                       metadata=bearer(admin))
        seen, token = [], ""
        for _ in range(10):
            page = await stack.runs.ListAuditEvents(rs.ListAuditEventsRequest(
                action="run.cancel", page_size=2, page_token=token), metadata=bearer(admin))
            seen += [e.run_id for e in page.events]
            token = page.next_page_token
            if not token:
                break
        assert seen == [r.run.run_id for r in reversed(runs)]  # newest first, each once
        one = await stack.runs.ListAuditEvents(rs.ListAuditEventsRequest(run_id=runs[2].run.run_id),
                                               metadata=bearer(admin))
        assert [(e.action, e.reason) for e in one.events] == [("run.cancel", "cleanup")]
        assert json.loads(one.events[0].state_after_json)["status"] == "CANCELLED"
        # Another tenant's admin sees none of it; a filter on a principal narrows.
        theirs = await stack.runs.ListAuditEvents(rs.ListAuditEventsRequest(), metadata=bearer(other_admin))
        assert [e.action for e in theirs.events] == ["key.create"]
        nobody = await stack.runs.ListAuditEvents(rs.ListAuditEventsRequest(principal="key:nobody"),
                                                  metadata=bearer(admin))
        assert list(nobody.events) == []
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stack.runs.ListAuditEvents(rs.ListAuditEventsRequest(action="run.resume", page_token=token or "x"),
                                             metadata=bearer(admin))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_an_export_is_audited_once_at_its_first_page_and_needs_the_operator_role(db_url):
    world = await world_of(db_url)
    operator_id, operator = await make_key(db_url, role="operator", tenants=[TENANT])
    _, viewer = await make_key(db_url, role="viewer", tenants=[TENANT])
    before = len(await audit_rows(db_url))
    async with scheduler_stack(db_url, **SETTINGS) as stack:
        request = rs.GetRunHistoryRequest(run_id=world.running.run_id, page_size=1, export=True,
                                          note=rs.AuditNote(reason="legal hold", ticket_id="LEG-1"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stack.runs.GetRunHistory(request, metadata=bearer(viewer))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        pages, token = 0, ""
        while True:
            request.page_token = token
            page = await stack.runs.GetRunHistory(request, metadata=bearer(operator))
            pages, token = pages + 1, page.next_page_token
            if not token:
                break
        assert pages > 1
        plain = rs.GetRunHistoryRequest(run_id=world.running.run_id)
        await stack.runs.GetRunHistory(plain, metadata=bearer(viewer))  # a read, not an export
    rows = (await audit_rows(db_url))[before:]
    assert [(r["action"], r["principal"], r["reason"], r["ticket_id"]) for r in rows] == [
        ("run.export", f"key:{operator_id}", "legal hold", "LEG-1")]
    assert str(rows[0]["run_id"]) == world.running.run_id


async def test_key_rows_of_several_tenants_are_seen_by_each_and_by_admins_of_every_tenant(db_url):
    _, root = await make_key(db_url, role="admin", tenants=["*"], name="root")
    _, acme_admin = await make_key(db_url, role="admin", tenants=[TENANT], name="acme-admin")
    async with scheduler_stack(db_url, **SETTINGS) as stack:
        await stack.runs.CreateApiKey(rs.CreateApiKeyRequest(name="two", role=rs.API_KEY_ROLE_ADMIN,
                                                             tenants=[TENANT, "globex"]), metadata=bearer(root))
        ours = await stack.runs.ListAuditEvents(rs.ListAuditEventsRequest(), metadata=bearer(acme_admin))
        theirs = await stack.runs.ListAuditEvents(rs.ListAuditEventsRequest(),
                                                  metadata=[*bearer(root), ("x-tenant-id", "globex")])
        everything = await stack.runs.ListAuditEvents(rs.ListAuditEventsRequest(), metadata=bearer(root))

    def created(events) -> list[str]:
        return [json.loads(e.state_after_json)["name"] for e in events if e.action == "key.create"]

    assert created(ours.events) == ["two", "acme-admin"]  # not the '*' key's row
    assert created(theirs.events) == ["two"]
    assert created(everything.events) == ["two", "acme-admin", "root"]


async def test_schedule_changes_are_audited_under_the_schedule_id(db_url):
    """CreateSchedule, UpdateSchedule, PauseSchedule (pause and resume) and DeleteSchedule each write one
    audit row naming the key, with the schedule's state before and after (never its input); a repeated
    create or pause changes nothing and writes none; a refused one writes none."""
    submitter_id, submitter = await make_key(db_url, role="submitter", tenants=[TENANT], name="sched-bot")
    _, viewer = await make_key(db_url, role="viewer", tenants=[TENANT])
    before = len(await audit_rows(db_url))
    spec = rs.ScheduleSpec(agent_name="nightly", input_json='{"secret": "s3cr3t"}', cron="0 3 * * *")
    async with scheduler_stack(db_url, schedule_poll_interval_ms=0, **SETTINGS) as stack:
        md = [*bearer(submitter), ("x-request-id", "req-create")]
        made = await stack.runs.CreateSchedule(rs.CreateScheduleRequest(name="nightly", spec=spec), metadata=md)
        again = await stack.runs.CreateSchedule(rs.CreateScheduleRequest(name="nightly", spec=spec), metadata=md)
        assert made.created and not again.created
        sid = made.schedule.schedule_id
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stack.runs.PauseSchedule(rs.PauseScheduleRequest(schedule_id=sid, paused=True),
                                           metadata=bearer(viewer))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        hourly = rs.ScheduleSpec(agent_name="nightly", interval_ms=3_600_000)
        await stack.runs.UpdateSchedule(rs.UpdateScheduleRequest(schedule_id=sid, spec=hourly),
                                        metadata=bearer(submitter))
        for paused in (True, True, False):
            await stack.runs.PauseSchedule(rs.PauseScheduleRequest(schedule_id=sid, paused=paused),
                                           metadata=bearer(submitter))
        await stack.runs.DeleteSchedule(rs.DeleteScheduleRequest(schedule_id=sid), metadata=bearer(submitter))
    rows = (await audit_rows(db_url))[before:]
    assert [r["action"] for r in rows] == ["schedule.create", "schedule.update", "schedule.pause",
                                           "schedule.resume", "schedule.delete"]
    assert {(r["principal"], r["principal_kind"], r["tenant_id"]) for r in rows} == {
        (f"key:{submitter_id}", "api_key", TENANT)}
    assert all(r["run_id"] is None for r in rows)
    create, update, pause, resume, delete = rows
    assert create["request_id"] == "req-create" and create["state_before"] is None
    assert create["state_after"]["schedule_id"] == sid and create["state_after"]["cron"] == "0 3 * * *"
    assert (update["state_before"]["cron"], update["state_after"]["interval_ms"]) == ("0 3 * * *", 3_600_000)
    assert (pause["state_before"]["paused"], pause["state_after"]["paused"]) == (False, True)
    assert (resume["state_before"]["paused"], resume["state_after"]["paused"]) == (True, False)
    assert delete["state_before"]["name"] == "nightly" and delete["state_after"] is None
    # The events travel on the schedule's own stream; the input stays out of the trail.
    events = (await audit_events(db_url))[-5:]
    assert [e["event_type"] for e in events] == [f"agent.audit.{r['action']}" for r in rows]
    assert {str(e["run_id"]) for e in events} == {sid}
    assert "s3cr3t" not in json.dumps([dict(r) for r in rows], default=str) + json.dumps(events, default=str)
