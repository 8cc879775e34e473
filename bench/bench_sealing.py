"""Sealing benchmark: what sealing a marked input adds to SubmitRun, and to the executor's claim.

    python -m bench.bench_sealing [--rounds 30] [--calls 20]

One in-process scheduler on a scratch database (AGENTRT_BENCH_DATABASE_URL, dropped at the end)
with a keyring; two agents registered, alike but for one mark: "plain" (no sensitive field) and
"sealed" (its input's `card` marked x-agentrt-sensitive). Each round makes `--calls` sequential
SubmitRun calls of each (the order swapped every round), then claims them all (ClaimWork: the
sealed runs' leases are opened, with one data-key read per run the process has not cached).

Figures: p50 SubmitRun latency of sealed against plain (same run), p50 ClaimWork latency of
sealed against plain, and the cost of sealing and opening one value in process.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import time
import uuid

import asyncpg
import grpc

from bench._pg import emit, figure, log, percentile, scratch_database
from scheduler.config import SchedulerSettings
from scheduler.security.sealing import RunKey, Sensitivity
from scheduler.server import SchedulerServer
from scheduler.store.migrate import migrate
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import run_service_pb2_grpc as rs_grpc
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.gen.agentrt.v1 import work_service_pb2_grpc as ws_grpc

BENCH = "sealing"
SCHEMA = {"type": "object", "properties": {"card": {"type": "string", "x-agentrt-sensitive": True},
                                           "amount": {"type": "integer"}}}


async def run(rounds: int, calls: int) -> list[dict]:
    async with scratch_database("agentrt_bench_sealing") as url:
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        keys = json.dumps({"current": "k1", "keys": {"k1": base64.b64encode(os.urandom(32)).decode()}})
        settings = SchedulerSettings(database_url=url, listen_addr="127.0.0.1:0", auth_mode="none",
                                     require_registered_agents=True, encryption_keys=keys, log_level="WARNING")
        server = SchedulerServer(settings)
        port = await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        runs, work = rs_grpc.RunServiceStub(channel), ws_grpc.WorkServiceStub(channel)
        md = (("x-tenant-id", "bench"),)
        try:
            await work.RegisterAgents(ws.RegisterAgentsRequest(worker_id="bench", ttl_ms=3_600_000, agents=[
                ws.AgentRegistration(name="plain", version="1", input_schema_json=json.dumps(SCHEMA).replace(
                    '"x-agentrt-sensitive": true', '"description": "card"')),
                ws.AgentRegistration(name="sealed", version="1", input_schema_json=json.dumps(SCHEMA),
                                     sensitive_json=json.dumps({"input": [["card"]]}))]))
            submit: dict[str, list[float]] = {"plain": [], "sealed": []}
            claim: dict[str, list[float]] = {"plain": [], "sealed": []}
            for index in range(rounds + 2):  # two warm-up rounds
                order = ("plain", "sealed") if index % 2 == 0 else ("sealed", "plain")
                for agent in order:
                    for _ in range(calls):
                        request = rs.SubmitRunRequest(agent_name=agent, input_json=json.dumps(
                            {"card": f"4111-{uuid.uuid4()}", "amount": 5}))
                        started = time.perf_counter()
                        await runs.SubmitRun(request, metadata=md)
                        if index >= 2:
                            submit[agent].append(time.perf_counter() - started)
                for agent in order:
                    for _ in range(calls):
                        started = time.perf_counter()
                        reply = await work.ClaimWork(ws.ClaimWorkRequest(worker_id="bench", agents=[agent]))
                        assert reply.HasField("lease")
                        if index >= 2:
                            claim[agent].append(time.perf_counter() - started)
        finally:
            await channel.close()
            await server.stop(0.5)
    key = RunKey(uuid.uuid4(), os.urandom(32), Sensitivity())
    value = {"card": "4111-1111-1111-1111", "amount": 5}
    n = 20_000
    started = time.perf_counter()
    for _ in range(n):
        sealed = key.seal_paths(value, [("card",)])
    seal_us = (time.perf_counter() - started) / n * 1e6
    started = time.perf_counter()
    for _ in range(n):
        key.unseal(sealed)
    open_us = (time.perf_counter() - started) / n * 1e6
    p = {name: {agent: percentile(samples, 50) * 1000 for agent, samples in data.items()}
         for name, data in (("submit", submit), ("claim", claim))}
    log(f"submit p50 plain {p['submit']['plain']:.2f} ms, sealed {p['submit']['sealed']:.2f} ms; "
        f"claim p50 plain {p['claim']['plain']:.2f} ms, sealed {p['claim']['sealed']:.2f} ms; "
        f"seal {seal_us:.1f} us, open {open_us:.1f} us")
    return [
        figure(BENCH, "submit_p50_sealed", p["submit"]["sealed"], "ms", p["submit"]["plain"],
               p["submit"]["sealed"] / p["submit"]["plain"]),
        figure(BENCH, "claim_p50_sealed", p["claim"]["sealed"], "ms", p["claim"]["plain"],
               p["claim"]["sealed"] / p["claim"]["plain"]),
        figure(BENCH, "seal_one_value", seal_us, "us"),
        figure(BENCH, "open_one_value", open_us, "us"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_sealing")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    emit(asyncio.run(run(args.rounds, args.calls)))


if __name__ == "__main__":
    main()
