"""`agentrt chaos --ha`: the long soak on a Patroni cluster, with a failover every 15 minutes.

    agentrt chaos --ha --minutes 60 --kill-every-s 20 --fault-probability 0.002

The pipeline of experiment 10 (etcd, two PostgreSQL 15 nodes under Patroni in synchronous mode,
every service on the multi-host DSN with target_session_attrs=read-write; the scheduler, three
executors, the mock tool, the relay, a broker and a consumer) first runs a burst to measure its
throughput, then takes runs of the chaos soak's three agents at half that rate for `--minutes`
while:

- executors 2.. and the relay are SIGKILLed at random (`--kill-every-s`) and carry armed fault
  points; whatever dies is started again. The scheduler and executor-1 are never killed: they
  live through the whole soak, so their RSS is a series a leak would show in;
- every `--failover-every-min` minutes the leader's Patroni and postmaster are SIGKILLed, the
  standby takes over and the old leader comes back through pg_rewind. Committed progress read
  before the kill (and flushed by the synchronous standby) must all be there afterwards;
- retention is on: the scheduler's sweep runs every `--retention-interval-s`. The shortest policy
  is one day, so the soak's driver moves a run's finished_at back a day once it has been terminal
  for `--keep-finished-s` (the one write it makes to the runtime's tables; it stands for time
  passing), and the sweep then deletes it with its rows, as it would a day later;
- every `--maintain-every-min` minutes the soak runs `agentrt maintain indexes` as the owner, as
  the chart's CronJob does (runs paused in doubt are never deleted, and each pins the pages of
  the time-ordered indexes it sits on: scheduler/background/maintenance.py).

Every minute it samples: RSS of the scheduler and of executor-1; table plus index size of the
runtime tables; p50/p99 of step latency (from one tool result of a run to its next, in the ledger),
of submit to first step (a run's creation to its first ledger intent, for the runs of the previous
minute) and of claim wait (agentrt_claim_wait_seconds, interpolated within buckets); runs finished.
The report (devstack/acceptance/soak_report.py) calls each figure flat when its value at the end
(the last sixth) is within 1.2x of minutes 10-20 (the second sixth), and checks every invariant of
the chaos soak and of experiment 10. Evidence, samples.jsonl and report.md go to the artifacts.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import json
import random
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import grpc

from devstack.acceptance import ha_cluster, soak_ha_checks, soak_report
from devstack.acceptance.agents import three_step, write_agents
from devstack.acceptance.chaos import (
    AGENTS,
    EXECUTOR_POINTS,
    TENANTS,
    respawn_the_dead,
    spawn_faulty_relay,
    write_summary,
)
from devstack.acceptance.experiments_ha import CLUSTER_PROCS, CommitProbe, _final, _lost, _snapshot
from devstack.acceptance.ha_cluster import HaCluster
from devstack.acceptance.lab import Lab, Suite
from devstack.acceptance.pipeline import Pipeline
from devstack.acceptance.procs import ExperimentError, Proc, wait_until
from devstack.embedded_pg import free_port
from shared.db import CONNECTION_ERRORS

MAIN_TABLES = soak_report.MAIN_TABLES
MIB = 1024 * 1024

STEP_LATENCY = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY gap) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY gap) AS p99, count(*) AS n
FROM (SELECT t.completed_at,
             extract(epoch FROM t.completed_at - lag(t.completed_at) OVER (PARTITION BY t.run_id
                                                                           ORDER BY t.completed_at)) * 1000 AS gap
      FROM tool_executions t WHERE t.completed_at > $1::timestamptz - interval '2 minutes') s
WHERE s.gap IS NOT NULL AND s.completed_at > $1 AND s.completed_at <= $2"""

FIRST_STEP = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99, count(*) AS n
FROM (SELECT extract(epoch FROM (SELECT min(t.outbound_intent_at) FROM tool_executions t WHERE t.run_id = r.id)
                                - r.created_at) * 1000 AS ms
      FROM agent_runs r WHERE r.created_at > $1 AND r.created_at <= $2) s
WHERE ms IS NOT NULL"""

SIZES = """
SELECT c.relname, pg_table_size(c.oid) + pg_indexes_size(c.oid) AS bytes, pg_indexes_size(c.oid) AS index_bytes
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND c.relname <> 'ha_probe'"""

# A run is aged no sooner than 150 s after its creation: the sampler times the first step of the
# previous minute's runs, so a run must still be there up to two minutes after it was submitted.
AGE_FINISHED = """
WITH aged AS (
  UPDATE agent_runs SET finished_at = finished_at - interval '1 day'
  WHERE finished_at > clock_timestamp() - interval '12 hours'
    AND finished_at < clock_timestamp() - make_interval(secs => $1)
    AND created_at < clock_timestamp() - interval '150 seconds'
  RETURNING 1)
SELECT count(*) FROM aged"""


class Reader:
    """One connection of the soak's own (the sampler's, the ager's), through the multi-host DSN.
    A statement that fails (a failover under way, a cancel) is retried on a new connection a few
    times: a sample is read, never a reason to end the soak. Retries are counted for the report."""

    def __init__(self, dsn: str, errors: collections.Counter[str]) -> None:
        self.dsn, self.errors = dsn, errors
        self.conn: asyncpg.Connection | None = None

    async def rows(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        for attempt in range(6):
            try:
                if self.conn is None or self.conn.is_closed():
                    self.conn = await asyncpg.connect(self.dsn, timeout=5)
                return list(await self.conn.fetch(sql, *args, timeout=60))
            except (*CONNECTION_ERRORS, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                self.errors[type(exc).__name__] += 1
                if self.conn is not None:
                    self.conn.terminate()
                self.conn = None
                if attempt == 5:
                    raise
                await asyncio.sleep(2)
        raise AssertionError("unreachable")

    async def value(self, sql: str, *args: Any) -> Any:
        rows = await self.rows(sql, *args)
        return rows[0][0] if rows else None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.terminate()


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


class HaSoak:
    def __init__(self, lab: Lab, args: argparse.Namespace) -> None:
        self.lab, self.args = lab, args
        self.rng = random.Random(args.seed)
        self.cluster = HaCluster(lab, nodes=2, strict=False)
        self.line = Pipeline(lab)
        self.executors: dict[str, Proc] = {}
        self.generation: collections.Counter[str] = collections.Counter()
        self.kills: collections.Counter[str] = collections.Counter()
        self.respawns: collections.Counter[str] = collections.Counter()
        self.refused: collections.Counter[str] = collections.Counter()
        self.run_ids: list[str] = []
        self.samples: list[dict[str, Any]] = []
        self.failovers: list[dict[str, Any]] = []
        self.timeline: list[str] = []
        self.aged = 0
        self.maintenance: list[dict[str, Any]] = []
        self.faulty = True
        self.rate = 0.0
        self.calm = asyncio.Event()  # set while the killer and the ager may act (cleared around a failover)
        self.calm.set()
        self.stopping = asyncio.Event()
        self.probe: CommitProbe | None = None
        self.read_errors: collections.Counter[str] = collections.Counter()
        self.reader: Reader | None = None
        self.ager: Reader | None = None

    def note(self, text: str) -> None:
        line = f"+{self.lab.elapsed():7.1f}s {text}"
        self.timeline.append(line)
        print(f"  {line}", flush=True)

    # ------------------------------------------------------------------ processes

    async def spawn_executor(self, slot: str, wait: bool = False) -> None:
        self.generation[slot] += 1
        p = self.args.fault_probability
        faults = [f"{point}@probability={p},seed={self.rng.randrange(1 << 30)},action=sigkill"
                  for point in EXECUTOR_POINTS] if self.faulty and slot != "executor-1" else []
        self.executors[slot] = await self.lab.executor(f"{slot}.g{self.generation[slot]}", self.line.agents_dir,
                                                       faults=faults, slots=8, wait=wait)

    async def spawn_relay(self, wait: bool = False) -> None:
        await spawn_faulty_relay(self, wait)

    async def supervise(self) -> None:
        await respawn_the_dead(self)

    async def start(self) -> None:
        lab, line, args = self.lab, self.line, self.args
        await self.cluster.start()
        leader = self.cluster.leader()
        assert leader is not None
        lab.pg_url = self.cluster.dsn("postgres", order=[leader, *self.cluster.replicas()])
        await lab.runtime_database()
        assert lab.db is not None  # the shortest policy there is (one day), the soak's ager standing for the day
        await lab.db.execute("UPDATE retention_policies SET keep_days = 1 WHERE tenant_id = '*'")
        self.metrics_port = free_port()
        self.scheduler = await lab.scheduler(db_probe_interval_s=0.5, metrics_addr=f"127.0.0.1:{self.metrics_port}",
                                             run_retention_interval_s=args.retention_interval_s,
                                             run_retention_pause_ms=0)
        mock = line.mock = await lab.mocktool()
        write_agents(line.agents_dir, *(three_step(name, mock.url, contract) for name, contract in AGENTS.items()))
        await line.start_events(relay=False)
        await self.spawn_relay(wait=True)
        for i in range(args.executors):
            await self.spawn_executor(f"executor-{i + 1}", wait=True)
        assert lab.db is not None
        await lab.db.execute("CREATE TABLE ha_probe (seq bigint PRIMARY KEY, "
                             "at timestamptz NOT NULL DEFAULT clock_timestamp())")
        self.probe = CommitProbe(lab.db_url).start()
        self.reader, self.ager = Reader(lab.db_url, self.read_errors), Reader(lab.db_url, self.read_errors)

    # ------------------------------------------------------------------ load

    async def _submit(self, i: int) -> None:
        api = self.lab.api
        assert api is not None
        tenant, agent = TENANTS[i % 2], list(AGENTS)[i % len(AGENTS)]
        while True:  # the same client_request_id makes a retried submit land once
            try:
                run = await api.submit(tenant, agent, {"n": i}, client_request_id=f"soak-{i}")
                break
            except grpc.aio.AioRpcError as exc:
                self.refused[exc.code().name] += 1
                await asyncio.sleep(0.2)
        self.run_ids.append(run.run_id)

    async def calibrate(self) -> float:
        """Runs per second the pipeline completes when a burst waits for it (faults armed, no kills)."""
        n = self.args.calibration_runs
        started = time.monotonic()
        for first in range(0, n, 20):
            await asyncio.gather(*(self._submit(i) for i in range(first, min(first + 20, n))))
        await self.line.wait_runs_settled(self.run_ids, 600)
        rate = n / (time.monotonic() - started)
        self.note(f"calibration: {n} runs in {time.monotonic() - started:.1f}s = {rate:.1f} runs/s")
        return rate

    async def feed(self) -> None:
        i, interval = self.args.calibration_runs, 1 / self.rate
        next_at = time.monotonic()
        while not self.stopping.is_set():
            await self._submit(i)
            i += 1
            next_at = max(next_at + interval, time.monotonic() - 1)  # catch up at most a second after an outage
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), max(0.0, next_at - time.monotonic()))

    async def keep_alive(self) -> None:
        while not self.stopping.is_set():
            await self.supervise()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 1)

    async def kill_at_random(self) -> None:
        every = self.args.kill_every_s
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.rng.uniform(every * 0.5, every * 1.5))
            await self.calm.wait()
            if self.stopping.is_set():
                return
            slots = sorted(s for s in self.executors if s != "executor-1")
            target = self.rng.choices(["executor", "relay"], weights=[4, 1])[0] if slots else "relay"
            proc = self.executors[self.rng.choice(slots)] if target == "executor" else self.line.relay
            if proc is not None and proc.alive():
                self.kills[target] += 1
                await asyncio.to_thread(proc.kill)

    async def age_finished(self) -> None:
        while not self.stopping.is_set():
            await self.calm.wait()
            assert self.ager is not None
            self.aged += int(await self.ager.value(AGE_FINISHED, float(self.args.keep_finished_s)) or 0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 15)

    async def maintain(self) -> None:
        """`agentrt maintain indexes` every `--maintain-every-min` minutes, as the chart's CronJob runs it
        (as the owner; the soak's pace is a week's in an hour, so its cron is minutes, not days)."""
        from scheduler.background.maintenance import maintain_indexes

        every = self.args.maintain_every_min * 60
        while every > 0 and not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), every)
            await self.calm.wait()
            if self.stopping.is_set():
                return
            started = time.monotonic()
            try:
                conn = await asyncpg.connect(self.lab.db_url, timeout=10)
                try:
                    report = await maintain_indexes(conn)
                finally:
                    await conn.close()
            except (*CONNECTION_ERRORS, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                self.maintenance.append({"error": f"{type(exc).__name__}: {exc}"})  # the next pass drops leftovers
                continue
            done = {"seconds": round(time.monotonic() - started, 2),
                    "rebuilt": {e["index"]: [round(e["bytes_before"] / MIB, 2), round(e["bytes_after"] / MIB, 2)]
                                for e in report.rebuilt}, "dropped": [e["index"] for e in report.dropped]}
            self.maintenance.append(done)
            self.note(f"index upkeep: {len(report.rebuilt)} rebuilt in {done['seconds']} s "
                      f"(MiB before, after: {done['rebuilt']})")

    # ------------------------------------------------------------------ samples

    async def sample(self, minute: int, since: Any, scrape: dict[float, float]) -> tuple[Any, dict[float, float]]:
        lab = self.reader
        assert lab is not None
        now = await lab.value("SELECT clock_timestamp()")
        step = (await lab.rows(STEP_LATENCY, since, now))[0]
        previous = self.samples[-1]["since"] if self.samples else since
        first = (await lab.rows(FIRST_STEP, previous, since))[0]
        size_rows = await lab.rows(SIZES)
        sizes = {r["relname"]: r["bytes"] for r in size_rows}
        index_mib = {r["relname"]: round(r["index_bytes"] / MIB, 3) for r in size_rows if r["relname"] in MAIN_TABLES}
        finished = await lab.value("SELECT count(*) FROM agent_runs WHERE finished_at > $1 AND finished_at <= $2",
                                   since, now)
        queued = await lab.value("SELECT count(*) FROM agent_runs WHERE status = 'QUEUED'")
        buckets = soak_report.claim_wait_buckets(await asyncio.to_thread(_metrics, self.metrics_port))
        figures: dict[str, float | None] = {
            "RSS scheduler": rss_mib(self.scheduler.pid), "RSS executor-1": rss_mib(self.executors["executor-1"].pid),
            "size all tables": sum(sizes.values()) / MIB,
            **{f"size {t}": sizes.get(t, 0) / MIB for t in MAIN_TABLES},
            "step p50": step["p50"], "step p99": step["p99"],
            "submit to first step p50": first["p50"], "submit to first step p99": first["p99"],
            "claim wait p50": _ms(soak_report.bucket_quantile(scrape, buckets, 0.5)),
            "claim wait p99": _ms(soak_report.bucket_quantile(scrape, buckets, 0.99))}
        record = {"minute": minute, "since": since, "until": now,
                  "figures": {k: (round(float(v), 3) if v is not None else None) for k, v in figures.items()},
                  "runs_finished": finished, "steps": step["n"], "queued": queued, "submitted": len(self.run_ids),
                  "aged": self.aged, "index_mib": index_mib,
                  "relay_rss_mib": rss_mib(self.line.relay.pid) if self.line.relay else None}
        self.samples.append(record)
        await asyncio.to_thread(_append, self.lab.dir / "samples.jsonl", json.dumps(record, default=str))
        f = record["figures"]
        self.note(f"minute {minute}: {finished} runs finished, {step['n']} steps, queued {queued}; "
                  f"step p50/p99 {f['step p50']}/{f['step p99']} ms; RSS sched {f['RSS scheduler']} "
                  f"exec-1 {f['RSS executor-1']} MiB; tables {f['size all tables']} MiB")
        return now, buckets

    # ------------------------------------------------------------------ failover

    async def failover(self, number: int) -> None:
        """SIGKILL the leader's Patroni and postmaster; the standby takes over; the old leader
        comes back through pg_rewind. The killer and the ager rest meanwhile."""
        lab, cluster = self.lab, self.cluster
        self.calm.clear()
        try:
            excluded = {r["id"] for r in await lab.fetch(
                "SELECT id FROM agent_runs WHERE finished_at < clock_timestamp() - interval '12 hours'")}
            events = {r["event_id"] for r in await lab.fetch(
                "SELECT event_id FROM outbox WHERE run_id = ANY($1::uuid[])", list(excluded))}
            before = _without(await _snapshot(lab, f"committed progress before failover {number}"), excluded, events)
            victim = cluster.leader()
            assert victim is not None
            t_kill = time.monotonic()
            self.note(f"failover {number}: SIGKILL {victim.name}'s Patroni and postmaster")
            record: dict[str, Any] = {"number": number, "killed": cluster.kill(victim)}
            successor = await cluster.wait_leader(60, other_than=victim)
            record.update(new_leader=successor.name, seconds_until_new_leader=round(time.monotonic() - t_kill, 2))
            record["rejoin"] = await cluster.rejoin(victim)
            await cluster.wait_in_sync(90)
            after = await _final(lab)
            assert self.probe is not None
            recovered = self.probe.recovered_after(t_kill)
            record.update(time_to_recover_s=round(recovered, 2) if recovered else None,
                          lost=_lost(before, after),
                          fence_went_back=[str(k) for k, r in before["runs"].items()
                                           if k in after["runs"] and after["runs"][k]["fencing_token"]
                                           < r["fencing_token"]][:10])
            self.failovers.append(record)
            self.note(f"failover {number}: {successor.name} leads after {record['seconds_until_new_leader']}s, "
                      f"writes again after {record['time_to_recover_s']}s; old leader back (pg_rewind "
                      f"{record['rejoin'].get('pg_rewind_used')})")
        finally:
            self.calm.set()

    # ------------------------------------------------------------------ the soak

    async def run(self) -> int:
        args = self.args
        await self.start()
        self.rate = args.rate or await self.calibrate() / 2
        self.note(f"soak for {args.minutes:g} min at {self.rate:.1f} runs/s, failover every "
                  f"{args.failover_every_min:g} min, seed {args.seed}")
        tasks = [asyncio.create_task(coro) for coro in (self.feed(), self.keep_alive(), self.kill_at_random(),
                                                        self.age_finished(), self.maintain())]
        started = time.monotonic()
        assert self.reader is not None
        since = await self.reader.value("SELECT clock_timestamp()")
        scrape = soak_report.claim_wait_buckets(await asyncio.to_thread(_metrics, self.metrics_port))
        failovers_done, minute = 0, 0
        while minute < args.minutes:
            await _sleep_until(started + (minute + 1) * 60)
            minute += 1
            since, scrape = await self.sample(minute, since, scrape)
            if minute < args.minutes and minute % args.failover_every_min == 0:
                failovers_done += 1
                await self.failover(failovers_done)
        self.stopping.set()
        await asyncio.gather(*tasks)
        await self.settle()
        return await self.report()

    async def settle(self) -> None:
        self.note(f"faults off; settling ({len(self.run_ids)} runs submitted)")
        self.faulty = False
        await self.supervise()
        for slot, proc in list(self.executors.items()):
            if slot != "executor-1":
                await asyncio.to_thread(proc.stop, 10)
                await self.spawn_executor(slot)
        if self.line.relay is not None:
            await asyncio.to_thread(self.line.relay.stop, 10)
        await self.spawn_relay()
        self.statuses = await self._settled(self.args.settle_minutes * 60)
        try:
            await self.line.wait_delivered(self.args.settle_minutes * 60)
        except ExperimentError as exc:
            # Not the end of the soak: the report still gives every figure it measured, and the
            # delivery check below fails naming the events not applied (their details are in the evidence).
            self.note(f"settle: {exc}")
        if self.probe is not None:
            await self.probe.stop()

    async def _settled(self, within: float) -> collections.Counter[str]:
        """Runs that retention deleted were terminal; the rest must be terminal or paused."""
        settled = ("COMPLETED", "FAILED", "CANCELLED", "PAUSED_HUMAN", "PAUSED_INDOUBT")

        async def done() -> collections.Counter[str] | None:
            counts = await self.line.statuses(self.run_ids)
            counts["deleted by retention"] = len(self.run_ids) - sum(counts.values())
            return counts if sum(counts[s] for s in settled) + counts["deleted by retention"] == len(
                self.run_ids) else None

        return await wait_until(done, within, f"all {len(self.run_ids)} runs to settle", interval=0.5)

    async def report(self) -> int:
        return await soak_ha_checks.report(self)

    async def teardown(self) -> None:
        """Services first, then the cluster they use; the databases go with its data directories."""
        self.stopping.set()
        if self.probe is not None:
            await self.probe.stop()
        for reader in (self.reader, self.ager):
            if reader is not None:
                reader.close()
        for proc in reversed(stop_cluster_last(self.lab)):
            await asyncio.to_thread(proc.stop, 10)
        if self.lab.db is not None and not self.lab.db.is_closed():
            self.lab.db.terminate()
        await self.cluster.stop()
        self.lab.databases.clear()


def _append(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _without(snapshot: dict[str, Any], runs: set[uuid.UUID], events: set[uuid.UUID]) -> dict[str, Any]:
    """The snapshot less the runs retention may delete meanwhile (aged before the failover)."""
    return {"runs": {k: v for k, v in snapshot["runs"].items() if k not in runs},
            "checkpoints": {k: v for k, v in snapshot["checkpoints"].items() if k[0] not in runs},
            "ledger": {k: v for k, v in snapshot["ledger"].items() if k[0] not in runs},
            "journal": {k for k in snapshot["journal"] if k[0] not in runs},
            "outbox": {k: v for k, v in snapshot["outbox"].items() if k not in events}}


async def _sleep_until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - time.monotonic()))


def stop_cluster_last(lab: Lab) -> list[Proc]:
    """The lab's processes that are services (stopped before the cluster they use)."""
    return [p for p in lab.procs if not p.name.startswith(CLUSTER_PROCS)]


async def main_async(args: argparse.Namespace) -> int:
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    missing = ha_cluster.missing_binaries()
    if missing:
        print(f"agentrt chaos --ha needs {', '.join(missing)} (Debian: apt-get install patroni etcd-server "
              "postgresql-15)", file=sys.stderr)
        return 2
    artifacts = args.artifacts or Path("artifacts/soak-ha") / dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    suite = await Suite(artifacts, lease_ms=args.lease_ms).start()
    code = 1
    try:
        lab = Lab(suite, "soak-ha", "HA soak", 1,
                  "Flat resources and latencies; nothing committed lost across failovers; every run settled; "
                  "every outbox row published and applied once; no invariant violations.",
                  "random SIGKILLs of executors and the relay, armed fault points, a failover every "
                  f"{args.failover_every_min:g} minutes")
        soak = HaSoak(lab, args)
        async with lab:
            try:
                code = await soak.run()
            finally:
                await soak.teardown()
        if lab.ev.error:
            print(f"HA soak failed: {lab.ev.error} (see {lab.dir})", file=sys.stderr)
        if lab.ev.pass_or_fail != "PASS":
            code = 1
        write_summary(artifacts, lab)
    finally:
        await suite.stop()
    return code


__all__ = ["HaSoak", "main_async", "rss_mib", "stop_cluster_last"]
