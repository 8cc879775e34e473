"""The lease holder's tool-call writes: Tx1 (begin), the combined Tx2 + Tx1, NOT_EXECUTED and
IN_DOUBT (docs/design.md §tool-calls, §in-doubt). Each is one statement under the fenced-write
guard; a refusal is explained by scheduler/store/recovery.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from asyncpg import Record

from scheduler.config import ToolLimit
from scheduler.states import Op, run_status, sources
from scheduler.store.batched import ALONE, SetWrite
from scheduler.store.core import Database, Repository, binding_params, db_call, fence_params, fenced_write, trace_params
from scheduler.store.fenced import BeginCall, CompleteAndBegin, InDoubt, NotExecuted
from scheduler.store.keys import KeyStore
from scheduler.store.queries import Q
from scheduler.store.recovery import Recovery
from scheduler.store.rows import Began, Chained, Completed, ExecutionRow
from scheduler.store.types import NO_JOURNAL, Journal, LeaseRef
from shared.canonical import request_hashes
from shared.db import execute, fetchrow, fetchval
from shared.errors import AlreadyExists, DecisionNotCheckpointed, ToolRateLimited, VersionConflict
from shared.tracing import NO_TRACE, Trace

# begin_tool_call's per-run arrays, in the order of the values each write gives SetWrite.
INTENT_COLUMNS = ("run_ids", "worker_ids", "fencing_tokens", "expected_versions", "step_keys", "tool_names",
                  "idempotency_keys", "requests", "request_hashes", "legacy_request_hashes", "execution_ids",
                  "event_ids", "traceparents", "tracestates", "write_ops", "write_hashes")

# complete_and_begin_tool_call's per-run arrays, in the order of the values each write gives SetWrite.
CHAIN_COLUMNS = ("run_ids", "worker_ids", "fencing_tokens", "expected_versions", "step_keys", "outcomes", "states",
                 "state_hashes", "schema_versions", "responses", "remote_resource_ids", "error_codes", "evidences",
                 "event_ids", "next_step_keys", "next_tool_names", "next_idempotency_keys", "next_request_hashes",
                 "next_legacy_request_hashes", "next_execution_ids", "next_requests", "next_event_ids",
                 "traceparents", "tracestates", "write_ops", "write_hashes")


class ToolWrites(Repository):
    """The lease holder's writes of the tool-execution ledger: begin (Tx1), complete, complete-and-begin,
    in doubt, not executed (docs/design.md §tool-calls)."""

    def __init__(self, db: Database, keys: KeyStore, recovery: Recovery) -> None:
        super().__init__(db)
        self.keys = keys
        self.recovery = recovery
        self.intents = SetWrite(self.work_pool, Q.begin_tool_call, INTENT_COLUMNS,
                                {"allowed_statuses": sources(Op.BEGIN_TOOL_CALL)}, journal=False)
        self.chains = SetWrite(self.work_pool, Q.complete_and_begin_tool_call, CHAIN_COLUMNS,
                               {"allowed_statuses": sources(Op.COMPLETE_AND_BEGIN_TOOL_CALL)})

    async def _within_tool_limits(self, conn: asyncpg.Connection, lease: LeaseRef, tool_name: str,
                                  write: Callable[[], Awaitable[Record | None]]) -> Record | None:
        """Runs a Tx1 write (`write`) only when the tool's limits allow one more call: in one transaction,
        the tool's (and the tenant × tool pair's) advisory locks, their counts in a new snapshot, then the
        write. Over a limit: ToolRateLimited with the delay after which a call fits, nothing written."""
        flow = await self.db.flow(conn)
        own, per_tenant = flow.tool_limits_of(tool_name)
        if own is None and not per_tenant:
            return await write()
        tenant, tenant_limit = None, None
        if per_tenant:
            tenant = await fetchval(conn, Q.run_tenant, run_id=lease.run_id)
            tenant_limit = flow.tenant_tool_limits.get(tenant or "", {}).get(tool_name)
        async with conn.transaction():
            await execute(conn, Q.lock_tool_slots, tool_key_1=tool_name,
                          tool_key_2=f"{tenant}/{tool_name}" if tenant_limit is not None else None)
            if own is not None:
                await self._check_tool(conn, tool_name, None, own)
            if tenant_limit is not None:
                await self._check_tool(conn, tool_name, tenant, tenant_limit)
            return await write()

    async def _tx1(self, group: SetWrite, lease: LeaseRef, tool_name: str, values: tuple[Any, ...],
                   journal: Journal) -> Record | None:
        """A write that records an intent (Tx1, alone or chained): shared with the other runs' writes sent
        at the same moment (store/batched.py) when the tool has no limits; a limited tool's write, or one
        the shared statement refused as a whole, goes alone under the tool's advisory locks. Its row, or
        None when it matched nothing."""
        flow = self.db.flow_if_fresh()
        if flow is not None and flow.tool_limits_of(tool_name) == (None, False):
            row = await group.write(lease.run_id, values, journal)
            if row is not ALONE:
                return row  # type: ignore[return-value]
        async with self.work_pool.acquire() as conn:
            return await self._within_tool_limits(conn, lease, tool_name, lambda: group.alone(conn, values, journal))

    async def _check_tool(self, conn: asyncpg.Connection, tool_name: str, tenant: str | None,
                          limit: ToolLimit) -> None:
        rate, window_ms = limit.rate_per_window
        usage = await fetchrow(conn, Q.tool_usage, tool_name=tool_name, tenant_id=tenant, rate=rate,
                               window_ms=window_ms, concurrency=limit.concurrency or 0)
        assert usage is not None
        whose = f"tool {tool_name!r}" + (f" for tenant {tenant!r}" if tenant else "")
        if rate and usage["recent"] >= rate:
            raise ToolRateLimited(f"{whose} is at its rate limit ({limit.rate})",
                                  retry_after_s=max(usage["retry_s"] or 0.0, 0.001), limit="rate", tool=tool_name,
                                  tenant=tenant)
        if limit.concurrency and usage["open"] >= limit.concurrency:
            raise ToolRateLimited(f"{whose} has {limit.concurrency} calls open, its concurrency limit",
                                  retry_after_s=self.settings.tool_concurrency_retry_after_ms / 1000,
                                  limit="concurrency", tool=tool_name, tenant=tenant)

    @db_call
    async def begin_tool_call(self, lease: LeaseRef, write: BeginCall, trace: Trace = NO_TRACE) -> Began:
        """Tx1. `existing` is never a licence to resend. The request is stored as it is (its marked values
        sealed by the edge's filter, scheduler/api/shield.py); its hash is over the plain request, so a replay
        compares equal whichever values are sealed."""
        intent = write.intent
        digest, legacy_digest = request_hashes(intent.tool_name, await self.keys.plain(lease.run_id, intent.request))
        binding = write.binding(lease, digest)
        values = (lease.run_id, lease.worker_id, lease.fencing_token, write.expected_version, intent.step_key,
                  intent.tool_name, intent.idempotency_key, intent.request, digest, legacy_digest, intent.execution_id,
                  intent.event_id, trace.traceparent, trace.tracestate, binding.op, binding.digest)
        row = await self._tx1(self.intents, lease, intent.tool_name, values, NO_JOURNAL)
        if row is not None:
            return Began(ExecutionRow.of(row), False, False)
        async with self.work_pool.acquire() as conn:
            replay = await self.recovery.replay(conn, lease, binding, intent.event_id, "ledger")
            if replay is not None:
                return Began(ExecutionRow.of(replay), True, True)
            existing = await fetchrow(conn, Q.tool_execution_for_step, run_id=lease.run_id, step_key=intent.step_key)
            run = None
            if existing is not None:
                # The existing row is an answer for the live holder only; a stale fence gets LEASE_LOST.
                run = await self.recovery.run_for(conn, lease)
                if run is not None and run["holds_lease"]:
                    return Began(ExecutionRow.of(existing), True, False)
            else:
                by_key = await fetchrow(conn, Q.tool_execution_by_key, tool_name=intent.tool_name,
                                        idempotency_key=intent.idempotency_key)
                if by_key is not None:
                    raise AlreadyExists("idempotency_key is already recorded for another step",
                                        field="idempotency_key")
            refusal = await self.recovery.refusal(conn, Op.BEGIN_TOOL_CALL, lease, write.expected_version, run=run)
            # Recovery.refusal's last resort is a VersionConflict at the expected version ("changed
            # concurrently"): with everything else in order, the decision is what did not match.
            if not (isinstance(refusal, VersionConflict)
                    and refusal.metadata.get("version") == str(write.expected_version)):
                raise refusal
            raise DecisionNotCheckpointed(
                "the current checkpoint does not record this tool decision (step key, tool and request "
                "hash must match its pending_tool); save the decision before calling the tool",
                step_key=intent.step_key, request_hash=digest.hex(),
            )

    @db_call
    async def complete_and_begin_tool_call(self, lease: LeaseRef, write: CompleteAndBegin,
                                           trace: Trace = NO_TRACE) -> Chained:
        """Tx2 of `write.step_key` and Tx1 of `write.intent` in one statement, shared with the other runs'
        chained steps sent at the same moment (scheduler/store/batched.py) when the next tool has no limits.

        Refusals are those of the two halves: LEASE_LOST, RUN_CANCELLED (the
        outcome is kept on the closed row), INVALID_TRANSITION, VERSION_CONFLICT,
        INVALID_ARGUMENT (not waiting on step_key), ALREADY_EXISTS (a ledger row
        for the next step or its idempotency key exists: nothing is written, and
        the caller falls back to Tx2 then Tx1, which answers with that row), and
        DECISION_NOT_CHECKPOINTED (the new checkpoint does not record the next call).
        """
        intent = write.intent
        digest, legacy_digest = request_hashes(
            intent.tool_name, await self.keys.plain(lease.run_id, intent.request))
        binding = write.binding(lease, digest)
        values = (lease.run_id, lease.worker_id, lease.fencing_token, write.expected_version, write.step_key,
                  write.outcome, write.stored, write.state_hash, write.schema_version, write.response,
                  write.remote_resource_id, write.error_code, write.evidence, write.event_id, intent.step_key,
                  intent.tool_name, intent.idempotency_key, digest, legacy_digest, intent.execution_id,
                  intent.request, intent.event_id, trace.traceparent, trace.tracestate, binding.op, binding.digest)
        row = await self._tx1(self.chains, lease, intent.tool_name, values, write.journal)
        if row is not None:
            return Chained(row["cp_version"], ExecutionRow.of(row), False)
        async with self.work_pool.acquire() as conn:
            replay = await self.recovery.replay_all(conn, lease, binding, ((write.event_id, "checkpoint", "event_id"),
                                                                           (intent.event_id, "ledger",
                                                                            "next.event_id")))
            if replay is not None:
                checkpoint, execution = replay
                return Chained(checkpoint["version"], ExecutionRow.of(execution), True)
            refusal = await self.recovery.tool_refusal(
                conn, Op.COMPLETE_AND_BEGIN_TOOL_CALL, lease, write.expected_version, write.step_key,
                close_as=write.close_as, journal=write.journal,
            )
            raise await self._chain_refusal(conn, lease, refusal, write, (digest, legacy_digest))

    @staticmethod
    async def _chain_refusal(conn: asyncpg.Connection, lease: LeaseRef, refusal: Exception, write: CompleteAndBegin,
                             digests: tuple[bytes, bytes]) -> Exception:
        """The last resort is a VersionConflict at the expected version: with the run and the
        completed step in order, the Tx1 half is what did not match. Says which part."""
        if not (isinstance(refusal, VersionConflict)
                and refusal.metadata.get("version") == str(write.expected_version)):
            return refusal
        intent = write.intent
        existing = await fetchrow(conn, Q.tool_execution_for_step, run_id=lease.run_id, step_key=intent.step_key)
        if existing is not None:
            return AlreadyExists(
                f"a ledger row for step {intent.step_key!r} already exists ({existing['status']}); "
                "nothing was written", field="next.step_key", status=existing["status"])
        if await fetchrow(conn, Q.tool_execution_by_key, tool_name=intent.tool_name,
                          idempotency_key=intent.idempotency_key):
            return AlreadyExists("next.idempotency_key is already recorded for another step",
                                 field="next.idempotency_key")
        pending = write.state.get("pending_tool") if isinstance(write.state, dict) else None
        if not (isinstance(pending, dict) and pending.get("step_key") == intent.step_key
                and pending.get("tool_name") == intent.tool_name
                and pending.get("request_hash") in {d.hex() for d in digests}):
            return DecisionNotCheckpointed(
                "the new checkpoint does not record the next tool decision (its pending_tool must "
                "name next.step_key, next.tool_name and the hash of next.request_json); nothing was "
                "written", step_key=intent.step_key, request_hash=digests[0].hex(),
            )
        return refusal

    @db_call
    async def tool_not_executed(self, lease: LeaseRef, write: NotExecuted, trace: Trace = NO_TRACE) -> Completed:
        """Closes the open ledger row NOT_EXECUTED (docs/design.md §in-doubt)."""
        s = self.settings
        binding = write.binding(lease)
        async with self.work_pool.acquire() as conn:
            row = await fenced_write(
                conn, Q.tool_not_executed, **fence_params(lease, Op.TOOL_NOT_EXECUTED),
                expected_version=write.expected_version, step_key=write.step_key, backoff_base_ms=s.backoff_base_ms,
                backoff_cap_ms=s.backoff_cap_ms, backoff_jitter_ms=s.backoff_jitter_ms, error_code=write.error_code,
                evidence=write.evidence, event_id=write.event_id, **trace_params(trace), **binding_params(binding))
            if row is not None:
                return Completed(row["version"], run_status(row["status"]), False)
            replay = await self.recovery.replay(conn, lease, binding, write.event_id, "run")
            if replay is not None:
                return Completed(replay["run_version"], run_status(replay["payload"].get("status", "QUEUED")), True)
            raise await self.recovery.tool_refusal(conn, Op.TOOL_NOT_EXECUTED, lease, write.expected_version,
                                                   write.step_key, close_as=None)

    @db_call
    async def mark_tool_in_doubt(self, lease: LeaseRef, write: InDoubt, trace: Trace = NO_TRACE) -> bool:
        """Freeze on an unknown outcome (docs/design.md §in-doubt). Returns replayed."""
        binding = write.binding(lease)
        async with self.work_pool.acquire() as conn:
            row = await fenced_write(
                conn, Q.mark_tool_in_doubt, **fence_params(lease, Op.MARK_TOOL_IN_DOUBT), step_key=write.step_key,
                error_code=write.error_code, event_id=write.event_id, detail=write.detail, **trace_params(trace),
                **binding_params(binding))
            if row is not None:
                return False
            if await self.recovery.replay(conn, lease, binding, write.event_id, "run") is not None:
                return True
            raise await self.recovery.tool_refusal(conn, Op.MARK_TOOL_IN_DOUBT, lease, None, write.step_key,
                                                   close_as=("IN_DOUBT", None, None, write.error_code))


__all__ = ["ToolWrites"]
