"""Experiment 10: the database primary lost under load (Patroni, etcd, PostgreSQL 15; docs/ha.md).

The whole pipeline (scheduler, two executors, mock tool, relay, broker, consumer) runs on a
two-node Patroni cluster in synchronous mode, every service connecting through the multi-host
DSN with target_session_attrs=read-write. A feeder submits a run every 150 ms throughout, so
runs are at every stage when a fault lands: (a) a switchover with patronictl, (b) the leader's
Patroni and postmaster SIGKILLed (a failover), (c) the old leader back as a standby (pg_rewind).
Before each fault the committed progress is read from the leader and the experiment waits until
the synchronous standby has flushed past it; afterwards none of it may be missing. A probe in
this process commits a row every 50 ms and keeps what was acknowledged: no acknowledged row may
be lost, and the end of its longest pause after the kill is the time to recover. The services
must ride it all out with the same pids.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import itertools
import re
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.acceptance import ha_cluster
from devstack.acceptance.agents import LOOKUP, three_step, write_agents
from devstack.acceptance.evidence import jsonable
from devstack.acceptance.experiments_platform import check_invariants
from devstack.acceptance.ha_cluster import HaCluster
from devstack.acceptance.lab import TENANT, Lab
from devstack.acceptance.pipeline import Pipeline
from devstack.acceptance.procs import ExperimentError, wait_until
from devstack.embedded_pg import free_port
from shared.db import CONNECTION_ERRORS
from shared.gen.agentrt.v1 import run_service_pb2

RUN_SERVICE = run_service_pb2.DESCRIPTOR.services_by_name["RunService"].full_name
PROBE_INTERVAL_S = 0.05
RECONNECT_METRICS = ("agentrt_db_connections_opened", "agentrt_db_unavailable_errors", "agentrt_db_pool_")
CLUSTER_PROCS = ("patroni", "etcd")  # the lab processes that are the database, not the services


class CommitProbe:
    """Commits one numbered row every 50 ms through the multi-host DSN; keeps what was acknowledged."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.acked: list[tuple[int, float]] = []  # (seq, monotonic time of the acknowledgement)
        self.errors: collections.Counter[str] = collections.Counter()
        self.reconnects = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> CommitProbe:
        self._task = asyncio.create_task(self._run(), name="commit-probe")
        return self

    async def _run(self) -> None:
        seq = 0
        conn: asyncpg.Connection | None = None
        while not self._stop.is_set():
            try:
                if conn is None or conn.is_closed():
                    conn = await asyncpg.connect(self.dsn, timeout=2)
                    self.reconnects += 1
                seq += 1  # never reused: a commit whose answer was lost keeps its number
                await asyncio.wait_for(conn.execute("INSERT INTO ha_probe (seq) VALUES ($1)", seq), 5)
                self.acked.append((seq, time.monotonic()))
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                self.errors[type(exc).__name__] += 1
                if conn is not None:
                    conn.terminate()
                conn = None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), PROBE_INTERVAL_S)
        if conn is not None:
            conn.terminate()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    def recovered_after(self, moment: float) -> float | None:
        """Seconds from `moment` to the first acknowledgement after the longest pause that follows it
        (commits already under way when the primary died may still be acknowledged just after)."""
        times = [moment] + [at for _, at in self.acked if at > moment]
        if len(times) < 2:
            return None
        _, resumed = max(itertools.pairwise(times), key=lambda pair: pair[1] - pair[0])
        return resumed - moment

    def longest_pause(self, start: float, end: float) -> float:
        times = [start] + [at for _, at in self.acked if start < at < end] + [end]
        return max(b - a for a, b in itertools.pairwise(times))


class LoadFeeder:
    """Submits a run every `interval` seconds until stopped, so that runs are at every stage when a
    fault lands. A submit refused while no primary answers is retried with the same
    client_request_id (idempotent), so the load waits out the outage instead of skipping runs."""

    def __init__(self, lab: Lab, agent: str, interval: float = 0.15) -> None:
        self.lab, self.agent, self.interval = lab, agent, interval
        self.run_ids: list[str] = []
        self.refused: collections.Counter[str] = collections.Counter()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> LoadFeeder:
        self._task = asyncio.create_task(self._run(), name="load-feeder")
        return self

    async def _run(self) -> None:
        assert self.lab.api is not None
        api, order = self.lab.api, 0
        while not self._stop.is_set():
            try:
                run = await api.submit(TENANT, self.agent, {"order": order}, client_request_id=f"e10-{order}")
            except grpc.aio.AioRpcError as exc:
                self.refused[exc.code().name] += 1
            else:
                self.run_ids.append(run.run_id)
                self.lab.ev.run_ids.append(run.run_id)
                order += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


class HealthWatch:
    """Polls the scheduler's RunService and the relay's readiness; keeps every change of status."""

    def __init__(self, targets: dict[str, tuple[str, str]]) -> None:
        self.targets = targets  # name -> (address, service)
        self.changes: dict[str, list[tuple[float, str]]] = {name: [] for name in targets}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> HealthWatch:
        self._task = asyncio.create_task(self._run(), name="health-watch")
        return self

    async def _status(self, addr: str, service: str) -> str:
        try:
            async with grpc.aio.insecure_channel(addr) as channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=1)
                return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
        except grpc.aio.AioRpcError as exc:
            return f"rpc {exc.code().name}"

    async def _run(self) -> None:
        while not self._stop.is_set():
            for name, (addr, service) in self.targets.items():
                status = await self._status(addr, service)
                seen = self.changes[name]
                if not seen or seen[-1][1] != status:
                    seen.append((time.monotonic(), status))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.2)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    def during(self, name: str, start: float, end: float) -> list[str]:
        """The statuses seen from `start` to `end` (the one in force at `start` first)."""
        seen = self.changes[name]
        before = [s for t, s in seen if t <= start][-1:]
        return before + [s for t, s in seen if start < t <= end]


async def _snapshot(lab: Lab, note: str) -> dict[str, Any]:
    """Committed progress read on the leader, then waited for on the synchronous standby (flushed)."""
    runs = {r["id"]: dict(r) for r in await lab.fetch(
        "SELECT id, status, version, fencing_token, lease_owner FROM agent_runs")}
    checkpoints = {(r["run_id"], r["version"]): (r["hash"], r["fencing_token"]) for r in await lab.fetch(
        "SELECT run_id, version, fencing_token, encode(state_hash, 'hex') AS hash FROM agent_checkpoints")}
    ledger = {(r["run_id"], r["step_key"]): r["status"] for r in await lab.fetch(
        "SELECT run_id, step_key, status FROM tool_executions")}
    journal = {(r["run_id"], r["seq"]) for r in await lab.fetch("SELECT run_id, seq FROM run_journal")}
    outbox = {r["event_id"]: r["published"] for r in await lab.fetch(
        "SELECT event_id, published_at IS NOT NULL AS published FROM outbox")}
    lsn = await lab.value("SELECT pg_current_wal_lsn()::text")

    async def flushed() -> bool:
        return bool(await lab.value("SELECT coalesce(bool_or(flush_lsn >= $1::text::pg_lsn), false) "
                                    "FROM pg_stat_replication WHERE sync_state = 'sync'", lsn))

    await wait_until(flushed, 30, f"the synchronous standby to flush past {lsn}", interval=0.05)
    lab.ev.query("-- committed progress (counts)", (), [{
        "runs": len(runs), "checkpoints": len(checkpoints), "ledger_rows": len(ledger), "journal_rows": len(journal),
        "outbox_rows": len(outbox), "published": sum(outbox.values()), "wal_lsn": lsn}], note)
    return {"runs": runs, "checkpoints": checkpoints, "ledger": ledger, "journal": journal, "outbox": outbox,
            "lsn": lsn}


async def _final(lab: Lab) -> dict[str, Any]:
    runs = {r["id"]: dict(r) for r in await lab.fetch("SELECT id, status, version, fencing_token FROM agent_runs")}
    checkpoints = {(r["run_id"], r["version"]): (r["hash"], r["fencing_token"]) for r in await lab.fetch(
        "SELECT run_id, version, fencing_token, encode(state_hash, 'hex') AS hash FROM agent_checkpoints")}
    ledger = {(r["run_id"], r["step_key"]): r["status"] for r in await lab.fetch(
        "SELECT run_id, step_key, status FROM tool_executions")}
    journal = {(r["run_id"], r["seq"]) for r in await lab.fetch("SELECT run_id, seq FROM run_journal")}
    outbox = {r["event_id"]: r["published"] for r in await lab.fetch(
        "SELECT event_id, published_at IS NOT NULL AS published FROM outbox")}
    return {"runs": runs, "checkpoints": checkpoints, "ledger": ledger, "journal": journal, "outbox": outbox}


def _lost(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[Any]]:
    """What `before` committed that `after` lacks or shows changed (closed rows may not reopen)."""
    closed = ("SUCCEEDED", "FAILED", "NOT_EXECUTED")
    return {
        "checkpoints": [str(k) for k, v in before["checkpoints"].items() if after["checkpoints"].get(k) != v][:10],
        "ledger": [str(k) for k, v in before["ledger"].items()
                   if k not in after["ledger"] or (v in closed and after["ledger"][k] != v)][:10],
        "journal": [str(k) for k in before["journal"] - after["journal"]][:10],
        "outbox": [str(k) for k, published in before["outbox"].items()
                   if k not in after["outbox"] or (published and not after["outbox"][k])][:10],
        "versions": [str(k) for k, r in before["runs"].items()
                     if k not in after["runs"] or after["runs"][k]["version"] < r["version"]][:10],
    }


async def _under_way(line: Pipeline, feeder: LoadFeeder, more: int, within: float = 90) -> None:
    """Until `more` runs have completed since now, with runs still arriving (the load is on)."""
    async def completed() -> int:
        return (await line.statuses(feeder.run_ids))["COMPLETED"]

    target = await completed() + more
    await wait_until(lambda: _at_least(completed(), target), within,
                     f"{more} more runs to complete under the feeder's load", interval=0.1)


async def _at_least(value: Any, target: int) -> bool:
    return bool(await value >= target)


def _db_metrics(port: int) -> dict[str, float]:
    """The scheduler's connection samples (its /metrics): connections opened, calls refused for want
    of a primary by error class, pool expirations and the pool's connections."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(agentrt_db_\w+(?:\{[^}]*\})?) (\S+)$", text, re.M)
            if m.group(1).startswith(RECONNECT_METRICS) and "_created" not in m.group(1)}


def _health_port(log: str) -> str:
    found = re.search(r"health on port (\d+)", log)
    if not found:
        raise ExperimentError("the relay did not log its health port")
    return found.group(1)


@dataclass
class Trial:
    """One run of the experiment: the cluster, the pipeline on it, and what each phase recorded."""

    lab: Lab
    cluster: HaCluster
    line: Pipeline
    probe: CommitProbe
    watch: HealthWatch
    feeder: LoadFeeder
    started: float
    metrics_port: int  # the scheduler's /metrics
    phases: dict[str, Any] = field(default_factory=dict)
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)
    t_kill: float = 0.0
    t_done: float = 0.0

    @property
    def run_ids(self) -> list[str]:
        return self.feeder.run_ids


async def _start(lab: Lab, cluster: HaCluster) -> Trial:
    started = time.monotonic()
    await cluster.start()
    lab.ev.observe(ha_versions=ha_cluster.versions())
    leader = cluster.leader()
    assert leader is not None
    # The leader first in the DSN: a database just created may not exist yet on the standby,
    # and a host that answers with an error ends asyncpg's walk along the hosts.
    lab.pg_url = cluster.dsn("postgres", order=[leader, *cluster.replicas()])
    line = Pipeline(lab)
    await lab.runtime_database()
    metrics_port = free_port()
    await lab.scheduler(db_probe_interval_s=0.5, metrics_addr=f"127.0.0.1:{metrics_port}")
    mock = line.mock = await lab.mocktool()
    write_agents(line.agents_dir, three_step("acc-e10", mock.url, LOOKUP, sleep_ms=200))
    await line.start_executors(2)
    await line.start_events()
    assert lab.db is not None and line.relay is not None
    await lab.db.execute("CREATE TABLE ha_probe (seq bigint PRIMARY KEY, "
                         "at timestamptz NOT NULL DEFAULT clock_timestamp())")
    probe = CommitProbe(lab.db_url).start()
    watch = HealthWatch({"scheduler": (lab.scheduler_addr, RUN_SERVICE),
                         "relay": (f"127.0.0.1:{_health_port(line.relay.log())}", "agentrt.relay")}).start()
    feeder = LoadFeeder(lab, "acc-e10").start()
    trial = Trial(lab, cluster, line, probe, watch, feeder, started, metrics_port)
    trial.phases["bootstrap_seconds"] = round(time.monotonic() - started, 1)
    return trial


async def _switchover(t: Trial) -> None:
    """(a) patronictl switchover under load, then both nodes in sync again."""
    await _under_way(t.line, t.feeder, 8)
    t.snapshots["switchover"] = await _snapshot(t.lab, "committed progress before the switchover")
    old = t.cluster.leader()
    assert old is not None
    candidate = next(n for n in t.cluster.nodes if n is not old)
    started = time.monotonic()
    t.phases["switchover"] = await t.cluster.switchover(old, candidate)
    await t.cluster.wait_in_sync(90)
    t.phases["switchover"]["longest_pause_s"] = round(t.probe.longest_pause(started, time.monotonic()), 2)


async def _failover(t: Trial) -> None:
    """(b) SIGKILL of the leader's Patroni and postmaster; (c) the old leader back at once (with
    synchronous_mode_strict the new leader takes no writes until a standby is back in sync:
    recovery then includes the rejoin)."""
    await _under_way(t.line, t.feeder, 8)
    t.snapshots["failover"] = await _snapshot(t.lab, "committed progress before the kill")
    t.phases["scheduler_metrics_before_kill"] = await asyncio.to_thread(_db_metrics, t.metrics_port)
    victim = t.cluster.leader()
    assert victim is not None
    t.t_kill = time.monotonic()
    kill_wall = dt.datetime.now(dt.UTC)
    failover: dict[str, Any] = {"killed": t.cluster.kill(victim)}
    t.phases["failover"] = failover
    successor = await t.cluster.wait_leader(60, other_than=victim)
    failover.update(new_leader=successor.name, seconds_until_new_leader=round(time.monotonic() - t.t_kill, 2))
    rejoin = asyncio.create_task(t.cluster.rejoin(victim))
    probe = t.probe
    t.phases["rejoin"] = await rejoin
    await t.cluster.wait_in_sync(90)
    recovered = probe.recovered_after(t.t_kill)
    failover.update(time_to_recover_s=round(recovered or -1, 2),
                    longest_pause_s=round(probe.longest_pause(t.t_kill, time.monotonic()), 2))
    # The services' own recovery: the end of the longest silence between checkpoints after the kill
    # (a checkpoint stamped just after the kill may be one whose commit was already under way).
    stamps = [r["created_at"] for r in await t.lab.fetch(
        "SELECT created_at FROM agent_checkpoints WHERE created_at > $1::timestamptz - interval '2 seconds' "
        "AND created_at < $1::timestamptz + interval '120 seconds' ORDER BY created_at", kill_wall)]
    gaps = [(b - a, b) for a, b in itertools.pairwise(stamps) if b > kill_wall]
    if gaps:
        silence, resumed = max(gaps)
        failover.update(checkpoints_silent_s=round(silence.total_seconds(), 2),
                        first_checkpoint_after_silence_s=round((resumed - kill_wall).total_seconds(), 2))
    t.t_done = time.monotonic()


def _fence_order(requests: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Runs whose accepted tool calls arrived with a fence lower than an earlier one."""
    accepted: dict[str, list[int]] = collections.defaultdict(list)
    for row in requests:
        if row["kind"] == "call" and row["outcome"] != "stale_fence" and row["fence"] is not None:
            accepted[row["run_id"]].append(int(row["fence"]))
    return {run: fences for run, fences in accepted.items() if fences != sorted(fences)}


async def _verify(t: Trial) -> None:
    lab, line, probe, phases = t.lab, t.line, t.probe, t.phases
    assert line.mock is not None
    counts = await line.wait_runs_settled(t.run_ids, 180)
    await line.wait_delivered(120)
    await probe.stop()
    await t.watch.stop()
    final = await _final(lab)
    acked = [seq for seq, _ in probe.acked]
    lost_acks = sorted(set(acked) - {r["seq"] for r in await lab.fetch("SELECT seq FROM ha_probe")})
    lost = {name: _lost(snap, final) for name, snap in t.snapshots.items()}
    before = t.snapshots["failover"]["runs"]
    went_back = {str(k): (r["fencing_token"], final["runs"][k]["fencing_token"]) for k, r in before.items()
                 if final["runs"][k]["fencing_token"] < r["fencing_token"]}
    leased = [k for k, r in before.items() if r["lease_owner"] is not None]
    requests = line.mock.requests()
    fence_back = _fence_order(requests)
    executions = line.mock.executions()
    sched_health = t.watch.during("scheduler", t.t_kill, t.t_done)
    metrics_before = phases["scheduler_metrics_before_kill"]
    metrics_after = phases["scheduler_metrics_after"] = await asyncio.to_thread(_db_metrics, t.metrics_port)
    opened = "agentrt_db_connections_opened_total"
    unavailable = sum(v for k, v in metrics_after.items() if k.startswith("agentrt_db_unavailable_errors_total")) \
        - sum(v for k, v in metrics_before.items() if k.startswith("agentrt_db_unavailable_errors_total"))
    lab.ev.mock_tool_request_log = jsonable(requests)
    lab.ev.method = {"kind": "Patroni 3 + etcd, 2 PostgreSQL 15 nodes, synchronous_mode"
                             + (" strict" if t.cluster.strict else ""), "dcs": ha_cluster.DCS,
                     "dsn": t.cluster.dsn("<db>"), "phases": jsonable(phases)}
    lab.ev.observe(statuses=dict(counts), runs=len(t.run_ids), submits_refused=dict(t.feeder.refused),
                   probe_acked=len(acked),
                   probe_errors=dict(probe.errors), probe_reconnects=probe.reconnects,
                   time_to_recover_s=phases["failover"]["time_to_recover_s"], runs_leased_at_kill=len(leased),
                   runs_reclaimed_with_a_greater_fence=sum(
                       1 for k in leased if final["runs"][k]["fencing_token"] > before[k]["fencing_token"]),
                   stale_fence_refusals=sum(1 for r in requests if r["outcome"] == "stale_fence"),
                   health_during_failover={"scheduler": sched_health,
                                           "relay": t.watch.during("relay", t.t_kill, t.t_done)},
                   health_changes={k: [(round(at - t.started, 2), s) for at, s in v]
                                   for k, v in t.watch.changes.items()},
                   reconnect_log_lines={p.name: sum(p.log().count(w) for w in ("unavailable", "Unavailable"))
                                        for p in lab.procs if not p.name.startswith(CLUSTER_PROCS)})
    line.alive_check([p for p in lab.procs if p.name != "mocktool" and not p.name.startswith(CLUSTER_PROCS)],
                     "scheduler, executors, relay and consumer rode out the failover (same pids, no restarts)")
    lab.ev.check("the switchover completed (patronictl's own words) and the old leader followed",
                 bool(phases["switchover"]["seconds_until_new_leader"]), phases["switchover"])
    lab.ev.check("the old leader came back as a synchronous standby (pg_rewind)",
                 phases["rejoin"]["pg_rewind_used"], phases["rejoin"])
    lab.ev.check("no acknowledged commit lost (probe rows)", not lost_acks and len(acked) > 100,
                 {"acked": len(acked), "lost": lost_acks[:20]})
    for name, missing in lost.items():
        lab.ev.check(f"no committed checkpoint, ledger row, journal entry or outbox row lost ({name})",
                     not any(missing.values()), missing)
    lab.ev.check("fencing tokens never went back across the failover", not went_back and not fence_back,
                 {"runs": went_back, "tool_requests": fence_back})
    lab.ev.check("every run COMPLETED", counts["COMPLETED"] == len(t.run_ids), dict(counts))
    lab.ev.check("no tool request executed twice for one idempotency key (lookup contract)",
                 all(n == 1 for n in executions.values()) and len(executions) == 3 * len(t.run_ids),
                 {"keys": len(executions), "twice": {k: n for k, n in executions.items() if n > 1}})
    lab.ev.check("the scheduler answered NOT_SERVING while no primary was reachable, SERVING after",
                 "NOT_SERVING" in sched_health and sched_health[-1] == "SERVING", sched_health)
    lab.ev.check("the scheduler's metrics show the reconnects (connections opened, calls refused for want of a "
                 "primary)", metrics_after.get(opened, 0) > metrics_before.get(opened, 0) and unavailable > 0,
                 {"opened": (metrics_before.get(opened), metrics_after.get(opened)), "unavailable": unavailable})
    lab.ev.check("time to recover (first acknowledged commit after the kill) reported",
                 phases["failover"]["time_to_recover_s"] > 0, phases["failover"]["time_to_recover_s"])
    await line.check_delivery()
    await check_invariants(lab, t.run_ids)


async def primary_lost(lab: Lab) -> None:
    missing = ha_cluster.missing_binaries()
    if missing:
        raise ExperimentError(f"experiment 10 needs {', '.join(missing)} (Debian: apt-get install patroni "
                              "etcd-server postgresql-15)")
    cluster = HaCluster(lab, nodes=2, strict=lab.suite.ha_strict)
    trial: Trial | None = None
    try:
        trial = await _start(lab, cluster)
        await _switchover(trial)
        await _failover(trial)
        await _under_way(trial.line, trial.feeder, 8)  # on the rejoined cluster
        await trial.feeder.stop()
        await _verify(trial)
    finally:
        if trial is not None:
            await trial.feeder.stop()
            await trial.probe.stop()
            await trial.watch.stop()
        for proc in reversed(lab.procs):
            if not proc.name.startswith(CLUSTER_PROCS):
                await asyncio.to_thread(proc.stop, 10)
        if lab.db is not None and not lab.db.is_closed():
            lab.db.terminate()
        await cluster.stop()
        lab.databases.clear()  # they went with the cluster's data directories


__all__ = ["primary_lost"]
