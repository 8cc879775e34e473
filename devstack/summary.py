"""The closing report of `agentrt dev`: read from the scheduler (run histories), the mock tool
server's own store (every request it received) and the Kafka reader, never from the services' logs.

`problems` lists what keeps the session from being a success: a run neither
completed nor in its expected pause, more than one request for one idempotency
key of the non-idempotent tool, an event not published or not consumed.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Any

import aiohttp

from devstack.demo import AWAITING_APPROVAL, CANCELLED, COMPLETED, DemoRun
from devstack.watch import EventCounter
from executor.agents import AgentDefinition
from shared.client.runs import AgentrtClient, History

TAKEOVER_RULE = "executor-takeover/1"


@dataclass
class ChaosCounts:
    executor_kills: int = 0
    relay_kills: int = 0
    tool_faults: int = 0


async def histories(client: AgentrtClient, runs: list[DemoRun], batch: int = 20) -> dict[str, History]:
    ids = [r.run_id for r in runs if r.run_id]
    found: dict[str, History] = {}
    for start in range(0, len(ids), batch):
        for history in await asyncio.gather(*(client.history(i) for i in ids[start:start + batch])):
            found[history.run.run_id] = history
    return found


async def mock_requests(mock_url: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(
            f"{mock_url}/_requests", timeout=aiohttp.ClientTimeout(total=30)) as resp:
        resp.raise_for_status()
        rows: list[dict[str, Any]] = await resp.json()
        return rows


def event_check(found: dict[str, History], events: EventCounter | None) -> dict[str, Any]:
    """Published = outbox rows with published_at; consumed = those ids read from the topic."""
    published: set[str] = set()
    pending = 0
    for history in found.values():
        for event in history.events:
            if event.get("published_at"):
                published.add(event["event_id"])
            else:
                pending += 1
    consumed = set().union(*(events.ids_by_run.get(r, set()) for r in found)) if events else set()
    return {"published": len(published), "pending": pending, "consumed": len(published & consumed),
            "missing": len(published - consumed) if events else None,
            "duplicate_deliveries": events.duplicates if events else 0}


def tool_requests(rows: list[dict[str, Any]], run_ids: set[str], agent: AgentDefinition) -> dict[str, Any]:
    per_key: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for row in rows:
        if row.get("kind") == "call" and row.get("run_id") in run_ids:
            per_key[row["tool"]][row["idempotency_key"]] += 1
    out = {}
    for tool in agent.tools:
        counts = per_key.get(tool.name, collections.Counter())
        out[tool.name] = {"idempotent": tool.contract.idempotent, "keys": len(counts),
                          "requests": sum(counts.values()), "max_per_key": max(counts.values(), default=0),
                          "keys_with_more_than_one": sorted(k for k, n in counts.items() if n > 1)}
    return out


def in_doubt(found: dict[str, History]) -> list[dict[str, Any]]:
    """Every freeze (agent.tool_in_doubt) and what settled it (agent.tool_resolved, or nothing yet)."""
    out = []
    for run_id, history in found.items():
        resolutions = {e["payload"]["step_key"]: e["payload"] for e in history.events
                       if e.get("event_type") == "agent.tool_resolved" and isinstance(e.get("payload"), dict)}
        for event in history.events:
            if event.get("event_type") != "agent.tool_in_doubt":
                continue
            payload = event.get("payload") or {}
            resolved = resolutions.get(payload.get("step_key"))
            evidence = (resolved or {}).get("evidence") or {}
            out.append({"run_id": run_id, "step_key": payload.get("step_key"), "error_code": payload.get("error_code"),
                        "resolution": resolved.get("outcome") if resolved else "unresolved",
                        "resolved_by": resolved.get("resolved_by") if resolved else None,
                        "lookup": evidence.get("lookup") if isinstance(evidence, dict) else None,
                        "run_status": history.run.status})
    return out


def takeovers(found: dict[str, History]) -> dict[str, int]:
    """WAITING_TOOL runs taken over by another executor, settled by lookup (found, or proven not executed)."""
    counts: collections.Counter[str] = collections.Counter()
    for history in found.values():
        for row in history.tool_executions:
            evidence = row.get("reconciliation_evidence")
            if isinstance(evidence, dict) and evidence.get("rule") == TAKEOVER_RULE:
                counts[str(evidence.get("lookup"))] += 1
    return dict(counts)


async def build(client: AgentrtClient, runs: list[DemoRun], mock_url: str | None, agent: AgentDefinition,
                events: EventCounter | None, chaos: ChaosCounts | None, *, auto_approve: bool) -> dict[str, Any]:
    found = await histories(client, runs)
    for run in runs:
        if run.run_id in found:
            run.update(found[run.run_id].run)
    outcomes = collections.Counter(r.outcome(auto_approve=auto_approve) for r in runs)
    summary: dict[str, Any] = {
        "runs": {"submitted": len(runs), "by_status": dict(collections.Counter(r.status for r in runs)),
                 "completed": outcomes[COMPLETED], "awaiting_approval": outcomes[AWAITING_APPROVAL],
                 "approved_by_dev": sum(r.resumed for r in runs), "cancelled": outcomes[CANCELLED],
                 "not_done": [{"run_id": r.run_id, "status": r.status, "step": r.step, "reason": r.reason}
                              for r in runs if r.outcome(auto_approve=auto_approve) not in
                              (COMPLETED, AWAITING_APPROVAL, CANCELLED)]},
        "tool_requests": tool_requests(await mock_requests(mock_url), set(found), agent) if mock_url else {},
        "in_doubt": in_doubt(found),
        "takeover_lookups": takeovers(found),
        "events": event_check(found, events),
        "chaos": chaos.__dict__ if chaos else None,
    }
    problems = [f"run {r['run_id'] or '(not submitted)'} is {r['status']} at {r['step'] or '-'}: {r['reason']}"
                for r in summary["runs"]["not_done"]]
    for tool, figures in summary["tool_requests"].items():
        if not figures["idempotent"] and figures["max_per_key"] > 1:
            problems.append(f"{tool} (not idempotent) got {figures['max_per_key']} requests for one idempotency key")
    ev = summary["events"]
    if ev["pending"]:
        problems.append(f"{ev['pending']} events not published yet")
    if ev["missing"]:
        problems.append(f"{ev['missing']} published events not consumed")
    summary["problems"] = problems
    summary["ok"] = not problems
    return summary


def text(summary: dict[str, Any]) -> list[str]:
    runs, ev = summary["runs"], summary["events"]
    lines = ["", "summary",
             f"  runs: {runs['submitted']} submitted; {runs['completed']} completed, "
             f"{runs['awaiting_approval']} waiting for approval (agentrt runs resume RUN --approve)"
             + (f", {runs['approved_by_dev']} approved by --auto-approve" if runs["approved_by_dev"] else "")
             + (f", {runs['cancelled']} cancelled" if runs["cancelled"] else "")
             + f"; by status {runs['by_status']}"]
    if summary["tool_requests"]:
        lines.append("  tool requests per idempotency key (from the mock tool server's store):")
        for tool, f in summary["tool_requests"].items():
            kind = "idempotent" if f["idempotent"] else "NOT idempotent"
            lines.append(f"    {tool:17} {kind:15} {f['keys']:4} keys {f['requests']:4} requests, "
                         f"at most {f['max_per_key']} per key")
    doubts = summary["in_doubt"]
    lines.append(f"  runs in doubt: {len({d['run_id'] for d in doubts})} ({len(doubts)} tool calls)")
    how = collections.Counter(f"{d['resolution']} by {d['resolved_by'] or '-'} (lookup {d['lookup'] or '-'})"
                              for d in doubts)
    for resolution, count in sorted(how.items()):
        lines.append(f"    {count} × {resolution}")
    if summary["takeover_lookups"]:
        lines.append("  takeovers settled by lookup: "
                     + ", ".join(f"{k} {v}" for k, v in sorted(summary["takeover_lookups"].items())))
    lines.append(f"  events: {ev['published']} published, {ev['consumed']} consumed"
                 + (f", {ev['pending']} not yet published" if ev["pending"] else "")
                 + (f", {ev['duplicate_deliveries']} duplicate deliveries dropped by id"
                    if ev["duplicate_deliveries"] else ""))
    if summary["chaos"]:
        c = summary["chaos"]
        lines.append(f"  chaos: {c['executor_kills']} executor and {c['relay_kills']} relay SIGKILLs, "
                     f"{c['tool_faults']} label answers dropped (queued on the mock tool server)")
    lines.extend(f"  PROBLEM: {p}" for p in summary["problems"])
    lines.append("  all runs done, every event consumed" if summary["ok"] else "  not done")
    return lines
