"""Experiments 4, 6, 7 and 8: the relay's duplicate window, tenants, and PostgreSQL / broker restarts under load."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from typing import Any

import grpc

from devstack.acceptance.agents import LOOKUP, NON_IDEMPOTENT, http_tool, scripted, three_step, tool_step, write_agents
from devstack.acceptance.api import STATUS, reason_of
from devstack.acceptance.evidence import jsonable
from devstack.acceptance.experiments_partition import partition
from devstack.acceptance.invariants import STUCK_SQL, violations
from devstack.acceptance.lab import TENANT, Lab
from devstack.acceptance.pipeline import Pipeline, TopicReader, read_all
from devstack.acceptance.procs import wait_until
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

__all__ = ["broker_restart", "crash_after_broker_ack", "partition", "postgres_restart", "tenant_isolation"]


async def check_invariants(lab: Lab, run_ids: list[str]) -> None:
    assert lab.db is not None
    found = await violations(lab.db)
    for name, rows in found.items():
        lab.ev.query(f"-- invariant: {name}", (), rows, "invariant query (rows = violations)")
    lab.ev.check("invariant queries find no violations", not any(found.values()),
                 {k: v for k, v in found.items() if v})
    stuck = await lab.sql(STUCK_SQL + " AND id = ANY($1::uuid[])", [uuid.UUID(r) for r in run_ids],
                          note="runs not settled (stuck)")
    lab.ev.check("no run stuck (every run terminal or paused with a reason)", not stuck, [dict(r) for r in stuck])


# ---------------------------------------------------------------------------------------------- 4


async def crash_after_broker_ack(lab: Lab) -> None:
    """Relay A SIGKILLs itself after Kafka acknowledged its first round, before marking; B publishes again."""
    line = Pipeline(lab)
    mock = await line.start_core()
    write_agents(line.agents_dir, three_step("acc-e4", mock.url, LOOKUP))
    await line.start_executors(1)
    run_ids = [await lab.submit("acc-e4", {"order": i}) for i in range(5)]
    await line.wait_runs_settled(run_ids, 90)
    await line.start_events(relay=False)
    assert line.broker is not None
    total = len(await line.outbox_ids())
    lab.ev.check("all events wait in the outbox before any relay runs", await line.pending() == total, total)
    spec = "after_broker_ack_before_outbox_mark"
    lab.ev.method = {"kind": "relay fault point, SIGKILL self on its first round with rows", "spec": spec}
    relay_a = await lab.relay("relay-a", line.broker.bootstrap, line.topic, fault_point=spec, fault_round=1,
                              batch_size=1000, wait=False)
    await wait_until(lambda: not relay_a.alive(), 60, "relay A to SIGKILL itself after the broker's ack")
    lab.ev.check("relay A ended by SIGKILL at the fault point", relay_a.returncode == -signal.SIGKILL
                 and f"fault point {spec} reached" in relay_a.log(), relay_a.returncode)
    pending_after_a = await line.pending()
    reader = await TopicReader(line.broker.bootstrap, line.topic).start()
    try:
        await read_all(reader)
        acked_by_a = len(reader.counts())
        lab.ev.check("relay A's round reached Kafka but nothing was marked",
                     acked_by_a > 0 and pending_after_a == total, {"acked": acked_by_a, "pending": pending_after_a})
        await lab.relay("relay-b", line.broker.bootstrap, line.topic)
        await line.wait_delivered(90)
        await read_all(reader)
        await line.check_delivery(reader)
        counts = reader.counts()
        lab.ev.check("the broker holds duplicates (published twice), as at-least-once delivery allows",
                     any(n > 1 for n in counts.values()), {"duplicated": sum(1 for n in counts.values() if n > 1)})
    finally:
        await reader.stop()
    await check_invariants(lab, run_ids)


# ---------------------------------------------------------------------------------------------- 6


async def _attempt(name: str, call: Any) -> str:
    try:
        await call
        return "ALLOWED"
    except grpc.aio.AioRpcError as exc:
        return reason_of(exc)


# One text per run covering its row, checkpoints, ledger rows and events.
FINGERPRINT_SQL = """
    SELECT r.id, md5(concat_ws(' / ', r::text,
      (SELECT string_agg(c::text, ' | ' ORDER BY c.version) FROM agent_checkpoints c WHERE c.run_id = r.id),
      (SELECT string_agg(t::text, ' | ' ORDER BY t.step_key) FROM tool_executions t WHERE t.run_id = r.id),
      (SELECT string_agg(o::text, ' | ' ORDER BY o.id) FROM outbox o WHERE o.run_id = r.id))) AS fingerprint
    FROM agent_runs r WHERE r.tenant_id = $1 ORDER BY r.id"""


async def _intruder_calls(api: Any, md: Any, r_wait: str, r_doubt: str, step: str,
                          owner: str) -> dict[str, str]:
    """Every RunService call on the owner's runs, made as the intruder with its own key (and one naming
    the owner's tenant with that key, and one without any credential)."""
    borrowed = [("x-tenant-id", owner), *[(k, v) for k, v in md if k == "authorization"]]
    return {
        "GetRun": await _attempt("GetRun", api.runs.GetRun(rs.GetRunRequest(run_id=r_wait), metadata=md)),
        "GetRunHistory": await _attempt("GetRunHistory", api.runs.GetRunHistory(
            rs.GetRunHistoryRequest(run_id=r_doubt), metadata=md)),
        "CancelRun": await _attempt("CancelRun", api.runs.CancelRun(
            rs.CancelRunRequest(run_id=r_wait, reason="intruder"), metadata=md)),
        "ResumeRun": await _attempt("ResumeRun", api.runs.ResumeRun(rs.ResumeRunRequest(
            run_id=r_wait, decision=rs.RESUME_DECISION_INPUT, input_json="{}", operator="intruder"), metadata=md)),
        "ResolveToolExecution": await _attempt("Resolve", api.runs.ResolveToolExecution(
            rs.ResolveToolExecutionRequest(run_id=r_doubt, step_key=step, outcome=rs.RESOLUTION_OUTCOME_SUCCEEDED,
                                           result_json="{}", evidence_json='{"by": "intruder"}',
                                           resolved_by="intruder", event_id=str(uuid.uuid4())), metadata=md)),
        "no credential": await _attempt("GetRun", api.runs.GetRun(rs.GetRunRequest(run_id=r_wait))),
        "owner's tenant named with the intruder's key": await _attempt("GetRun", api.runs.GetRun(
            rs.GetRunRequest(run_id=r_wait), metadata=borrowed)),
    }


async def tenant_isolation(lab: Lab) -> None:
    """Tenant B calls every RunService method on tenant A's runs with its own API key, and writes with
    forged leases. The scheduler authenticates (auth_mode api_key): each tenant has a real key."""
    await lab.runtime_database()
    owner, intruder = TENANT, "tenant-intruder"
    keys = {owner: await lab.api_key(owner, "operator"), intruder: await lab.api_key(intruder, "operator")}
    # WorkService stays open on purpose: the forged-lease writes below test fencing, not the token.
    await lab.scheduler(auth_mode="api_key", work_service_open="true")
    assert lab.api is not None
    lab.api.keys.update(keys)
    mock = await lab.mocktool()
    waiting = scripted("acc-e6-wait", [tool_step("a", "acc-e6-wait.a"), {"id": "ask", "wait_for_input": "ok?"},
                                       {"id": "done", "finish": {"ok": True}}],
                       [http_tool(mock.url, "acc-e6-wait.a", LOOKUP)])
    doubtful = scripted("acc-e6-doubt", [tool_step("pay", "acc-e6-doubt.pay"), {"id": "done", "finish": {"ok": 1}}],
                        [http_tool(mock.url, "acc-e6-doubt.pay", NON_IDEMPOTENT, timeout_s=1.0)])
    agents = write_agents(lab.dir / "agents", waiting, doubtful)
    mock.fault("acc-e6-doubt.pay", "timeout_after_execute", hold_ms=3000)  # executes, answers too late
    await lab.executor("executor", agents)
    assert lab.api is not None
    api = lab.api
    r_wait = (await api.submit(owner, "acc-e6-wait", {"order": 42}, client_request_id="order-42")).run_id
    r_doubt = (await api.submit(owner, "acc-e6-doubt", {"order": 43})).run_id
    lab.ev.run_ids += [r_wait, r_doubt]
    await lab.wait_settled(r_wait, 60, {pb.RUN_STATUS_PAUSED_HUMAN})
    await lab.wait_settled(r_doubt, 60, {pb.RUN_STATUS_PAUSED_INDOUBT})
    before = await lab.sql(FINGERPRINT_SQL, owner, note="fingerprints of the owner's runs before the intrusion")
    run = await api.get(owner, r_wait)
    step = (await api.history(owner, r_doubt)).tool_executions[0].step_key
    md = api.md(intruder)
    attempts = await _intruder_calls(api, md, r_wait, r_doubt, step, owner)
    listed = await api.runs.ListRuns(rs.ListRunsRequest(page_size=500), metadata=md)
    stats = await api.runs.GetStats(rs.GetStatsRequest(), metadata=md)
    # The same client_request_id in another tenant is another run, not the owner's.
    theirs = await api.runs.SubmitRun(rs.SubmitRunRequest(agent_name="acc-e6-wait", input_json="{}",
                                                          client_request_id="order-42"), metadata=md)
    # Work on a run needs its lease: forged leases (any worker, the current or the next fence) write nothing.
    forged = {f"fence {run.fencing_token + d}": await api.stale_write(r_wait, "intruder-worker",
                                                                      run.fencing_token + d, run.version)
              for d in (0, 1)}
    claim_md = await _attempt("ClaimWork", api.work.ClaimWork(
        ws.ClaimWorkRequest(worker_id="intruder-worker", agents=["no-such-agent"], wait_ms=0), metadata=md))
    after = await lab.sql(FINGERPRINT_SQL, owner, note="fingerprints of the owner's runs after the intrusion")
    own_resume = await _attempt("ResumeRun", api.resume(owner, r_wait, payload={"ok": True}))
    completed = await lab.wait_settled(r_wait, 60)
    audit = await lab.sql("SELECT event_type, count(*) FROM outbox WHERE run_id = ANY($1::uuid[]) GROUP BY 1 "
                          "ORDER BY 1", [uuid.UUID(r_wait), uuid.UUID(r_doubt)],
                          note="the owner's events (an intrusion would have left some)")
    lab.record_mock(mock)
    lab.ev.method = {"kind": "RunService calls with another tenant's real API key (auth_mode api_key); "
                             "WorkService writes with forged leases", "intruder": intruder}
    lab.ev.observe(intruder_calls=attempts, intruder_listed=[r.run_id for r in listed.runs],
                   intruder_stats={"runs_by_status": dict(stats.runs_by_status), "in_doubt": stats.in_doubt_runs,
                                   "outbox_pending": stats.outbox_pending},
                   intruder_submit=(theirs.run.run_id, theirs.created), forged_lease_writes=forged,
                   # WorkService is the executors' API and takes no tenant: isolation of claims rests on
                   # who can reach it (see the report), not on x-tenant-id.
                   work_service_with_tenant_header=claim_md, owner_resume=own_resume,
                   owner_run_after=STATUS(completed.status), events=[dict(r) for r in audit])
    lab.ev.check("reads, cancel, resume and resolve of another tenant's run answer NOT_FOUND",
                 all(attempts[k] == "NOT_FOUND" for k in ("GetRun", "GetRunHistory", "CancelRun", "ResumeRun",
                                                           "ResolveToolExecution")), attempts)
    lab.ev.check("a call without a credential is refused", attempts["no credential"] == "CREDENTIAL_REQUIRED",
                 attempts["no credential"])
    lab.ev.check("the intruder's key cannot name the owner's tenant",
                 attempts["owner's tenant named with the intruder's key"] == "TENANT_NOT_ALLOWED",
                 attempts["owner's tenant named with the intruder's key"])
    lab.ev.check("ListRuns and GetStats show none of the owner's runs",
                 not {r_wait, r_doubt} & {r.run_id for r in listed.runs}
                 and sum(stats.runs_by_status.values()) == 0 and stats.in_doubt_runs == 0,
                 {"listed": [r.run_id for r in listed.runs], "stats": dict(stats.runs_by_status)})
    lab.ev.check("the same client_request_id in another tenant makes that tenant's own run",
                 theirs.created and theirs.run.run_id != r_wait and theirs.run.tenant_id == intruder,
                 theirs.run.run_id)
    lab.ev.check("forged leases cannot claim or write (every fenced call refused)",
                 all(v == "LEASE_LOST" for writes in forged.values() for v in writes.values()), forged)
    lab.ev.check("nothing of the owner's runs changed (row, checkpoints, ledger, events)",
                 [dict(r) for r in before] == [dict(r) for r in after] and len(before) == 2)
    lab.ev.check("control: the owner's own resume works and the run completes",
                 own_resume == "ALLOWED" and completed.status == pb.RUN_STATUS_COMPLETED, own_resume)


# ---------------------------------------------------------------------------------------------- 7


async def postgres_restart(lab: Lab) -> None:
    """`pg_ctl restart -m immediate` while runs, the relay and the consumer are busy."""
    line = Pipeline(lab)
    mock = await line.start_core()
    write_agents(line.agents_dir, three_step("acc-e7", mock.url, LOOKUP, sleep_ms=200))
    await line.start_executors(2)
    await line.start_events()
    run_ids = [await lab.submit("acc-e7", {"order": i}) for i in range(24)]

    async def mid_load() -> bool:
        counts = await line.statuses(run_ids)
        return counts["COMPLETED"] >= 4 and counts["COMPLETED"] <= len(run_ids) - 6

    await wait_until(mid_load, 90, "the load to be under way (some runs done, most not)", interval=0.1)
    snap_runs = await lab.sql("SELECT id, status, version FROM agent_runs ORDER BY id",
                              note="committed progress just before the restart: runs")
    snap_cps = await lab.fetch("SELECT run_id, version, encode(state_hash, 'hex') AS hash FROM agent_checkpoints")
    snap_ledger = await lab.fetch("SELECT run_id, step_key, status FROM tool_executions")
    snap_published = await lab.value("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
    lab.ev.query("SELECT run_id, version, state_hash FROM agent_checkpoints", (), [{"checkpoints": len(snap_cps)}],
                 "committed checkpoints just before the restart (count; all compared afterwards)")
    assert lab.suite.pg is not None
    pg = lab.suite.pg
    started = time.monotonic()
    log = str(pg.data_dir / "server.log")  # a log file, or the new postmaster would hold our pipes open
    lab.commands.add(f"pg_ctl -D {pg.data_dir} -w -t 60 -l {log} -m immediate restart")
    await asyncio.to_thread(pg.pg_ctl, "-w", "-t", "60", "-l", log, "-m", "immediate", "restart")
    restart_s = time.monotonic() - started
    lab.ev.method = {"kind": "pg_ctl restart -m immediate", "restart_seconds": round(restart_s, 2)}
    await lab.reconnect()
    counts = await line.wait_runs_settled(run_ids, 180)
    await line.wait_delivered(120)
    final_runs = {r["id"]: dict(r) for r in await lab.fetch("SELECT id, status, version FROM agent_runs")}
    final_cps = {(r["run_id"], r["version"]): r["hash"] for r in await lab.fetch(
        "SELECT run_id, version, encode(state_hash, 'hex') AS hash FROM agent_checkpoints")}
    final_ledger = {(r["run_id"], r["step_key"]): r["status"] for r in await lab.fetch(
        "SELECT run_id, step_key, status FROM tool_executions")}
    lost_cps = [jsonable(dict(r)) for r in snap_cps if final_cps.get((r["run_id"], r["version"])) != r["hash"]]
    went_back = [jsonable(dict(r)) for r in snap_runs if final_runs[r["id"]]["version"] < r["version"]]
    reopened = [jsonable(dict(r)) for r in snap_ledger if r["status"] in ("SUCCEEDED", "FAILED", "NOT_EXECUTED")
                and final_ledger.get((r["run_id"], r["step_key"])) != r["status"]]
    logs = {p.name: sum(p.log().count(w) for w in ("connection", "Connection", "unavailable", "Unavailable"))
            for p in lab.procs}
    lab.ev.observe(restart_seconds=round(restart_s, 2), statuses=dict(counts), checkpoints_before=len(snap_cps),
                   published_before=snap_published, reconnect_log_lines=logs)
    line.alive_check([p for p in lab.procs if p.name != "mocktool"],
                     "scheduler, executors, relay and consumer reconnected (same pids, no restarts)")
    lab.ev.check("no committed checkpoint lost or changed", not lost_cps, lost_cps[:10])
    lab.ev.check("no run's version went back", not went_back, went_back[:10])
    lab.ev.check("no closed ledger row reopened or changed", not reopened, reopened[:10])
    lab.ev.check("every run COMPLETED", counts["COMPLETED"] == len(run_ids), dict(counts))
    await line.check_delivery()
    await check_invariants(lab, run_ids)
    calls = line.mock.calls_by_key() if line.mock else {}
    lab.ev.check("no tool request sent twice for one idempotency key", all(n == 1 for n in calls.values()),
                 {k: n for k, n in calls.items() if n > 1})


# ---------------------------------------------------------------------------------------------- 8


async def broker_restart(lab: Lab) -> None:
    """The broker goes away for several seconds mid-load and comes back on the same port."""
    line = Pipeline(lab)
    mock = await line.start_core()
    write_agents(line.agents_dir, three_step("acc-e8", mock.url, LOOKUP, sleep_ms=200))
    await line.start_executors(2)
    await line.start_events()
    assert line.broker is not None and line.relay is not None
    run_ids = [await lab.submit("acc-e8", {"order": i}) for i in range(24)]
    reader = await TopicReader(line.broker.bootstrap, line.topic).start()
    try:
        async def mid_load() -> bool:
            counts = await line.statuses(run_ids)
            return counts["COMPLETED"] >= 4 and counts["COMPLETED"] <= len(run_ids) - 6

        await wait_until(mid_load, 90, "the load to be under way", interval=0.1)
        # Tansu keeps topics in memory: events it acknowledged but nobody read would die with it
        # (a test-broker artefact; Kafka keeps its log). So the relay is held (SIGSTOP) while the
        # consumer reads what the broker has, then the broker stops and the relay resumes into the
        # outage with the load still running.
        line.relay.signal(signal.SIGSTOP)
        await read_all(reader)
        on_broker = set(reader.counts())

        async def drained() -> bool:
            return on_broker <= set(await line.applied())

        await wait_until(drained, 60, "the consumer to apply what the broker holds", interval=0.1)
        port = line.broker.port
        await asyncio.to_thread(line.broker.stop)
        lab.commands.add(f"kill -TERM <tansu>  # broker on port {port} stopped")
        down_at = await lab.value("SELECT clock_timestamp()")
        line.relay.signal(signal.SIGCONT)
        pending_at_stop = await line.pending()

        relay = line.relay

        async def outage_seen() -> bool:
            text = relay.log()
            return "Kafka publish failed" in text or "re-creating the Kafka producer" in text \
                or await line.pending() > pending_at_stop + 5

        await wait_until(outage_seen, 60, "the relay to run into the outage with new events waiting")
        outage_started = time.monotonic()
        await wait_until(lambda: time.monotonic() - outage_started > 4, 10, "a few seconds of outage")
        up_at = await lab.value("SELECT clock_timestamp()")
        marked_during = await lab.sql(
            "SELECT event_id FROM outbox WHERE published_at > $1 AND published_at < $2", down_at, up_at,
            note="rows marked published while no broker was up")
        unacked_marks = [str(r["event_id"]) for r in marked_during if r["event_id"] not in on_broker]
        await reader.stop()
        outage_s = time.monotonic() - outage_started
        broker = await line.start_broker_again(port, lab)
        reader = await TopicReader(broker.bootstrap, line.topic).start()
        await line.wait_runs_settled(run_ids, 180)
        await line.wait_delivered(120)
        await read_all(reader)
    finally:
        await reader.stop()
    lab.ev.method = {"kind": "Tansu stopped (SIGTERM) and started again on the same port",
                     "relay_held_before_stop": "SIGSTOP until the consumer had applied what the broker held",
                     "relay_held_across_restart": "SIGSTOP from the broker's start until the consumer rejoined",
                     "outage_seconds": round(outage_s, 1)}
    lab.ev.observe(events_on_old_broker=len(on_broker), pending_at_stop=pending_at_stop,
                   marked_during_outage=len(marked_during), relay_failures=line.relay.log().count("publish failed"))
    lab.ev.check("nothing marked published without the broker's ack during the outage", not unacked_marks,
                 unacked_marks[:10])
    line.alive_check([p for p in lab.procs if p.name != "mocktool"],
                     "relay, consumer, executors and scheduler rode the outage out (same pids)")
    statuses = await line.statuses(run_ids)
    lab.ev.check("every run COMPLETED", statuses["COMPLETED"] == len(run_ids), dict(statuses))
    await line.check_delivery(reader)
    await check_invariants(lab, run_ids)

