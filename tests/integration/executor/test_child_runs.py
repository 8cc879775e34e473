"""Child runs through the real trio's scheduler and executor (issue 19): a scripted plan spawns child
runs and waits for all or any of them, or its timeout; the parent parks without a lease and the end of
a child that meets the join wakes it (no polling); cancelling the parent cancels its children; a spawn
repeated by a takeover spawns nothing twice; `agentrt runs tree` shows the family."""

from __future__ import annotations

import json
from typing import Any

import pytest
from executor_support import executor, get_run, scripted_agent, wait_for, wait_status, write_agent
from helpers import run_agentrt
from support import Stack, claim, lease_ref, rpc_error, scheduler_stack, submit

from executor.faults import Faults
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration
END = (pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED, pb.RUN_STATUS_CANCELLED)
HOUR_MS = 3_600_000


def quick_agent() -> dict[str, Any]:
    return scripted_agent("quick", [{"id": "done", "finish": {"n": "${input.n}"}}], [])


def slow_agent() -> dict[str, Any]:
    return scripted_agent("slow", [{"id": "nap", "sleep_ms": HOUR_MS}, {"id": "done", "finish": "late"}], [])


def parent_agent(children: list[dict[str, Any]] | None = None, *, join: str = "all", timeout_ms: int = HOUR_MS,
                 detach: bool = False, fan_out: bool = False) -> dict[str, Any]:
    spawn: dict[str, Any] = {"join": join, "detach": detach}
    if fan_out:
        spawn.update(for_each="${input.items}", child={"agent": "quick", "input": {"n": "${item}"}})
    else:
        spawn["children"] = children or []
    plan = [{"id": "fan", "spawn": spawn, "timeout_ms": timeout_ms},
            {"id": "done", "finish": {"joined": "${inputs.fan}"}}]
    return scripted_agent("parent", plan, [])


def agents(tmp_path: Any, parent: dict[str, Any]) -> Any:
    directory = tmp_path / "agents"
    for definition in (parent, quick_agent(), slow_agent()):
        write_agent(directory, definition)
    return directory


async def children_of(db: Any, run_id: str) -> list[dict[str, Any]]:
    return [dict(r) for r in await db.fetch(
        "SELECT id, status, agent_name, tenant_id, spawn_index, detached FROM agent_runs "
        "WHERE parent_run_id = $1::uuid ORDER BY spawn_index", run_id)]


async def parked_on_join(db: Any, run_id: str) -> bool:
    row = await db.fetchrow("SELECT status, awaiting_join, lease_owner FROM agent_runs WHERE id = $1::uuid", run_id)
    return bool(row["status"] == "QUEUED" and row["awaiting_join"] and row["lease_owner"] is None)


async def test_fan_out_of_twenty_children_joined_with_all(db_url, db, tmp_path):
    async with scheduler_stack(db_url) as stack:
        directory = agents(tmp_path, parent_agent(fan_out=True))
        run = await submit(stack, agent="parent", payload={"items": list(range(20))})
        async with executor(stack, directory, slots=8):
            done = await wait_status(stack, run.run_id, *END, within=60)
        assert done.status == pb.RUN_STATUS_COMPLETED, done.terminal_reason
        joined = json.loads(done.result_json)["joined"]
        assert joined["join"] == "all" and joined["timed_out"] is False
        assert [c["result"] for c in joined["children"]] == [{"n": n} for n in range(20)]
        assert {c["status"] for c in joined["children"]} == {"COMPLETED"}
        rows = await children_of(db, run.run_id)
        assert len(rows) == 20 and {r["tenant_id"] for r in rows} == {"tenant-a"}
        assert [str(r["id"]) for r in rows] == [c["run_id"] for c in joined["children"]]
        child = await get_run(stack, joined["children"][0]["run_id"])
        assert child.parent_run_id == run.run_id
        # The children's submitted events carry the trace of the parent's spawn.
        traces = await db.fetch("SELECT traceparent FROM outbox WHERE event_type = 'agent.run_submitted' "
                                "AND run_id IN (SELECT id FROM agent_runs WHERE parent_run_id = $1::uuid)",
                                run.run_id)
        assert len(traces) == 20 and all(t["traceparent"] for t in traces)
        assert len({t["traceparent"].split("-")[1] for t in traces}) == 1


async def test_join_any_resumes_with_the_first_child_that_ended(db_url, db, tmp_path):
    children = [{"agent": "slow"}, {"agent": "quick", "input": {"n": 7}}, {"agent": "slow"}]
    async with scheduler_stack(db_url) as stack:
        directory = agents(tmp_path, parent_agent(children, join="any"))
        run = await submit(stack, agent="parent")
        async with executor(stack, directory):
            done = await wait_status(stack, run.run_id, *END, within=30)
        assert done.status == pb.RUN_STATUS_COMPLETED, done.terminal_reason
        joined = json.loads(done.result_json)["joined"]
        assert joined["timed_out"] is False
        statuses = [c["status"] for c in joined["children"]]
        # The quick child ended first; the slow ones had not ended (asleep, or in a step when it was read).
        assert statuses[1] == "COMPLETED" and {statuses[0], statuses[2]} <= {"QUEUED", "RUNNING"}, statuses
        assert joined["children"][1]["result"] == {"n": 7}


async def test_a_join_ends_at_its_timeout(db_url, db, tmp_path):
    async with scheduler_stack(db_url) as stack:
        directory = agents(tmp_path, parent_agent([{"agent": "slow"}], timeout_ms=800))
        run = await submit(stack, agent="parent")
        async with executor(stack, directory):
            done = await wait_status(stack, run.run_id, *END, within=30)
        assert done.status == pb.RUN_STATUS_COMPLETED, done.terminal_reason
        joined = json.loads(done.result_json)["joined"]
        assert joined["timed_out"] is True and joined["children"][0]["status"] == "QUEUED"


@pytest.mark.parametrize("detach", [False, True])
async def test_cancelling_a_parent_cancels_its_children_unless_detached(db_url, db, tmp_path, detach):
    async with scheduler_stack(db_url) as stack:
        directory = agents(tmp_path, parent_agent([{"agent": "slow"}, {"agent": "slow"}], detach=detach))
        run = await submit(stack, agent="parent")
        async with executor(stack, directory):
            await wait_for(lambda: parked_on_join(db, run.run_id), 20, "the parent to park on its join")

            async def children_sleeping() -> bool:
                rows = await children_of(db, run.run_id)
                return len(rows) == 2 and all(r["status"] == "QUEUED" for r in rows)

            await wait_for(children_sleeping, 20, "both children to sleep")
            cancelled = await stack.runs.CancelRun(rs.CancelRunRequest(run_id=run.run_id, reason="enough"),
                                                   metadata=stack.md())
        assert cancelled.status == pb.RUN_STATUS_CANCELLED
        rows = await children_of(db, run.run_id)
        assert {r["status"] for r in rows} == ({"QUEUED"} if detach else {"CANCELLED"})
        assert {r["detached"] for r in rows} == {detach}
        if not detach:
            reasons = await db.fetch("SELECT terminal_reason FROM agent_runs WHERE parent_run_id = $1::uuid",
                                     run.run_id)
            assert all(f"parent {run.run_id} cancelled: enough" in r["terminal_reason"] for r in reasons)


@pytest.mark.parametrize("point", ["before_spawn_send", "after_spawn_commit"])
async def test_a_spawn_repeated_by_a_takeover_spawns_nothing_twice(db_url, db, tmp_path, point):
    """The executor abandons the parent right before SpawnChildren is sent, or right after it committed
    (its lease left to lapse, like a crash, before the run parks on the join): the next holder spawns
    from the saved checkpoint, or repeats the spawn and finds the children the first one made."""
    async with scheduler_stack(db_url, lease_duration_ms=1500) as stack:
        directory = agents(tmp_path, parent_agent(fan_out=True))
        run = await submit(stack, agent="parent", payload={"items": [1, 2, 3]})
        faults = Faults([point], action="raise")
        async with executor(stack, directory, faults=faults):
            done = await wait_status(stack, run.run_id, *END, within=40)
        assert faults.fired == [point], "the crash happened"
        assert done.status == pb.RUN_STATUS_COMPLETED and done.fencing_token >= 2, "a takeover finished the run"
        rows = await children_of(db, run.run_id)
        assert [r["spawn_index"] for r in rows] == [0, 1, 2]
        submitted = await db.fetchval(
            "SELECT count(*) FROM outbox WHERE event_type = 'agent.run_submitted' "
            "AND run_id IN (SELECT id FROM agent_runs WHERE parent_run_id = $1::uuid)", run.run_id)
        assert submitted == 3
        assert [c["result"] for c in json.loads(done.result_json)["joined"]["children"]] == [
            {"n": 1}, {"n": 2}, {"n": 3}]


async def spawn_call(stack: Stack, lease: ws.Lease, **fields: Any) -> Any:
    request = ws.SpawnChildrenRequest(lease=lease_ref(lease), spawn_key="fan/attempt-1", join=ws.JOIN_MODE_ALL,
                                      children=[ws.ChildSpec(agent_name="quick")])
    for name, value in fields.items():
        if name == "children":
            del request.children[:]
            request.children.extend(value)
        else:
            setattr(request, name, value)
    return await stack.work.SpawnChildren(request)


async def test_bad_spawns_are_refused_naming_the_field(db_url, db):
    async with scheduler_stack(db_url, require_registered_agents=True) as stack:
        await stack.work.RegisterAgents(ws.RegisterAgentsRequest(
            worker_id="w1", agents=[ws.AgentRegistration(name="quick", version="1")], ttl_ms=60_000))
        run = await submit(stack, agent="parent", allow_unregistered=True)
        lease = await claim(stack, agents=("parent",))
        assert lease is not None and lease.run.run_id == run.run_id
        cases = {
            "join": {"join": ws.JOIN_MODE_UNSPECIFIED},
            "children": {"children": []},
            "children[0].agent_name": {"children": [ws.ChildSpec(agent_name="nobody-serves-this")]},
            "children[1].input_json": {"children": [ws.ChildSpec(agent_name="quick"),
                                                    ws.ChildSpec(agent_name="quick", input_json="[1")]},
            "spawn_key": {"spawn_key": ""},
        }
        for field, fields in cases.items():
            error = await rpc_error(spawn_call(stack, lease, **fields))
            assert error.code().name == "INVALID_ARGUMENT", (field, error.details())
            assert error.details().startswith(f"{field}:"), (field, error.details())
        assert await db.fetchval("SELECT count(*) FROM agent_runs WHERE parent_run_id IS NOT NULL") == 0
        row = await db.fetchrow("SELECT join_key, join_total FROM agent_runs WHERE id = $1::uuid", run.run_id)
        assert row["join_key"] is None and row["join_total"] == 0


async def test_run_tree_shows_the_family(db_url, db, tmp_path):
    async with scheduler_stack(db_url) as stack:
        directory = agents(tmp_path, parent_agent(fan_out=True))
        run = await submit(stack, agent="parent", payload={"items": [1, 2]})
        async with executor(stack, directory):
            await wait_status(stack, run.run_id, *END, within=30)
        tree = await stack.runs.GetRunTree(rs.GetRunTreeRequest(run_id=run.run_id), metadata=stack.md())
        assert [(n.depth, n.run.agent_name, n.run.status) for n in tree.nodes] == [
            (0, "parent", pb.RUN_STATUS_COMPLETED), (1, "quick", pb.RUN_STATUS_COMPLETED),
            (1, "quick", pb.RUN_STATUS_COMPLETED)]
        assert not tree.truncated
        small = await stack.runs.GetRunTree(rs.GetRunTreeRequest(run_id=run.run_id, max_runs=2), metadata=stack.md())
        assert len(small.nodes) == 2 and small.truncated
        other = await rpc_error(stack.runs.GetRunTree(rs.GetRunTreeRequest(run_id=run.run_id),
                                                      metadata=stack.md("tenant-b")))
        assert other.code().name == "NOT_FOUND"


async def agentrt(*args: str, addr: str) -> tuple[int, str, str]:
    return await run_agentrt(*args, "--tenant", "tenant-a", "--addr", addr)


async def test_runs_tree_cli_shows_the_run_and_its_children(db_url, db, tmp_path):
    async with scheduler_stack(db_url) as stack:
        directory = agents(tmp_path, parent_agent([{"agent": "quick", "input": {"n": 1}}, {"agent": "slow"}],
                                                  join="any"))
        run = await submit(stack, agent="parent")
        async with executor(stack, directory):
            await wait_status(stack, run.run_id, *END, within=30)
        code, out, err = await agentrt("runs", "tree", run.run_id, addr=stack.addr)
        assert code == 0, err
        lines = out.strip().splitlines()
        assert len(lines) == 3
        assert lines[0].startswith(run.run_id) and "parent" in lines[0] and "COMPLETED" in lines[0]
        kids = {row["agent_name"]: str(row["id"]) for row in await children_of(db, run.run_id)}
        assert lines[1].startswith(f"  {kids['quick']}") and "COMPLETED" in lines[1]
        assert lines[2].startswith(f"  {kids['slow']}") and "QUEUED" in lines[2]
        code, out, _ = await agentrt("runs", "tree", run.run_id, "--json", addr=stack.addr)
        tree = json.loads(out)
        assert [(r["depth"], r["parent_run_id"]) for r in tree["runs"]] == [(0, ""), (1, run.run_id), (1, run.run_id)]
        code, _, err = await agentrt("runs", "tree", "not-a-uuid", addr=stack.addr)
        assert code != 0 and "run_id" in err and len(err.strip().splitlines()) == 1


async def test_children_sharing_the_budget_spend_the_parents(db_url, db, tmp_path):
    """A parent of max_cost_usd 1.0 spends 0.1 deciding to spawn three children that share its budget:
    each child may spend at most the 0.9 left, and their 1.2 spent is charged to the parent when the
    join ends, so its next decision finds the budget exhausted."""
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack, agent="frugal_parent")
        async with executor(stack, "child_agents"):
            done = await wait_status(stack, run.run_id, *END, within=30)
        assert done.status == pb.RUN_STATUS_FAILED
        assert done.terminal_reason.startswith("budget exhausted: max_cost_usd 1.0 reached (1.3"), done.terminal_reason
        caps = await db.fetch("SELECT budget_max_cost_usd, status FROM agent_runs WHERE parent_run_id = $1::uuid",
                              run.run_id)
        assert [(round(r["budget_max_cost_usd"], 6), r["status"]) for r in caps] == [(0.9, "COMPLETED")] * 3
