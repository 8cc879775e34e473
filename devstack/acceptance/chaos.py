"""`agentrt chaos`: the soak. Many runs, random SIGKILLs, one PostgreSQL and one broker restart, then invariants.

    agentrt chaos --runs 500 --minutes 10

For `--minutes` the suite submits `--runs` runs (three agents: a
non-idempotent tool without lookup, an idempotent one, one with lookup and
fences, in two tenants) while it SIGKILLs executors, the relay and the
scheduler at random moments, and the executors and relay kill themselves at
armed fault points with a small probability (shared.faults). One third in,
PostgreSQL is restarted with `pg_ctl restart -m immediate`; two thirds in, the
broker is stopped and started again. Killed processes are started again at
once. Then the faults stop and everything settles, and the soak checks:

- every run terminal, or paused with a recorded reason; the long runs (`--long-share` of the runs,
  `--long-steps` tool steps each, taken over whenever their executor is killed) completed, each
  step's call recorded once in the ledger and once in the run's gapless journal;
- at most one mock request per idempotency key for non-idempotent tools without lookup;
- every outbox row published; the consumer applied every event exactly once;
- the invariant queries (devstack.acceptance.invariants) find no violations and no checkpoint version gaps.

It prints the figures and exits 1 on any violation. Evidence and every log go
to the artifacts directory (default artifacts/chaos/<time>).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import json
import random
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from devstack.acceptance.agents import IDEMPOTENT, LOOKUP, NON_IDEMPOTENT, long_run, three_step, write_agents
from devstack.acceptance.experiments_platform import check_invariants
from devstack.acceptance.lab import Lab, Suite
from devstack.acceptance.pipeline import Pipeline, TopicReader, read_all
from devstack.acceptance.procs import Proc, wait_until

AGENTS = {"chaos-nonidem": NON_IDEMPOTENT, "chaos-idem": IDEMPOTENT, "chaos-lookup": LOOKUP}
LONG_AGENT = "chaos-long"
TENANTS = ("tenant-chaos-1", "tenant-chaos-2")
EXECUTOR_POINTS = ("after_claim_commit", "after_checkpoint_commit", "after_outbound_intent_commit",
                   "before_tool_send", "after_tool_response_before_tx2_commit", "before_finish")


async def spawn_faulty_relay(soak: Any, wait: bool = False) -> None:
    """The soak's next relay (`soak.line.relay`, named by its generation), its fault point armed
    while `soak.faulty`: a crash after the broker's ack and before the outbox row is marked."""
    assert soak.line.broker is not None
    soak.generation["relay"] += 1
    fault = (f"after_broker_ack_before_outbox_mark@probability={soak.args.fault_probability},"
             f"seed={soak.rng.randrange(1 << 30)},times=0") if soak.faulty else ""
    soak.line.relay = await soak.lab.relay(f"relay.g{soak.generation['relay']}", soak.line.broker.bootstrap,
                                           soak.line.topic, fault_point=fault, wait=wait)


async def respawn_the_dead(soak: Any) -> None:
    """Starts again each executor and the relay of a soak that died (killed by the soak or by its
    own fault point), counting the restarts in `soak.respawns`."""
    for slot, proc in list(soak.executors.items()):
        if not proc.alive():
            soak.respawns["executor"] += 1
            await soak.spawn_executor(slot)
    if soak.line.relay is not None and not soak.line.relay.alive():
        soak.respawns["relay"] += 1
        await soak.spawn_relay()


class Chaos:
    def __init__(self, lab: Lab, args: argparse.Namespace) -> None:
        self.lab = lab
        self.args = args
        self.rng = random.Random(args.seed)
        self.line = Pipeline(lab)
        self.executors: dict[str, Proc] = {}
        self.generation: collections.Counter[str] = collections.Counter()
        self.kills: collections.Counter[str] = collections.Counter()
        self.respawns: collections.Counter[str] = collections.Counter()
        self.run_ids: list[str] = []
        self.long_ids: list[str] = []
        self.faulty = True  # executors and the relay carry armed fault points until the settle phase
        self.submit_errors = 0
        self.timeline: list[str] = []
        self.must_kill = ["executor", "relay", "scheduler"]
        self.rng.shuffle(self.must_kill)

    def note(self, text: str) -> None:
        line = f"+{self.lab.elapsed():6.1f}s {text}"
        self.timeline.append(line)
        print(f"  {line}", flush=True)

    # ------------------------------------------------------------------ processes

    def _executor_faults(self) -> list[str]:
        if not self.faulty:
            return []
        p = self.args.fault_probability
        return [f"{point}@probability={p},seed={self.rng.randrange(1 << 30)},action=sigkill"
                for point in EXECUTOR_POINTS]

    async def spawn_executor(self, slot: str) -> None:
        self.generation[slot] += 1
        name = f"{slot}.g{self.generation[slot]}"
        self.executors[slot] = await self.lab.executor(name, self.line.agents_dir, faults=self._executor_faults(),
                                                       slots=8, wait=False)

    async def spawn_relay(self) -> None:
        await spawn_faulty_relay(self)

    async def spawn_scheduler(self) -> None:
        self.generation["scheduler"] += 1
        port = int(self.lab.scheduler_addr.rpartition(":")[2])
        self.scheduler = await self.lab.scheduler(name=f"scheduler.g{self.generation['scheduler']}", port=port)

    async def supervise(self) -> None:
        """Starts again whatever died (killed by the soak or by its own fault point)."""
        if not self.scheduler.alive():
            self.respawns["scheduler"] += 1
            await self.spawn_scheduler()
        await respawn_the_dead(self)

    # ------------------------------------------------------------------ load

    async def submit_all(self, until: float) -> None:
        assert self.lab.api is not None
        api = self.lab.api
        agents = list(AGENTS)
        every = max(1, round(1 / self.args.long_share)) if self.args.long_share > 0 else 0
        for i in range(self.args.runs):
            due = self.started + (until - self.started) * i / self.args.runs
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())
            long = bool(every) and i % every == 0  # the first run is long: it lives through the most faults
            tenant, agent = TENANTS[i % 2], LONG_AGENT if long else agents[i % len(agents)]
            while True:  # the same client_request_id makes a retried submit land once
                try:
                    run = await api.submit(tenant, agent, {"n": i}, client_request_id=f"chaos-{i}")
                    break
                except grpc.aio.AioRpcError:
                    self.submit_errors += 1
                    await asyncio.sleep(0.2)
            self.run_ids.append(run.run_id)
            if long:
                self.long_ids.append(run.run_id)

    # ------------------------------------------------------------------ faults

    async def kill_something(self) -> None:
        if not self.must_kill:  # every kind of process is killed at least once, then at random
            target = self.rng.choices(["executor", "relay", "scheduler"], weights=[4, 1, 1])[0]
        else:
            target = self.must_kill.pop()
        if target == "executor":
            slot = self.rng.choice(sorted(self.executors))
            proc = self.executors[slot]
        elif target == "relay":
            proc = self.line.relay  # type: ignore[assignment]
        else:
            proc = self.scheduler
        if proc is not None and proc.alive():
            self.kills[target] += 1
            self.note(f"SIGKILL {proc.name} (pid {proc.pid})")
            await asyncio.to_thread(proc.kill)

    async def restart_postgres(self) -> None:
        pg = self.lab.suite.pg
        assert pg is not None
        log = str(pg.data_dir / "server.log")
        self.note("pg_ctl restart -m immediate")
        self.lab.commands.add(f"pg_ctl -D {pg.data_dir} -w -t 60 -l {log} -m immediate restart")
        started = time.monotonic()
        await asyncio.to_thread(pg.pg_ctl, "-w", "-t", "60", "-l", log, "-m", "immediate", "restart")
        self.postgres_restart_s = round(time.monotonic() - started, 2)
        await self.lab.reconnect()

    async def restart_broker(self) -> None:
        """Stop and start Tansu on the same port; the relay is held first so nothing acked dies unread.

        Tansu keeps topics in memory only: what it acknowledged and nobody read would be lost with it
        (a test-broker artefact; Kafka keeps its log). So: SIGSTOP the relay, let the consumer apply
        what the broker holds, stop the broker, SIGCONT the relay into the outage, start the broker.
        """
        line = self.line
        assert line.broker is not None and line.relay is not None
        self.note("broker restart: holding the relay, draining the consumer")
        relay = line.relay
        relay.signal(signal.SIGSTOP)
        reader = await TopicReader(line.broker.bootstrap, line.topic).start()
        try:
            await read_all(reader, 60)
            on_broker = set(reader.counts())
        finally:
            await reader.stop()

        async def drained() -> bool:
            return on_broker <= set(await line.applied())

        await wait_until(drained, 120, "the consumer to apply what the broker holds", interval=0.2)
        port = line.broker.port
        await asyncio.to_thread(line.broker.stop)
        self.note(f"broker stopped (port {port}); relay resumed into the outage")
        if relay.alive():
            relay.signal(signal.SIGCONT)
        outage = time.monotonic()
        await wait_until(lambda: time.monotonic() - outage > 5, 10, "a five-second outage")
        await line.start_broker_again(port, self.lab)
        self.note("broker started again (relay held until the consumer rejoined)")

    # ------------------------------------------------------------------ the soak

    async def run(self) -> int:
        lab, line, args = self.lab, self.line, self.args
        mock = await line.start_core()
        self.scheduler = next(p for p in lab.procs if p.name == "scheduler")
        self.generation["scheduler"] = 1
        write_agents(line.agents_dir, *(three_step(name, mock.url, contract, sleep_ms=100 if name ==
                                                   "chaos-lookup" else 0) for name, contract in AGENTS.items()),
                     long_run(LONG_AGENT, mock.url, args.long_steps))
        await line.start_events(relay=False)
        await self.spawn_relay()
        for i in range(args.executors):
            await self.spawn_executor(f"executor-{i + 1}")
        self.started = time.monotonic()
        end = self.started + args.minutes * 60
        submitter = asyncio.create_task(self.submit_all(self.started + (end - self.started) * 0.85))
        pg_at, broker_at = self.started + (end - self.started) / 3, self.started + (end - self.started) * 2 / 3
        pg_done = broker_done = False
        self.note(f"chaos for {args.minutes:g} min: {args.runs} runs, {args.executors} executors, seed {args.seed}")
        while time.monotonic() < end:
            await asyncio.sleep(self.rng.uniform(args.kill_every_s * 0.5, args.kill_every_s * 1.5))
            await self.supervise()
            now = time.monotonic()
            if not pg_done and now >= pg_at:
                await self.restart_postgres()
                pg_done = True
            elif not broker_done and now >= broker_at:
                await self.restart_broker()
                broker_done = True
            else:
                await self.kill_something()
        if not pg_done:
            await self.restart_postgres()
        if not broker_done:
            await self.restart_broker()
        await submitter
        self.note(f"faults off; settling ({len(self.run_ids)} runs submitted)")
        self.faulty = False
        await self.supervise()
        for slot, proc in list(self.executors.items()):  # start again without armed fault points
            await asyncio.to_thread(proc.stop, 10)
            await self.spawn_executor(slot)
        if line.relay is not None:
            await asyncio.to_thread(line.relay.stop, 10)
        await self.spawn_relay()
        settle = args.settle_minutes * 60
        statuses = await line.wait_runs_settled(self.run_ids, settle)
        await line.wait_delivered(settle)
        self.note("settled; checking")
        return await self.report(statuses)

    async def check_long_runs(self) -> None:
        lab = self.lab
        if not self.long_ids:
            return
        ids = [uuid.UUID(i) for i in self.long_ids]
        rows = await lab.sql(
            "SELECT r.id, r.status, r.fencing_token, "
            "(SELECT count(*) FROM tool_executions t WHERE t.run_id = r.id AND t.status = 'SUCCEEDED') AS steps, "
            "(SELECT count(*) FROM run_journal j WHERE j.run_id = r.id AND j.kind = 'tool') AS tool_entries, "
            "(SELECT count(DISTINCT j.step_key) FROM run_journal j WHERE j.run_id = r.id AND j.kind = 'tool') "
            "  AS distinct_tool_entries, "
            "(SELECT coalesce(max(seq), 0) = count(*) FROM run_journal j WHERE j.run_id = r.id) AS gapless, "
            "(SELECT max(octet_length(state_json::text)) FROM agent_checkpoints c WHERE c.run_id = r.id) "
            "  AS max_checkpoint_bytes "
            "FROM agent_runs r WHERE r.id = ANY($1::uuid[]) ORDER BY r.created_at", ids,
            note="long runs: status, takeovers (fence), steps, journal")
        steps = self.args.long_steps
        lab.ev.observe(long_runs=[{k: (str(v) if k == "id" else v) for k, v in dict(r).items()} for r in rows])
        lab.ev.check(f"long runs ({len(rows)} of {steps} steps) completed, each step once in the ledger and the "
                     "journal, the journal gapless",
                     len(rows) == len(ids) and all(
                         r["status"] == "COMPLETED" and r["steps"] == steps and r["tool_entries"] == steps
                         and r["distinct_tool_entries"] == steps and r["gapless"] for r in rows),
                     [dict(r) for r in rows])

    async def report(self, statuses: collections.Counter[str]) -> int:
        lab, line = self.lab, self.line
        assert line.mock is not None
        ev = lab.ev
        reasons = await lab.sql("SELECT status, coalesce(pause_reason, terminal_reason, '') AS reason, count(*) "
                                "FROM agent_runs WHERE status NOT IN ('COMPLETED') GROUP BY 1, 2 ORDER BY 3 DESC",
                                note="runs not COMPLETED, by reason")
        per_key: dict[str, int] = {}
        max_calls: dict[str, int] = {}
        for name in AGENTS:
            counts: list[int] = []
            for step in "abc":
                counts += line.mock.calls_by_key(f"{name}.{step}").values()
            max_calls[name] = max(counts, default=0)
            per_key[name] = sum(counts)
        over = {k: n for step in "abc" for k, n in line.mock.calls_by_key(f"chaos-nonidem.{step}").items() if n > 1}
        fired = collections.Counter(
            text.split("fault point ", 1)[1].split(" ", 1)[0].rstrip(":")
            for p in lab.procs for text in p.log().splitlines() if "fault point " in text and "resumed" not in text)
        ev.method = {"kind": "chaos soak", "seed": self.args.seed, "runs": len(self.run_ids),
                     "minutes": self.args.minutes, "executors": self.args.executors,
                     "fault_probability": self.args.fault_probability}
        ev.observe(runs=len(self.run_ids), statuses=dict(statuses), not_completed=[dict(r) for r in reasons],
                   sigkills_by_soak=dict(self.kills), restarts=dict(self.respawns), fault_points_fired=dict(fired),
                   postgres_restart_s=getattr(self, "postgres_restart_s", None), broker_restarts=1,
                   mock_calls_per_agent=per_key, max_calls_per_key=max_calls, submit_retries=self.submit_errors,
                   timeline=self.timeline)
        settled = sum(statuses[s] for s in ("COMPLETED", "FAILED", "CANCELLED", "PAUSED_HUMAN", "PAUSED_INDOUBT"))
        ev.check("every run terminal or paused with a recorded reason", settled == len(self.run_ids),
                 dict(statuses))
        ev.check("non-idempotent tools without lookup: at most one request per idempotency key", not over, over)
        await self.check_long_runs()
        await line.check_delivery()
        await check_invariants(lab, self.run_ids)
        ev.finish()
        print()
        print(f"runs {len(self.run_ids)}: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
        for row in reasons:
            print(f"  {row['status']:<15} {row['count']:>5}  {row['reason'][:90]}")
        print(f"SIGKILLs by the soak: {dict(self.kills)}; processes started again: {dict(self.respawns)}")
        print(f"fault points fired: {dict(fired)}; PostgreSQL restart {ev.observed_result.get('postgres_restart_s')}s;"
              f" broker restarts 1")
        print(f"mock requests per agent: {per_key}; most requests for one key: {max_calls}")
        outbox = ev.observed_result
        print(f"outbox rows {outbox.get('outbox_rows')}, unpublished {outbox.get('outbox_pending')}; "
              f"events applied {outbox.get('events_applied')} ({outbox.get('distinct_events_applied')} distinct)")
        for check in ev.checks:
            print(f"  [{'ok' if check.ok else 'VIOLATION'}] {check.name}")
        print(f"\n{ev.pass_or_fail}: {sum(c.ok for c in ev.checks)} checks passed, "
              f"{sum(not c.ok for c in ev.checks)} violated; evidence in {lab.dir}")
        return 0 if ev.pass_or_fail == "PASS" else 1


async def main_async(args: argparse.Namespace) -> int:
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    artifacts = args.artifacts or Path("artifacts/chaos") / dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    suite = await Suite(artifacts, lease_ms=args.lease_ms).start()
    code = 1
    try:
        lab = Lab(suite, "chaos", "chaos soak", 1,
                  "Every run terminal or paused with a reason; at most one request per key for non-idempotent "
                  "tools without lookup; every outbox row published and applied once; no invariant violations.",
                  "random SIGKILLs of executors, relay and scheduler; armed fault points; one pg_ctl restart "
                  "-m immediate; one broker restart")
        async with lab:
            code = await Chaos(lab, args).run()
        if lab.ev.error:  # the soak itself broke (a wait timed out, a process would not start)
            print(f"chaos soak failed: {lab.ev.error} (see {lab.dir})", file=sys.stderr)
        if lab.ev.pass_or_fail != "PASS":
            code = 1
        write_summary(artifacts, lab)
    finally:
        await suite.stop()
    return code


def write_summary(artifacts: Path, lab: Lab) -> None:
    summary = {"pass_or_fail": lab.ev.pass_or_fail, "error": lab.ev.error, "observed": lab.ev.observed_result,
               "checks": [{"name": c.name, "ok": c.ok} for c in lab.ev.checks]}
    (artifacts / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    from devstack.acceptance.options import chaos_arguments, quiet

    parser = argparse.ArgumentParser(prog="agentrt chaos", description=__doc__.split("\n")[0])
    chaos_arguments(parser)
    quiet()
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
