"""Auth benchmark: what API-key authentication adds to SubmitRun latency with TLS on (same-run ratio).

    python -m bench.bench_auth [--warmup 200] [--rounds 200] [--calls 20] [--control]

Everything runs in one scratch database on AGENTRT_BENCH_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/postgres), dropped at the end:

1. Setup: `python -m cli migrate` and the bootstrap `python -m cli keys create
   --database-url … --role submitter --tenant bench` (as an operator would), a throwaway CA and
   a server certificate for localhost / 127.0.0.1 (devstack/certs.py) in a temporary directory.
2. Two scheduler processes (`python -m cli scheduler`, log level WARNING, each on its own
   port) on that database, both with TLS on the same certificate: A with auth_mode none (the
   caller names its tenant in x-tenant-id), B with auth_mode api_key (the caller presents
   `authorization: Bearer <key>`; default api_key_cache_ttl_ms, so a lookup every 2 s). Both admit
   unregistered agents (require_registered_agents false).
3. One TLS channel per scheduler from this process, warmed up with `--warmup` submits each, then
   `--rounds` rounds of `--calls` sequential SubmitRun calls (fresh client_request_id each) on A and
   on B, the order swapped every round, so the machine's background load lands on both alike
   (short rounds: with 200-call rounds two identical processes differed by up to 7% on a shared
   2-core machine; `--control` runs B with auth_mode none too, to see that noise floor).

Figures: p50 and p99 of B against A (target: p50 ratio <= 1.10; beside it the median of the
per-round p50 ratios), sequential submits/s, and the scheduler CPU per submit of each.
Progress goes to stderr; stdout ends with one JSON line per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench._core_procs import ROOT, _proc_cpu, stop_process, wait_serving
from bench._pg import emit, figure, free_port, log, percentile, scratch_database
from devstack.certs import make_authority
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc
from shared.transport import ClientTls, open_channel

BENCH = "auth"
TENANT = "bench"
AGENT = "bench"
TARGET_P50_RATIO = 1.10
Metadata = tuple[tuple[str, str], ...]


def _cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("AGENTRT_CONFIG_FILE", None)
    return env


def cli(*args: str) -> str:
    """`python -m cli …` from the repository root; its stdout (it must succeed)."""
    done = subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, env=_cli_env(),
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"agentrt {args[0]} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass
class TlsScheduler:
    """`python -m cli scheduler` on a free loopback port with TLS on, in one auth mode."""

    label: str
    db_url: str
    auth_mode: str
    cert: Path
    key: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.port = free_port()
        env = {**_cli_env(), "AGENTRT_DATABASE_URL": self.db_url, "AGENTRT_LISTEN_ADDR": self.addr,
               "AGENTRT_LOG_LEVEL": "WARNING", "AGENTRT_AUTH_MODE": self.auth_mode,
               "AGENTRT_TLS_CERT_FILE": str(self.cert), "AGENTRT_TLS_KEY_FILE": str(self.key),
               "AGENTRT_WORK_TOKEN": secrets.token_hex(16),  # WorkService closed, as with auth it must be
               # the bench submits for an agent no executor registered
               "AGENTRT_REQUIRE_REGISTERED_AGENTS": "false"}
        self.proc = subprocess.Popen([sys.executable, "-m", "cli", "scheduler"], cwd=ROOT, env=env)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def wait_serving(self, tls: ClientTls, limit_s: float = 30.0) -> None:
        assert self.proc is not None
        await wait_serving(self.addr, self.proc, limit_s, tls)

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return _proc_cpu(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout_s=20)


@dataclass
class Side:
    """One scheduler as this process calls it: its channel, the metadata of its calls, what was measured."""

    label: str
    scheduler: TlsScheduler
    metadata: Metadata
    stub: rs_grpc.RunServiceStub | None = None
    samples: list[float] = field(default_factory=list)
    round_p50_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0

    async def submits(self, count: int, keep: bool) -> None:
        assert self.stub is not None
        cpu0, start = self.scheduler.cpu_seconds(), time.perf_counter()
        mark = len(self.samples)
        for _ in range(count):
            request = rs.SubmitRunRequest(agent_name=AGENT, input_json="{}", client_request_id=uuid.uuid4().hex)
            t0 = time.perf_counter()
            reply = await self.stub.SubmitRun(request, metadata=self.metadata, timeout=10)
            elapsed = time.perf_counter() - t0
            if not reply.created:
                raise RuntimeError(f"{self.label}: a fresh client_request_id did not create a run")
            if keep:
                self.samples.append(elapsed)
        if keep:
            self.round_p50_ms.append(percentile(self.samples[mark:], 50) * 1000)
            self.wall_s += time.perf_counter() - start
            self.cpu_s += self.scheduler.cpu_seconds() - cpu0

    def p_ms(self, q: float) -> float:
        return percentile(self.samples, q) * 1000

    @property
    def per_s(self) -> float:
        return len(self.samples) / self.wall_s

    @property
    def cpu_ms_per_submit(self) -> float:
        return self.cpu_s / len(self.samples) * 1000


async def refused_without_key(stub: rs_grpc.RunServiceStub) -> grpc.StatusCode:
    """What B answers a submit that names a tenant but presents no credential (must be a refusal)."""
    try:
        await stub.SubmitRun(rs.SubmitRunRequest(agent_name=AGENT, client_request_id=uuid.uuid4().hex),
                             metadata=(("x-tenant-id", TENANT),), timeout=10)
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


async def measure(args: argparse.Namespace, db_url: str, workdir: Path) -> tuple[Side, Side, dict[str, Any]]:
    log("migrate, bootstrap API key (role submitter, tenant bench), CA + server certificate ...")
    cli("migrate", "--database-url", db_url)
    secret = json.loads(cli("keys", "create", "--database-url", db_url, "--tenant", TENANT, "--role", "submitter",
                            "--name", "bench", "--json"))["secret"]
    ca = make_authority(workdir / "ca", "agentrt-bench-ca")
    server = ca.issue(workdir / "ca", "localhost", stem="server")
    tls = ClientTls(ca_file=str(ca.cert))

    none = Side("none+TLS", TlsScheduler("A", db_url, "none", server.cert, server.key), (("x-tenant-id", TENANT),))
    if args.control:  # evaluation only: the noise floor between two processes of one configuration
        keyed = Side("none+TLS(B)", TlsScheduler("B", db_url, "none", server.cert, server.key),
                     (("x-tenant-id", TENANT),))
    else:
        keyed = Side("api_key+TLS", TlsScheduler("B", db_url, "api_key", server.cert, server.key),
                     (("authorization", f"Bearer {secret}"),))
    sides = (none, keyed)
    async with contextlib.AsyncExitStack() as stack:
        for side in sides:
            side.scheduler.start()
            stack.callback(side.scheduler.stop)
            assert side.scheduler.proc is not None
            log(f"  scheduler {side.scheduler.label} ({side.label}): pid {side.scheduler.proc.pid}, "
                f"{side.scheduler.addr}")
        for side in sides:
            await side.scheduler.wait_serving(tls)
            channel = await stack.enter_async_context(open_channel(side.scheduler.addr, tls))
            side.stub = rs_grpc.RunServiceStub(channel)
        assert keyed.stub is not None
        code = await refused_without_key(keyed.stub)
        if code != grpc.StatusCode.UNAUTHENTICATED and not args.control:
            raise RuntimeError(f"scheduler B (auth_mode api_key) answered {code.name} to a submit without a key")

        log(f"warm-up: {args.warmup} submits each ...")
        for side in sides:
            await side.submits(args.warmup, keep=False)
        log(f"measuring: {args.rounds} rounds x {args.calls} sequential submits each, order swapped every round ...")
        for i in range(args.rounds):
            for side in (sides if i % 2 == 0 else sides[::-1]):
                await side.submits(args.calls, keep=True)
    detail = {"refused_without_key": code.name}
    return none, keyed, detail


async def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    async with scratch_database("agentrt_bench_auth") as db_url:
        with tempfile.TemporaryDirectory(prefix="agentrt-bench-auth-") as tmp:
            none, keyed, detail = await measure(args, db_url, Path(tmp))
    for side in (none, keyed):
        log(f"  {side.label:12s} p50 {side.p_ms(50):6.3f} ms  p99 {side.p_ms(99):6.3f} ms  "
            f"{side.per_s:6.0f} submits/s  scheduler {side.cpu_ms_per_submit:.3f} cpu ms/submit "
            f"(n={len(side.samples)})")
        rounds = sorted(side.round_p50_ms)
        log(f"    p50 of its rounds: min {rounds[0]:.3f}  median {percentile(rounds, 50):.3f}  max {rounds[-1]:.3f} ms")
    p50_ratio = keyed.p_ms(50) / none.p_ms(50)
    # Paired view: the ratio of the two sides' p50 within each round (adjacent in time), its median.
    paired = percentile([b / a for a, b in zip(none.round_p50_ms, keyed.round_p50_ms, strict=True)], 50)
    common: dict[str, Any] = {"calls": len(keyed.samples), "rounds": args.rounds, "calls_per_round": args.calls}
    if args.control:
        common["control"] = "B with auth_mode none too (noise floor)"
    figures = [
        figure(BENCH, "submit_p50_auth_tls", keyed.p_ms(50), "ms", none.p_ms(50), p50_ratio,
               baseline_name="p50 auth_mode none, TLS on, same run", target=TARGET_P50_RATIO,
               median_round_ratio=round(paired, 4), **common, **detail),
        figure(BENCH, "submit_p99_auth_tls", keyed.p_ms(99), "ms", none.p_ms(99), keyed.p_ms(99) / none.p_ms(99),
               baseline_name="p99 auth_mode none, TLS on, same run", **common),
        figure(BENCH, "submits_per_s_auth_tls", keyed.per_s, "submits/s", none.per_s, keyed.per_s / none.per_s,
               baseline_name="sequential submits/s auth_mode none, TLS on, same run", **common),
        figure(BENCH, "scheduler_cpu_ms_per_submit_auth_tls", keyed.cpu_ms_per_submit, "cpu ms",
               none.cpu_ms_per_submit, keyed.cpu_ms_per_submit / none.cpu_ms_per_submit,
               baseline_name="scheduler cpu ms per submit auth_mode none, TLS on, same run", **common),
    ]
    met = p50_ratio <= TARGET_P50_RATIO
    print(f"SubmitRun p50 with API key + TLS {keyed.p_ms(50):.3f} ms vs {none.p_ms(50):.3f} ms with auth_mode none "
          f"+ TLS = {p50_ratio:.3f}x (target <= {TARGET_P50_RATIO}: {'met' if met else 'MISSED'}); "
          f"{len(keyed.samples)} calls per side in {args.rounds} alternating rounds of {args.calls} (median of the "
          f"per-round p50 ratios {paired:.3f})")
    print(f"runtime {time.monotonic() - started:.0f}s")
    emit(figures)
    return 0 if met else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_auth", description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured submits per scheduler first")
    parser.add_argument("--rounds", type=int, default=200, help="measuring rounds (each on both schedulers)")
    parser.add_argument("--calls", type=int, default=20,
                        help="sequential submits per scheduler per round (default 20: short rounds keep both "
                             "sides adjacent in time; 200-call rounds let the machine's drift show as a "
                             "difference of up to ±7%% between two identical processes)")
    parser.add_argument("--control", action="store_true",
                        help="B with auth_mode none as well: the noise floor between two scheduler processes "
                             "(evaluation only)")
    args = parser.parse_args()
    if min(args.rounds, args.calls) < 1 or args.warmup < 0:
        parser.error("--rounds and --calls must be at least 1, --warmup not negative")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
