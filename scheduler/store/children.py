"""Child runs (docs/design.md §child-runs): the spawn of a step's children with the join its run
waits on, the tree of a run's descendants, and what a cancel cancels with its run.

A child's id and client_request_id are derived from (parent, spawn key, index):
a spawn repeated after a crash or a takeover inserts nothing and answers with
the children it made. The join lives on the parent's row; a child counts its
own end there in the transaction that ends it (the trigger of migration 0014).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from scheduler.security.sealing import Sensitivity
from scheduler.states import TERMINAL, Op
from scheduler.store.core import Database, Repository, db_call, fence_params, trace_params
from scheduler.store.keys import KeyStore
from scheduler.store.queries import Q
from scheduler.store.recovery import Recovery
from scheduler.store.rows import ChildRow, RunRow, Spawned
from scheduler.store.types import LeaseRef
from shared.canonical import content_hash, sha256_of, uuid7
from shared.db import execute, fetch, fetchrow, fetchval
from shared.errors import NotFound, SpawnLimitExceeded
from shared.tracing import NO_TRACE, Trace

# The namespace of child run ids: uuid5(CHILD_NAMESPACE, "<parent>/<spawn key>/<index>").
CHILD_NAMESPACE = uuid.UUID("5f0c7a52-6a43-4c1e-9f0b-2f6b4c1d9e11")
TERMINAL_STATUSES = tuple(sorted(status.value for status in TERMINAL))


@dataclass(frozen=True)
class ChildSpec:
    agent_name: str
    agent_version: str
    input: dict[str, Any]
    labels: dict[str, str]
    max_steps: int = 0
    max_tokens: int = 0
    max_cost_usd: float = 0.0
    sensitive: dict[str, Any] | None = None  # the serving version's marks: its input is sealed as SubmitRun's
    # The parent's marked values the input carries (scheduler/api/shield.py `carried`): sealed under the
    # child's own data key wherever they appear in its input, as the parent's are under the parent's.
    carried: tuple[str, ...] = ()


def child_id(parent: uuid.UUID, spawn_key: str, index: int) -> uuid.UUID:
    return uuid.uuid5(CHILD_NAMESPACE, f"{parent}/{spawn_key}/{index}")


def child_request_id(parent: uuid.UUID, spawn_key: str, index: int) -> str:
    return f"child:{parent}:{index}:{sha256_of(spawn_key).hex()[:32]}"


@dataclass(frozen=True)
class TreeCursor:
    """Where a page of GetRunTree ended: its last node's place in the breadth-first order
    (depth, parent, spawn group, index, id); depth 0 is the run asked for."""

    depth: int | None
    parent_run_id: uuid.UUID | None
    spawn_key: str | None
    spawn_index: int | None
    run_id: uuid.UUID | None

    @classmethod
    def after(cls, row: RunRow) -> TreeCursor:
        return cls(row.depth or 0, row.parent_run_id, row.spawn_key, row.spawn_index, row.id)

    def params(self) -> dict[str, Any]:
        return {"after_depth": self.depth, "after_parent": self.parent_run_id, "after_spawn_key": self.spawn_key,
                "after_spawn_index": self.spawn_index, "after_id": self.run_id}


def join_met(mode: str, total: int, done: int) -> bool:
    return done > 0 if mode == "ANY" else done >= total


class ChildStore(Repository):
    """Child runs: spawn (the lease holder's write, sealed as SubmitRun seals), join and the run tree."""

    def __init__(self, db: Database, keys: KeyStore, recovery: Recovery) -> None:
        super().__init__(db)
        self.keys = keys
        self.recovery = recovery

    @db_call
    async def spawn_children(self, lease: LeaseRef, *, spawn_key: str, children: list[ChildSpec], join_mode: str,
                             detach: bool, max_attempts: int, trace: Trace = NO_TRACE) -> Spawned:
        """Spawns the children of step `spawn_key` of the holder's RUNNING run (those not spawned yet) and
        records the join on the run; LEASE_LOST (or the cancel applied) when the caller is not the holder."""
        async with self.work_pool.acquire() as conn:
            async with conn.transaction():
                parent = await fetchrow(conn, Q.lock_spawning_parent, **fence_params(lease, Op.SAVE_CHECKPOINT))
                if parent is not None:
                    created = 0
                    # Under the parent's lock: the children a repeated spawn made already are not
                    # sealed again (a new data key would be cached for a child that keeps its first).
                    made = {r["spawn_index"] for r in await fetch(conn, Q.spawn_group, parent_run_id=lease.run_id,
                                                                  spawn_key=spawn_key)}
                    root = parent["root_run_id"] or parent["id"]
                    depth = parent["spawn_depth"] + 1
                    await self._within_tree_limits(conn, root, depth, sum(i not in made for i in range(len(children))))
                    for index, spec in enumerate(children):
                        if index in made:
                            continue
                        run_id, stored, sealed = child_id(lease.run_id, spawn_key, index), spec.input, None
                        marks = Sensitivity.of_json(spec.sensitive)
                        if marks.any or spec.carried:
                            sealed = self.keys.new_run_key(run_id, marks)
                            sealed.key.secrets.update(spec.carried)
                            stored = sealed.key.seal_strings(sealed.key.seal_paths(spec.input, marks.input),
                                                             spec.carried)
                        created += await fetchval(
                            conn, Q.spawn_child, run_id=run_id,
                            tenant_id=parent["tenant_id"], agent_name=spec.agent_name,
                            agent_version=spec.agent_version, input=stored, labels=spec.labels,
                            key_id=sealed.key_id if sealed else None,
                            wrapped_key=sealed.wrapped if sealed else None,
                            sensitive=marks.to_json() if sealed else None,
                            max_attempts=max_attempts, max_steps=spec.max_steps, max_tokens=spec.max_tokens,
                            max_cost_usd=spec.max_cost_usd,
                            client_request_id=child_request_id(lease.run_id, spawn_key, index),
                            submit_hash=content_hash({"agent_name": spec.agent_name, "input": spec.input}),
                            priority=parent["priority"], fair_step=self.settings.fair_step(parent["tenant_id"]),
                            parent_run_id=lease.run_id, spawn_key=spawn_key, spawn_index=index, detached=detach,
                            root_run_id=root, spawn_depth=depth, event_id=uuid7(), **trace_params(trace))
                    done = await fetchval(conn, Q.record_join, run_id=lease.run_id, spawn_key=spawn_key,
                                          join_mode=join_mode, join_total=len(children))
                    rows = await fetch(conn, Q.spawn_group, parent_run_id=lease.run_id, spawn_key=spawn_key)
                    return Spawned([ChildRow.of(r) for r in rows], created, join_met(join_mode, len(children), done))
            raise await self.recovery.refusal(conn, Op.SAVE_CHECKPOINT, lease, None)

    async def _within_tree_limits(self, conn: asyncpg.Connection, root: uuid.UUID, depth: int, new: int) -> None:
        """Refuses (SpawnLimitExceeded, before anything is written) a spawn whose children would sit
        deeper than max_spawn_depth, or take the root's descendants past max_descendants_per_root. The
        count is taken under the tree's lock: two runs of one tree spawning at once cannot both pass."""
        if not new:
            return  # a repeated spawn that makes nothing new is answered as the first was
        settings = self.settings
        if depth > settings.max_spawn_depth:
            raise SpawnLimitExceeded(
                f"children of this run would be at depth {depth} below their root run {root}, past "
                f"max_spawn_depth ({settings.max_spawn_depth})", limit="max_spawn_depth",
                max=settings.max_spawn_depth, root_run_id=root, depth=depth)
        await execute(conn, Q.lock_spawn_tree, root_run_id=root)
        existing = await fetchval(conn, Q.tree_descendants, root_run_id=root)
        if existing + new > settings.max_descendants_per_root:
            raise SpawnLimitExceeded(
                f"root run {root} has {existing} descendants; {new} more would pass max_descendants_per_root "
                f"({settings.max_descendants_per_root})", limit="max_descendants_per_root",
                max=settings.max_descendants_per_root, root_run_id=root, descendants=existing)

    @db_call
    async def run_tree(self, tenant_id: str, run_id: uuid.UUID, *, limit: int,
                       after: TreeCursor | None = None) -> list[RunRow]:
        """The run and its descendants within the tenant, breadth first; at most `limit` rows after
        `after` (a page's last node). NotFound when the run is not the tenant's."""
        async with self.db.tenant_tx(tenant_id, readonly=True) as conn:
            if after is not None and await fetchrow(conn, Q.get_run, run_id=run_id, tenant_id=tenant_id) is None:
                raise NotFound(f"run {run_id} not found", run_id=run_id)
            rows = await fetch(conn, Q.run_tree, tenant_id=tenant_id, run_id=run_id, limit=limit,
                               **(after or TreeCursor(None, None, None, None, None)).params())
        if not rows and after is None:
            raise NotFound(f"run {run_id} not found", run_id=run_id)
        return [RunRow.of(row) for row in rows]

    @staticmethod
    async def cancellable_descendants(conn: asyncpg.Connection, run_id: uuid.UUID) -> list[uuid.UUID]:
        """The run's unended, undetached descendants, deepest first (the cancel's lock order)."""
        return [row["id"] for row in await fetch(conn, Q.cancellable_descendants, run_id=run_id)]


__all__ = ["CHILD_NAMESPACE", "ChildSpec", "ChildStore", "TreeCursor", "child_id", "child_request_id", "join_met"]
