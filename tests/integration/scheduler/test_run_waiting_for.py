"""Run.waiting_for says what a run waits for (GetRun, ListRuns, `agentrt runs get/list`), and a
run that ended no longer says it waits: CancelRun of a run paused for approval, in doubt or
waiting for a signal clears its pause reason (no stale "approve with …")."""

from __future__ import annotations

import contextlib
import io
import json
import uuid

from support import Stack, claim, eid, lease_ref, scheduler_stack, submit

from cli import main as cli
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws


async def held(stack: Stack) -> ws.Lease:
    await submit(stack)
    lease = await claim(stack)
    assert lease is not None
    return lease


async def finish(stack: Stack, lease: ws.Lease, **fields: object) -> None:
    await stack.work.FinishRun(ws.FinishRunRequest(lease=lease_ref(lease), expected_version=0, event_id=eid(),
                                                   **fields))


async def get(stack: Stack, run_id: str) -> pb.Run:
    return await stack.runs.GetRun(rs.GetRunRequest(run_id=run_id), metadata=stack.md())


async def test_waiting_for_names_approval_signal_timer_retry_and_children(db_url, db):
    async with scheduler_stack(db_url) as stack:
        fresh = await submit(stack)
        assert (await get(stack, fresh.run_id)).waiting_for == "", "a due run waits for an executor only"

        approval = await held(stack)
        await finish(stack, approval, outcome=ws.FINISH_OUTCOME_PAUSED_HUMAN,
                     reason="approve with agentrt runs resume X --approve")
        assert (await get(stack, approval.run.run_id)).waiting_for == \
            "approval: approve with agentrt runs resume X --approve"

        signal = await held(stack)
        await finish(stack, signal, outcome=ws.FINISH_OUTCOME_SLEEP, sleep_ms=600_000, wait_signal="payment")
        run = await get(stack, signal.run.run_id)
        assert run.status == pb.RUN_STATUS_QUEUED
        assert run.waiting_for.startswith("signal payment (times out at ")

        timer = await held(stack)
        await finish(stack, timer, outcome=ws.FINISH_OUTCOME_SLEEP, sleep_ms=600_000)
        assert (await get(stack, timer.run.run_id)).waiting_for.startswith("timer until ")

        retry = await held(stack)
        await finish(stack, retry, outcome=ws.FINISH_OUTCOME_RETRY, reason="model overloaded")
        run = await get(stack, retry.run.run_id)
        assert run.status == pb.RUN_STATUS_QUEUED and run.waiting_for.startswith("retry at ")
        assert run.waiting_for.endswith(f"(attempt 2 of {run.max_attempts})")

        children = await held(stack)
        await stack.work.SpawnChildren(ws.SpawnChildrenRequest(
            lease=lease_ref(children), spawn_key="fan-out", join=ws.JOIN_MODE_ALL,
            children=[ws.ChildSpec(agent_name="demo", input_json="{}") for _ in range(3)]))
        await finish(stack, children, outcome=ws.FINISH_OUTCOME_SLEEP, sleep_ms=600_000, wait_children=True)
        assert (await get(stack, children.run.run_id)).waiting_for == "children: 0/3 ended (join ALL)"

        listed = await stack.runs.ListRuns(rs.ListRunsRequest(page_size=50), metadata=stack.md())
        by_id = {r.run_id: r.waiting_for for r in listed.runs}
        assert by_id[approval.run.run_id].startswith("approval: ") and by_id[signal.run.run_id].startswith("signal ")


async def test_a_cancelled_run_no_longer_says_it_waits(db_url, db):
    """The sweep: every waiting state a run can be cancelled in (paused for a person, in doubt,
    waiting for a signal, sleeping) ends with no pause reason and no waiting_for."""
    async with scheduler_stack(db_url) as stack:
        waiting: list[str] = []
        lease = await held(stack)
        await finish(stack, lease, outcome=ws.FINISH_OUTCOME_PAUSED_HUMAN, reason="approve with agentrt runs resume")
        waiting.append(lease.run.run_id)
        lease = await held(stack)
        await finish(stack, lease, outcome=ws.FINISH_OUTCOME_SLEEP, sleep_ms=600_000, wait_signal="go")
        waiting.append(lease.run.run_id)
        lease = await held(stack)
        await finish(stack, lease, outcome=ws.FINISH_OUTCOME_SLEEP, sleep_ms=600_000)
        waiting.append(lease.run.run_id)
        # In doubt: the scheduler parks a run whose tool outcome is unknown with a pause reason.
        lease = await held(stack)
        await db.execute("UPDATE agent_runs SET status = 'PAUSED_INDOUBT', lease_owner = NULL, "
                         "lease_expires_at = NULL, pause_reason = 'tool outcome unknown: timeout' WHERE id = $1",
                         uuid.UUID(lease.run.run_id))
        waiting.append(lease.run.run_id)
        for run_id in waiting:
            assert (await get(stack, run_id)).waiting_for, run_id
            cancelled = await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run_id, reason="not needed"),
                                                   metadata=stack.md())
            assert cancelled.status == pb.RUN_STATUS_CANCELLED
            assert cancelled.pause_reason == "" and cancelled.waiting_for == "", (run_id, cancelled)
            row = await db.fetchrow("SELECT pause_reason, awaiting_signal FROM agent_runs WHERE id = $1",
                                    uuid.UUID(run_id))
            assert row["pause_reason"] is None and row["awaiting_signal"] is None


async def test_the_cli_shows_waiting_for_in_runs_get_and_list(db_url, monkeypatch):
    async with scheduler_stack(db_url) as stack:
        lease = await held(stack)
        await finish(stack, lease, outcome=ws.FINISH_OUTCOME_SLEEP, sleep_ms=600_000, wait_signal="payment")
        monkeypatch.setenv("AGENTRT_TENANT", "tenant-a")

        def run_cli(*words: str) -> str:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert cli.main([*words, "--addr", stack.addr]) == 0
            return out.getvalue()

        got = await _in_thread(run_cli, "runs", "get", lease.run.run_id)
        assert "waiting_for" in got and "signal payment (times out at" in got
        listed = await _in_thread(run_cli, "runs", "list")
        header, *rows = listed.splitlines()
        assert header.split()[-1] == "WAITING_FOR"
        assert any(lease.run.run_id in row and "signal payment" in row for row in rows)
        as_json = json.loads(await _in_thread(run_cli, "runs", "get", lease.run.run_id, "--json"))
        assert as_json["waiting_for"].startswith("signal payment")


async def _in_thread(func, *args):  # type: ignore[no-untyped-def]
    import asyncio

    return await asyncio.to_thread(func, *args)
