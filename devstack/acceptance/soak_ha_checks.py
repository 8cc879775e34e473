"""The HA soak's checks and report (the soak and its entry point: devstack/acceptance/soak_ha.py)."""

from __future__ import annotations

import collections
from typing import Any

from devstack.acceptance import ha_cluster, soak_report
from devstack.acceptance.experiments_platform import check_invariants


async def report(soak: Any) -> int:
    """`soak` is a finished devstack.acceptance.soak_ha.HaSoak (typed Any: that module imports this one)."""
    lab, line, args = soak.lab, soak.line, soak.args
    ev = lab.ev
    assert line.mock is not None
    verdicts = soak_report.flatness(soak.samples, args.minutes, soak_report.UNITS)
    markdown = soak_report.table(verdicts, args.minutes)
    over = {k: n for step in "abc" for k, n in line.mock.calls_by_key(f"chaos-nonidem.{step}").items() if n > 1}
    ev.method = {"kind": "HA soak: Patroni 3 + etcd, 2 PostgreSQL 15 nodes, synchronous_mode",
                 "dsn": soak.cluster.dsn("<db>"), "seed": args.seed, "minutes": args.minutes,
                 "failover_every_min": args.failover_every_min, "rate_runs_per_s": round(soak.rate, 2),
                 "kill_every_s": args.kill_every_s, "fault_probability": args.fault_probability,
                 "keep_finished_s": args.keep_finished_s, "retention_interval_s": args.retention_interval_s,
                 "maintain_every_min": args.maintain_every_min,
                 "versions": ha_cluster.versions()}
    ev.observe(runs=len(soak.run_ids), statuses=dict(soak.statuses), failovers=soak.failovers,
               flatness=verdicts, samples=len(soak.samples), sigkills_by_soak=dict(soak.kills),
               restarts=dict(soak.respawns), submits_refused=dict(soak.refused), runs_aged=soak.aged,
               sample_read_retries=dict(soak.read_errors), index_maintenance=soak.maintenance,
               timeline=soak.timeline)
    ev.check(f"{len(soak.samples)} per-minute samples of {args.minutes:g} minutes",
             len(soak.samples) == int(args.minutes), len(soak.samples))
    expected = max(0, -(-int(args.minutes) // int(args.failover_every_min)) - 1)
    ev.check(f"{expected} failovers, each with a new leader and the old one back through pg_rewind",
             len(soak.failovers) == expected and all(f["rejoin"].get("pg_rewind_used") for f in soak.failovers),
             [{k: f[k] for k in ("number", "new_leader", "seconds_until_new_leader", "time_to_recover_s")}
              for f in soak.failovers])
    for f in soak.failovers:
        ev.check(f"failover {f['number']}: no committed checkpoint, ledger row, journal entry or outbox row lost, "
                 "no fencing token went back", not any(f["lost"].values()) and not f["fence_went_back"],
                 {"lost": f["lost"], "fence_went_back": f["fence_went_back"]})
    retained = sum(soak.statuses[s] for s in ("COMPLETED", "FAILED", "CANCELLED", "PAUSED_HUMAN", "PAUSED_INDOUBT"))
    ev.check("every run terminal or paused with a recorded reason (or terminal and deleted by retention)",
             retained + soak.statuses["deleted by retention"] == len(soak.run_ids), dict(soak.statuses))
    ev.check("retention deleted runs during the soak", soak.statuses["deleted by retention"] > 0,
             soak.statuses["deleted by retention"])
    ev.check("non-idempotent tools without lookup: at most one request per idempotency key", not over, over)
    line.alive_check([soak.scheduler, soak.executors["executor-1"]],
                     "the scheduler and executor-1 lived through the whole soak (same pids)")
    if args.minutes >= 30:  # the windows mean something only over a long soak
        ev.check("every figure flat: the last sixth within 1.2x of the second sixth",
                 all(v["flat"] for v in verdicts), [v for v in verdicts if not v["flat"]])
    await line.check_delivery()
    await check_invariants(lab, [r for r in soak.run_ids])
    ev.finish()
    (lab.dir / "report.md").write_text(_report_markdown(soak, verdicts, markdown))
    print("\n" + markdown + "\n")
    for check in ev.checks:
        print(f"  [{'ok' if check.ok else 'VIOLATION'}] {check.name}")
    print(f"\n{ev.pass_or_fail}: {sum(c.ok for c in ev.checks)} checks passed, "
          f"{sum(not c.ok for c in ev.checks)} violated; evidence in {lab.dir}")
    return 0 if ev.pass_or_fail == "PASS" else 1


def _report_markdown(soak: Any, verdicts: list[dict[str, Any]], markdown: str) -> str:
    args = soak.args
    counts = collections.Counter({k: v for k, v in soak.statuses.items() if v})
    lines = [f"# HA soak, {args.minutes:g} minutes (seed {args.seed})", "",
             f"{len(soak.run_ids)} runs at {soak.rate:.1f} runs/s; statuses {dict(counts)}; "
             f"SIGKILLs {dict(soak.kills)}; restarts {dict(soak.respawns)}; runs aged for retention {soak.aged}.",
             "", "Failovers (leader's Patroni and postmaster SIGKILLed):", ""]
    for f in soak.failovers:
        lines.append(f"- {f['number']}: new leader {f['new_leader']} after {f['seconds_until_new_leader']} s, "
                     f"first acknowledged commit after {f['time_to_recover_s']} s, old leader a synchronous "
                     f"standby again after {f['rejoin'].get('seconds_until_sync_standby')} s "
                     f"(pg_rewind {f['rejoin'].get('pg_rewind_used')})")
    passes = [m for m in soak.maintenance if "error" not in m]
    lines += ["", f"Index upkeep (`agentrt maintain indexes` every {args.maintain_every_min:g} min): {len(passes)} "
              f"passes, {sum(len(m['rebuilt']) for m in passes)} rebuilds, "
              f"{sum(len(m['dropped']) for m in passes)} leftovers dropped, "
              f"{len(soak.maintenance) - len(passes)} passes cut short."]
    lines += ["", markdown, "", f"Flat: {all(v['flat'] for v in verdicts)}; checks: {soak.lab.ev.pass_or_fail}."]
    return "\n".join(lines) + "\n"


__all__ = ["report"]
