"""The console's cost (issue 25): with 100,000 runs in the database, the runs page and the page of a run
with 1,000 steps, each timed beside the bare RunService call it is built on, in the same run.

    python -m bench.bench_console [--runs 100000] [--steps 1000] [--requests 60]

A scratch database gets `--runs` runs of one tenant (bulk SQL, setup only) and one run whose journal
holds `--steps` entries. The scheduler (auth_mode none) and the console run as their own processes,
as deployed (`agentrt scheduler`, `agentrt console`). Each figure is the latency a client on loopback
sees, p50 and p95 over `--requests` requests after a warm-up: GET /runs beside ListRuns (page of 50),
GET /runs/{id} beside GetRunHistory (its pages of 500, as the page reads them) plus GetRun and
GetRunTree. The console's resident memory (VmRSS of its process) is read after the load.

Targets (issue 25): each page p95 <= 300 ms; the console adds <= 50 MB RSS: its process's RSS after the
load above that of a process holding only what any RunService client holds (grpcio, the stubs).
Progress goes to stderr; stdout ends with one JSON line per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import grpc

from bench._pg import emit, figure, free_port, log, scratch_database
from bench.bench_core import migrated
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc

BENCH = "console"
TENANT = "tenant-a"
REPO = Path(__file__).resolve().parent.parent


async def seed(url: str, runs: int, steps: int) -> str:
    """`runs` completed runs of one tenant and one run with `steps` journal entries; its id."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """
            INSERT INTO agent_runs (id, tenant_id, agent_name, agent_version, input, labels, max_attempts,
                                    budget_max_steps, budget_max_tokens, budget_max_cost_usd,
                                    client_request_id, next_attempt_at)
            SELECT gen_random_uuid(), $2, 'bench', '1', jsonb_build_object('n', g),
                   jsonb_build_object('team', 'ops-' || (g % 10)), 3, 0, 0, 0,
                   NULL, clock_timestamp()
            FROM generate_series(1, $1::int) AS g
            """, runs - 1, TENANT)
        long_id = str(await conn.fetchval(
            """
            INSERT INTO agent_runs (id, tenant_id, agent_name, agent_version, input, labels, max_attempts,
                                    budget_max_steps, budget_max_tokens, budget_max_cost_usd,
                                    client_request_id, next_attempt_at, journal_length)
            VALUES (gen_random_uuid(), $1, 'bench', '1', '{"long": true}', '{}', 3, 0, 0, 0, NULL,
                    clock_timestamp(), $2)
            RETURNING id
            """, TENANT, steps))
        columns = {r["column_name"] for r in await conn.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'run_journal'")}
        tenant = ", tenant_id" if "tenant_id" in columns else ""
        await conn.execute(
            f"""
            INSERT INTO run_journal (run_id, seq, kind, step_key, node, tool, detail, fencing_token,
                                     run_version{tenant})
            SELECT $1::uuid, g, 'tool', 'step-' || g || '/attempt-1', 'node-' || (g % 7), 'pay.charge',
                   jsonb_build_object('request', jsonb_build_object('n', g, 'note', repeat('x', 64))), 1, g
                   {", $3" if tenant else ""}
            FROM generate_series(1, $2::int) AS g
            """, long_id, steps, *([TENANT] if tenant else []))
        await conn.execute("VACUUM ANALYZE agent_runs")
        await conn.execute("VACUUM ANALYZE run_journal")
        return long_id
    finally:
        await conn.close()


def start(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "cli", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, cwd=REPO)


async def wait_http(url: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(url) as reply:
                    if reply.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer within {within}s")
            await asyncio.sleep(0.1)


async def timed(call: Callable[[], Awaitable[Any]], count: int) -> list[float]:
    for _ in range(3):  # warm-up
        await call()
    took = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        took.append((time.perf_counter() - started) * 1000)
    return took


def p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def rss_mb(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(found.group(1)) / 1024 if found else float("nan")


def client_rss_mb() -> float:
    """The RSS of a process holding what any RunService client holds (Python, grpcio, the generated
    stubs, shared.client): the console's own cost is its RSS above this."""
    probe = ("import re, grpc, shared.client.runs, shared.gen.agentrt.v1.run_service_pb2_grpc; "
             "print(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    return int(out.stdout) / 1024


async def measure(base: str, grpc_addr: str, long_id: str, requests: int) -> dict[str, list[float]]:
    """Each page and its bare RunService calls, timed `requests` times (the console signed in first)."""
    channel = grpc.aio.insecure_channel(grpc_addr)
    await asyncio.wait_for(channel.channel_ready(), 60)
    stub = rs_grpc.RunServiceStub(channel)
    md = [("x-tenant-id", TENANT)]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/signin") as reply:
            token = re.search(r'name="csrf" value="([^"]+)"', await reply.text())
        assert token, "no CSRF token on the sign-in page"
        # auth_mode none: any credential, the tenant names the tenant. The cookie is Secure: sent
        # by hand (aiohttp keeps Secure cookies for https only).
        cookie = reply.cookies["agentrt_console"].value
        async with http.post(f"{base}/signin", data={"csrf": token.group(1), "credential": "bench",
                                                     "tenant": TENANT},
                             headers={"cookie": f"agentrt_console={cookie}"},
                             allow_redirects=False) as reply:
            assert reply.status == 303, await reply.text()
            session = reply.cookies["agentrt_console"].value
        headers = {"cookie": f"agentrt_console={session}"}

        async def page(path: str) -> None:
            async with http.get(f"{base}{path}", headers=headers, allow_redirects=False) as reply:
                body = await reply.read()
                assert reply.status == 200, (path, reply.status, body[:300])

        async def list_runs() -> None:
            await stub.ListRuns(rs.ListRunsRequest(page_size=50), metadata=md)

        async def run_history() -> None:
            page_token = ""
            await stub.GetRun(rs.GetRunRequest(run_id=long_id), metadata=md)
            await stub.GetRunTree(rs.GetRunTreeRequest(run_id=long_id, max_runs=200), metadata=md)
            while True:
                reply = await stub.GetRunHistory(rs.GetRunHistoryRequest(
                    run_id=long_id, page_size=500, page_token=page_token), metadata=md)
                page_token = reply.next_page_token
                if not page_token:
                    return

        log(f"timing {requests} requests each ...")
        results = {
            "runs_page": await timed(lambda: page("/runs"), requests),
            "list_runs": await timed(list_runs, requests),
            "run_page": await timed(lambda: page(f"/runs/{long_id}"), requests),
            "run_history": await timed(run_history, requests),
        }
    await channel.close()
    return results


async def main(args: argparse.Namespace) -> int:
    procs: list[subprocess.Popen[bytes]] = []
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentrt-bench-console-{os.getpid()}"
    logs.mkdir(exist_ok=True)
    async with scratch_database("agentrt_bench_console") as url:
        await migrated(url)
        log(f"seeding {args.runs} runs and one of {args.steps} steps ...")
        long_id = await seed(url, args.runs, args.steps)
        grpc_addr, http_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        env = {**os.environ, "AGENTRT_DATABASE_URL": url, "AGENTRT_LISTEN_ADDR": grpc_addr,
               "AGENTRT_AUTH_MODE": "none", "AGENTRT_REQUIRE_REGISTERED_AGENTS": "false"}
        try:
            procs.append(start(["scheduler"], env, logs / "scheduler.log"))
            procs.append(start(["console", "--scheduler", grpc_addr, "--listen", http_addr], env,
                               logs / "console.log"))
            console_pid = procs[1].pid
            base = f"http://{http_addr}"
            await wait_http(f"{base}/healthz")
            results = await measure(base, grpc_addr, long_id, args.requests)
            console_rss = rss_mb(console_pid)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    client = client_rss_mb()
    for name, values in results.items():
        log(f"  {name}: p50 {p(values, 50):.1f} ms, p95 {p(values, 95):.1f} ms")
    figures = [
        figure(BENCH, "runs_page_p95_ms", p(results["runs_page"], 95), "ms",
               baseline=p(results["list_runs"], 95)),
        figure(BENCH, "run_page_1000_steps_p95_ms", p(results["run_page"], 95), "ms",
               baseline=p(results["run_history"], 95)),
        figure(BENCH, "runs_page_p50_ms", p(results["runs_page"], 50), "ms", baseline=p(results["list_runs"], 50)),
        figure(BENCH, "run_page_1000_steps_p50_ms", p(results["run_page"], 50), "ms",
               baseline=p(results["run_history"], 50)),
        figure(BENCH, "console_rss_mb", console_rss, "MB", baseline=client),
        figure(BENCH, "console_rss_above_a_client_mb", console_rss - client, "MB"),
    ]
    emit(figures)
    ok = all(f["value"] <= 300 for f in figures if f["figure"].endswith("p95_ms"))
    if not ok:
        log("a page's p95 is above the 300 ms target")
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_console")
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=1_000)
    parser.add_argument("--requests", type=int, default=60)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
