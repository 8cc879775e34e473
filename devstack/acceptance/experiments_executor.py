"""Experiments 1, 2, 3 and 5: executor crashes, a stale fence, and a checkpoint schema upgrade."""

from __future__ import annotations

import json
import signal
import uuid
from typing import Any

from devstack.acceptance.agents import LOOKUP, NON_IDEMPOTENT, http_tool, scripted, three_step, tool_step, write_agents
from devstack.acceptance.api import STATUS
from devstack.acceptance.lab import TENANT, Lab
from devstack.acceptance.procs import PYTHON, ExperimentError, wait_until
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws


def _key_of(snapshot: dict[str, Any], step_key: str) -> str:
    for row in snapshot["ledger"]:
        if row["step_key"] == step_key:
            return str(row["idempotency_key"])
    raise ExperimentError(f"no ledger row for {step_key}: {snapshot['ledger']}")


async def _lease_lapsed(lab: Lab, run_id: str) -> bool:
    return bool(await lab.value("SELECT lease_expires_at < clock_timestamp() FROM agent_runs WHERE id = $1",
                                uuid.UUID(run_id)))


# ---------------------------------------------------------------------------------------------- 1


async def crash_after_checkpoint_commit(lab: Lab) -> None:
    """Executor A SIGKILLs itself right after saving the decision for step b (a is done); B continues."""
    await lab.runtime_database()
    await lab.scheduler()
    mock = await lab.mocktool()
    agents = write_agents(lab.dir / "agents", three_step("acc-e1", mock.url, LOOKUP, sleep_ms=1))
    run_id = await lab.submit("acc-e1", {"order": lab.ev.repetition})
    # Occurrence 2: the first save is step a's decision; after a, the run sleeps and the
    # decision for b is the next SaveCheckpoint.
    spec = f"after_checkpoint_commit@run={run_id},occurrence=2,action=sigkill"
    lab.ev.method = {"kind": "fault point, SIGKILL self", "spec": spec}
    a = await lab.executor("executor-a", agents, faults=[spec])
    await wait_until(lambda: not a.alive(), 60, "executor A to SIGKILL itself")
    lab.ev.check("A ended by SIGKILL at after_checkpoint_commit",
                 a.returncode == -signal.SIGKILL and "fault point after_checkpoint_commit" in a.log(),
                 {"returncode": a.returncode})
    at_crash = await lab.snapshot(run_id, "A dead, before B")
    crash_version, crash_fence = at_crash["run"]["version"], at_crash["run"]["fencing_token"]
    pending = await lab.sql("SELECT version, state_json->'pending_tool'->>'step_key' AS pending_step "
                            "FROM agent_checkpoints WHERE run_id = $1 ORDER BY version DESC LIMIT 1",
                            uuid.UUID(run_id), note="the decision A committed last")
    calls_at_crash = mock.calls_by_key()
    await lab.executor("executor-b", agents)
    final = await lab.wait_settled(run_id, 90)
    after = await lab.snapshot(run_id, "after B")
    calls = mock.calls_by_key()
    lab.record_mock(mock)
    b_checkpoints = [c for c in after["checkpoints"] if c["fencing_token"] > crash_fence]
    versions = [c["version"] for c in after["checkpoints"]]
    lab.ev.observe(final_status=STATUS(final.status), crash_version=crash_version, crash_fence=crash_fence,
                   pending_at_crash=pending[0]["pending_step"] if pending else None,
                   first_version_after_takeover=b_checkpoints[0]["version"] if b_checkpoints else None,
                   mock_calls_at_crash=calls_at_crash, mock_calls_final=calls, checkpoint_versions=versions)
    lab.ev.check("run COMPLETED", final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason)
    lab.ev.check("A had committed step a and the decision for b", pending and pending[0]["pending_step"] ==
                 "b/attempt-1" and any(r["step_key"] == "a/attempt-1" and r["status"] == "SUCCEEDED"
                                       for r in at_crash["ledger"]), at_crash["ledger"])
    lab.ev.check("committed checkpoints kept unchanged",
                 after["checkpoints"][:len(at_crash["checkpoints"])] == at_crash["checkpoints"])
    lab.ev.check("B continued from the committed version (next version = crash version + 1)",
                 bool(b_checkpoints) and b_checkpoints[0]["version"] == crash_version + 1,
                 {"crash_version": crash_version, "b_first": b_checkpoints[:1]})
    lab.ev.check("checkpoint versions 1..version without gaps",
                 versions == list(range(1, after["run"]["version"] + 1)), versions)
    lab.ev.check("completed step a not redone: one request per key, a sent once before the crash",
                 calls_at_crash.get(_key_of(after, "a/attempt-1")) == 1 and len(calls) == 3
                 and set(calls.values()) == {1}, calls)
    lab.ev.check("b and c were sent by B's fence", all(
        r["fencing_token"] > crash_fence for r in after["ledger"] if r["step_key"] != "a/attempt-1"), after["ledger"])


# ---------------------------------------------------------------------------------------------- 2


async def crash_before_tx2(lab: Lab) -> None:
    """The tool answered and the executor died before Tx2: no resend without a contract; lookup resolves."""
    await lab.runtime_database()
    await lab.scheduler()
    mock = await lab.mocktool()
    plain = scripted("acc-e2-plain", [tool_step("pay", "acc-e2-plain.pay"), {"id": "done", "finish": {"ok": True}}],
                     [http_tool(mock.url, "acc-e2-plain.pay", NON_IDEMPOTENT)])
    looked = scripted("acc-e2-lookup", [tool_step("pay", "acc-e2-lookup.pay"),
                                        {"id": "done", "finish": {"paid": "${results.pay.response.id}"}}],
                      [http_tool(mock.url, "acc-e2-lookup.pay", LOOKUP)])
    agents = write_agents(lab.dir / "agents", plain, looked)
    specs = []
    runs = {}
    for name, agent in (("plain", "acc-e2-plain"), ("lookup", "acc-e2-lookup")):
        run_id = await lab.submit(agent, {"amount": 10 + lab.ev.repetition})
        spec = f"after_tool_response_before_tx2_commit@run={run_id},action=sigkill"
        specs.append(spec)
        crashing = await lab.executor(f"executor-a-{name}", agents, faults=[spec])
        await wait_until(crashing.exited, 60, f"executor A ({name}) to SIGKILL itself")
        lab.ev.check(f"{name}: A ended by SIGKILL after the tool answered", crashing.returncode == -signal.SIGKILL
                     and "fault point after_tool_response_before_tx2_commit" in crashing.log(), crashing.returncode)
        runs[name] = run_id
    lab.ev.method = {"kind": "fault point, SIGKILL self", "specs": specs}
    await lab.executor("executor-b", agents)
    plain_run = await lab.wait_settled(runs["plain"], 60)
    lookup_run = await lab.wait_settled(runs["lookup"], 60)
    # The reconciler sweeps in-doubt runs: it must not resend what has no lookup contract either.
    reconcile = lab.spawn("reconcile", [PYTHON, "-m", "cli", "reconcile", "--tenants", TENANT, "--once",
                                        "--scheduler", lab.scheduler_addr, "--agents", str(agents)], {})
    await wait_until(lambda: not reconcile.alive(), 60, "`agentrt reconcile --once` to finish")
    report = reconcile.log().strip().splitlines()[-1] if reconcile.log().strip() else ""
    plain_after = await lab.snapshot(runs["plain"], "no-contract run after takeover and a reconcile sweep")
    lookup_after = await lab.snapshot(runs["lookup"], "lookup run after takeover")
    plain_run = await lab.api.get(TENANT, runs["plain"]) if lab.api else plain_run
    rows = lab.record_mock(mock)
    plain_calls = mock.calls_by_key("acc-e2-plain.pay")
    lookup_calls = mock.calls_by_key("acc-e2-lookup.pay")
    lookups = [r for r in rows if r["kind"] == "lookup"]
    [plain_row] = plain_after["ledger"]
    [lookup_row] = lookup_after["ledger"]
    evidence = lookup_row["reconciliation_evidence"] or {}
    lab.ev.observe(plain_status=STATUS(plain_run.status), plain_pause_reason=plain_run.pause_reason,
                   plain_ledger=plain_row, lookup_status=STATUS(lookup_run.status), lookup_ledger=lookup_row,
                   mock_calls_plain=plain_calls, mock_calls_lookup=lookup_calls, reconcile_report=report)
    lab.ev.check("no contract: run PAUSED_INDOUBT with its reason", plain_run.status == pb.RUN_STATUS_PAUSED_INDOUBT
                 and plain_run.pause_reason.startswith("tool outcome unknown"), plain_run.pause_reason)
    lab.ev.check("no contract: ledger row IN_DOUBT", plain_row["status"] == "IN_DOUBT", plain_row)
    lab.ev.check("no contract: exactly one request, never resent (also after the reconcile sweep)",
                 list(plain_calls.values()) == [1] and reconcile.returncode == 0, plain_calls)
    lab.ev.check("lookup: run COMPLETED", lookup_run.status == pb.RUN_STATUS_COMPLETED, lookup_run.terminal_reason)
    lab.ev.check("lookup: ledger SUCCEEDED with recorded lookup evidence",
                 lookup_row["status"] == "SUCCEEDED" and evidence.get("lookup") == "found"
                 and int(evidence.get("fencing_token", 0)) > lookup_row["fencing_token"], evidence)
    lab.ev.check("lookup: one request and one lookup, no resend",
                 list(lookup_calls.values()) == [1] and len([r for r in lookups if r["tool"] == "acc-e2-lookup.pay"])
                 == 1, {"calls": lookup_calls, "lookups": lookups})


# ---------------------------------------------------------------------------------------------- 3


async def stale_fence(lab: Lab) -> None:
    """A pauses (SIGSTOP) just before sending; its lease lapses; B takes over; A resumes and is fenced off."""
    await lab.runtime_database()
    await lab.scheduler()
    mock = await lab.mocktool()
    agent = scripted("acc-e3", [tool_step("prep", "acc-e3.prep"), tool_step("pay", "acc-e3.pay"),
                                {"id": "done", "finish": {"paid": "${results.pay.response.id}"}}],
                     [http_tool(mock.url, "acc-e3.prep", LOOKUP), http_tool(mock.url, "acc-e3.pay", LOOKUP)])
    agents = write_agents(lab.dir / "agents", agent)
    run_id = await lab.submit("acc-e3", {"amount": 30 + lab.ev.repetition})
    # Occurrence 2 of before_tool_send: pay (prep was the first), after Tx1 and the lease check.
    spec = f"before_tool_send@run={run_id},occurrence=2,action=sigstop"
    lab.ev.method = {"kind": "fault point, SIGSTOP self (pause), SIGCONT by the suite", "spec": spec}
    a = await lab.executor("executor-a", agents, faults=[spec])
    await wait_until(a.stopped, 60, "executor A to SIGSTOP itself before sending pay")
    paused = await lab.snapshot(run_id, "A paused after Tx1 of pay")
    fence_a = paused["run"]["fencing_token"]
    worker_a = lab.worker_id(a)
    await wait_until(lambda: _lease_lapsed(lab, run_id), 30, "A's lease to lapse by database time")
    await lab.executor("executor-b", agents)
    final = await lab.wait_settled(run_id, 90)
    before = await lab.snapshot(run_id, "B finished; A still paused")
    resumed_at = len(a.log())
    a.signal(signal.SIGCONT)
    late = await wait_until(lambda: [r for r in mock.requests("acc-e3.pay") if r["kind"] == "call"
                                     and r["fence"] == fence_a], 30, "A's late pay request at the mock")
    reactions = ("stopped working on it", "work cancelled", "refused a write", "lost:")
    await wait_until(lambda: any(text in a.log()[resumed_at:] for text in reactions), 30,
                     "A to hear that its lease is gone")
    after_a = await lab.snapshot(run_id, "after A resumed and tried")
    probe = await lab.api.stale_write(run_id, worker_a, fence_a, before["run"]["version"],  # type: ignore[union-attr]
                                      step_key="pay/attempt-1")
    lab.commands.add(f"grpc WorkService.* with A's lease (worker {worker_a}, fence {fence_a}) -> {probe}")
    after_probe = await lab.snapshot(run_id, "after the stale-lease probe")
    rows = lab.record_mock(mock)
    a_key = _key_of(paused, "pay/attempt-1")
    executions = mock.executions("acc-e3.pay")
    a_tail = a.log()[resumed_at:]
    lab.ev.observe(final_status=STATUS(final.status), fence_a=fence_a, worker_a=worker_a,
                   fence_final=before["run"]["fencing_token"], late_request=late, stale_lease_probe=probe,
                   pay_executions_by_key=executions, a_log_after_resume=a_tail[-3000:],
                   version_before_resume=before["run"]["version"], version_after=after_probe["run"]["version"],
                   checkpoints_before=len(before["checkpoints"]), checkpoints_after=len(after_probe["checkpoints"]))
    lab.ev.check("B completed the run", final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason)
    lab.ev.check("A's late request carried its old fence and the mock refused it",
                 all(r["outcome"] == "stale_fence" and r["http_status"] == 409 for r in late), late)
    lab.ev.check("A's attempt-1 request never executed; attempt-2 executed once",
                 a_key not in executions and list(executions.values()) == [1], executions)
    lab.ev.check("A's writes changed nothing (row, checkpoints, ledger, events)", after_a == before,
                 {"before": before["run"], "after": after_a["run"]})
    lab.ev.check("stale-lease writes affect 0 rows (every fenced call refused)",
                 probe and all(v in ("LEASE_LOST", "FAILED_PRECONDITION", "ABORTED") for v in probe.values()), probe)
    lab.ev.check("version and checkpoint count unchanged and consistent",
                 after_probe == before and len(before["checkpoints"]) == before["run"]["version"],
                 {"version": after_probe["run"]["version"], "checkpoints": len(after_probe["checkpoints"])})
    lab.ev.check("B's takeover proved attempt-1 not executed with a lookup under a newer fence", any(
        r["kind"] == "lookup" and r["idempotency_key"] == a_key and r["fence"] > fence_a for r in rows), a_key)


# ---------------------------------------------------------------------------------------------- 5


async def _legacy_layout_run(lab: Lab) -> str:
    """Case (c): a legacy layout labelled schema 1, written by an older writer, then retried."""
    assert lab.api is not None
    legacy_run = await lab.submit("acc-e5", {"case": "legacy"})
    lease = (await lab.api.work.ClaimWork(ws.ClaimWorkRequest(worker_id="legacy-writer", agents=["acc-e5"]),
                                          timeout=15)).lease
    ref = ws.LeaseRef(run_id=legacy_run, worker_id="legacy-writer", fencing_token=lease.run.fencing_token)
    legacy_state = {"cursor": "a", "step": 1, "results": {"a": {"id": "legacy-1"}}}
    await lab.api.work.SaveCheckpoint(ws.SaveCheckpointRequest(
        lease=ref, expected_version=0, state_json=json.dumps(legacy_state), schema_version=1, step_key="a",
        event_id=str(uuid.uuid4())), timeout=15)
    await lab.api.work.FinishRun(ws.FinishRunRequest(lease=ref, expected_version=1, outcome=ws.FINISH_OUTCOME_RETRY,
                                                     reason="legacy writer", event_id=str(uuid.uuid4())), timeout=15)
    lab.commands.add(f"grpc ClaimWork/SaveCheckpoint(schema 1, legacy layout)/FinishRun RETRY on run {legacy_run}")
    return legacy_run


async def checkpoint_schema_upgrade(lab: Lab) -> None:
    """Old checkpoints read by a newer executor: migrated explicitly, or refused; never zero values."""
    await lab.runtime_database()
    await lab.scheduler()
    mock = await lab.mocktool()
    agent = scripted("acc-e5", [tool_step("a", "acc-e5.a"), {"id": "ask", "wait_for_input": "continue?"},
                                tool_step("b", "acc-e5.b"),
                                {"id": "done", "finish": {"b": "${results.b.response.id}"}}],
                     [http_tool(mock.url, "acc-e5.a", LOOKUP), http_tool(mock.url, "acc-e5.b", LOOKUP)])
    agents = write_agents(lab.dir / "agents", agent)
    lab.ev.method = {"kind": "executor images: schema 1 (devstack.acceptance.older_executor) and schema 2 (as built)"}
    assert lab.api is not None
    legacy_run = await _legacy_layout_run(lab)
    # (a) a run parked at a v1 checkpoint by the executor as built.
    old_run = await lab.submit("acc-e5", {"case": "upgrade"})
    v1 = await lab.executor("executor-v1", agents, module="devstack.acceptance.older_executor")
    legacy = await lab.wait_settled(legacy_run, 60)
    parked = await lab.wait_settled(old_run, 60, {pb.RUN_STATUS_PAUSED_HUMAN})
    v1.stop()
    v2 = await lab.executor("executor-v2", agents)
    await lab.api.resume(TENANT, old_run, payload={"ok": True})
    upgraded = await lab.wait_settled(old_run, 60)
    # (b) rollback drill: a v2 checkpoint read by the v1 executor.
    new_run = await lab.submit("acc-e5", {"case": "rollback"})
    await lab.wait_settled(new_run, 60, {pb.RUN_STATUS_PAUSED_HUMAN})
    v2.stop()
    before_rollback = await lab.snapshot(new_run, "rollback drill: before the v1 executor reads the v2 checkpoint")
    await lab.executor("executor-v1-rollback", agents, module="devstack.acceptance.older_executor")
    await lab.api.resume(TENANT, new_run, payload={"ok": True})
    rolled = await wait_until(lambda: _refused(lab, new_run), 30, "the v1 executor to refuse the v2 checkpoint")
    legacy_snap = await lab.snapshot(legacy_run, "legacy layout after the executor read it")
    upgraded_snap = await lab.snapshot(old_run, "upgraded run")
    rolled_snap = await lab.snapshot(new_run, "rollback drill after the refusal")
    migrated = await lab.sql("SELECT version, schema_version, state_json ? 'history' AS inline_history, "
                             "octet_length(state_json::text) AS bytes FROM agent_checkpoints WHERE run_id = $1 "
                             "ORDER BY version", uuid.UUID(old_run),
                             note="schema versions along the upgraded run (schema 1 keeps its history inline)")
    journal = await lab.sql("SELECT seq, kind, step_key FROM run_journal WHERE run_id = $1 ORDER BY seq",
                            uuid.UUID(old_run), note="the upgraded run's journal")
    lab.record_mock(mock)
    calls = {tool: mock.calls_by_key(tool) for tool in ("acc-e5.a", "acc-e5.b")}
    lab.ev.observe(legacy=(STATUS(legacy.status), legacy.pause_reason), parked=STATUS(parked.status),
                   upgraded=(STATUS(upgraded.status), upgraded.terminal_reason),
                   rollback=(rolled["status"], rolled["pause_reason"]), mock_calls=calls,
                   v2_migration_log=[line for line in v2.log().splitlines() if "migrated" in line][:5])
    schema_by_version = [(r["version"], r["schema_version"]) for r in migrated]
    inline = {r["schema_version"]: r["inline_history"] for r in migrated}
    lab.ev.check("legacy layout refused, naming the field, with the checkpoint untouched",
                 legacy.status == pb.RUN_STATUS_PAUSED_HUMAN and "does not match schema version" in legacy.pause_reason
                 and len(legacy_snap["checkpoints"]) == 1, legacy.pause_reason)
    lab.ev.check("upgrade: the v2 executor migrated the v1 checkpoint and completed the run",
                 upgraded.status == pb.RUN_STATUS_COMPLETED and inline == {1: True, 2: False}
                 and "checkpoint migrated from schema 1 to 2" in v2.log(), schema_by_version)
    lab.ev.check("upgrade: the schema-1 history became the run's first journal entries, each once, in order",
                 [r["seq"] for r in journal] == list(range(1, len(journal) + 1))
                 and [r["kind"] for r in journal][:2] == ["tool", "input"]
                 and sum(1 for r in journal if r["kind"] == "tool") == 2, journal)
    lab.ev.check("upgrade: checkpoints before the resume are schema 1, after it schema 2, no gaps",
                 [s for _, s in schema_by_version] == sorted(s for _, s in schema_by_version)
                 and {s for _, s in schema_by_version} == {1, 2}
                 and [v for v, _ in schema_by_version] == list(range(1, upgraded_snap["run"]["version"] + 1)),
                 schema_by_version)
    lab.ev.check("upgrade: step a not redone, b sent once",
                 sorted(calls["acc-e5.a"].values()) == [1, 1] and list(calls["acc-e5.b"].values()) == [1], calls)
    lab.ev.check("rollback: the v1 executor refused the v2 checkpoint (PAUSED_HUMAN, reason given)",
                 rolled["status"] == "PAUSED_HUMAN" and "schema version 2 is not supported" in rolled["pause_reason"],
                 rolled)
    lab.ev.check("rollback: no checkpoint rewritten, b never sent",
                 rolled_snap["checkpoints"] == before_rollback["checkpoints"]
                 and _key_for_run(rolled_snap) not in calls["acc-e5.b"], rolled_snap["checkpoints"])


async def _refused(lab: Lab, run_id: str) -> dict[str, Any] | None:
    row = await lab.run_row(run_id)
    if row.get("status") == "PAUSED_HUMAN" and "not supported" in (row.get("pause_reason") or ""):
        return row
    return None


def _key_for_run(snapshot: dict[str, Any]) -> str:
    rows = [r for r in snapshot["ledger"] if r["step_key"].startswith("b/")]
    return str(rows[0]["idempotency_key"]) if rows else "-"
