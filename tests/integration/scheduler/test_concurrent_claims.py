"""Concurrent claims from several OS processes over 1,000 runs (docs/design.md §leases-and-fencing).

Path 1: a scheduler subprocess (`python -m cli scheduler`) and several
worker processes (tests/integration/scheduler/_claim_worker.py) claiming through gRPC.
Path 2: several worker processes calling Store.claim directly, each with its own
asyncpg pool. Some first claims are abandoned without heartbeating, so those runs
are taken over with fence 2 once the lease lapses by database time.

Checked from the workers' records and the database: every run COMPLETED exactly
once, every (run, fence) claimed by exactly one worker, fences 1..n claimed once
each, one checkpoint per run.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import TENANT

from devstack.embedded_pg import free_port
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[3]
WORKER_SCRIPT = Path(__file__).with_name("_claim_worker.py")
RUNS = 1000
LEASE_MS = 3000
ABANDON_EVERY = 40  # per worker thread, of its first claims (fence 1)


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """Stops one process we started, by its pid: SIGTERM, then SIGKILL after the grace period."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def tail(path: Path, chars: int = 2000) -> str:
    return path.read_text()[-chars:] if path.exists() else ""


def start_scheduler(db_url: str, addr: str, log: Path) -> subprocess.Popen[Any]:
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "cli", "scheduler"], cwd=REPO_ROOT,
            env=child_env(AGENTRT_DATABASE_URL=db_url, AGENTRT_LISTEN_ADDR=addr,
                          AGENTRT_LEASE_DURATION_MS=str(LEASE_MS), AGENTRT_CLAIM_POLL_INTERVAL_MS="100",
                          AGENTRT_DB_POOL_MAX="12", AGENTRT_LOG_LEVEL="WARNING", AGENTRT_SHUTDOWN_GRACE_S="1",
                          # The workers claim as bare gRPC clients; auth is not under test here.
                          AGENTRT_REQUIRE_REGISTERED_AGENTS="false", AGENTRT_AUTH_MODE="none"),
            stdout=out, stderr=subprocess.STDOUT)


async def wait_serving(addr: str, proc: subprocess.Popen[Any], log: Path, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"scheduler exited with {proc.returncode}: {tail(log)}")
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"scheduler not SERVING within {within}s: {tail(log)}")
            await asyncio.sleep(0.1)


async def submit_runs(addr: str, count: int) -> set[str]:
    async with grpc.aio.insecure_channel(addr) as channel:
        runs = rs_grpc.RunServiceStub(channel)
        gate = asyncio.Semaphore(32)

        async def one(i: int) -> str:
            async with gate:
                reply = await runs.SubmitRun(rs.SubmitRunRequest(
                    agent_name="demo", input_json=json.dumps({"n": i}), client_request_id=f"req-{i}"),
                    metadata=[("x-tenant-id", TENANT)], timeout=30)
                return reply.run.run_id

        ids = await asyncio.gather(*(one(i) for i in range(count)))
    assert len(set(ids)) == count
    return set(ids)


async def wait_all_completed(db: Any, workers: list[subprocess.Popen[Any]], count: int, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        done = await db.fetchval("SELECT count(*) FROM agent_runs WHERE status = 'COMPLETED'")
        if done == count:
            return
        for proc in workers:
            if proc.poll() is not None:
                raise AssertionError(f"worker {proc.args} exited early with {proc.returncode}")
        if time.monotonic() > deadline:
            statuses = await db.fetch("SELECT status, count(*) FROM agent_runs GROUP BY status")
            raise AssertionError(f"only {done}/{count} runs completed within {within}s: {statuses}")
        await asyncio.sleep(0.2)


def start_workers(tmp_path: Path, mode: str, processes: int, threads: int, stop_file: Path,
                  **target: str) -> list[subprocess.Popen[Any]]:
    workers = []
    for i in range(processes):
        cmd = [sys.executable, str(WORKER_SCRIPT), "--mode", mode, "--worker", f"{mode}-p{i}",
               "--threads", str(threads), "--abandon-every", str(ABANDON_EVERY), "--lease-ms", str(LEASE_MS),
               "--out", str(tmp_path / f"records-{mode}-{i}.jsonl"), "--stop-file", str(stop_file)]
        for key, value in target.items():
            cmd += [f"--{key.replace('_', '-')}", value]
        with (tmp_path / f"worker-{mode}-{i}.log").open("w") as err:
            workers.append(subprocess.Popen(cmd, cwd=REPO_ROOT, env=child_env(), stdout=subprocess.DEVNULL,
                                            stderr=err))
    return workers


def stop_workers(workers: list[subprocess.Popen[Any]], stop_file: Path) -> list[int | None]:
    stop_file.touch()
    deadline = time.monotonic() + 30
    for proc in workers:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            pass
    codes = [proc.returncode for proc in workers]
    for proc in workers:
        stop_process(proc, grace=2)
    return codes


def read_records(tmp_path: Path, mode: str) -> list[dict[str, Any]]:
    records = []
    for path in sorted(tmp_path.glob(f"records-{mode}-*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line]
    return records


async def check_outcome(db: Any, records: list[dict[str, Any]], run_ids: set[str], processes: int) -> None:
    by_op: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for record in records:
        by_op[record["op"]].append(record)

    # Each (run, fence) was claimed by exactly one worker: no run claimed twice with one fence.
    claims = collections.Counter((r["run"], r["fence"]) for r in by_op["claim"])
    doubled = {key: n for key, n in claims.items() if n > 1}
    assert not doubled, f"claimed more than once with the same fence: {list(doubled.items())[:5]}"
    assert {run for run, _ in claims} == run_ids

    # Fences only come from claims: each run's claimed fences are exactly 1..its final fence.
    fences: dict[str, list[int]] = collections.defaultdict(list)
    for run, fence in claims:
        fences[run].append(fence)
    db_runs = {str(r["id"]): r for r in await db.fetch("SELECT * FROM agent_runs")}
    assert set(db_runs) == run_ids
    for run, seen in fences.items():
        assert sorted(seen) == list(range(1, db_runs[run]["fencing_token"] + 1)), (run, seen)

    # Every run COMPLETED exactly once, by the holder of its last fence.
    assert {r["status"] for r in db_runs.values()} == {"COMPLETED"}
    done = collections.Counter(r["run"] for r in by_op["done"])
    assert set(done) == run_ids and set(done.values()) == {1}
    for record in by_op["done"]:
        assert record["fence"] == db_runs[record["run"]]["fencing_token"]
        assert db_runs[record["run"]]["result"] == {"by": record["worker"]}
    completed_events = collections.Counter(str(r["run_id"]) for r in await db.fetch(
        "SELECT run_id FROM outbox WHERE event_type = 'agent.run_completed'"))
    assert set(completed_events) == run_ids and set(completed_events.values()) == {1}

    # One checkpoint per run, written by the finishing fence.
    assert await db.fetchval("SELECT count(*) FROM agent_checkpoints") == RUNS
    assert {r["version"] for r in db_runs.values()} == {1}
    bad = await db.fetchval("""SELECT count(*) FROM agent_checkpoints c JOIN agent_runs r ON r.id = c.run_id
                               WHERE c.version <> 1 OR c.fencing_token <> r.fencing_token""")
    assert bad == 0
    assert len(by_op["save"]) == RUNS and not by_op["lost"]

    # Abandoned first claims were taken over (fence 2) once their lease lapsed; takeover is not an attempt.
    abandoned = {r["run"] for r in by_op["abandon"]}
    assert abandoned, "no claim was abandoned: the takeover path was not exercised"
    for run in abandoned:
        assert db_runs[run]["fencing_token"] >= 2 and db_runs[run]["attempt_count"] == 1
    assert {r["attempt_count"] for r in db_runs.values()} == {1}
    # The work really was spread over several processes.
    processes_seen = {r["worker"].rsplit("-t", 1)[0] for r in by_op["done"]}
    assert len(processes_seen) == processes, processes_seen
    assert await db.fetchval("""SELECT count(*) FROM agent_runs WHERE lease_owner IS NOT NULL
                                OR lease_expires_at IS NOT NULL""") == 0


async def test_concurrent_claims_through_grpc_from_several_processes(db_url, db, tmp_path):
    port = free_port()
    addr = f"127.0.0.1:{port}"
    log = tmp_path / "scheduler.log"
    scheduler = start_scheduler(db_url, addr, log)
    workers: list[subprocess.Popen[Any]] = []
    stop_file = tmp_path / "stop-grpc"
    processes = 4
    try:
        await wait_serving(addr, scheduler, log)
        run_ids = await submit_runs(addr, RUNS)
        workers = start_workers(tmp_path, "grpc", processes, 2, stop_file, addr=addr)
        await wait_all_completed(db, workers, RUNS, within=120)
        codes = stop_workers(workers, stop_file)
        logs = {p.name: tail(p) for p in tmp_path.glob("worker-grpc-*.log")}
        assert codes == [0] * processes, (codes, logs)
    finally:
        stop_file.touch()
        for proc in workers:
            stop_process(proc, grace=5)
        stop_process(scheduler)
    assert scheduler.returncode == 0, tail(log)
    await check_outcome(db, read_records(tmp_path, "grpc"), run_ids, processes)


async def test_concurrent_claims_through_the_store_from_several_processes(db_url, db, tmp_path):
    """The same protocol without the gRPC layer: each process has its own pool, so the row locks
    and SKIP LOCKED are contended between separate database clients."""
    from scheduler.config import SchedulerSettings
    from scheduler.store import Store, SubmitSpec, connect_pool

    pool = await connect_pool(db_url, min_size=1, max_size=4)
    try:
        store = Store(pool, SchedulerSettings(database_url=db_url))
        gate = asyncio.Semaphore(4)

        async def one(i: int) -> str:
            async with gate:
                row, created = await store.runs.submit_run(TENANT, SubmitSpec(
                    agent_name="demo", agent_version="", input={"n": i}, client_request_id=None,
                    max_attempts=3, labels={}))
                assert created
                return str(row["id"])

        run_ids = set(await asyncio.gather(*(one(i) for i in range(RUNS))))
    finally:
        await pool.close()
    stop_file = tmp_path / "stop-store"
    processes = 3
    workers = start_workers(tmp_path, "store", processes, 3, stop_file, db_url=db_url)
    try:
        await wait_all_completed(db, workers, RUNS, within=120)
        codes = stop_workers(workers, stop_file)
        logs = {p.name: tail(p) for p in tmp_path.glob("worker-store-*.log")}
        assert codes == [0] * processes, (codes, logs)
    finally:
        stop_file.touch()
        for proc in workers:
            stop_process(proc, grace=5)
    await check_outcome(db, read_records(tmp_path, "store"), run_ids, processes)
