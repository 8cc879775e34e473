"""`agentrt runs …` / `agentrt tools resolve` against a live scheduler, as a user would run them."""

import json

import pytest
from helpers import agentrt
from support import claim, eid, lease_ref, scheduler_stack, submit, tool_state

from devstack.embedded_pg import free_port
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration




async def test_every_runs_command_against_a_live_scheduler(db_url):
    async with scheduler_stack(db_url) as stack:
        a = stack.addr
        code, out, _ = await agentrt("runs", "submit", "demo", "--input", '{"order": 7}', "--request-id", "r-1",
                                     "--json", addr=a)
        assert code == 0
        submitted = json.loads(out)
        run_id = submitted["run_id"]
        assert submitted["created"] is True and submitted["input"] == {"order": 7}
        code, out, _ = await agentrt("runs", "submit", "demo", "--input", '{"order": 7}', "--request-id", "r-1",
                                     "--json", addr=a)
        assert json.loads(out)["run_id"] == run_id and json.loads(out)["created"] is False

        code, out, _ = await agentrt("runs", "get", run_id, "--json", addr=a)
        assert code == 0 and json.loads(out)["status"] == "QUEUED"
        code, out, _ = await agentrt("runs", "list", "--status", "QUEUED", "--json", addr=a)
        assert [r["run_id"] for r in json.loads(out)["runs"]] == [run_id]
        code, out, _ = await agentrt("runs", "list", addr=a)
        assert code == 0 and run_id in out and "STATUS" in out

        # Pause it for a human, then resume with an approval.
        lease = await claim(stack)
        await stack.work.FinishRun(ws.FinishRunRequest(lease=lease_ref(lease), expected_version=0,
                                                       outcome=ws.FINISH_OUTCOME_PAUSED_HUMAN,
                                                       reason="refund above threshold", event_id=eid()))
        code, out, _ = await agentrt("runs", "watch", run_id, "--until", "PAUSED_HUMAN", "--json", addr=a)
        assert code == 0 and json.loads(out.strip().splitlines()[-1])["status"] == "PAUSED_HUMAN"
        code, out, _ = await agentrt("runs", "resume", run_id, "--approve", "--operator", "alice", "--json", addr=a)
        resumed = json.loads(out)
        assert resumed["status"] == "QUEUED" and resumed["human_input"]["decision"] == "APPROVE"

        # Freeze it in doubt, then resolve the tool execution with evidence.
        lease = await claim(stack)
        ref = lease_ref(lease)
        await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=ref, expected_version=0, state_json=json.dumps(tool_state("label/attempt-1", "label", {"o": 7})),
            schema_version=1, event_id=eid()))
        await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=ref, expected_version=1, step_key="label/attempt-1", tool_name="label", idempotency_key="k-7",
            request_json='{"o": 7}', execution_id=eid(), event_id=eid()))
        await stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(lease=ref, step_key="label/attempt-1",
                                                                   error_code="timeout", event_id=eid()))
        code, out, err = await agentrt("tools", "resolve", run_id, "label/attempt-1", "--succeeded", "--result",
                                       '{"label": "L-1"}', "--evidence", '{"lookup": "found"}', "--json", addr=a)
        assert code == 0, err
        resolved = json.loads(out)
        assert resolved["run"]["status"] == "QUEUED"
        assert resolved["execution"]["status"] == "TOOL_EXECUTION_STATUS_SUCCEEDED"

        code, out, _ = await agentrt("runs", "history", run_id, "--json", addr=a)
        history = json.loads(out)
        # int64 fields print as strings in proto JSON.
        assert [int(c["version"]) for c in history["checkpoints"]] == [1, 2]
        assert "agent.tool_resolved" in [e["event_type"] for e in history["events"]]
        code, out, _ = await agentrt("runs", "history", run_id, addr=a)
        assert code == 0 and "tool executions (1)" in out

        code, out, _ = await agentrt("runs", "cancel", run_id, "--reason", "done testing", "--json", addr=a)
        assert json.loads(out)["status"] == "CANCELLED"

        # Errors: one readable line, non-zero exit, no traceback.
        code, _, err = await agentrt("runs", "get", "not-a-uuid", addr=a)
        assert code == 1 and "run_id" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
        code, _, err = await agentrt("runs", "get", run_id, addr=a, tenant="tenant-b")
        assert code == 1 and "NOT_FOUND" in err
        code, _, err = await agentrt("runs", "submit", "demo", "--input", "[1]", addr=a)
        assert code == 1 and "--input" in err
        code, _, err = await agentrt("runs", "resume", run_id, addr=a)
        assert code == 1 and "decided" in err
        code, _, err = await agentrt("runs", "frobnicate", addr=a)
        assert code == 2


async def test_runs_signal_queues_once_per_request_id_and_refuses_bad_input(db_url, db):
    async with scheduler_stack(db_url) as stack:
        a = stack.addr
        run = await submit(stack)
        args = ("runs", "signal", run.run_id, "customer.reply", "--payload", '{"text": "ok"}', "--request-id", "m-1")
        code, out, _ = await agentrt(*args, "--json", addr=a)
        assert code == 0
        queued = json.loads(out)
        assert (queued["name"], queued["payload"], queued["created"], queued["run_status"]) == (
            "customer.reply", {"text": "ok"}, True, "QUEUED")
        code, out, _ = await agentrt(*args, addr=a)
        assert code == 0 and out.startswith(f"already queued: signal customer.reply #{queued['seq']}")
        assert await db.fetchval("SELECT count(*) FROM run_signals") == 1
        code, _, err = await agentrt("runs", "signal", run.run_id, "customer.reply", "--payload", "{nope", addr=a)
        assert code == 1 and "--payload" in err and len(err.strip().splitlines()) == 1
        code, _, err = await agentrt("runs", "signal", run.run_id, "bad name!", addr=a)
        assert code == 1 and "name" in err and "Traceback" not in err
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run.run_id), metadata=stack.md())
        code, _, err = await agentrt("runs", "signal", run.run_id, "late", addr=a)
        assert code == 1 and "RUN_ENDED" in err and len(err.strip().splitlines()) == 1
        assert await db.fetchval("SELECT count(*) FROM run_signals") == 1


async def test_runs_list_filters_cancel_keep_children_and_retry(db_url, db):
    async with scheduler_stack(db_url) as stack:
        a = stack.addr
        low = await submit(stack, labels={"team": "a"}, priority=2)
        high = await submit(stack, labels={"team": "a", "env": "prod"}, priority=8)
        await submit(stack, labels={"team": "b"}, priority=8)
        code, out, _ = await agentrt("runs", "list", "--label", "team=a", "--min-priority", "5",
                                     "--since", "2020-01-01T00:00:00", "--json", addr=a)
        assert code == 0 and [r["run_id"] for r in json.loads(out)["runs"]] == [high.run_id]
        code, out, _ = await agentrt("runs", "list", "--label", "team=a", "--label", "env=dev", addr=a)
        assert code == 0 and out.startswith("no runs for tenant tenant-a with label team=a; label env=dev")
        for bad, named in ((("--label", "team"), "--label"), (("--min-priority", "7", "--max-priority", "3"),
                                                              "min_priority"),
                           (("--since", "yesterday"), "--since")):
            code, _, err = await agentrt("runs", "list", *bad, addr=a)
            assert code == 1 and named in err and len(err.strip().splitlines()) == 1, err

        parent = await submit(stack, agent="parent")
        lease = await claim(stack, agents=("parent",))
        spawned = await stack.work.SpawnChildren(ws.SpawnChildrenRequest(
            lease=lease_ref(lease), spawn_key="fan/1", join=ws.JOIN_MODE_ALL,
            children=[ws.ChildSpec(agent_name="kid", input_json="{}")]))
        code, out, _ = await agentrt("runs", "cancel", parent.run_id, "--keep-children", "--json", addr=a)
        assert code == 0 and json.loads(out)["cancel_requested"] is True
        child = await stack.runs.GetRun(rs.GetRunRequest(run_id=spawned.children[0].run_id), metadata=stack.md())
        assert child.status == 1  # QUEUED: kept

        code, _, err = await agentrt("runs", "retry", low.run_id, addr=a)
        assert code == 1 and "INVALID_TRANSITION" in err and len(err.strip().splitlines()) == 1
        await stack.runs.CancelRun(rs.CancelRunRequest(run_id=low.run_id), metadata=stack.md())
        code, out, _ = await agentrt("runs", "retry", low.run_id, "--request-id", "again-1", "--json", addr=a)
        retried = json.loads(out)
        assert code == 0 and retried["created"] is True and retried["retry_of_run_id"] == low.run_id
        code, out, _ = await agentrt("runs", "retry", low.run_id, "--request-id", "again-1", addr=a)
        assert code == 0 and out.startswith(f"already retried: {retried['run_id']} (QUEUED)")


async def test_a_stopped_service_is_one_line_and_non_zero():
    code, _, err = await agentrt("runs", "list", "--timeout", "0.5", addr=f"127.0.0.1:{free_port()}")
    assert code == 1 and "UNAVAILABLE" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = await agentrt("runs", "list", tenant="", addr="127.0.0.1:1")
    assert code == 1 and "--tenant" in err


async def test_status_reports_health_counts_and_lag(db_url, db):
    async with scheduler_stack(db_url) as stack:
        for _ in range(2):
            await submit(stack)
        lease = await claim(stack)
        ref = lease_ref(lease)
        await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=ref, expected_version=0, state_json=json.dumps(tool_state("t/attempt-1", "t", {})),
            schema_version=1, event_id=eid()))
        await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=ref, expected_version=1, step_key="t/attempt-1", tool_name="t", idempotency_key="k",
            request_json="{}", execution_id=eid(), event_id=eid()))
        await stack.work.MarkToolInDoubt(ws.MarkToolInDoubtRequest(lease=ref, step_key="t/attempt-1",
                                                                   error_code="timeout", event_id=eid()))
        code, out, err = await agentrt("status", "--json", addr=stack.addr)
        assert code == 0, err
        status = json.loads(out)
        assert status["services"]["scheduler"]["health"] == "SERVING"
        assert status["runs_by_status"] == {"QUEUED": 1, "PAUSED_INDOUBT": 1}
        assert status["in_doubt_runs"] == 1 and status["oldest_queued_age_s"] >= 0
        # No relay runs here: every event written so far is pending (2 submits, checkpoint, Tx1, in doubt).
        assert status["outbox_pending"] == await db.fetchval("SELECT count(*) FROM outbox") == 5
        code, out, _ = await agentrt("status", "--service", f"relay=127.0.0.1:{free_port()}", addr=stack.addr)
        assert code == 1 and "relay" in out and "UNREACHABLE" in out
        code, _, _ = await agentrt("status", "--json", addr=stack.addr, tenant="tenant-b")
        assert code == 0


async def test_history_shows_the_journal_page_by_page(db_url):
    from shared.gen.agentrt.v1 import common_pb2 as pb

    async with scheduler_stack(db_url) as stack:
        run_id = (await submit(stack)).run_id
        ref = lease_ref(await claim(stack))
        await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=ref, expected_version=0, state_json='{"cursor": 3}', schema_version=2, event_id=eid(),
            journal=[pb.JournalEntry(seq=n, kind="sleep", step_key=f"nap/{n}", detail_json='{"ms": 1}')
                     for n in (1, 2, 3)]))
        code, out, err = await agentrt("runs", "history", run_id, "--include", "journal", "--page-size", "2",
                                       "--json", addr=stack.addr)
        assert code == 0, err
        page = json.loads(out)
        assert [int(e["seq"]) for e in page["journal"]] == [1, 2] and not page["checkpoints"]
        assert page["journal"][0]["detail"] == {"ms": 1} and page["next_page_token"]
        code, out, err = await agentrt("runs", "history", run_id, "--include", "journal", "--page-size", "2",
                                       "--all", addr=stack.addr)
        assert code == 0, err
        assert "3 sleep nap/3" in out and out.count("journal (") == 2, out


async def test_schedules_commands_create_list_pause_resume_delete(db_url, db):
    async with scheduler_stack(db_url, schedule_poll_interval_ms=0) as stack:
        a = stack.addr
        args = ("schedules", "create", "nightly", "reporting", "--cron", "0 3 * * *", "--tz", "Europe/Paris",
                "--input", '{"scope": "all"}', "--overlap", "buffer_one")
        code, out, _ = await agentrt(*args, "--json", addr=a)
        assert code == 0
        made = json.loads(out)
        assert made["created"] and made["spec"]["cron"] == "0 3 * * *" and made["spec"]["input"] == {"scope": "all"}
        code, out, _ = await agentrt(*args, addr=a)
        assert code == 0 and out.startswith("already exists: ")
        code, out, _ = await agentrt("schedules", "list", addr=a)
        assert code == 0 and "nightly" in out and "Europe/Paris" in out
        sid = made["schedule_id"]
        code, out, _ = await agentrt("schedules", "pause", sid, addr=a)
        assert code == 0 and "paused" in out
        code, out, _ = await agentrt("schedules", "resume", sid, "--json", addr=a)
        assert code == 0 and not json.loads(out).get("paused", False)
        code, out, _ = await agentrt("schedules", "update", sid, "reporting", "--every", "5m", "--json", addr=a)
        assert code == 0 and int(json.loads(out)["spec"]["interval_ms"]) == 300_000
        code, _, err = await agentrt("schedules", "create", "bad", "reporting", "--cron", "61 * * * *", addr=a)
        assert code == 1 and "spec.cron" in err and len(err.strip().splitlines()) == 1
        code, _, err = await agentrt("schedules", "create", "bad", "reporting", "--every", "soon", addr=a)
        assert code == 1 and "--every" in err
        code, out, _ = await agentrt("schedules", "delete", sid, addr=a)
        assert code == 0 and out.startswith("deleted: ")
        assert await db.fetchval("SELECT count(*) FROM agent_schedules") == 0
