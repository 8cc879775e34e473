"""Run trees have no silent bound (issue 24, defect 2): every walk of a tree reaches every node, a
paged read says where it stopped, and SpawnChildren bounds a tree's depth and size.

Deep chains and wide trees are written straight into the database (as SpawnChildren would write
them, but past the spawn limits: a tree made before them, or under larger ones), so each walk is
tested at and past any bound it might hide: a chain of 45 (the old walks stopped at depth 32) and a
tree of 300 read 100 at a time. Each recursive query of scheduler/sql/queries.sql names its tests
in tests/unit/test_recursive_walks.py.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import grpc
import pytest
from executor_support import executor, scripted_agent, wait_status, write_agent
from support import Stack, claim, eid, lease_ref, reason_of, rpc_error, scheduler_stack, submit

from scheduler.store.migrate import available_migrations, migrate
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration
TENANT = "tenant-a"
DEEP = 45  # past the old walks' depth limit of 32


@pytest.fixture
async def stack(db_url: str) -> AsyncIterator[Stack]:
    async with scheduler_stack(db_url) as running:
        yield running


async def insert_run(db: asyncpg.Connection, *, parent: uuid.UUID | None = None, root: uuid.UUID | None = None,
                     depth: int = 0, index: int = 0, detached: bool = False, status: str = "QUEUED",
                     with_tree_columns: bool = True) -> uuid.UUID:
    run_id = uuid.uuid4()
    tree = ", root_run_id, spawn_depth" if with_tree_columns else ""
    values = ", $8, $9" if with_tree_columns else ""
    args: list[object] = [run_id, TENANT, parent, "step" if parent else None, index if parent else None, detached,
                          status]
    if with_tree_columns:
        args += [root, depth]
    await db.execute(
        f"INSERT INTO agent_runs (id, tenant_id, agent_name, parent_run_id, spawn_key, spawn_index, detached, status"
        f"{tree}) VALUES ($1, $2, 'demo', $3, $4, $5, $6, $7{values})", *args)
    return run_id


async def chain(db: asyncpg.Connection, length: int, **kwargs: bool) -> list[uuid.UUID]:
    """A root and `length` runs below it, each the only child of the one before."""
    runs = [await insert_run(db, **kwargs)]
    for depth in range(1, length + 1):
        runs.append(await insert_run(db, parent=runs[-1], root=runs[0], depth=depth, **kwargs))
    return runs


async def statuses(db: asyncpg.Connection, runs: list[uuid.UUID]) -> list[str]:
    by_id = {r["id"]: r["status"] for r in await db.fetch("SELECT id, status FROM agent_runs WHERE id = ANY($1)", runs)}
    return [by_id[run] for run in runs]


async def test_cancelling_the_root_of_a_deep_chain_cancels_every_descendant(db: asyncpg.Connection,
                                                                           stack: Stack) -> None:
    """cancellable_descendants past depth 32: the old cancel left the runs below 32 QUEUED (to run)."""
    runs = await chain(db, DEEP)
    # A detached child deep down, and its own child: left alone, at any depth.
    detached = await insert_run(db, parent=runs[40], root=runs[0], depth=41, index=1, detached=True)
    below_detached = await insert_run(db, parent=detached, root=runs[0], depth=42)
    cancelled = await stack.runs.CancelRun(rs.CancelRunRequest(run_id=str(runs[0]), reason="runaway"),
                                           metadata=stack.md())
    assert cancelled.status == pb.RUN_STATUS_CANCELLED
    assert await statuses(db, runs) == ["CANCELLED"] * (DEEP + 1)
    assert await statuses(db, [detached, below_detached]) == ["QUEUED", "QUEUED"]
    deepest = await db.fetchval("SELECT terminal_reason FROM agent_runs WHERE id = $1", runs[-1])
    assert deepest == f"cancelled: parent {runs[0]} cancelled: runaway"
    # Each cancel announced, in the cancel's transaction.
    assert await db.fetchval("SELECT count(*) FROM outbox WHERE event_type = 'agent.run_cancelled' "
                             "AND run_id = ANY($1)", runs) == DEEP + 1


async def test_cancelling_a_run_in_the_middle_cancels_its_subtree_only(db: asyncpg.Connection,
                                                                       stack: Stack) -> None:
    runs = await chain(db, DEEP)
    await stack.runs.CancelRun(rs.CancelRunRequest(run_id=str(runs[5])), metadata=stack.md())
    assert await statuses(db, runs) == ["QUEUED"] * 5 + ["CANCELLED"] * (DEEP + 1 - 5)


async def test_the_tree_of_a_deep_chain_answers_every_run(db: asyncpg.Connection, stack: Stack) -> None:
    """run_tree past depth 32: the old read answered 33 nodes with truncated=false."""
    runs = await chain(db, DEEP)
    tree = await stack.runs.GetRunTree(rs.GetRunTreeRequest(run_id=str(runs[0])), metadata=stack.md())
    assert [(n.depth, n.run.run_id) for n in tree.nodes] == [(d, str(r)) for d, r in enumerate(runs)]
    assert not tree.truncated and tree.next_page_token == ""
    # At the page bound exactly: not truncated; one less: truncated, and the rest one page away.
    exact = await stack.runs.GetRunTree(rs.GetRunTreeRequest(run_id=str(runs[0]), max_runs=DEEP + 1),
                                        metadata=stack.md())
    assert len(exact.nodes) == DEEP + 1 and not exact.truncated and exact.next_page_token == ""
    short = await stack.runs.GetRunTree(rs.GetRunTreeRequest(run_id=str(runs[0]), max_runs=DEEP),
                                        metadata=stack.md())
    assert len(short.nodes) == DEEP and short.truncated and short.next_page_token
    rest = await stack.runs.GetRunTree(rs.GetRunTreeRequest(run_id=str(runs[0]), max_runs=DEEP,
                                                            page_token=short.next_page_token), metadata=stack.md())
    assert [(n.depth, n.run.run_id) for n in rest.nodes] == [(DEEP, str(runs[-1]))]
    assert not rest.truncated and rest.next_page_token == ""


async def test_a_wide_tree_is_read_page_by_page_in_breadth_first_order(db: asyncpg.Connection,
                                                                       stack: Stack) -> None:
    root = await insert_run(db)
    children = [await insert_run(db, parent=root, root=root, depth=1, index=i) for i in range(120)]
    grandchildren = [await insert_run(db, parent=children[i % 7], root=root, depth=2, index=i) for i in range(179)]
    whole = await stack.runs.GetRunTree(rs.GetRunTreeRequest(run_id=str(root), max_runs=10_000), metadata=stack.md())
    assert len(whole.nodes) == 300 and not whole.truncated
    pages, token = [], ""
    while True:
        page = await stack.runs.GetRunTree(rs.GetRunTreeRequest(run_id=str(root), max_runs=100, page_token=token),
                                           metadata=stack.md())
        pages.append(page)
        assert page.truncated == bool(page.next_page_token)
        if not page.truncated:
            break
        token = page.next_page_token
    assert [len(p.nodes) for p in pages] == [100, 100, 100]
    paged = [(n.depth, n.run.run_id) for p in pages for n in p.nodes]
    assert paged == [(n.depth, n.run.run_id) for n in whole.nodes]  # same order, none twice, none missed
    assert {r for _, r in paged} == {str(r) for r in [root, *children, *grandchildren]}
    # A page that starts right after the run itself.
    first = await stack.runs.GetRunTree(rs.GetRunTreeRequest(run_id=str(root), max_runs=1), metadata=stack.md())
    second = await stack.runs.GetRunTree(rs.GetRunTreeRequest(run_id=str(root), max_runs=1,
                                                              page_token=first.next_page_token), metadata=stack.md())
    assert [n.run.run_id for n in second.nodes] == [str(children[0])]
    # A token is the server's, for this run's tree.
    for token, problem in (("garbage", "is not a token"), (second.next_page_token, None)):
        other = await insert_run(db) if problem is None else root
        error = await rpc_error(stack.runs.GetRunTree(
            rs.GetRunTreeRequest(run_id=str(other), page_token=token), metadata=stack.md()))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in (error.details() or "")
    # Another tenant's tree, paged or not: NOT_FOUND.
    error = await rpc_error(stack.runs.GetRunTree(rs.GetRunTreeRequest(run_id=str(root), page_token=token),
                                                  metadata=stack.md("tenant-b")))
    assert error.code() == grpc.StatusCode.NOT_FOUND


async def spawn(stack: Stack, lease: ws.Lease, key: str, count: int) -> ws.SpawnChildrenResponse:
    return await stack.work.SpawnChildren(ws.SpawnChildrenRequest(
        lease=lease_ref(lease), spawn_key=key, join=ws.JOIN_MODE_ALL,
        children=[ws.ChildSpec(agent_name="demo", input_json="{}") for _ in range(count)]))


async def everything(db: asyncpg.Connection) -> tuple[int, int, int]:
    return (await db.fetchval("SELECT count(*) FROM agent_runs"), await db.fetchval("SELECT count(*) FROM outbox"),
            await db.fetchval("SELECT count(*) FROM agent_runs WHERE join_key IS NOT NULL"))


async def test_spawn_depth_is_bounded_and_a_refused_spawn_writes_nothing(db_url: str,
                                                                         db: asyncpg.Connection) -> None:
    async with scheduler_stack(db_url, max_spawn_depth=2) as stack:
        root = await submit(stack)
        lease = await claim(stack)
        assert lease is not None and lease.run.run_id == root.run_id
        assert (await spawn(stack, lease, "a", 1)).created == 1  # depth 1
        child = await claim(stack)
        assert child is not None and child.run.parent_run_id == root.run_id
        assert (await spawn(stack, child, "b", 1)).created == 1  # depth 2: at the bound
        grandchild = await claim(stack)
        assert grandchild is not None and grandchild.run.parent_run_id == child.run.run_id
        before = await everything(db)
        error = await rpc_error(spawn(stack, grandchild, "c", 1))  # depth 3: past it
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and reason_of(error) == "SPAWN_LIMIT_EXCEEDED"
        assert "max_spawn_depth" in (error.details() or "") and root.run_id in (error.details() or "")
        assert await everything(db) == before
        depths = await db.fetch("SELECT spawn_depth, root_run_id FROM agent_runs ORDER BY spawn_depth")
        assert [(r["spawn_depth"], str(r["root_run_id"]) if r["root_run_id"] else None) for r in depths] == [
            (0, None), (1, root.run_id), (2, root.run_id)]
        # The refused parent can still finish (the executor fails it: permanent:spawn_refused).
        await stack.work.FinishRun(ws.FinishRunRequest(lease=lease_ref(grandchild), expected_version=0,
                                                       outcome=ws.FINISH_OUTCOME_FAILED, event_id=eid()))


async def test_descendants_per_root_are_bounded_at_every_depth(db_url: str, db: asyncpg.Connection) -> None:
    async with scheduler_stack(db_url, max_descendants_per_root=5) as stack:
        root = await submit(stack)
        lease = await claim(stack)
        assert lease is not None
        assert (await spawn(stack, lease, "a", 3)).created == 3
        child = await claim(stack)
        assert child is not None
        before = await everything(db)
        error = await rpc_error(spawn(stack, child, "b", 3))  # a grandchild counts against the root too
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and reason_of(error) == "SPAWN_LIMIT_EXCEEDED"
        assert "max_descendants_per_root" in (error.details() or "")
        assert await everything(db) == before
        assert (await spawn(stack, child, "b", 2)).created == 2  # exactly at the bound
        assert (await spawn(stack, child, "b", 2)).created == 0  # a repeated spawn is answered, not refused
        error = await rpc_error(spawn(stack, lease, "c", 1))
        assert reason_of(error) == "SPAWN_LIMIT_EXCEEDED"
        assert await db.fetchval("SELECT count(*) FROM agent_runs WHERE root_run_id = $1::uuid", root.run_id) == 5


async def test_migration_0019_finds_the_root_and_depth_of_every_run_made_before_it(db_url: str) -> None:
    """The backfill's recursive walk (no depth limit) over a chain of 45 and a child whose parent
    retention deleted, in a database migrated to 0018 first."""
    admin = await asyncpg.connect(db_url)
    name = f"agentrt_t_{uuid.uuid4().hex[:12]}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        conn = await asyncpg.connect(db_url.rsplit("/", 1)[0] + f"/{name}")
        try:
            migrations = available_migrations()
            await migrate(conn, [m for m in migrations if m.version < 19])
            runs = await chain(conn, DEEP, with_tree_columns=False)
            orphan = await insert_run(conn, parent=uuid.uuid4(), with_tree_columns=False)
            below_orphan = await insert_run(conn, parent=orphan, with_tree_columns=False)
            orphan_parent = await conn.fetchval("SELECT parent_run_id FROM agent_runs WHERE id = $1", orphan)
            await migrate(conn, migrations)
            rows = {r["id"]: (r["root_run_id"], r["spawn_depth"])
                    for r in await conn.fetch("SELECT id, root_run_id, spawn_depth FROM agent_runs")}
            assert [rows[r] for r in runs] == [(None, 0)] + [(runs[0], d) for d in range(1, DEEP + 1)]
            assert rows[orphan] == (orphan_parent, 1) and rows[below_orphan] == (orphan_parent, 2)
        finally:
            await conn.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def test_a_runaway_recursive_agent_stops_at_the_depth_bound(db_url: str, db: asyncpg.Connection,
                                                                  tmp_path: Path) -> None:
    """Through a real executor: an agent that spawns itself (children skip the submit quota) grows no
    deeper than max_spawn_depth; the refused run fails permanent:spawn_refused, and each parent's join
    then ends with it."""
    plan = [{"id": "fan", "spawn": {"join": "all", "children": [{"agent": "recurse"}]}, "timeout_ms": 600_000},
            {"id": "done", "finish": {"joined": "${inputs.fan}"}}]
    directory = tmp_path / "agents"
    write_agent(directory, scripted_agent("recurse", plan, []))
    async with scheduler_stack(db_url, max_spawn_depth=3) as stack:
        run = await submit(stack, agent="recurse")
        async with executor(stack, directory, slots=4):
            done = await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED,
                                     pb.RUN_STATUS_CANCELLED, within=60)
        assert done.status == pb.RUN_STATUS_COMPLETED, done.terminal_reason
        rows = await db.fetch("SELECT spawn_depth, status, terminal_reason FROM agent_runs ORDER BY spawn_depth")
        assert [(r["spawn_depth"], r["status"]) for r in rows] == [
            (0, "COMPLETED"), (1, "COMPLETED"), (2, "COMPLETED"), (3, "FAILED")]
        reason = rows[3]["terminal_reason"]
        assert reason.startswith("spawn at fan/") and "refused" in reason and "max_spawn_depth (3)" in reason
