"""Signals through the real trio's scheduler and executor (issue 19): a scripted plan waits for a
signal, parks without a lease, and a SignalRun wakes it at once; the signal is consumed exactly once,
even when the executor crashes between taking it in and the checkpoint that consumes it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from executor_support import executor, get_run, history, scripted_agent, wait_for, wait_status, write_agent
from support import Stack, scheduler_stack, submit

from executor.faults import Faults
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs

pytestmark = pytest.mark.integration
END = (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED)
HOUR_MS = 3_600_000


def waiting_agent(timeout_ms: int = HOUR_MS) -> dict[str, Any]:
    plan = [{"id": "reply", "wait_for_signal": "customer.reply", "timeout_ms": timeout_ms},
            {"id": "done", "finish": {"reply": "${inputs.reply}"}}]
    return scripted_agent("support", plan, [])


async def parked_on_signal(db: Any, run_id: str) -> bool:
    row = await db.fetchrow("SELECT status, awaiting_signal FROM agent_runs WHERE id = $1::uuid", run_id)
    return bool(row["status"] == "QUEUED" and row["awaiting_signal"] == "customer.reply")


async def send(stack: Stack, run_id: str, payload: Any, request_id: str = "") -> rs.SignalRunResponse:
    return await stack.runs.SignalRun(rs.SignalRunRequest(run_id=run_id, name="customer.reply",
                                                          payload_json=json.dumps(payload), request_id=request_id),
                                      metadata=stack.md())


async def consumption(db: Any, run_id: str) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]]]:
    """The run's signal rows, its signal events, and the journal answers recorded for them."""
    signals = [dict(r) for r in await db.fetch("SELECT * FROM run_signals WHERE run_id = $1::uuid", run_id)]
    events = [r["event_type"] for r in await db.fetch(
        "SELECT event_type FROM outbox WHERE run_id = $1::uuid AND event_type LIKE 'agent.signal_%' ORDER BY id",
        run_id)]
    answers = [dict(r) for r in await db.fetch(
        "SELECT step_key, detail FROM run_journal WHERE run_id = $1::uuid AND kind = 'answer' ORDER BY seq", run_id)]
    return signals, events, answers


async def test_a_signal_wakes_a_waiting_run_at_once(db_url, db, tmp_path):
    async with scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", waiting_agent())
        run = await submit(stack, agent="support")
        async with executor(stack, tmp_path / "agents"):
            await wait_for(lambda: parked_on_signal(db, run.run_id), 15, "the run to park on its signal")
            parked = await get_run(stack, run.run_id)
            sleeping = json.loads((await history(stack, run.run_id)).events[-1].payload_json)
            assert parked.lease_owner == "" and sleeping["awaiting_signal"] == "customer.reply"
            assert sleeping["reason"].startswith("waiting for signal customer.reply at reply/attempt-1")
            sent = await send(stack, run.run_id, {"text": "yes please"}, request_id="mail-1")
            # The timeout is an hour away: only the signal can have ended the wait.
            done = await wait_status(stack, run.run_id, *END, within=15)
        assert done.status == pb.RUN_STATUS_COMPLETED
        reply = json.loads(done.result_json)["reply"]
        assert reply == {"name": "customer.reply", "payload": {"text": "yes please"}, "seq": sent.signal.seq,
                         "timed_out": False}
        signals, events, answers = await consumption(db, run.run_id)
        [row] = signals
        assert row["consumed_at"] is not None and row["consumed_version"] is not None
        assert events == ["agent.signal_received", "agent.signal_consumed"]
        assert [a["step_key"] for a in answers] == ["reply/attempt-1"]
        # A retried SignalRun after the end answers with the signal it queued; a new one is refused.
        again = await send(stack, run.run_id, {"text": "yes please"}, request_id="mail-1")
        assert not again.created and again.signal.seq == sent.signal.seq


async def test_a_signal_wait_ends_at_its_timeout(db_url, db, tmp_path):
    async with scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", waiting_agent(timeout_ms=400))
        run = await submit(stack, agent="support")
        async with executor(stack, tmp_path / "agents"):
            done = await wait_status(stack, run.run_id, *END, within=20)
        assert done.status == pb.RUN_STATUS_COMPLETED
        assert json.loads(done.result_json)["reply"] == {"name": "customer.reply", "payload": None, "seq": 0,
                                                         "timed_out": True}


async def test_a_signal_sent_before_the_wait_is_its_answer(db_url, db, tmp_path):
    """Queued before any executor ran: delivered at the first claim, it answers the wait when the
    plan reaches it (the park is due at once, the next claim ends the wait)."""
    async with scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", waiting_agent())
        run = await submit(stack, agent="support")
        sent = await send(stack, run.run_id, {"text": "early"})
        async with executor(stack, tmp_path / "agents"):
            done = await wait_status(stack, run.run_id, *END, within=15)
        reply = json.loads(done.result_json)["reply"]
        assert (reply["payload"], reply["seq"], reply["timed_out"]) == ({"text": "early"}, sent.signal.seq, False)
        signals, events, _ = await consumption(db, run.run_id)
        assert [r["consumed_at"] is not None for r in signals] == [True]
        assert events.count("agent.signal_consumed") == 1


@pytest.mark.parametrize("fault", ["before_signal_consume_commit", "after_checkpoint_commit@occurrence=2"])
async def test_a_signal_is_consumed_once_across_an_executor_crash(db_url, db, tmp_path, fault):
    """The executor abandons the run (its lease left to lapse, like a crash) either after taking the
    signal in but before the checkpoint consuming it, or right after that checkpoint committed. The
    takeover consumes it if and only if it was not consumed: once in all, recorded once."""
    async with scheduler_stack(db_url, lease_duration_ms=1500) as stack:
        write_agent(tmp_path / "agents", waiting_agent())
        run = await submit(stack, agent="support")
        faults = Faults([fault], action="raise")
        async with executor(stack, tmp_path / "agents", faults=faults):
            await wait_for(lambda: parked_on_signal(db, run.run_id), 15, "the run to park on its signal")
            sent = await send(stack, run.run_id, {"text": "once"})
            done = await wait_status(stack, run.run_id, *END, within=30)
        assert faults.fired == [fault.partition("@")[0]], "the crash happened"
        assert done.status == pb.RUN_STATUS_COMPLETED and done.fencing_token >= 3, "a takeover finished the run"
        assert json.loads(done.result_json)["reply"]["seq"] == sent.signal.seq
        signals, events, answers = await consumption(db, run.run_id)
        [row] = signals
        assert row["consumed_at"] is not None
        assert events == ["agent.signal_received", "agent.signal_consumed"]
        assert [a["step_key"] for a in answers] == ["reply/attempt-1"]
        consumed_by = await db.fetchrow("SELECT fencing_token FROM agent_checkpoints WHERE run_id = $1::uuid "
                                        "AND version = $2", run.run_id, row["consumed_version"])
        assert consumed_by["fencing_token"] == row["consumed_fencing_token"]


async def test_other_signals_reach_the_next_decision_once(db_url, db, tmp_path):
    """Signals of other names do not end the wait; they are consumed with it and shown to the decision
    after it (ctx.signals), and kept in the state's inputs."""
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack, agent="signal_collector")
        async with executor(stack, "signal_agents"):
            async def parked() -> bool:
                row = await db.fetchrow("SELECT status, awaiting_signal FROM agent_runs WHERE id = $1::uuid",
                                        run.run_id)
                return bool(row["status"] == "QUEUED" and row["awaiting_signal"] == "go")

            await wait_for(parked, 15, "the run to park on go")
            for name, payload in (("note", {"n": 1}), ("note", {"n": 2})):
                await stack.runs.SignalRun(rs.SignalRunRequest(run_id=run.run_id, name=name,
                                                               payload_json=json.dumps(payload)), metadata=stack.md())
            assert await parked(), "a signal of another name leaves the run parked"
            go = await stack.runs.SignalRun(rs.SignalRunRequest(run_id=run.run_id, name="go", payload_json="1"),
                                            metadata=stack.md())
            done = await wait_status(stack, run.run_id, *END, within=15)
        assert done.status == pb.RUN_STATUS_COMPLETED, done.terminal_reason
        result = json.loads(done.result_json)
        assert result["go"] == {"name": "go", "payload": 1, "seq": go.signal.seq, "timed_out": False}
        assert result["shown"] == [{"name": "note", "payload": {"n": 1}}, {"name": "note", "payload": {"n": 2}}]
        assert len(result["kept"]) == 2
        rows = await db.fetch("SELECT consumed_version FROM run_signals WHERE run_id = $1::uuid", run.run_id)
        assert len({r["consumed_version"] for r in rows}) == 1 and None not in {r["consumed_version"] for r in rows}


async def test_the_next_wait_is_answered_by_a_signal_delivered_with_the_one_that_ended_the_last(db_url, db,
                                                                                               tmp_path):
    """The run parks on `first`; `first` and `second` are both queued before it is claimed again. The claim
    ends the `first` wait and takes `second` in as a signal shown to the next decision (consuming it); that
    decision waits for `second`: the wait ends at once with it. (It used to park for the whole timeout,
    its signal consumed already: lost.)"""
    plan = [{"id": "first", "wait_for_signal": "first", "timeout_ms": HOUR_MS},
            {"id": "second", "wait_for_signal": "second", "timeout_ms": HOUR_MS},
            {"id": "done", "finish": {"first": "${inputs.first}", "second": "${inputs.second}"}}]
    async with scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", scripted_agent("two-waits", plan, []))
        run = await submit(stack, agent="two-waits")

        async def parked_on_first() -> bool:
            row = await db.fetchrow("SELECT status, awaiting_signal FROM agent_runs WHERE id = $1::uuid", run.run_id)
            return bool(row["status"] == "QUEUED" and row["awaiting_signal"] == "first")

        async with executor(stack, tmp_path / "agents"):
            await wait_for(parked_on_first, 15, "the run to park on first")
        sent = {}
        for name in ("first", "second"):
            sent[name] = (await stack.runs.SignalRun(rs.SignalRunRequest(
                run_id=run.run_id, name=name, payload_json=json.dumps({"n": name})), metadata=stack.md())).signal.seq
        async with executor(stack, tmp_path / "agents"):
            done = await wait_status(stack, run.run_id, *END, within=15)
        assert done.status == pb.RUN_STATUS_COMPLETED, done.terminal_reason
        result = json.loads(done.result_json)
        for name in ("first", "second"):
            assert result[name] == {"name": name, "payload": {"n": name}, "seq": sent[name], "timed_out": False}
        signals, events, answers = await consumption(db, run.run_id)
        assert all(r["consumed_at"] is not None for r in signals) and len(signals) == 2
        assert events.count("agent.signal_consumed") == 2
        assert sorted(a["step_key"] for a in answers if not a["step_key"].startswith("signal/")) == [
            "first/attempt-1", "second/attempt-1"]


async def test_signals_queued_before_the_first_claim_answer_successive_waits_in_turn(db_url, db, tmp_path):
    """Three waits (a, b, c) and all three signals queued before any executor ran (c first): one claim takes
    them all in, and each wait is answered by its own signal in turn. (Only the first used to be: the
    others were consumed with it and b slept to its timeout.)"""
    plan = [*({"id": name, "wait_for_signal": name, "timeout_ms": HOUR_MS} for name in "abc"),
            {"id": "done", "finish": {name: f"${{inputs.{name}}}" for name in "abc"}}]
    async with scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", scripted_agent("three-waits", plan, []))
        run = await submit(stack, agent="three-waits")
        seqs = {}
        for name in "cab":
            seqs[name] = (await stack.runs.SignalRun(rs.SignalRunRequest(
                run_id=run.run_id, name=name, payload_json=json.dumps(name)), metadata=stack.md())).signal.seq
        async with executor(stack, tmp_path / "agents"):
            done = await wait_status(stack, run.run_id, *END, within=15)
        assert done.status == pb.RUN_STATUS_COMPLETED, done.terminal_reason
        result = json.loads(done.result_json)
        assert {name: (result[name]["seq"], result[name]["payload"]) for name in "abc"} == {
            name: (seqs[name], name) for name in "abc"}
        signals, events, _ = await consumption(db, run.run_id)
        assert len(signals) == 3 and all(r["consumed_at"] is not None for r in signals)
        assert events.count("agent.signal_consumed") == 3
