"""Sensitive values: what an agent marks "x-agentrt-sensitive" is stored sealed (AES-256-GCM under a
per-run data key wrapped by a KEK), reaches the lease holder in the clear, is redacted by GetRun and
GetRunHistory unless revealed (runs.reveal, audited), and survives a KEK rotation."""

from __future__ import annotations

import asyncio
import json
import uuid

import grpc
import pytest
from sealing_support import K1, K2, SCHEMA, SECRET, SENSITIVE, TOKEN, keyring, raw_tables, register, submit
from support import TENANT, claim, eid, lease_ref, reason_of, rpc_error, scheduler_stack, tool_state

from scheduler.store import keys as keys_module
from scheduler.store.queries import Q
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration

async def test_marked_values_are_sealed_in_the_database_plain_for_the_executor_and_redacted_unless_revealed(
        db_url, db):
    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1)) as stack:
        await register(stack)
        run_id = await submit(stack, card=SECRET, amount=12)
        key = await db.fetchrow("SELECT key_id, length(wrapped_key) AS n FROM run_data_keys WHERE run_id = $1::uuid",
                                run_id)
        assert key["key_id"] == "k1" and key["n"] == 12 + 32 + 16
        stored = json.loads(await db.fetchval("SELECT input::text FROM agent_runs WHERE id = $1::uuid", run_id))
        assert stored["amount"] == 12 and set(stored["card"]) == {"$sealed"}

        shown = await stack.runs.GetRun(rs.GetRunRequest(run_id=run_id), metadata=stack.md())
        assert json.loads(shown.input_json) == {"amount": 12, "card": "[redacted]"}

        lease = await claim(stack, agents=("payer",))
        assert json.loads(lease.run.input_json) == {"amount": 12, "card": SECRET}  # the executor's copy is plain
        ref = lease_ref(lease)
        request = {"card": SECRET, "amount": 12, "note": f"charge {SECRET} now"}
        state = tool_state("s1", "pay.charge", request, raw={"args": request})
        await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=ref, expected_version=0, state_json=json.dumps(state), schema_version=1, step_key="s1",
            event_id=eid()))
        await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=ref, expected_version=1, step_key="s1", tool_name="pay.charge", idempotency_key=f"k-{run_id}",
            request_json=json.dumps(request), execution_id=eid(), event_id=eid()))
        await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
            lease=ref, expected_version=1, step_key="s1", outcome=ws.TOOL_OUTCOME_SUCCEEDED,
            response_json=json.dumps({"token": TOKEN, "ok": True}), state_json='{"cursor": "done"}',
            schema_version=1, event_id=eid()))
        answer = await stack.work.GetToolResults(ws.GetToolResultsRequest(lease=ref, step_keys=["s1"]))
        assert json.loads(answer.executions[0].request_json) == request
        assert json.loads(answer.executions[0].response_json) == {"token": TOKEN, "ok": True}

        everything = await raw_tables(db)
        assert SECRET not in everything and TOKEN not in everything
        assert "$sealed" in everything

        history = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=run_id), metadata=stack.md())
        text = str(history)
        assert SECRET not in text and TOKEN not in text and "[redacted]" in text
        revealed = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=run_id, reveal=True),
                                                  metadata=stack.md())
        execution = revealed.tool_executions[0]
        assert json.loads(execution.request_json) == request
        assert json.loads(execution.response_json)["token"] == TOKEN
        assert json.loads(revealed.run.input_json)["card"] == SECRET
        one = await stack.runs.GetRun(rs.GetRunRequest(run_id=run_id, reveal=True), metadata=stack.md())
        assert json.loads(one.input_json)["card"] == SECRET
        audits = await db.fetch("SELECT action, evidence FROM audit_log WHERE run_id = $1::uuid ORDER BY id",
                                run_id)
        assert [(a["action"], a["evidence"]["rpc"]) for a in audits] == [
            ("run.reveal", "GetRunHistory"), ("run.reveal", "GetRun")]
    # Another scheduler process (nothing cached) learns the run's marked values from its input and
    # ledger: the lease holder's next checkpoint, which copies the tool's marked answer, is sealed too.
    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1)) as stack:
        saved = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=ref, expected_version=2, state_json=json.dumps({"cursor": "x", "seen": f"token {TOKEN}"}),
            schema_version=1, event_id=eid()))
        assert saved.version == 3
        again = await latest_state(db, run_id)
        assert TOKEN not in again and "$sealed" in again


async def latest_state(db, run_id: str) -> str:
    return await db.fetchval("SELECT state_json::text FROM agent_checkpoints WHERE run_id = $1::uuid "
                             "ORDER BY version DESC LIMIT 1", run_id)


async def test_a_marked_agent_without_keys_is_refused_and_nothing_is_written(db_url, db):
    async with scheduler_stack(db_url) as stack:
        await register(stack)
        error = await rpc_error(submit(stack, card=SECRET))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and reason_of(error) == "ENCRYPTION_KEY_MISSING"
        assert await db.fetchval("SELECT count(*) FROM agent_runs") == 0


async def test_rotation_rewraps_every_data_key_and_then_the_new_kek_alone_reads(db_url, db):
    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1)) as stack:
        await register(stack)
        runs = [await submit(stack, card=f"{SECRET}-{i}") for i in range(7)]
    # Rotation, online: a scheduler with the new KEK current and the old one kept for reading serves
    # reads and submits while the keys are re-wrapped in batches.
    async with scheduler_stack(db_url, encryption_keys=keyring("k2", k1=K1, k2=K2), rotate_batch=3) as stack:
        await register(stack)
        runs.append(await submit(stack, card=f"{SECRET}-new"))
        first = await stack.server.store.keys.rotate_keys(max_batches=1)
        assert first.rewrapped == 3 and first.remaining == {"k1": 4, "k2": 4}
        mid = await stack.runs.GetRun(rs.GetRunRequest(run_id=runs[-2], reveal=True), metadata=stack.md())
        assert json.loads(mid.input_json)["card"] == f"{SECRET}-6"
        rest = await stack.server.store.keys.rotate_keys()
        assert rest.rewrapped == 4 and rest.remaining == {"k2": 8}
    async with scheduler_stack(db_url, encryption_keys=keyring("k2", k2=K2)) as stack:
        for i, run_id in enumerate(runs):
            shown = await stack.runs.GetRun(rs.GetRunRequest(run_id=run_id, reveal=True), metadata=stack.md())
            assert json.loads(shown.input_json)["card"] == (f"{SECRET}-{i}" if i < 7 else f"{SECRET}-new")
    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1)) as stack:
        error = await rpc_error(stack.runs.GetRun(rs.GetRunRequest(run_id=runs[0], reveal=True), metadata=stack.md()))
        assert reason_of(error) == "ENCRYPTION_KEY_MISSING"
    assert TENANT


async def test_cli_rotate_and_status(db_url, db, monkeypatch, capsys):
    from cli.main import main

    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1)) as stack:
        await register(stack)
        runs = [await submit(stack, card=f"{SECRET}-{i}") for i in range(3)]
    monkeypatch.setenv("AGENTRT_ENCRYPTION_KEYS", keyring("k2", k1=K1, k2=K2))
    assert await asyncio.to_thread(main, ["encryption", "status", "--database-url", db_url]) == 0
    assert json.loads(capsys.readouterr().out) == {"current_key_id": "k2", "keys_by_kek": {"k1": 3}}
    assert await asyncio.to_thread(main, ["encryption", "rotate", "--batch", "2", "--database-url", db_url]) == 0
    assert json.loads(capsys.readouterr().out) == {"current_key_id": "k2", "keys_by_kek": {"k2": 3}, "rewrapped": 3}
    assert await asyncio.to_thread(main, ["encryption", "rotate", "--batch", "0", "--database-url", db_url]) == 1
    assert capsys.readouterr().err.strip() == "agentrt encryption: error: --batch: must be between 1 and 10000"
    monkeypatch.setenv("AGENTRT_ENCRYPTION_KEYS", keyring("k2", k2=K2))
    async with scheduler_stack(db_url) as stack:  # the keyring from the environment: k2 alone
        shown = await stack.runs.GetRun(rs.GetRunRequest(run_id=runs[2], reveal=True), metadata=stack.md())
        assert json.loads(shown.input_json)["card"] == f"{SECRET}-2"


async def test_retention_deletes_a_runs_data_key_with_the_run(db_url, db):
    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1)) as stack:
        await register(stack)
        old, young = await submit(stack, card=SECRET), await submit(stack, card=SECRET)
        await db.execute("UPDATE agent_runs SET status = 'COMPLETED', finished_at = clock_timestamp() - "
                         "interval '40 days' WHERE id = $1::uuid", old)
        await db.execute("UPDATE outbox SET published_at = clock_timestamp() WHERE run_id = $1::uuid", old)
        purged = await stack.server.store.runs.retention_purge(max_runs=100, dry_run=False, after_finished=None,
                                                               after_id=None)
        assert purged.runs == 1
        assert [str(r[0]) for r in await db.fetch("SELECT run_id FROM run_data_keys")] == [young]


async def test_a_scheduled_run_of_a_marked_agent_is_sealed_like_a_submitted_one(db_url, db):
    from executor_support import wait_for

    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1), schedule_poll_interval_ms=100) as stack:
        await register(stack)
        await stack.runs.CreateSchedule(rs.CreateScheduleRequest(name="nightly-charge", spec=rs.ScheduleSpec(
            agent_name="payer", input_json=json.dumps({"card": SECRET}), interval_ms=1000)), metadata=stack.md())

        async def fired() -> str | None:
            return await db.fetchval("SELECT id::text FROM agent_runs WHERE labels->>'agentrt.schedule' = "
                                     "'nightly-charge' LIMIT 1")

        run_id = await wait_for(fired, 20, "a fire")
        stored = await db.fetchval("SELECT input::text FROM agent_runs WHERE id = $1::uuid", run_id)
        assert SECRET not in stored and "$sealed" in stored
        assert await db.fetchval("SELECT key_id FROM run_data_keys WHERE run_id = $1::uuid", run_id) == "k1"
        lease = await claim(stack, agents=("payer",))
        assert json.loads(lease.run.input_json)["card"] == SECRET


async def test_a_reveal_needs_runs_reveal_and_a_bad_mark_list_is_refused(db_url, db):
    from auth_support import make_key

    operator_id, operator = await make_key(db_url, role="operator", tenants=[TENANT])
    _, viewer = await make_key(db_url, role="viewer", tenants=[TENANT])
    settings = {"auth_mode": "api_key", "api_key_cache_ttl_ms": 0, "work_token": "w-secret"}
    work_md = [("authorization", "Bearer w-secret")]
    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1), **settings) as stack:
        bad = await rpc_error(stack.work.RegisterAgents(ws.RegisterAgentsRequest(
            worker_id="w1", ttl_ms=60_000, agents=[ws.AgentRegistration(
                name="payer", version="1", sensitive_json=json.dumps({"input": "card"}))]), metadata=work_md))
        assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad.details().startswith("agents[0].sensitive_json: input must be a list of paths")
        await stack.work.RegisterAgents(ws.RegisterAgentsRequest(worker_id="w1", ttl_ms=60_000, agents=[
            ws.AgentRegistration(name="payer", version="1", input_schema_json=json.dumps(SCHEMA),
                                 sensitive_json=json.dumps(SENSITIVE))]), metadata=work_md)
        run = await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="payer", input_json=json.dumps(
            {"card": SECRET})), metadata=[("authorization", f"Bearer {operator}")])
        assert json.loads(run.run.input_json)["card"] == "[redacted]"  # the submitter's answer too
        run_id = run.run.run_id
        for call in (stack.runs.GetRun(rs.GetRunRequest(run_id=run_id, reveal=True),
                                       metadata=[("authorization", f"Bearer {viewer}")]),
                     stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=run_id, reveal=True),
                                              metadata=[("authorization", f"Bearer {viewer}")])):
            refused = await rpc_error(call)
            assert refused.code() == grpc.StatusCode.PERMISSION_DENIED and "runs.reveal" in refused.details()
        assert await db.fetchval("SELECT count(*) FROM audit_log WHERE action = 'run.reveal'") == 0
        shown = await stack.runs.GetRun(rs.GetRunRequest(run_id=run_id, reveal=True, note=rs.AuditNote(
            reason="chargeback", ticket_id="CB-9")), metadata=[("authorization", f"Bearer {operator}")])
        assert json.loads(shown.input_json)["card"] == SECRET
        row = await db.fetchrow("SELECT principal, reason, ticket_id FROM audit_log WHERE action = 'run.reveal'")
        assert tuple(row) == (f"key:{operator_id}", "chargeback", "CB-9")
        # The reveal's Kafka event names who and why, never the value.
        assert SECRET not in await raw_tables(db)


async def test_a_child_of_a_marked_agent_is_sealed_and_a_repeated_spawn_keeps_its_key(db_url, db):
    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1)) as stack:
        await register(stack)
        await stack.work.RegisterAgents(ws.RegisterAgentsRequest(worker_id="w2", ttl_ms=60_000, agents=[
            ws.AgentRegistration(name="parent", version="1")]))
        parent = await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="parent", input_json="{}"),
                                            metadata=stack.md())
        lease = await claim(stack, agents=("parent",))
        assert lease.run.run_id == parent.run.run_id
        request = ws.SpawnChildrenRequest(
            lease=lease_ref(lease), spawn_key="pay/attempt-1", join=ws.JOIN_MODE_ALL,
            children=[ws.ChildSpec(agent_name="payer", input_json=json.dumps({"card": SECRET, "amount": 3}))])
        first = await stack.work.SpawnChildren(request)
        child_id = first.children[0].run_id
        wrapped = await db.fetchval("SELECT wrapped_key FROM run_data_keys WHERE run_id = $1::uuid", child_id)
        assert wrapped is not None
        stored = json.loads(await db.fetchval("SELECT input::text FROM agent_runs WHERE id = $1::uuid", child_id))
        assert stored["amount"] == 3 and set(stored["card"]) == {"$sealed"}
        again = await stack.work.SpawnChildren(request)  # a takeover's repeat: nothing new, the same key
        assert [c.run_id for c in again.children] == [child_id]
        assert await db.fetchval("SELECT wrapped_key FROM run_data_keys WHERE run_id = $1::uuid", child_id) == wrapped
        assert SECRET not in await raw_tables(db)
        child = await claim(stack, agents=("payer",))
        assert child.run.run_id == child_id and json.loads(child.run.input_json) == {"card": SECRET, "amount": 3}


def charge_spec(card: str, interval_ms: int = 1000) -> rs.ScheduleSpec:
    return rs.ScheduleSpec(agent_name="payer", input_json=json.dumps({"card": card, "amount": 5}),
                           interval_ms=interval_ms)


async def test_a_schedules_marked_input_is_sealed_at_rest_redacted_in_lists_and_plain_for_the_executor(db_url, db):
    from executor_support import wait_for

    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1), schedule_poll_interval_ms=0) as stack:
        await register(stack)
        created = await stack.runs.CreateSchedule(rs.CreateScheduleRequest(
            name="monthly", spec=charge_spec(f"{SECRET}-old")), metadata=stack.md())
        assert created.created and json.loads(created.schedule.spec.input_json) == {"amount": 5, "card": "[redacted]"}
        sid = created.schedule.schedule_id
        row = await db.fetchrow("SELECT input::text, key_id, wrapped_key, t::text AS raw FROM agent_schedules t "
                                "WHERE id = $1::uuid", sid)
        stored = json.loads(row["input"])
        assert stored["amount"] == 5 and set(stored["card"]) == {"$sealed"}
        assert row["key_id"] == "k1" and len(row["wrapped_key"]) == 12 + 32 + 16 and SECRET not in row["raw"]
        # The same spec again is the same schedule (its sealed input hashes the same); another value is not.
        again = await stack.runs.CreateSchedule(rs.CreateScheduleRequest(
            name="monthly", spec=charge_spec(f"{SECRET}-old")), metadata=stack.md())
        assert not again.created and again.schedule.schedule_id == sid
        clash = await rpc_error(stack.runs.CreateSchedule(rs.CreateScheduleRequest(
            name="monthly", spec=charge_spec(SECRET)), metadata=stack.md()))
        assert clash.code() == grpc.StatusCode.ALREADY_EXISTS

        updated = await stack.runs.UpdateSchedule(rs.UpdateScheduleRequest(schedule_id=sid, spec=charge_spec(SECRET)),
                                                  metadata=stack.md())
        assert json.loads(updated.spec.input_json)["card"] == "[redacted]"
        assert await db.fetchval("SELECT wrapped_key FROM agent_schedules WHERE id = $1::uuid", sid) == \
            row["wrapped_key"]  # the schedule keeps its data key
        listed = await stack.runs.ListSchedules(rs.ListSchedulesRequest(), metadata=stack.md())
        assert [json.loads(s.spec.input_json) for s in listed.schedules] == [{"amount": 5, "card": "[redacted]"}]
        assert SECRET not in await raw_tables(db)
    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1), schedule_poll_interval_ms=100) as stack:
        async def fired() -> str | None:
            return await db.fetchval("SELECT id::text FROM agent_runs WHERE labels->>'agentrt.schedule' = "
                                     "'monthly' LIMIT 1")

        run_id = await wait_for(fired, 20, "a fire")
        run_key = await db.fetchval("SELECT wrapped_key FROM run_data_keys WHERE run_id = $1::uuid", run_id)
        assert run_key is not None and run_key != row["wrapped_key"]  # sealed again under the run's own key
        lease = await claim(stack, agents=("payer",))
        assert lease.run.run_id == run_id and json.loads(lease.run.input_json) == {"amount": 5, "card": SECRET}
        assert SECRET not in await raw_tables(db)


async def test_a_schedule_of_a_marked_agent_without_keys_is_refused_and_nothing_is_written(db_url, db):
    async with scheduler_stack(db_url, schedule_poll_interval_ms=0) as stack:
        await register(stack)
        error = await rpc_error(stack.runs.CreateSchedule(rs.CreateScheduleRequest(
            name="monthly", spec=charge_spec(SECRET)), metadata=stack.md()))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and reason_of(error) == "ENCRYPTION_KEY_MISSING"
        assert await db.fetchval("SELECT count(*) FROM agent_schedules") == 0
        assert await db.fetchval("SELECT count(*) FROM audit_log WHERE action LIKE 'schedule.%'") == 0
        assert SECRET not in await raw_tables(db)


async def test_rotation_rewraps_a_schedules_key_and_it_fires_under_the_new_kek_alone(db_url, db, monkeypatch, capsys):
    from executor_support import wait_for

    from cli.main import main

    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1), schedule_poll_interval_ms=0) as stack:
        await register(stack)
        created = await stack.runs.CreateSchedule(rs.CreateScheduleRequest(name="monthly", spec=charge_spec(SECRET)),
                                                  metadata=stack.md())
        sid = created.schedule.schedule_id
        await submit(stack, card=f"{SECRET}-run")
    before = await db.fetchval("SELECT wrapped_key FROM agent_schedules WHERE id = $1::uuid", sid)
    monkeypatch.setenv("AGENTRT_ENCRYPTION_KEYS", keyring("k2", k1=K1, k2=K2))
    assert await asyncio.to_thread(main, ["encryption", "status", "--database-url", db_url]) == 0
    assert json.loads(capsys.readouterr().out) == {"current_key_id": "k2", "keys_by_kek": {"k1": 2}}
    assert await asyncio.to_thread(main, ["encryption", "rotate", "--database-url", db_url]) == 0
    assert json.loads(capsys.readouterr().out) == {"current_key_id": "k2", "keys_by_kek": {"k2": 2}, "rewrapped": 2}
    after = await db.fetchrow("SELECT key_id, wrapped_key, key_rotated_at FROM agent_schedules WHERE id = $1::uuid",
                              sid)
    assert after["key_id"] == "k2" and after["wrapped_key"] != before and after["key_rotated_at"] is not None
    async with scheduler_stack(db_url, encryption_keys=keyring("k2", k2=K2), schedule_poll_interval_ms=100) as stack:
        async def fired() -> str | None:
            return await db.fetchval("SELECT id::text FROM agent_runs WHERE labels->>'agentrt.schedule' = "
                                     "'monthly' LIMIT 1")

        run_id = await wait_for(fired, 20, "a fire")
        assert await db.fetchval("SELECT key_id FROM run_data_keys WHERE run_id = $1::uuid", run_id) == "k2"
        lease = await wait_for(lambda: claim_run(stack, run_id), 20, "the fired run's lease")
        assert json.loads(lease.run.input_json)["card"] == SECRET
        listed = await stack.runs.ListSchedules(rs.ListSchedulesRequest(), metadata=stack.md())
        assert json.loads(listed.schedules[0].spec.input_json)["card"] == "[redacted]"


async def claim_run(stack, run_id: str):
    """The next lease of a payer run, when it is `run_id`'s (the submitted run goes first)."""
    lease = await claim(stack, agents=("payer",))
    return lease if lease is not None and lease.run.run_id == run_id else None


async def test_a_schedule_whose_key_no_kek_opens_is_put_off_and_the_others_still_fire(db_url, db):
    from executor_support import wait_for

    async with scheduler_stack(db_url, encryption_keys=keyring("k1", k1=K1), schedule_poll_interval_ms=0) as stack:
        await register(stack)
        sealed = await stack.runs.CreateSchedule(rs.CreateScheduleRequest(name="a-sealed", spec=charge_spec(SECRET)),
                                                 metadata=stack.md())
        await stack.runs.CreateSchedule(rs.CreateScheduleRequest(name="b-plain", spec=rs.ScheduleSpec(
            agent_name="plain", input_json="{}", interval_ms=1000)), metadata=stack.md())
    async with scheduler_stack(db_url, encryption_keys=keyring("k2", k2=K2), schedule_poll_interval_ms=100):
        async def plain_fired() -> str | None:
            return await db.fetchval("SELECT id::text FROM agent_runs WHERE labels->>'agentrt.schedule' = "
                                     "'b-plain' LIMIT 1")

        async def put_off() -> bool:  # tried, and to be tried again in a minute
            return bool(await db.fetchval("SELECT due_at > clock_timestamp() + interval '30 seconds' "
                                          "FROM agent_schedules WHERE id = $1::uuid", sealed.schedule.schedule_id))

        await wait_for(plain_fired, 20, "the plain schedule's fire")
        await wait_for(put_off, 20, "the sealed schedule put off")
        assert await db.fetchval("SELECT fires FROM agent_schedules WHERE id = $1::uuid",
                                 sealed.schedule.schedule_id) == 0
        assert await db.fetchval("SELECT count(*) FROM agent_runs WHERE labels->>'agentrt.schedule' = 'a-sealed'") == 0


async def test_a_claim_says_whether_the_run_holds_a_data_key_so_a_plain_run_costs_no_key_lookup(db_url, db,
                                                                                                  monkeypatch):
    """The claim reads whether its run holds a data key: a run without one is known keyless at once (its
    writes and answers look nothing up), while a marked run's key is still read and opens its values."""
    lookups: list[object] = []
    real_fetchrow = keys_module.fetchrow

    async def counting_fetchrow(conn, query, **params):
        if query is Q.run_data_key:
            lookups.append(params["run_id"])
        return await real_fetchrow(conn, query, **params)

    monkeypatch.setattr(keys_module, "fetchrow", counting_fetchrow)
    settings = {"encryption_keys": keyring("k1", k1=K1), "lease_duration_ms": 60_000}
    async with scheduler_stack(db_url, **settings) as stack:
        await register(stack)
        marked = await submit(stack, card=SECRET, amount=12)
        plain = (await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json='{"n": 1}'),
                                            metadata=stack.md())).run.run_id
    async with scheduler_stack(db_url, **settings) as stack:  # a scheduler that has cached nothing yet
        keys = stack.server.store.keys
        lease = await claim(stack, agents=("demo",))
        assert lease.run.run_id == plain and json.loads(lease.run.input_json) == {"n": 1}
        assert keys.keyless(uuid.UUID(plain))
        ref = lease_ref(lease)
        await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=ref, expected_version=0, state_json='{"cursor": "s1"}', schema_version=1, event_id=eid()))
        assert lookups == [], "a run the claim found keyless was looked up"

        lease = await claim(stack, agents=("payer",))
        assert lease.run.run_id == marked
        assert json.loads(lease.run.input_json) == {"amount": 12, "card": SECRET}  # opened with its key
        assert [str(run_id) for run_id in lookups] == [marked]
        assert not keys.keyless(uuid.UUID(marked))
