"""Experiment 9: one executor partitioned from the scheduler, its lease taken over, its writes refused on return.

With network namespaces (the suite runs this experiment inside a "hub"
namespace of its own): executor A lives in a second namespace joined to the hub
by a veth pair (198.18.0.1 hub side, 198.18.0.2 A's side; RFC 2544 test
addresses that exist only inside these namespaces). The cut is `ip link set
<hub end> down`: A's packets are dropped silently, as in a real partition.
Without namespaces A is paused with SIGSTOP instead, and the evidence says so.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import uuid

from devstack.acceptance.agents import LOOKUP, http_tool, scripted, tool_step, write_agents
from devstack.acceptance.api import STATUS
from devstack.acceptance.lab import Lab
from devstack.acceptance.procs import PYTHON, ExperimentError, wait_log, wait_until
from shared.gen.agentrt.v1 import common_pb2 as pb

HUB_ADDR, A_ADDR = "198.18.0.1", "198.18.0.2"


class Link:
    """A namespace for the partitioned executor and the veth pair to the hub (ip commands, recorded)."""

    def __init__(self, lab: Lab) -> None:
        tag = uuid.uuid4().hex[:6]
        self.lab, self.ns, self.hub_end, self.a_end = lab, f"acc-x-{tag}", f"vh{tag}", f"va{tag}"

    def ip(self, *args: str) -> None:
        self.lab.commands.add("ip " + " ".join(args))
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise ExperimentError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")

    def create(self) -> None:
        self.ip("netns", "add", self.ns)
        self.ip("link", "add", self.hub_end, "type", "veth", "peer", "name", self.a_end, "netns", self.ns)
        self.ip("addr", "add", f"{HUB_ADDR}/30", "dev", self.hub_end)
        self.ip("link", "set", self.hub_end, "up")
        self.ip("-n", self.ns, "addr", "add", f"{A_ADDR}/30", "dev", self.a_end)
        self.ip("-n", self.ns, "link", "set", self.a_end, "up")
        self.ip("-n", self.ns, "link", "set", "lo", "up")

    def cut(self) -> None:
        self.ip("link", "set", self.hub_end, "down")

    def heal(self) -> None:
        self.ip("link", "set", self.hub_end, "up")

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=30)
        self.lab.commands.add(f"ip netns del {self.ns}")


async def partition(lab: Lab) -> None:
    link = Link(lab) if lab.suite.hub else None
    if link is not None:
        await asyncio.to_thread(link.create)
    try:
        await _partition(lab, link)
    finally:
        if link is not None:
            await asyncio.to_thread(link.delete)


async def _partition(lab: Lab, link: Link | None) -> None:
    await lab.runtime_database()
    listen = "0.0.0.0" if link else "127.0.0.1"
    await lab.scheduler(listen_host=listen)
    port = lab.scheduler_addr.rpartition(":")[2]
    mock = await lab.mocktool(host=listen, url_host=HUB_ADDR if link else "")
    agent = scripted("acc-e9", [tool_step("a", "acc-e9.a"), tool_step("b", "acc-e9.b"),
                                {"id": "done", "finish": {"b": "${results.b.response.id}"}}],
                     [http_tool(mock.url, "acc-e9.a", LOOKUP), http_tool(mock.url, "acc-e9.b", LOOKUP)])
    agents = write_agents(lab.dir / "agents", agent)
    # b runs at once and its answer is held: A is waiting for it when the link goes.
    mock.fault("acc-e9.b", "timeout_after_execute", hold_ms=8000)
    a_addr = f"{HUB_ADDR}:{port}" if link else lab.scheduler_addr
    a = await lab.executor("executor-a", agents, scheduler_addr=a_addr,
                           prefix=["ip", "netns", "exec", link.ns] if link else None)
    worker_a = lab.worker_id(a)
    run_id = await lab.submit("acc-e9", {"order": lab.ev.repetition})
    await wait_until(lambda: [r for r in mock.requests("acc-e9.b") if r["outcome"] == "executed"], 60,
                     "A's request for b to execute at the mock (its answer held)")
    held = await lab.snapshot(run_id, "A waiting for b's answer")
    fence_a = held["run"]["fencing_token"]
    if link is not None:
        lab.ev.method = {"kind": "netns: veth link cut", "namespace": link.ns, "veth": [link.hub_end, link.a_end],
                         "addresses": {"hub": HUB_ADDR, "executor_a": A_ADDR}, "cut": "ip link set <hub end> down"}
        await asyncio.to_thread(link.cut)
    else:
        lab.ev.method = {"kind": "sigstop: executor paused (no network namespace)"}
        a.signal(signal.SIGSTOP)
    cut_at = len(a.log())
    await lab.executor("executor-b", agents)
    final = await lab.wait_settled(run_id, 90)
    before = await lab.snapshot(run_id, "B finished; A still partitioned")
    if link is not None:  # A noticed on its own clock that it cannot renew
        await wait_log(a, "lost: heartbeat unanswered", 30, cut_at)
    b_proc = next(p for p in lab.procs if p.name == "executor-b")
    await asyncio.to_thread(b_proc.stop)
    if link is not None:
        await asyncio.to_thread(link.heal)
    else:
        a.signal(signal.SIGCONT)
    # A is back when it finishes new work: by then its connection has delivered whatever it had
    # sent into the partition (TCP keeps order), so any stale write has reached the scheduler.
    second = await lab.submit("acc-e9", {"order": 1000 + lab.ev.repetition})
    await wait_log(a, f"run {second} -> RUN_STATUS_COMPLETED", 90, cut_at)
    after = await lab.snapshot(run_id, "A back and working")
    probe_argv = [PYTHON, "-m", "devstack.acceptance.probe", "--scheduler", a_addr, "--run", run_id, "--worker",
                  worker_a, "--fence", str(fence_a), "--version", str(before["run"]["version"]),
                  "--step-key", "b/attempt-1"]
    if link is not None:
        probe_argv = ["ip", "netns", "exec", link.ns, *probe_argv]
    lab.commands.add(" ".join(probe_argv).replace(PYTHON, "python") + "  # A's stale lease, from A's side")
    done = await asyncio.to_thread(subprocess.run, probe_argv, capture_output=True, text=True, timeout=60)
    try:
        probe = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ExperimentError(f"probe failed: {done.stdout[-500:]} {done.stderr[-1500:]}") from None
    after_probe = await lab.snapshot(run_id, "after A's stale writes")
    rows = lab.record_mock(mock)
    ledger = {r["step_key"]: r for r in before["ledger"]}
    run_keys = {r["idempotency_key"] for r in before["ledger"] if r["step_key"].startswith("b/")}
    executed = {k: n for k, n in mock.executions("acc-e9.b").items() if k in run_keys}
    evidence = (ledger.get("b/attempt-1") or {}).get("reconciliation_evidence") or {}
    lab.ev.observe(fence_a=fence_a, worker_a=worker_a, final_status=STATUS(final.status),
                   fence_after=before["run"]["fencing_token"], ledger=list(ledger.values()), probe=probe,
                   b_executions=executed, a_log_after_cut=a.log()[cut_at:][-3000:],
                   lookups=[r for r in rows if r["kind"] == "lookup"])
    lab.ev.check("another executor took over (newer fence) and completed the run",
                 final.status == pb.RUN_STATUS_COMPLETED and before["run"]["fencing_token"] > fence_a,
                 {"fence_a": fence_a, "fence_now": before["run"]["fencing_token"]})
    lab.ev.check("b ran once; the takeover found it by lookup and recorded the evidence",
                 list(executed.values()) == [1] and ledger.get("b/attempt-1", {}).get("status") == "SUCCEEDED"
                 and evidence.get("lookup") == "found", {"executions": executed, "evidence": evidence})
    lab.ev.check("A's writes after its return changed nothing", after == before and after_probe == before,
                 {"before": before["run"], "after": after_probe["run"]})
    lab.ev.check("A's stale-lease writes, sent over the healed link, are refused",
                 bool(probe) and all(v == "LEASE_LOST" for v in probe.values()), probe)
    lab.ev.check("A survived the partition and works again (same pid)", a.alive(), a.pid)
    if link is not None:
        lab.ev.check("A gave its lease up on its own clock during the partition",
                     "lost: heartbeat unanswered" in a.log()[cut_at:])
