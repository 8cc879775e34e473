"""Long-run benchmark (issue 12): does one run stay as cheap at step 10,000 as at step 10?

    python -m bench.bench_longrun [--steps 10000] [--answer-bytes 1024] [--big-steps 200]
                                  [--big-answer-bytes 262144] [--max-minutes 20]

One scratch database on AGENTRT_BENCH_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/postgres), dropped at the end; one scheduler process
(`python -m cli scheduler`, default settings but the lease duration, which is passed
explicitly so the takeover's claim time can be read back) and executor processes
(`python -m cli executor`, one slot, log level WARNING, stderr kept for the stop reason).

The agent is a scripted plan: one node repeating a python tool `--steps` times, then finish.
The tool answers `answer_bytes` of base64 text of SHAKE-256 output keyed by the step's
idempotency key: incompressible, and the same text for the same step, so the tool's lookup
(contract.lookup) can truthfully answer "found" with it when a new holder takes over a step.

1. Long run: one run of `--steps` steps, `--answer-bytes` answers, one executor. The database is
   polled (every 100 ms) for the run's SUCCEEDED ledger rows and pg_current_wal_lsn(); afterwards
   the ledger's completed_at (database clock) gives the time per step. The phase ends when the run
   ends or pauses, stops progressing for 1.5 leases + 10 s (e.g. a write refused over the payload
   limit, then refused again after each takeover), the executor exits, or after --max-minutes.
2. Big answers: a run of `--big-steps` steps answering `--big-answer-bytes`, on its own executor.
3. Takeover: SIGKILL the executor while it holds the long run (only when phase 1 stopped on its
   time bound with the run still progressing), start a new executor, and measure from the new
   fence's claim (lease_expires_at - lease duration: no write but a heartbeat moves it, and the
   first heartbeat comes a third of a lease later) to the first checkpoint or ledger row written
   with the new fence (their created_at / outbound_intent_at: database clock). Otherwise the same is
   done on a fresh run killed once it has reached `--takeover-steps` steps (default: as many as the long
   run, so the takeover rebuilds a 10,000-step run's view); the log says which.

Figures (value; baseline; ratio = value / baseline):
  step_time_late_vs_early           mean ms per step over the last 100 steps reached;
                                    baseline = mean over steps 10-110; target ratio <= 1.2
  wal_bytes_per_step_late_vs_early  WAL bytes per step over the last W steps reached; baseline =
                                    over steps 0..W, W = min(1000, reached // 2) so the two windows
                                    never overlap; target ratio <= 1.2. WAL is the whole server's:
                                    other databases' writes in the window count too.
  max_checkpoint_bytes              largest checkpoint of the long run (octet_length of its
                                    state_json text); baseline = target 16384
  executor_rss_mb                   peak VmRSS of the executor while it held the long run;
                                    baseline = target 150
  steps_reached                     SUCCEEDED steps of the long run; baseline = --steps;
                                    with its final status and reason
  big_answers_completed             SUCCEEDED steps of the big-answer run; baseline = --big-steps
  takeover_claim_to_first_write_ms  baseline = target 200
A figure that could not be measured has value null (and says why). Progress goes to stderr;
stdout ends with one JSON line per figure. Exit status 0 when every target is met, else 1.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import asyncpg
import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench._pg import emit, figure, free_port, log, scratch_database
from executor.tools.base import LookupOutcome, ToolCallContext
from scheduler.store.migrate import migrate

BENCH = "longrun"
ROOT = Path(__file__).resolve().parent.parent
TARGET_LATE_VS_EARLY = 1.2
TARGET_CHECKPOINT_BYTES = 16_384
TARGET_RSS_MB = 150
TARGET_TAKEOVER_MS = 200
POLL_S = 0.1
# A run in one of these is not going anywhere without an operator (or is done).
STOPPED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "PAUSED_INDOUBT", "PAUSED_HUMAN"})
HELD = frozenset({"RUNNING", "WAITING_TOOL"})


# ---------------------------------------------------------------------- the tool (runs in the executor)

def answer_text(idempotency_key: str, size: int) -> str:
    """`size` characters of base64 over SHAKE-256 output: incompressible, the same for the same key."""
    raw = hashlib.shake_256(idempotency_key.encode()).digest(size * 3 // 4 + 3)
    return base64.b64encode(raw).decode()[:size]


def _answer(size: int) -> Any:
    def answer(request: dict[str, Any], ctx: ToolCallContext) -> dict[str, Any]:
        return {"text": answer_text(ctx.idempotency_key, size)}
    return answer


def _lookup(size: int) -> Any:
    def lookup(idempotency_key: str, ctx: ToolCallContext) -> LookupOutcome:
        # The answer is a function of the key alone: recomputing it is the same as having sent it.
        return LookupOutcome("found", response={"text": answer_text(idempotency_key, size)})
    return lookup


def __getattr__(name: str) -> Any:
    """`answer_<bytes>` and `lookup_<bytes>`: the callables an agent file names (the size is in the name)."""
    kind, _, size = name.partition("_")
    if kind in ("answer", "lookup") and size.isdigit():
        return (_answer if kind == "answer" else _lookup)(int(size))
    raise AttributeError(name)


def agent_file(directory: Path, name: str, steps: int, answer_bytes: int) -> None:
    definition = {
        "name": name, "version": "1",
        "decider": {"kind": "scripted", "plan": [{"id": "step", "tool": "answer", "repeat": steps},
                                                 {"id": "done", "finish": {"steps": steps}}]},
        "tools": [{"name": "answer", "kind": "python", "callable": f"bench.bench_longrun:answer_{answer_bytes}",
                   "lookup_callable": f"bench.bench_longrun:lookup_{answer_bytes}",
                   "contract": {"idempotent": True, "lookup": True}}],
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(definition, sort_keys=False))


# ---------------------------------------------------------------------- processes

def stop_process(proc: subprocess.Popen[bytes], *, kill_after_s: float = 30.0) -> None:
    """SIGTERM, then SIGKILL after kill_after_s; only this process, by its pid."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=kill_after_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


class Processes:
    """Every process the bench starts, so that all of them are ended whatever happens."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[tuple[subprocess.Popen[bytes], TextIO]] = []

    def start(self, args: list[str], env: dict[str, str], log_name: str) -> tuple[subprocess.Popen[bytes], Path]:
        path = self.workdir / f"{log_name}.log"
        out = path.open("w")
        env = {**os.environ, **env}
        env.pop("AGENTRT_CONFIG_FILE", None)
        proc = subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
        self.started.append((proc, out))
        return proc, path

    def stop_all(self) -> None:
        for proc, out in self.started:
            stop_process(proc, kill_after_s=15)
            out.close()


class Scheduler:
    def __init__(self, procs: Processes, db_url: str, lease_ms: int) -> None:
        self.addr = f"127.0.0.1:{free_port()}"
        self.proc, self.log_path = procs.start(
            ["scheduler"], {"AGENTRT_DATABASE_URL": db_url, "AGENTRT_LISTEN_ADDR": self.addr,
                            "AGENTRT_LOG_LEVEL": "WARNING", "AGENTRT_LEASE_DURATION_MS": str(lease_ms),
                            # runs submitted before executors (auth is not under test here)
                            "AGENTRT_REQUIRE_REGISTERED_AGENTS": "false", "AGENTRT_AUTH_MODE": "none"},
            "scheduler")

    async def wait_serving(self, limit_s: float = 30.0) -> None:
        deadline = time.monotonic() + limit_s
        async with grpc.aio.insecure_channel(self.addr) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"scheduler exited with {self.proc.returncode} before serving; "
                                       f"log: {tail(self.log_path)}")
                with contextlib.suppress(grpc.aio.AioRpcError):
                    reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                await asyncio.sleep(0.1)
        raise TimeoutError(f"scheduler on {self.addr} not SERVING after {limit_s}s")


class Executor:
    def __init__(self, procs: Processes, scheduler: Scheduler, agents: Path, worker_id: str) -> None:
        self.worker_id = worker_id
        self.proc, self.log_path = procs.start(
            ["executor"], {"AGENTRT_SCHEDULER_ADDR": scheduler.addr, "AGENTRT_AGENTS_PATH": str(agents),
                           "AGENTRT_SLOTS": "1", "AGENTRT_CLAIMERS": "1", "AGENTRT_HEALTH_ADDR": "",
                           "AGENTRT_LOG_LEVEL": "WARNING", "AGENTRT_WORKER_ID": worker_id,
                           "AGENTRT_CLAIM_WAIT_MS": "1000"}, worker_id)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_mb(self) -> float:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def sigkill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        stop_process(self.proc, kill_after_s=15)


def tail(path: Path, lines: int = 5) -> str:
    with contextlib.suppress(OSError):
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])[-1500:]
    return ""


def last_problem(path: Path, run_id: str) -> str:
    """The executor's last WARNING/ERROR line about this run: why it stopped writing."""
    with contextlib.suppress(OSError):
        for line in reversed(path.read_text(errors="replace").splitlines()):
            if run_id in line and (" WARNING " in line or " ERROR " in line):
                return line.split(": ", 1)[-1][:400]
    return ""


# ---------------------------------------------------------------------- database side

async def submit(conn: asyncpg.Connection, agent: str) -> str:
    """One queued run with the columns submit_run writes (setup only)."""
    run_id = str(uuid.uuid4())
    await conn.execute(
        "INSERT INTO agent_runs (id, tenant_id, agent_name, agent_version, input, labels, max_attempts, "
        "next_attempt_at) VALUES ($1, 'bench', $2, '', '{}'::jsonb, '{}'::jsonb, 12, clock_timestamp())",
        uuid.UUID(run_id), agent)
    return run_id


@dataclass
class Sample:
    at: float  # monotonic
    steps: int
    wal: int  # bytes since 0/0
    status: str
    fence: int
    owner: str | None
    lease_expires_at: float | None  # epoch, database clock
    reason: str


async def sample(conn: asyncpg.Connection, run_id: str) -> Sample:
    row = await conn.fetchrow(
        """
        SELECT (SELECT count(*) FROM tool_executions WHERE run_id = r.id AND status = 'SUCCEEDED') AS steps,
               pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal, r.status, r.fencing_token,
               r.lease_owner, extract(epoch FROM r.lease_expires_at)::float8 AS lease_expires_at,
               coalesce(r.pause_reason, r.terminal_reason, '') AS reason
        FROM agent_runs AS r WHERE r.id = $1
        """, uuid.UUID(run_id))
    return Sample(time.monotonic(), int(row["steps"]), int(row["wal"]), row["status"], int(row["fencing_token"]),
                  row["lease_owner"], row["lease_expires_at"], row["reason"])


@dataclass
class Watched:
    samples: list[Sample]
    stop: str  # why watching ended
    rss_peak_mb: float
    seconds: float
    reason: str = ""  # the run's pause/terminal reason, or the executor's last complaint
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def last(self) -> Sample:
        return self.samples[-1]


async def watch(conn: asyncpg.Connection, run_id: str, executor: Executor, *, limit_s: float, stall_s: float,
                until_steps: int | None = None, first: Sample | None = None) -> Watched:
    """Polls the run until it stops, stalls, reaches until_steps, its executor exits, or limit_s passes."""
    started = time.monotonic()
    samples = [first] if first is not None else []
    rss_peak, progress_at, stop = 0.0, started, "time bound"
    for _ in range(int(limit_s / POLL_S) + 1):  # the deadline below ends it first; this bounds the count
        now = await sample(conn, run_id)
        if now.owner == executor.worker_id:
            rss_peak = max(rss_peak, executor.rss_mb())
        if not samples or now.steps > samples[-1].steps:
            progress_at = now.at
        samples.append(now)
        if now.status in STOPPED:
            stop = f"run {now.status}"
            break
        if until_steps is not None and now.steps >= until_steps:
            stop = f"reached {now.steps} steps"
            break
        if not executor.alive():
            stop = f"executor exited with {executor.proc.returncode}"
            break
        if now.at - progress_at > stall_s:
            stop = f"no progress for {stall_s:.0f} s"
            break
        if now.at - started > limit_s:
            break
        await asyncio.sleep(POLL_S)
    last = samples[-1]
    reason = last.reason if last.status in STOPPED else last_problem(executor.log_path, run_id)
    return Watched(samples, stop, rss_peak, time.monotonic() - started, reason)


async def step_times(conn: asyncpg.Connection, run_id: str) -> list[float]:
    rows = await conn.fetch("SELECT extract(epoch FROM completed_at)::float8 AS t FROM tool_executions "
                            "WHERE run_id = $1 AND status = 'SUCCEEDED' ORDER BY completed_at", uuid.UUID(run_id))
    return [r["t"] for r in rows]


def mean_step_ms(times: list[float], first: int, last: int) -> float | None:
    """Mean ms per step over steps first..last (1-based: step k completed at times[k-1])."""
    if first < 1 or last > len(times) or last <= first:
        return None
    return (times[last - 1] - times[first - 1]) / (last - first) * 1000


def wal_per_step(samples: list[Sample], low: int, high: int) -> float | None:
    """WAL bytes per step between the first samples at >= low and >= high steps."""
    a = next((s for s in samples if s.steps >= low), None)
    b = next((s for s in samples if s.steps >= high), None)
    if a is None or b is None or b.steps <= a.steps:
        return None
    return (b.wal - a.wal) / (b.steps - a.steps)


async def checkpoint_sizes(conn: asyncpg.Connection, run_id: str) -> dict[str, int]:
    row = await conn.fetchrow(
        "SELECT count(*) AS rows, coalesce(max(octet_length(state_json::text)), 0) AS max_bytes, "
        "coalesce(sum(octet_length(state_json::text)), 0)::bigint AS total_bytes, "
        "coalesce(sum(pg_column_size(state_json)), 0)::bigint AS stored_bytes "
        "FROM agent_checkpoints WHERE run_id = $1", uuid.UUID(run_id))
    return {k: int(row[k]) for k in ("rows", "max_bytes", "total_bytes", "stored_bytes")}


def measured(name: str, value: float | None, unit: str, baseline: float | None, why_missing: str = "",
             **extra: Any) -> dict[str, Any]:
    """A figure; value and ratio null (with the reason) when it could not be measured."""
    if value is None:
        item = figure(BENCH, name, 0.0, unit, baseline, None, **extra)
        item["value"] = None
        item["missing"] = why_missing
        return item
    ratio = value / baseline if baseline else None
    return figure(BENCH, name, value, unit, baseline, ratio, **extra)


# ---------------------------------------------------------------------- phases

@dataclass
class Context:
    args: argparse.Namespace
    conn: asyncpg.Connection
    procs: Processes
    scheduler: Scheduler
    workdir: Path

    @property
    def limit_s(self) -> float:
        return float(self.args.max_minutes) * 60

    @property
    def stall_s(self) -> float:
        return self.args.lease_ms / 1000 * 1.5 + 10


async def long_run(ctx: Context) -> tuple[list[dict[str, Any]], str, Executor, Watched]:
    args = ctx.args
    agents = ctx.workdir / "longrun"
    agent_file(agents, "bench-longrun", args.steps, args.answer_bytes)
    run_id = await submit(ctx.conn, "bench-longrun")
    before = await sample(ctx.conn, run_id)
    executor = Executor(ctx.procs, ctx.scheduler, agents, "bench-longrun-1")
    log(f"long run {run_id}: {args.steps} steps x {args.answer_bytes}-byte answers, bound {args.max_minutes} min ...")
    seen = await watch(ctx.conn, run_id, executor, limit_s=ctx.limit_s, stall_s=ctx.stall_s, first=before)
    times = await step_times(ctx.conn, run_id)
    reached = len(times)
    sizes = await checkpoint_sizes(ctx.conn, run_id)
    early, late = mean_step_ms(times, 10, 110), mean_step_ms(times, reached - 100, reached)
    window = min(1000, reached // 2)
    wal_early = wal_per_step(seen.samples, 0, window) if window else None
    wal_late = wal_per_step(seen.samples, reached - window, reached) if window else None
    status = seen.last.status
    log(f"  reached {reached}/{args.steps} steps in {seen.seconds:.0f} s; stopped watching: {seen.stop}; "
        f"status {status}; reason: {seen.reason or '-'}")
    log(f"  ms/step: steps 10-110 {fmt(early)}, last 100 {fmt(late)}; WAL bytes/step: first {window} "
        f"{fmt(wal_early)}, last {window} {fmt(wal_late)}")
    log(f"  checkpoints: {sizes['rows']} rows, largest {sizes['max_bytes']} B, all {sizes['total_bytes']} B as "
        f"text, {sizes['stored_bytes']} B stored; executor peak VmRSS {seen.rss_peak_mb:.1f} MB")
    no_early = f"the run reached {reached} steps; needs 111"
    figures = [
        measured("step_time_late_vs_early", late, "ms/step", early, no_early if early is None else "",
                 baseline_name="mean ms/step over steps 10-110", target_ratio=TARGET_LATE_VS_EARLY,
                 late_steps=[max(1, reached - 100), reached]),
        measured("wal_bytes_per_step_late_vs_early", wal_late, "bytes/step", wal_early,
                 "" if wal_early and wal_late else f"the run reached {reached} steps",
                 baseline_name=f"WAL bytes/step over steps 0-{window}", target_ratio=TARGET_LATE_VS_EARLY,
                 window_steps=window),
        measured("max_checkpoint_bytes", float(sizes["max_bytes"]) if sizes["rows"] else None, "bytes",
                 TARGET_CHECKPOINT_BYTES, "no checkpoint written", baseline_name="target",
                 checkpoint_rows=sizes["rows"], total_checkpoint_bytes=sizes["total_bytes"],
                 stored_checkpoint_bytes=sizes["stored_bytes"]),
        measured("executor_rss_mb", seen.rss_peak_mb or None, "MB", TARGET_RSS_MB,
                 "the executor never held the run", baseline_name="target"),
        measured("steps_reached", float(reached), "steps", args.steps, baseline_name="steps asked",
                 status=status, reason=seen.reason[:400], stopped_watching=seen.stop,
                 seconds=round(seen.seconds, 1), fencing_token=seen.last.fence),
    ]
    return figures, run_id, executor, seen


async def big_answers(ctx: Context) -> dict[str, Any]:
    args = ctx.args
    agents = ctx.workdir / "big"
    agent_file(agents, "bench-longrun-big", args.big_steps, args.big_answer_bytes)
    run_id = await submit(ctx.conn, "bench-longrun-big")
    executor = Executor(ctx.procs, ctx.scheduler, agents, "bench-longrun-big")
    log(f"big answers {run_id}: {args.big_steps} steps x {args.big_answer_bytes}-byte answers ...")
    try:
        seen = await watch(ctx.conn, run_id, executor, limit_s=ctx.limit_s, stall_s=ctx.stall_s)
    finally:
        executor.stop()
    done = seen.last.steps
    log(f"  {done}/{args.big_steps} steps in {seen.seconds:.0f} s; stopped watching: {seen.stop}; "
        f"status {seen.last.status}; reason: {seen.reason or '-'}")
    return measured("big_answers_completed", float(done), "steps", args.big_steps, baseline_name="steps asked",
                    answer_bytes=args.big_answer_bytes, status=seen.last.status, reason=seen.reason[:400],
                    stopped_watching=seen.stop, seconds=round(seen.seconds, 1))


async def takeover(ctx: Context, run_id: str, holder: Executor, agents: Path, which: str) -> dict[str, Any]:
    """SIGKILL the holder, start another executor, time its claim to its first fenced write."""
    before = await sample(ctx.conn, run_id)
    holder.sigkill()
    log(f"  SIGKILLed {holder.worker_id} holding {which} at {before.steps} steps (fence {before.fence}, "
        f"{before.status}); starting a new executor ...")
    successor = Executor(ctx.procs, ctx.scheduler, agents, f"{holder.worker_id}-successor")
    lease_s = ctx.args.lease_ms / 1000
    claim_at: float | None = None
    fence = before.fence
    try:
        deadline = time.monotonic() + lease_s + 60
        for _ in range(int((lease_s + 60) / 0.02) + 1):
            now = await sample(ctx.conn, run_id)
            if now.fence > before.fence and now.lease_expires_at is not None and claim_at is None:
                # The claim set lease_expires_at = clock_timestamp() + lease; only a heartbeat (a third
                # of a lease later) moves it again, and this poll comes well before that.
                fence, claim_at = now.fence, now.lease_expires_at - lease_s
            if claim_at is not None:
                first = await ctx.conn.fetchval(
                    "SELECT extract(epoch FROM least("
                    "(SELECT min(created_at) FROM agent_checkpoints WHERE run_id = $1 AND fencing_token = $2),"
                    "(SELECT min(outbound_intent_at) FROM tool_executions WHERE run_id = $1 AND fencing_token = $2)"
                    "))::float8", uuid.UUID(run_id), fence)
                if first is not None:
                    ms = (first - claim_at) * 1000
                    log(f"  fence {fence} claimed; first checkpoint/ledger write {ms:.1f} ms later")
                    return measured("takeover_claim_to_first_write_ms", ms, "ms", TARGET_TAKEOVER_MS,
                                    baseline_name="target", on=which, steps_at_kill=before.steps, fence=fence)
            if now.status in STOPPED or not successor.alive() or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        why = ("no claim by the new executor" if claim_at is None else
               f"fence {fence} wrote no checkpoint or ledger row ({now.status}; "
               f"{now.reason or last_problem(successor.log_path, run_id) or 'no reason logged'})")
        log(f"  takeover not measured: {why}")
        return measured("takeover_claim_to_first_write_ms", None, "ms", TARGET_TAKEOVER_MS, why,
                        baseline_name="target", on=which, steps_at_kill=before.steps)
    finally:
        successor.stop()


async def takeover_phase(ctx: Context, run_id: str, holder: Executor, seen: Watched) -> dict[str, Any]:
    last = seen.last
    if seen.stop == "time bound" and last.status in HELD and last.owner == holder.worker_id and holder.alive():
        log("takeover of the long run (still progressing when its time bound passed) ...")
        return await takeover(ctx, run_id, holder, ctx.workdir / "longrun", "the long run")
    log(f"takeover: the long run cannot be taken over usefully ({seen.stop}, {last.status}); "
        f"measuring on a fresh run of {ctx.args.takeover_steps} steps instead ...")
    holder.stop()
    agents = ctx.workdir / "takeover"
    steps = ctx.args.takeover_steps
    # A few more steps than the kill point, so the run is still being worked on when it is killed.
    agent_file(agents, "bench-longrun-takeover", steps + 100, ctx.args.answer_bytes)
    fresh = await submit(ctx.conn, "bench-longrun-takeover")
    first = Executor(ctx.procs, ctx.scheduler, agents, "bench-takeover")
    reached = await watch(ctx.conn, fresh, first, limit_s=ctx.limit_s, stall_s=ctx.stall_s, until_steps=steps)
    if not reached.stop.startswith("reached") or reached.last.owner != first.worker_id:
        why = f"the fresh run did not get to {steps} steps under its first holder ({reached.stop})"
        first.stop()
        log(f"  takeover not measured: {why}")
        return measured("takeover_claim_to_first_write_ms", None, "ms", TARGET_TAKEOVER_MS, why,
                        baseline_name="target", on=f"a fresh run killed at {steps}+ steps")
    return await takeover(ctx, fresh, first, agents, f"a fresh run killed at {steps}+ steps")


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


async def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    figures: list[dict[str, Any]] = []
    async with scratch_database("agentrt_bench_longrun") as db_url:
        conn = await asyncpg.connect(db_url)
        try:
            await migrate(conn)
            with tempfile.TemporaryDirectory(prefix="agentrt-bench-longrun-") as tmp:
                procs = Processes(Path(tmp))
                try:
                    scheduler = Scheduler(procs, db_url, args.lease_ms)
                    await scheduler.wait_serving()
                    ctx = Context(args, conn, procs, scheduler, Path(tmp))
                    long_figures, run_id, holder, seen = await long_run(ctx)
                    # Takeover before the big-answer phase: a long run still going would otherwise run on.
                    taken = await takeover_phase(ctx, run_id, holder, seen)
                    big = await big_answers(ctx)
                    figures = [*long_figures, big, taken]
                finally:
                    procs.stop_all()
        finally:
            await conn.close()
    log(f"long-run bench took {time.monotonic() - started:.0f} s")
    emit(figures)
    met = {
        "step_time_late_vs_early": lambda f: f["ratio"] is not None and f["ratio"] <= TARGET_LATE_VS_EARLY,
        "wal_bytes_per_step_late_vs_early": lambda f: f["ratio"] is not None and f["ratio"] <= TARGET_LATE_VS_EARLY,
        "steps_reached": lambda f: f["value"] == f["baseline"],
        "big_answers_completed": lambda f: f["value"] == f["baseline"],
    }
    ok = all(met.get(f["figure"], lambda f: f["ratio"] is not None and f["ratio"] <= 1)(f) for f in figures)
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_longrun",
                                     description="Issue 12's long-run benchmark (see the module docstring).")
    parser.add_argument("--steps", type=int, default=10_000, help="steps of the long run")
    parser.add_argument("--answer-bytes", type=int, default=1024, help="size of each tool answer in the long run")
    parser.add_argument("--big-steps", type=int, default=200, help="steps of the big-answer run")
    parser.add_argument("--big-answer-bytes", type=int, default=262_144, help="size of each big answer")
    parser.add_argument("--max-minutes", type=float, default=20.0,
                        help="wall-clock bound of each phase; the phase then reports what it reached")
    parser.add_argument("--takeover-steps", type=int, default=None,
                        help="steps the fresh run the takeover is measured on has reached when its executor is "
                             "killed (default: --steps)")
    parser.add_argument("--lease-ms", type=int, default=30_000,
                        help="the scheduler's lease duration (its default); a takeover waits for it to lapse")
    args = parser.parse_args()
    if args.takeover_steps is None:
        args.takeover_steps = args.steps
    for name in ("steps", "answer_bytes", "big_steps", "big_answer_bytes", "takeover_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.max_minutes <= 24 * 60:
        parser.error("--max-minutes must be in (0, 1440]")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
