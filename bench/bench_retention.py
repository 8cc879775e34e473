"""Retention benchmark: claim and submit latency while retention deletes 100,000 expired runs.

    python -m bench.bench_retention [--runs 100000] [--calls 20] [--block-s 2] [--batch-runs 100] [--pause-ms 200]

One scratch database on AGENTRT_BENCH_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/postgres), dropped at the end:

1. Setup: migrations, then `--runs` COMPLETED runs that finished 40 days ago by the
   database clock (past the default 30-day policy), each with a checkpoint, a ledger row, a
   journal row and two published outbox rows, written by SQL in bulk; ANALYZE.
2. A scheduler in this process (its own background task off) and one gRPC channel. The
   workload is rounds of `--calls` sequential SubmitRun calls, then `--calls` sequential
   ClaimWork calls that lease the runs just submitted (their events stay unpublished: no relay).
3. Retention runs as the scheduler's task does, on the scheduler's pool: batches of
   `--batch-runs` runs, `--pause-ms` apart. Blocks of `--block-s` alternate, idle (no batch
   in flight) and busy (batches running), until every expired run is gone: both sides see
   the same table growth and the same background load of the shared machine.

Figures: p50 and p99 of SubmitRun and ClaimWork in busy blocks against idle blocks (same-run
ratios), and the runs deleted per second while enabled. Progress goes to stderr; stdout
ends with one JSON line per figure. Exits non-zero if retention did not delete every
expired run, or deleted a live one.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from dataclasses import dataclass, field

import asyncpg
import grpc

from bench._pg import emit, figure, log, percentile, scratch_database
from scheduler.background.retention import TABLES, RetentionCounts
from scheduler.config import SchedulerSettings
from scheduler.server import SchedulerServer
from scheduler.store import Store
from scheduler.store.migrate import migrate
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.gen.agentrt.v1 import work_service_pb2_grpc as ws_grpc

BENCH = "retention"
TENANT = "bench"
AGENT = "bench"

SEED = [
    """INSERT INTO agent_runs (id, tenant_id, agent_name, status, created_at, updated_at, finished_at)
       SELECT gen_random_uuid(), 'old', 'bench', 'COMPLETED',
              clock_timestamp() - interval '41 days', clock_timestamp() - interval '40 days',
              clock_timestamp() - interval '40 days' - n * interval '1 second'
       FROM generate_series(1, $1::integer) AS n""",
    """INSERT INTO agent_checkpoints (run_id, version, state_json, state_hash, schema_version, fencing_token,
                                      event_id)
       SELECT id, 1, '{"cursor": "done"}', sha256(id::text::bytea), 1, 1, gen_random_uuid() FROM agent_runs""",
    """INSERT INTO tool_executions (id, run_id, step_key, tool_name, idempotency_key, request_json, request_hash,
                                    status, fencing_token, intent_event_id, completed_at)
       SELECT gen_random_uuid(), id, 'a/attempt-1', 't.a', id::text, '{}', sha256(id::text::bytea), 'SUCCEEDED', 1,
              gen_random_uuid(), finished_at FROM agent_runs""",
    """INSERT INTO run_journal (run_id, seq, kind, detail, fencing_token, run_version)
       SELECT id, 1, 'tool', '{}', 1, 1 FROM agent_runs""",
    """INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, published_at, created_at)
       SELECT gen_random_uuid(), id, tenant_id, 'agent.x', '{}', finished_at, finished_at
       FROM agent_runs, generate_series(1, 2)""",
    "ANALYZE",
]


@dataclass
class Samples:
    submit: list[float] = field(default_factory=list)
    claim: list[float] = field(default_factory=list)


async def seed(url: str, runs: int) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        await migrate(conn)
        started = time.perf_counter()
        for index, statement in enumerate(SEED):
            await conn.execute(statement, runs) if index == 0 else await conn.execute(statement)
        log(f"seeded {runs} expired runs in {time.perf_counter() - started:.1f} s")
    finally:
        await conn.close()


async def one_round(runs: rs_grpc.RunServiceStub, work: ws_grpc.WorkServiceStub, calls: int,
                    into: Samples) -> None:
    metadata = (("x-tenant-id", TENANT),)
    for _ in range(calls):
        started = time.perf_counter()
        await runs.SubmitRun(rs.SubmitRunRequest(agent_name=AGENT, input_json="{}",
                                                 client_request_id=str(uuid.uuid4())), metadata=metadata)
        into.submit.append(time.perf_counter() - started)
    for _ in range(calls):
        started = time.perf_counter()
        reply = await work.ClaimWork(ws.ClaimWorkRequest(worker_id="bench", agents=[AGENT], wait_ms=0))
        into.claim.append(time.perf_counter() - started)
        if not reply.HasField("lease"):
            raise RuntimeError("a claim found no queued run")


async def rounds_for(seconds: float, runs: rs_grpc.RunServiceStub, work: ws_grpc.WorkServiceStub, calls: int,
                     into: Samples) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await one_round(runs, work, calls, into)


class ToggledRetention:
    """The scheduler's retention batches (RunRetention's pace), run only while `enabled` is set, so that
    idle and busy blocks can alternate; `idle()` returns once no batch is in flight."""

    def __init__(self, store: Store, batch_runs: int, pause_s: float) -> None:
        self.store, self.batch_runs, self.pause_s = store, batch_runs, pause_s
        self.enabled = asyncio.Event()
        self.counts = RetentionCounts()
        self.done = asyncio.Event()
        self.busy_s = 0.0
        self._in_batch = asyncio.Lock()

    async def run(self) -> None:
        after_finished, after_id = None, None
        while True:
            await self.enabled.wait()
            async with self._in_batch:
                started = time.perf_counter()
                batch = await self.store.runs.retention_purge(max_runs=self.batch_runs, dry_run=False,
                                                              after_finished=after_finished, after_id=after_id)
                self.busy_s += time.perf_counter() - started
            self.counts.batches += 1
            for table in TABLES:
                setattr(self.counts, table, getattr(self.counts, table) + getattr(batch, table))
            if batch.scanned < self.batch_runs:
                self.done.set()
                return
            after_finished, after_id = batch.last_finished, batch.last_id
            await asyncio.sleep(self.pause_s)

    async def idle(self) -> None:
        self.enabled.clear()
        async with self._in_batch:
            pass


async def alternate(retention: ToggledRetention, runs: rs_grpc.RunServiceStub, work: ws_grpc.WorkServiceStub,
                    args: argparse.Namespace, idle: Samples, busy: Samples) -> float:
    """Idle and busy blocks of `--block-s` in turn until retention is done; returns its wall time."""
    task = asyncio.create_task(retention.run())
    started, deadline, block = time.perf_counter(), time.monotonic() + args.limit_s, 0
    try:
        while not retention.done.is_set():
            if time.monotonic() > deadline:
                raise RuntimeError(f"retention did not finish within {args.limit_s} s")
            busy_block = block % 2 == 1
            if busy_block:
                retention.enabled.set()
            else:
                await retention.idle()
            await rounds_for(args.block_s, runs, work, args.calls, busy if busy_block else idle)
            block += 1
    finally:
        retention.enabled.set()
        await task
    return time.perf_counter() - started


def ratio_figures(name: str, busy: list[float], idle: list[float]) -> list[dict[str, object]]:
    out = []
    for q in (50, 99):
        value, base = percentile(busy, q) * 1000, percentile(idle, q) * 1000
        out.append(figure(BENCH, f"{name}_p{q}_during_retention", value, "ms", base, value / base,
                          samples=len(busy), baseline_samples=len(idle)))
    return out


async def run(args: argparse.Namespace) -> int:
    async with scratch_database("agentrt_bench_retention") as url:
        await seed(url, args.runs)
        settings = SchedulerSettings(database_url=url, listen_addr="127.0.0.1:0", auth_mode="none",
                                     require_registered_agents=False, run_retention_enabled=False,
                                     lease_duration_ms=3_600_000, log_level="WARNING")
        server = SchedulerServer(settings)
        port = await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            runs, work = rs_grpc.RunServiceStub(channel), ws_grpc.WorkServiceStub(channel)
            warm = Samples()
            await rounds_for(3.0, runs, work, args.calls, warm)
            idle, busy = Samples(), Samples()
            log(f"idle and busy blocks of {args.block_s} s in turn while retention deletes {args.runs} runs")
            retention = ToggledRetention(server.store, args.batch_runs, args.pause_ms / 1000)  # type: ignore[arg-type]
            elapsed = await alternate(retention, runs, work, args, idle, busy)
            counts = retention.counts.as_dict()
            log(f"retention: {counts} in {elapsed:.1f} s ({retention.busy_s:.1f} s in batches, "
                f"{retention.busy_s / max(counts['batches'], 1) * 1000:.1f} ms each)")
            left = await server.store.pool.fetchval(  # type: ignore[union-attr]
                "SELECT count(*) FROM agent_runs WHERE tenant_id = 'old'")
            kept = await server.store.pool.fetchval(  # type: ignore[union-attr]
                "SELECT count(*) FROM agent_runs WHERE tenant_id = $1", TENANT)
        finally:
            await channel.close()
            await server.stop(0.5)
    submitted = len(warm.submit) + len(idle.submit) + len(busy.submit)
    if counts["runs"] != args.runs or left != 0 or kept != submitted:
        log(f"retention deleted {counts['runs']} of {args.runs} expired runs; {left} left, {kept} of "
            f"{submitted} live runs kept")
        return 1
    figures = [*ratio_figures("submit", busy.submit, idle.submit), *ratio_figures("claim", busy.claim, idle.claim),
               # While enabled (the busy half of the time): the pace the scheduler's task keeps.
               figure(BENCH, "runs_deleted_per_s", counts["runs"] / (elapsed / 2), "runs/s",
                      batch_runs=args.batch_runs, pause_ms=args.pause_ms, expired_runs=args.runs)]
    emit(figures)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--block-s", type=float, default=2.0)
    parser.add_argument("--batch-runs", type=int, default=100)
    parser.add_argument("--pause-ms", type=int, default=200)
    parser.add_argument("--limit-s", type=float, default=900.0)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
