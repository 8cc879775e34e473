"""Concurrency limits under chaos: executor processes SIGKILLed while they hold runs.

Three executor processes serve a keyed agent (one run per customer at a time) for two
tenants; tenant-a's limit comes from the settings, tenant-b's is set at run time
(SetLimit), the agent's from the settings. Every ~1.5 s an executor holding a live
lease is SIGKILLed and replaced: its runs keep their slots until their leases lapse,
then are taken over. A sampler polls an invariant query (live leased runs per tenant,
per agent, per key) the whole time: no group is ever over its limit, and every run
completes.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from executor_support import http_tool, mock_tool, scripted_agent, wait_status, write_agent
from support import scheduler_stack, submit

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
REPO = Path(__file__).resolve().parents[3]
END = (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED, pb.RUN_STATUS_PAUSED_INDOUBT, pb.RUN_STATUS_PAUSED_HUMAN)
LIMITS = {"tenant-a": 3, "tenant-b": 2}
AGENT_MAX = 4
KILLS = 6

# The most live leased runs in one group, by database time: what every limit counts.
WORST = """
SELECT coalesce(max(n), 0) FROM (
  SELECT count(*) AS n FROM agent_runs
  WHERE lease_owner IS NOT NULL AND lease_expires_at > clock_timestamp() {where}
  GROUP BY {by}) AS g
"""
HOLDERS = """
SELECT DISTINCT lease_owner FROM agent_runs
WHERE lease_owner IS NOT NULL AND lease_expires_at > clock_timestamp()
"""


def start_executor(stack: Any, agents: Path, worker_id: str, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
    env.update({"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                "AGENTRT_SCHEDULER_ADDR": stack.addr, "AGENTRT_AGENTS_PATH": str(agents),
                "AGENTRT_HEALTH_ADDR": "", "AGENTRT_CLAIM_WAIT_MS": "300", "AGENTRT_WORKER_ID": worker_id,
                "AGENTRT_SLOTS": "3", "AGENTRT_SHUTDOWN_GRACE_S": "1"})
    return subprocess.Popen([sys.executable, "-m", "cli", "executor"], cwd=REPO, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def end_process(proc: subprocess.Popen[bytes]) -> None:
    """Ends one process this test started, by its pid."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


async def test_killed_executors_never_let_a_concurrency_limit_be_passed(db_url, db, tmp_path):
    settings = {"lease_duration_ms": 1_000, "concurrency_recheck_ms": 30, "claim_poll_interval_ms": 30,
                "tenant_limits": {"tenant-a": {"max_running": LIMITS["tenant-a"]}},
                "agent_limits": {"chaos": {"max_running": AGENT_MAX}}, "require_registered_agents": True}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    async with mock_tool(tmp_path, latency_ms=300) as mock, scheduler_stack(db_url, **settings) as stack:
        steps = [{"id": f"s{n}", "tool": "t.chaos", "args": {"n": n}} for n in range(5)]
        write_agent(tmp_path / "agents", scripted_agent(
            "chaos", [*steps, {"id": "done", "finish": "ok"}], [http_tool(mock.url, "t.chaos")],
            concurrency={"key": "${input.customer_id}", "max": 1}))
        await stack.runs.SetLimit(rs.SetLimitRequest(scope="tenant", tenant_id="tenant-b", name="max_running",
                                                     value=str(LIMITS["tenant-b"])), metadata=stack.md())
        try:
            for n in range(3):
                procs[f"ex-{n}"] = start_executor(stack, tmp_path / "agents", f"ex-{n}", tmp_path / f"ex-{n}.log")

            async def registered() -> bool:
                agents = await stack.runs.ListAgents(rs.ListAgentsRequest(), metadata=stack.md())
                return any(agent.name == "chaos" for agent in agents.agents)

            deadline = time.monotonic() + 30
            while not await registered():
                assert time.monotonic() < deadline, "the executors never registered the agent"
                await asyncio.sleep(0.1)
            runs = [await submit(stack, agent="chaos", tenant=tenant, payload={"customer_id": f"c{n % 4}"})
                    for n in range(12) for tenant in LIMITS]
            assert await db.fetchval("SELECT count(DISTINCT concurrency_key) FROM agent_runs") == 4

            seen = {"tenant-a": 0, "tenant-b": 0, "agent": 0, "key": 0, "samples": 0}
            stop = asyncio.Event()

            async def sampler() -> None:
                own = await asyncpg.connect(db_url)
                try:
                    while not stop.is_set():
                        for tenant in LIMITS:
                            seen[tenant] = max(seen[tenant], await own.fetchval(
                                WORST.format(where=f"AND tenant_id = '{tenant}'", by="tenant_id")))
                        seen["agent"] = max(seen["agent"], await own.fetchval(WORST.format(where="", by="agent_name")))
                        seen["key"] = max(seen["key"], await own.fetchval(
                            WORST.format(where="", by="tenant_id, agent_name, concurrency_key")))
                        seen["samples"] += 1
                        await asyncio.sleep(0.005)
                finally:
                    await own.close()

            sampling = asyncio.create_task(sampler())
            rng, kills_holding, generation = random.Random(17), 0, 3
            # KILLS kills, each of an executor holding a live lease: on a loaded machine a fresh
            # executor may take a while to claim, so each kill waits for a holder (bounded).
            kill_deadline = time.monotonic() + 90
            while kills_holding < KILLS and time.monotonic() < kill_deadline:
                await asyncio.sleep(1.5)
                holders: set[str] = set()
                while not holders and time.monotonic() < kill_deadline:
                    holders = {row["lease_owner"] for row in await db.fetch(HOLDERS)} & set(procs)
                    if not holders:
                        if await db.fetchval("SELECT count(*) FROM agent_runs WHERE status <> 'COMPLETED'") == 0:
                            break  # every run is done: nothing left to hold
                        await asyncio.sleep(0.1)
                if not holders:
                    break
                victim = rng.choice(sorted(holders))
                end_process(procs.pop(victim))  # SIGKILL while it holds at least one live lease
                kills_holding += 1
                name = f"ex-{generation}"
                generation += 1
                procs[name] = start_executor(stack, tmp_path / "agents", name, tmp_path / f"{name}.log")
            finals = [await wait_status(stack, run.run_id, *END, within=90, tenant=run.tenant_id) for run in runs]
            stop.set()
            await sampling
        finally:
            for proc in procs.values():
                end_process(proc)
    assert [f.status for f in finals] == [pb.RUN_STATUS_COMPLETED] * len(runs), [f.terminal_reason for f in finals]
    assert kills_holding >= 3, "the executors were not killed while holding runs"
    assert await db.fetchval("SELECT max(fencing_token) FROM agent_runs") >= 2, "no run was taken over"
    assert seen["samples"] > 100
    assert seen["tenant-a"] <= LIMITS["tenant-a"] and seen["tenant-b"] <= LIMITS["tenant-b"], seen
    assert seen["agent"] <= AGENT_MAX and seen["key"] <= 1, seen
    assert seen["key"] == 1 and seen["tenant-b"] >= 1, seen  # the sampler saw work being done
