"""Checkpoint pruning (checkpoint_keep_last), on a real PostgreSQL.

Each run keeps its latest K checkpoint versions; older ones are deleted in
short batches. Commit-unknown recovery keeps its three answers afterwards: a
retry of a write whose checkpoint was pruned still replays (the pruned horizon
is recorded on the run), a write that never committed still runs, and a
checkpoint missing above the horizon is still half a commit (frozen).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from executor_support import wait_for
from support import claim, eid, lease_ref, reason_of, rpc_error, scheduler_stack, snapshot, submit, tool_state
from support import commit_unknown_count as counter

from scheduler.background import pruner
from scheduler.background.pruner import CheckpointPruner, prune_once
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration


def save(ref: ws.LeaseRef, version: int, event_id: str | None = None, cursor: str | None = None,
         journal: list[pb.JournalEntry] | None = None) -> ws.SaveCheckpointRequest:
    return ws.SaveCheckpointRequest(lease=ref, expected_version=version, schema_version=2,
                                    state_json=json.dumps({"cursor": cursor or f"v{version + 1}"}),
                                    event_id=event_id or eid(), journal=journal or [])


async def run_with_checkpoints(stack: Any, count: int, worker: str = "w1") -> tuple[str, ws.LeaseRef, list[str]]:
    """A leased run with `count` checkpoints (versions 1..count), each recording one journal entry."""
    run = await submit(stack)
    lease = await claim(stack, worker)
    assert lease is not None and lease.run.run_id == run.run_id
    ref = lease_ref(lease)
    events = []
    for version in range(count):
        event_id = eid()
        await stack.work.SaveCheckpoint(save(ref, version, event_id,
                                             journal=[pb.JournalEntry(seq=version + 1, kind="tool")]))
        events.append(event_id)
    return run.run_id, ref, events


async def versions(db: Any, run_id: str) -> list[int]:
    return [r["version"] for r in await db.fetch(
        "SELECT version FROM agent_checkpoints WHERE run_id = $1::uuid ORDER BY version", run_id)]


async def test_pruning_keeps_the_latest_versions_of_every_run(db_url, db):
    async with scheduler_stack(db_url) as stack:
        store = stack.server.store
        long_id, ref, _ = await run_with_checkpoints(stack, 6)
        short_id, _, _ = await run_with_checkpoints(stack, 1, "w2")
        none = await submit(stack)  # no checkpoint yet
        assert await prune_once(store, keep_last=2, batch_runs=1) == 4  # a batch of one run: the sweep goes on
        assert await versions(db, long_id) == [5, 6]
        assert await versions(db, short_id) == [1]
        assert await versions(db, none.run_id) == []
        assert await db.fetchval("SELECT checkpoints_pruned_through FROM agent_runs WHERE id = $1::uuid",
                                 long_id) == 4
        assert await prune_once(store, keep_last=2, batch_runs=100) == 0  # nothing left to do
        # The journal is never pruned, and the run goes on from its latest checkpoint.
        assert await db.fetchval("SELECT count(*) FROM run_journal WHERE run_id = $1::uuid", long_id) == 6
        assert (await stack.work.SaveCheckpoint(save(ref, 6))).version == 7
        assert await prune_once(store, keep_last=2, batch_runs=100) == 1
        assert await versions(db, long_id) == [6, 7]
        history = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=long_id), metadata=stack.md())
        assert [c.version for c in history.checkpoints] == [6, 7] and len(history.journal) == 6


async def test_a_long_backlog_is_pruned_over_several_statements(db_url, db, monkeypatch):
    monkeypatch.setattr(pruner, "MAX_VERSIONS_PER_RUN", 2)
    async with scheduler_stack(db_url) as stack:
        run_id, _, _ = await run_with_checkpoints(stack, 7)
        assert await prune_once(stack.server.store, keep_last=1, batch_runs=10) == 6
        assert await versions(db, run_id) == [7]


async def test_pruning_skips_a_run_whose_row_a_write_holds(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, _, _ = await run_with_checkpoints(stack, 4)
        async with db.transaction():
            await db.execute("SELECT 1 FROM agent_runs WHERE id = $1::uuid FOR UPDATE", run_id)
            assert await prune_once(stack.server.store, keep_last=1, batch_runs=10) == 0
        assert await prune_once(stack.server.store, keep_last=1, batch_runs=10) == 3


async def test_the_background_pruner_runs_only_when_configured(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, _, _ = await run_with_checkpoints(stack, 3)
        idle = CheckpointPruner(stack.server.store, stack.server.settings)  # checkpoint_keep_last 0: off
        idle.start()
        await idle.stop()
        assert await versions(db, run_id) == [1, 2, 3]
        settings = stack.server.settings.model_copy(update={"checkpoint_keep_last": 1,
                                                            "checkpoint_prune_interval_s": 0.05})
        task = CheckpointPruner(stack.server.store, settings)
        task.start()
        try:
            for _ in range(100):
                if await versions(db, run_id) == [3]:
                    break
                await asyncio.sleep(0.05)
        finally:
            await task.stop()
            await task.stop()  # safe twice
        assert await versions(db, run_id) == [3]


async def test_a_scheduler_with_checkpoint_keep_last_prunes_by_itself(db_url, db):
    async with scheduler_stack(db_url, checkpoint_keep_last=2, checkpoint_prune_interval_s=0.05) as stack:
        run_id, _, _ = await run_with_checkpoints(stack, 4)
        await wait_for(lambda: _versions_are(db, run_id, [3, 4]), within=20, what="the server's pruner")


async def _versions_are(db, run_id, wanted):
    return await versions(db, run_id) == wanted


# ---------------------------------------------------------------------------- commit-unknown after pruning


async def test_a_pruned_checkpoints_write_still_replays(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref, events = await run_with_checkpoints(stack, 4)
        assert await prune_once(stack.server.store, keep_last=1, batch_runs=10) == 3
        before = await snapshot(db, run_id)
        first = save(ref, 0, events[0], journal=[pb.JournalEntry(seq=1, kind="tool")])
        again = await stack.work.SaveCheckpoint(first)
        assert (again.version, again.replayed) == (1, True)
        third = save(ref, 2, events[2], journal=[pb.JournalEntry(seq=3, kind="tool")])
        assert (await stack.work.SaveCheckpoint(third)).version == 3
        # Same id, other entries: refused, as before pruning.
        other = save(ref, 0, events[0], journal=[pb.JournalEntry(seq=1, kind="sleep")])
        assert (await rpc_error(stack.work.SaveCheckpoint(other))).code() == grpc.StatusCode.ALREADY_EXISTS
        assert await snapshot(db, run_id) == before and await counter(db) == 0


async def test_a_tx2_whose_checkpoint_was_pruned_still_replays(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run = await submit(stack)
        ref = lease_ref(await claim(stack))
        step, tool, request = "s/1", "t", {"a": 1}
        await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=ref, expected_version=0, state_json=json.dumps(tool_state(step, tool, request)), schema_version=2,
            step_key=step, event_id=eid()))
        await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=ref, expected_version=1, step_key=step, tool_name=tool, idempotency_key="k", request_json='{"a": 1}',
            execution_id=eid(), event_id=eid()))
        tx2 = ws.CompleteToolCallRequest(
            lease=ref, expected_version=1, step_key=step, outcome=ws.TOOL_OUTCOME_SUCCEEDED, response_json="{}",
            state_json='{"cursor": "done"}', schema_version=2, event_id=eid(),
            journal=[pb.JournalEntry(seq=1, kind="result", step_key=step)])
        assert (await stack.work.CompleteToolCall(tx2)).version == 2
        await stack.work.SaveCheckpoint(save(ref, 2))
        assert await prune_once(stack.server.store, keep_last=1, batch_runs=10) == 2
        assert await versions(db, run.run_id) == [3]
        again = await stack.work.CompleteToolCall(tx2)
        assert (again.version, again.replayed) == (2, True)
        assert await counter(db) == 0


async def test_after_pruning_a_write_that_never_committed_runs(db_url, db):
    async with scheduler_stack(db_url) as stack:
        _, ref, _ = await run_with_checkpoints(stack, 4)
        await prune_once(stack.server.store, keep_last=1, batch_runs=10)
        event_id = eid()
        stale = save(ref, 1, event_id, journal=[pb.JournalEntry(seq=5, kind="tool")])  # a pruned version
        assert (await rpc_error(stack.work.SaveCheckpoint(stale))).code() == grpc.StatusCode.ABORTED
        reply = await stack.work.SaveCheckpoint(save(ref, 4, event_id, journal=[pb.JournalEntry(seq=5, kind="tool")]))
        assert (reply.version, reply.replayed) == (5, False)
        assert await counter(db) == 0


async def test_after_pruning_a_checkpoint_missing_above_the_horizon_is_half_a_commit(db_url, db):
    async with scheduler_stack(db_url) as stack:
        run_id, ref, events = await run_with_checkpoints(stack, 4)
        await prune_once(stack.server.store, keep_last=2, batch_runs=10)
        assert await versions(db, run_id) == [3, 4]
        # Simulates the inconsistency: the kept version 3 loses its checkpoint, its event stays.
        assert await db.execute("DELETE FROM agent_checkpoints WHERE event_id = $1::uuid", events[2]) == "DELETE 1"
        error = await rpc_error(stack.work.SaveCheckpoint(
            save(ref, 2, events[2], journal=[pb.JournalEntry(seq=3, kind="tool")])))
        assert reason_of(error) == "COMMIT_STATE_INCONSISTENT", error.details()
        row = await db.fetchrow("SELECT status, pause_reason FROM agent_runs WHERE id = $1::uuid", run_id)
        assert row["status"] == "PAUSED_INDOUBT" and events[2] in row["pause_reason"]
        assert await counter(db) == 1
