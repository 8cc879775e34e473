"""`agentrt acceptance`: experiments 1-9, each repeated with fresh run ids; evidence and a summary table.

    agentrt acceptance --repeat 5                 # the full suite
    agentrt acceptance --repeat 1 --only 1,3      # some experiments once
    agentrt acceptance --only 10 --repeat 5       # the primary lost under Patroni (docs/ha.md)

Artifacts: <dir>/e<id>-r<k>/ (evidence.json, every process log, the mock
tool's SQLite store), <dir>/summary.json. Exit status 0 only when every
repetition of every experiment passed.

Experiment 9 runs in a network namespace of its own (a "hub" holding its
PostgreSQL, scheduler, mock tool and the healthy executor; the partitioned
executor sits in a second namespace behind a veth pair whose link is cut).
When namespaces cannot be created it pauses the executor (SIGSTOP) instead and
says so in the evidence.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from devstack.acceptance.evidence import format_table, summary_rows
from devstack.acceptance.lab import Lab, Suite
from devstack.acceptance.options import DEFAULT_ARTIFACTS
from devstack.acceptance.procs import PYTHON, REPO_ROOT, clean_env


def default_artifacts() -> Path:
    return DEFAULT_ARTIFACTS / dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")


def netns_available() -> bool:
    name = f"acc-probe-{uuid.uuid4().hex[:6]}"
    try:
        made = subprocess.run(["ip", "netns", "add", name], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    if made.returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    return True


async def run_experiments(suite: Suite, ids: list[str], repeat: int, hub: str = "") -> list[dict[str, Any]]:
    from devstack.acceptance.experiments import EXPERIMENTS

    suite.hub = hub
    records = []
    for exp_id in ids:
        experiment = EXPERIMENTS[exp_id]
        for repetition in range(1, repeat + 1):
            lab = Lab(suite, experiment.id, experiment.title, repetition, experiment.expected, experiment.injection)
            async with lab:
                await asyncio.wait_for(experiment.body(lab), experiment.timeout_s)
            record = lab.ev.to_json()
            records.append(record)
            failed = [c["name"] for c in record["checks"] if not c["ok"]]
            print(f"  e{exp_id} r{repetition}: {record['pass_or_fail']} in {record['duration_s']:.1f}s"
                  + (f" — error: {record['error']}" if record["error"] else "")
                  + (f" — failed: {'; '.join(failed)}" if failed else ""), flush=True)
    return records


def run_partition_in_hub(artifacts: Path, repeat: int, lease_ms: int) -> list[dict[str, Any]] | None:
    """Experiment 9 in a fresh namespace of its own; None when namespaces are not available here."""
    hub = f"acc-hub-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", hub], capture_output=True, text=True, timeout=10) \
        if netns_available() else None
    if made is None or made.returncode != 0:
        return None
    try:
        subprocess.run(["ip", "-n", hub, "link", "set", "lo", "up"], check=True, timeout=10)
        argv = ["ip", "netns", "exec", hub, PYTHON, "-m", "devstack.acceptance.runner", "--only", "9",
                "--repeat", str(repeat), "--artifacts", str(artifacts.resolve()), "--lease-ms", str(lease_ms),
                "--hub", hub]
        print(f"  experiment 9 runs inside network namespace {hub}", flush=True)
        subprocess.run(argv, cwd=REPO_ROOT, env=clean_env({}), timeout=900)
    finally:
        subprocess.run(["ip", "netns", "del", hub], capture_output=True, timeout=30)
    records = []
    for repetition in range(1, repeat + 1):
        path = artifacts / f"e9-r{repetition}" / "evidence.json"
        if path.exists():
            records.append(json.loads(path.read_text()))
        else:
            records.append({"experiment_id": "9", "title": "network partition of one executor", "repetition":
                            repetition, "pass_or_fail": "FAIL", "duration_s": 0.0, "checks": [],
                            "fault_injection_point": "netns", "error": "no evidence written (see the output)"})
    return records


def write_summary(artifacts: Path, summary: dict[str, Any]) -> None:
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


async def main_async(args: argparse.Namespace) -> int:
    from devstack.acceptance.experiments import DEFAULT_IDS, EXPERIMENTS

    ids = [i.strip() for i in args.only.split(",") if i.strip()] or list(DEFAULT_IDS)
    unknown = [i for i in ids if i not in EXPERIMENTS]
    if unknown:
        print(f"unknown experiment(s): {', '.join(unknown)}; known: {', '.join(EXPERIMENTS)}", file=sys.stderr)
        return 2
    artifacts: Path = args.artifacts or default_artifacts()
    records: list[dict[str, Any]] = []
    in_process = [i for i in ids if i != "9" or args.hub]
    if "9" in ids and not args.hub:
        hub_records = run_partition_in_hub(artifacts, args.repeat, args.lease_ms) \
            if args.partition == "auto" else None
        if hub_records is None:
            print("  experiment 9 without a network namespace (unavailable, or --partition sigstop): "
                  "the executor is paused (SIGSTOP) instead", flush=True)
            in_process.append("9")
        else:
            records += hub_records
    if in_process:
        suite = await Suite(artifacts, lease_ms=args.lease_ms, keep_databases=args.keep_databases,
                            ha_strict=args.ha_strict).start()
        try:
            records += await run_experiments(suite, sorted(in_process, key=int), args.repeat, hub=args.hub)
        finally:
            await suite.stop()
    if args.hub:  # the child inside the hub: the parent writes the summary
        return 0 if all(r["pass_or_fail"] == "PASS" for r in records) else 1
    records.sort(key=lambda r: (int(r["experiment_id"]), r["repetition"]))
    rows = summary_rows(records)
    summary = {"artifacts": str(artifacts), "finished_at": dt.datetime.now(dt.UTC).isoformat(),
               "repeat": args.repeat, "experiments": rows,
               "passed": sum(r["passed"] for r in rows), "failed": sum(r["failed"] for r in rows)}
    write_summary(artifacts, summary)
    print()
    print(format_table(rows))
    print(f"\n{summary['passed']} passed, {summary['failed']} failed; evidence in {artifacts}")
    return 0 if summary["failed"] == 0 and summary["passed"] > 0 else 1


def main(argv: list[str] | None = None) -> int:
    from devstack.acceptance.options import acceptance_arguments, quiet

    parser = argparse.ArgumentParser(prog="agentrt acceptance", description=__doc__.split("\n")[0])
    acceptance_arguments(parser)
    quiet()
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
