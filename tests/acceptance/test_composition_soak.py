"""A chaos soak of composition (issue 19): runs wait on and receive signals, and a schedule fires every
second, while executors and schedulers are SIGKILLed and started again (and executors kill themselves
at armed fault points around signal consumption). Bounded: about 40 s of chaos, then a settle.

Checked from the database once everything settled:
- signals: every signal the test queued exists once (its request id), was consumed exactly once by a
  checkpoint of its run, and is recorded once in the run's history (one agent.signal_received and one
  agent.signal_consumed event carrying its seq); a retried SignalRun answered with the same signal;
  each waiting run finished with the very signals it was sent;
- the schedule: one run per fire time (client request id `schedule:<id>:<fire time>`), consecutive
  fire times one second apart (allow_all: nothing is dropped, the catch-up window covers the moments
  when both schedulers were down), the schedule's counters agree;
- child runs: parents submitted during the chaos spawn five children joined with `all`, then two joined
  with `any` (executors also kill themselves right before SpawnChildren and right after it committed);
  each spawn step made exactly its children (spawn indexes 0..n-1, unique ids, one agent.run_submitted
  event each), each join was answered once in the parent's journal, and each parent's result holds its
  children's ids, statuses and results as the database has them;
- every run (parents and children too) reached a terminal status (COMPLETED).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from executor_support import scripted_agent, wait_for, write_agent
from trio_support import Trio, TrioProc, md

from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc

pytestmark = [pytest.mark.integration, pytest.mark.acceptance, pytest.mark.slow, pytest.mark.timeout(300)]
T = TypeVar("T")

WAITERS = 16
CHAOS_S = 40.0
KILL_EVERY_S = 1.5
HOUR_MS = 3_600_000
SEED = 20261202
# Each executor incarnation may kill itself once at these points (the process, SIGKILL).
# Probabilities per hit, with fresh seeds at every start: claims and checkpoints are many, an incarnation
# lives a few seconds (more often and runs barely move until the settle), spawns are few.
EXECUTOR_FAULTS = {"before_signal_consume_commit": 0.15, "after_checkpoint_commit": 0.05, "after_claim_commit": 0.05,
                   "before_spawn_send": 0.5, "after_spawn_commit": 0.5}
PARENTS = 4
FAN = 5  # children of each parent's join-all step
# What a SIGKILLed scheduler answers (or a call that found it down); anything else fails the soak.
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


def waiter_agent() -> dict[str, Any]:
    """Waits for `first`, then for `second` (an hour each: only the signals end the waits); a `note`
    sent meanwhile is consumed with the wait it arrives during."""
    plan = [{"id": "first", "wait_for_signal": "first", "timeout_ms": HOUR_MS},
            {"id": "second", "wait_for_signal": "second", "timeout_ms": HOUR_MS},
            {"id": "done", "finish": {"first": "${inputs.first}", "second": "${inputs.second}"}}]
    return scripted_agent("waiter", plan, [])


def parent_agent() -> dict[str, Any]:
    """Spawns one `kid` per item and waits for all of them, then a `kid` and a `napper` and waits for
    either; its result holds both answers."""
    fan = {"for_each": "${input.items}", "child": {"agent": "kid", "input": {"n": "${item}"}}, "join": "all"}
    pick = {"children": [{"agent": "kid", "input": {"n": "${input.pick}"}},
                         {"agent": "napper", "input": {"n": "${input.pick}"}}], "join": "any"}
    plan = [{"id": "fan", "spawn": fan, "timeout_ms": HOUR_MS},
            {"id": "pick", "spawn": pick, "timeout_ms": HOUR_MS},
            {"id": "done", "finish": {"fan": "${inputs.fan}", "pick": "${inputs.pick}"}}]
    return scripted_agent("parent", plan, [])


def child_agent(name: str, nap_ms: int) -> dict[str, Any]:
    return scripted_agent(name, [{"id": "nap", "sleep_ms": nap_ms}, {"id": "done", "finish": {"n": "${input.n}"}}],
                          [])


@dataclass
class Sent:
    run_id: str
    name: str
    request_id: str
    payload: dict[str, Any]
    seqs: set[int] = field(default_factory=set)  # from every answer (a retry must answer with the same)
    created: int = 0  # answers with created=true


class Soak:
    def __init__(self, trio: Trio, addrs: list[str]) -> None:
        self.trio = trio
        self.stubs = [trio.runs(addr) for addr in addrs]
        self.rng = random.Random(SEED)
        self.sent: list[Sent] = []
        self.rpc_retries = 0
        self.kills: Counter[str] = Counter()

    async def call(self, method: Callable[[rs_grpc.RunServiceStub], Awaitable[T]], within: float = 45) -> T:
        """One RunService call on whichever scheduler answers; the same request again on a failure (every
        call here is idempotent: a request id or a client request id)."""
        deadline = time.monotonic() + within
        attempt = 0
        while True:
            stub = self.stubs[attempt % len(self.stubs)]
            attempt += 1
            try:
                return await method(stub)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE or time.monotonic() > deadline:
                    raise
                self.rpc_retries += 1
                await asyncio.sleep(0.1)

    async def signal(self, sent: Sent) -> None:
        request = rs.SignalRunRequest(run_id=sent.run_id, name=sent.name, payload_json=json.dumps(sent.payload),
                                      request_id=sent.request_id)
        reply = await self.call(lambda stub: stub.SignalRun(request, metadata=md(), timeout=5))
        sent.seqs.add(reply.signal.seq)
        sent.created += int(reply.created)

    async def converse(self, run_id: str, index: int, until: float) -> None:
        """first, a note, second: at random moments within the chaos; some signals sent twice (a client
        retrying with the same request id)."""
        for name in ("first", "note", "second"):
            delay = self.rng.uniform(0, max(0.0, (until - time.monotonic()) / 3))
            await asyncio.sleep(delay)
            sent = Sent(run_id, name, f"{name}-{index}", {"run": index, "name": name})
            self.sent.append(sent)
            await self.signal(sent)
            if self.rng.random() < 0.3:
                await self.signal(sent)

    async def parent(self, index: int, until: float) -> str:
        """One parent submitted at a random moment within the chaos (so its spawns meet the kills)."""
        await asyncio.sleep(self.rng.uniform(0, max(0.0, until - time.monotonic())))
        payload = {"items": [index * 100 + k for k in range(FAN)], "pick": index * 100 + 99}
        request = rs.SubmitRunRequest(agent_name="parent", input_json=json.dumps(payload),
                                      client_request_id=f"parent-{index}")
        reply = await self.call(lambda stub: stub.SubmitRun(request, metadata=md(), timeout=5))
        return str(reply.run.run_id)

    async def chaos(self, victims: list[TrioProc], until: float) -> None:
        """SIGKILLs one process every KILL_EVERY_S (each kind in turn, shuffled), starting it again at
        once; also starts again whatever killed itself at a fault point."""
        order: list[TrioProc] = []
        while time.monotonic() < until:
            if not order:
                order = list(victims)
                self.rng.shuffle(order)
            victim = order.pop()
            if victim.alive():
                victim.kill()
                self.kills[victim.name] += 1
            await asyncio.sleep(self.rng.uniform(0, 0.8))
            # Started again without waiting for it to serve: the next kill may find it (or the other
            # scheduler) still starting, so both schedulers are sometimes down at once.
            await self.revive(victims, wait=False, rng=self.rng)
            await asyncio.sleep(KILL_EVERY_S)

    @staticmethod
    async def revive(victims: list[TrioProc], wait: bool = True, rng: random.Random | None = None) -> None:
        """Starts again what is down; with `rng`, an executor's fault points get fresh seeds (the same seeds
        at every start would make each incarnation draw alike and die at the same first hit)."""
        for proc in victims:
            if not proc.alive():
                if rng is not None and "AGENTRT_FAULT_POINTS" in proc.env:
                    proc.env["AGENTRT_FAULT_POINTS"] = executor_faults(rng)
                await proc.start(wait=wait)


def executor_faults(rng: random.Random) -> str:
    return json.dumps([f"{point}@probability={chance},seed={rng.randrange(1 << 30)}"
                       for point, chance in EXECUTOR_FAULTS.items()])


async def test_signals_and_a_schedule_survive_killed_executors_and_schedulers(db_url: str, db: Any,
                                                                             tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    write_agent(agents, waiter_agent())
    write_agent(agents, scripted_agent("tick", [{"id": "done", "finish": {"ok": True}}], []))
    for definition in (parent_agent(), child_agent("kid", 300), child_agent("napper", 2500)):
        write_agent(agents, definition)
    trio = Trio(db_url, tmp_path / "logs")
    rng = random.Random(SEED + 1)
    try:
        one, one_addr = await trio.scheduler("scheduler-1", lease_duration_ms=2000)
        two, two_addr = await trio.scheduler("scheduler-2", lease_duration_ms=2000)
        executors = [await trio.executor(f"executor-{i}", addr, agents, fault_points=executor_faults(rng),
                                         fault_action="sigkill")
                     for i, addr in ((1, one_addr), (2, two_addr))]
        soak = Soak(trio, [one_addr, two_addr])
        made = await soak.call(lambda stub: stub.CreateSchedule(rs.CreateScheduleRequest(
            name="soak-tick", spec=rs.ScheduleSpec(agent_name="tick", interval_ms=1000,
                                                   overlap=rs.SCHEDULE_OVERLAP_ALLOW_ALL)), metadata=md(), timeout=5))
        sid = made.schedule.schedule_id
        waiters = []
        for i in range(WAITERS):
            request = rs.SubmitRunRequest(agent_name="waiter", input_json="{}", client_request_id=f"waiter-{i}")
            reply = await soak.call(lambda stub, r=request: stub.SubmitRun(r, metadata=md(), timeout=5))
            waiters.append(reply.run.run_id)
        until = time.monotonic() + CHAOS_S
        results = await asyncio.gather(*(soak.parent(i, until - 25) for i in range(PARENTS)),
                                       soak.chaos([one, two, *executors], until),
                                       *(soak.converse(run_id, i, until - 5) for i, run_id in enumerate(waiters)))
        parents = [str(r) for r in results[:PARENTS]]
        chaos_end = await db.fetchval("SELECT clock_timestamp()")

        # Settle: no more kills; everything up; the schedule paused. The executors keep only the spawn fault
        # points, until each has fired once (most spawns happen here: under the chaos, takeovers of lapsed
        # leases come first and fresh runs wait), then none.
        spawn_faults = json.dumps([f"{point}@probability=0.5,seed={rng.randrange(1 << 30)}"
                                   for point in ("before_spawn_send", "after_spawn_commit")])
        for proc in executors:
            proc.kill()
            proc.env["AGENTRT_FAULT_POINTS"] = spawn_faults
        await Soak.revive([one, two, *executors])
        paused = await soak.call(lambda stub: stub.PauseSchedule(rs.PauseScheduleRequest(schedule_id=sid, paused=True),
                                                                 metadata=md(), timeout=5))
        assert paused.paused

        async def all_terminal() -> bool:
            for proc in executors:
                if not proc.alive():
                    proc.env.pop("AGENTRT_FAULT_POINTS", None)
            await Soak.revive(executors)
            open_runs = await db.fetchval("SELECT count(*) FROM agent_runs WHERE status NOT IN "
                                          "('COMPLETED', 'FAILED', 'CANCELLED')")
            return bool(open_runs == 0)

        try:
            await wait_for(all_terminal, 60, "every run terminal")
        except AssertionError:
            stuck = await db.fetch(
                "SELECT r.id, r.agent_name, r.status, r.awaiting_signal, r.lease_owner, r.attempt_count, r.version, "
                "r.last_signal_seq, r.next_attempt_at, clock_timestamp() AS now, "
                "(SELECT array_agg(s.name || ':' || s.id || ':' || (s.consumed_at IS NOT NULL)) FROM run_signals s "
                " WHERE s.run_id = r.id) AS signals "
                "FROM agent_runs r WHERE status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')")
            raise AssertionError(f"runs not terminal: {[dict(r) for r in stuck]}") from None
        await check_signals(db, soak, waiters)
        await check_schedule(db, sid)
        await check_children(db, parents)
        statuses = Counter(r["status"] for r in await db.fetch("SELECT status FROM agent_runs"))
        assert set(statuses) == {"COMPLETED"}, statuses
        # SIGKILLed by the test or by its own fault point: an executor often dies by one before the other.
        fired_by = {proc.name: re.findall(r"fault injected at (\w+)", (trio.dir / f"{proc.name}.log").read_text())
                    for proc in executors}
        ends = soak.kills + Counter({name: len(points) for name, points in fired_by.items()})
        assert all(ends[proc.name] >= 3 for proc in (one, two, *executors)), (soak.kills, fired_by)
        fired = Counter(point for points in fired_by.values() for point in points)
        spawned = await db.fetch("SELECT parent_run_id, spawn_key, min(created_at) AS at FROM agent_runs "
                                 "WHERE parent_run_id IS NOT NULL GROUP BY 1, 2")
        late = sorted(round((r["at"] - chaos_end).total_seconds(), 1) for r in spawned)
        print(f"soak: spawn groups made at (s from the chaos's end) {late}")
        assert fired["before_spawn_send"] + fired["after_spawn_commit"] >= 1, (fired, late)
        print(f"soak: faults={dict(fired)} kills={dict(soak.kills)} executor_generations="
              f"{[p.generation for p in executors]} signals={len(soak.sent)} rpc_retries={soak.rpc_retries} "
              f"statuses={dict(statuses)}")
    except BaseException:
        print(trio.logs())
        raise
    finally:
        await trio.close()


async def check_signals(db: Any, soak: Soak, waiters: list[str]) -> None:
    rows = {(str(r["run_id"]), r["request_id"]): dict(r) for r in await db.fetch("SELECT * FROM run_signals")}
    assert len(rows) == len(soak.sent), "one row per signal the test queued, none more"
    events = Counter((str(r["run_id"]), r["event_type"], r["seq"]) for r in await db.fetch(
        "SELECT run_id, event_type, (payload->>'seq')::bigint AS seq FROM outbox "
        "WHERE event_type IN ('agent.signal_received', 'agent.signal_consumed')"))
    for sent in soak.sent:
        row = rows[(sent.run_id, sent.request_id)]
        assert sent.seqs == {row["id"]} and sent.created <= 1, (sent, row["id"])
        assert row["name"] == sent.name and row["payload"] == sent.payload
        assert row["consumed_at"] is not None, f"signal {sent.request_id} of run {sent.run_id} never consumed"
        for kind in ("agent.signal_received", "agent.signal_consumed"):
            assert events[(sent.run_id, kind, row["id"])] == 1, (kind, sent)
        # Consumed by a checkpoint of that run with that fence: the one that exists.
        checkpoint = await db.fetchval("SELECT fencing_token FROM agent_checkpoints WHERE run_id = $1::uuid "
                                       "AND version = $2", sent.run_id, row["consumed_version"])
        assert checkpoint == row["consumed_fencing_token"], sent
    assert sum(events.values()) == 2 * len(soak.sent), "no signal event for a signal the test did not queue"
    by_request = {(s.run_id, s.name): rows[(s.run_id, s.request_id)]["id"] for s in soak.sent}
    for run_id in waiters:
        run = await db.fetchrow("SELECT status, result FROM agent_runs WHERE id = $1::uuid", run_id)
        assert run["status"] == "COMPLETED", run
        for name in ("first", "second"):
            answer = run["result"][name]
            assert (answer["seq"], answer["name"], answer["timed_out"]) == (by_request[(run_id, name)], name, False)
        # Each wait answered once in the run's journal, even across takeovers.
        answers = [r["step_key"] for r in await db.fetch(
            "SELECT step_key FROM run_journal WHERE run_id = $1::uuid AND kind = 'answer' ORDER BY seq", run_id)]
        assert len(answers) == len(set(answers)), answers
        assert [a for a in answers if not a.startswith("signal/")] == ["first/attempt-1", "second/attempt-1"], answers


async def check_schedule(db: Any, sid: str) -> None:
    runs = await db.fetch("SELECT client_request_id, status FROM agent_runs WHERE client_request_id LIKE $1",
                          f"schedule:{sid}:%")
    times = sorted(dt.datetime.fromisoformat(r["client_request_id"].split(":", 2)[2]) for r in runs)
    assert len(times) == len(set(times)) == len(runs) >= 30, len(runs)
    gaps = {later - earlier for earlier, later in itertools.pairwise(times)}
    assert gaps == {dt.timedelta(seconds=1)}, sorted(gaps)
    row = await db.fetchrow("SELECT fires, skipped FROM agent_schedules WHERE id = $1::uuid", sid)
    assert (row["fires"], row["skipped"]) == (len(runs), 0)
    assert {r["status"] for r in runs} == {"COMPLETED"}


async def check_children(db: Any, parents: list[str]) -> None:
    assert len(parents) == PARENTS
    children = await db.fetch("SELECT id, parent_run_id, spawn_key, spawn_index, agent_name, status, result "
                              "FROM agent_runs WHERE parent_run_id IS NOT NULL")
    assert len(children) == PARENTS * (FAN + 2), "exactly the children the parents' steps name, none twice"
    assert {str(c["parent_run_id"]) for c in children} == set(parents)
    submitted = Counter(str(r["run_id"]) for r in await db.fetch(
        "SELECT run_id FROM outbox WHERE event_type = 'agent.run_submitted' "
        "AND run_id IN (SELECT id FROM agent_runs WHERE parent_run_id IS NOT NULL)"))
    assert submitted == Counter({str(c["id"]): 1 for c in children}), "one submitted event per child"
    for index, parent_id in enumerate(parents):
        mine = sorted((c for c in children if str(c["parent_run_id"]) == parent_id),
                      key=lambda c: (c["spawn_key"], c["spawn_index"]))
        groups: dict[str, list[Any]] = {}
        for c in mine:
            groups.setdefault(c["spawn_key"], []).append(c)
        assert set(groups) == {"fan/attempt-1", "pick/attempt-1"}, set(groups)
        assert [c["spawn_index"] for c in groups["fan/attempt-1"]] == list(range(FAN))
        assert [c["spawn_index"] for c in groups["pick/attempt-1"]] == [0, 1]
        parent = await db.fetchrow("SELECT status, result, awaiting_join FROM agent_runs WHERE id = $1::uuid",
                                   parent_id)
        assert parent["status"] == "COMPLETED" and not parent["awaiting_join"], parent
        fan, pick = parent["result"]["fan"], parent["result"]["pick"]
        assert (fan["join"], fan["timed_out"], pick["join"], pick["timed_out"]) == ("all", False, "any", False)
        # join all: every child's id, COMPLETED and its result, in spawn order
        assert [(c["run_id"], c["status"], c["result"]) for c in fan["children"]] == [
            (str(c["id"]), "COMPLETED", c["result"]) for c in groups["fan/attempt-1"]]
        assert [c["result"] for c in fan["children"]] == [{"n": index * 100 + k} for k in range(FAN)]
        # join any: both children named; at least one had ended, with its result as recorded
        assert [c["run_id"] for c in pick["children"]] == [str(c["id"]) for c in groups["pick/attempt-1"]]
        ended = [(c, row) for c, row in zip(pick["children"], groups["pick/attempt-1"], strict=True)
                 if c["status"] == "COMPLETED"]
        assert ended and all(c["result"] == row["result"] for c, row in ended), pick
        # Each join answered once in the parent's journal, even across takeovers.
        answers = [r["step_key"] for r in await db.fetch(
            "SELECT step_key FROM run_journal WHERE run_id = $1::uuid AND kind = 'answer' ORDER BY seq", parent_id)]
        assert answers == ["fan/attempt-1", "pick/attempt-1"], answers
