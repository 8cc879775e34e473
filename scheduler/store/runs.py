"""The RunService side of the store: submit, read, list, cancel, resume, resolve, history, stats.

Operator paths (cancel, resume, resolve) lock the run row, check the
transition table in code, then write, in one explicit transaction. No network
call other than to PostgreSQL ever happens while a run row is locked.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from asyncpg import Record

from scheduler.config import SubmitQuota
from scheduler.states import LEASED, TERMINAL, Op, RunStatus, transition
from scheduler.store.auth import run_state, write_audit
from scheduler.store.children import ChildStore
from scheduler.store.core import (
    Database,
    Repository,
    db_call,
    insert_event,
    lock_tenant_run,
    replayed_request,
    request_event_id,
    trace_params,
)
from scheduler.store.keys import KeyStore
from scheduler.store.queries import Q
from scheduler.store.rows import (
    CheckpointRow,
    DbHealth,
    DbTableHealth,
    EventRow,
    ExecutionRow,
    GlobalStats,
    JournalRow,
    Pruned,
    Purged,
    Resolved,
    RunRow,
    Signalled,
    SignalRow,
    Submitted,
    TenantStats,
)
from scheduler.store.types import (
    HISTORY_PARTS,
    HISTORY_START,
    AuditEntry,
    History,
    HistoryCursor,
    HistoryPage,
    ResolveOutcome,
    RunFilter,
    SubmitSpec,
)
from shared.canonical import content_hash, content_hash_matches, sha256_of, uuid7
from shared.db import DB_STATS, execute, fetch, fetchrow, fetchval
from shared.errors import (
    AlreadyExists,
    InvalidArgument,
    InvalidTransition,
    NotFound,
    QuotaExceeded,
    RunEnded,
    Unavailable,
)
from shared.tracing import NO_TRACE, Trace

_RESOLVE_OP = {"SUCCEEDED": Op.RESOLVE_SUCCEEDED, "NOT_EXECUTED": Op.RESOLVE_NOT_EXECUTED,
               "UNKNOWN": Op.RESOLVE_UNKNOWN}


class RunStore(Repository):
    """RunService's reads and operator writes: submit, get, list, history, cancel, resume, signal, resolve,
    stats, retention and health."""

    def __init__(self, db: Database, keys: KeyStore) -> None:
        super().__init__(db)
        self.keys = keys

    @db_call
    async def submit_run(self, tenant_id: str, spec: SubmitSpec, trace: Trace = NO_TRACE,
                         created: Callable[[asyncpg.Connection, Record], Awaitable[None]] | None = None) -> Submitted:
        """Creates the run, or answers a retried submit with its run. Over a tenant quota
        (settings.submit_quota): QuotaExceeded, and nothing is written. `created` runs in the
        transaction that made the run (RetryRun's audit row)."""
        digest = spec.submit_hash() if spec.client_request_id else None
        async with self.db.tenant_tx(tenant_id) as conn:
            flow = await self.db.flow(conn)
            quota, step = flow.submit_quota(tenant_id), flow.fair_step(tenant_id)
            if not quota.active:
                row = await self._insert_run(conn, tenant_id, spec, digest, step, trace)
                existing = None if row is not None else await fetchrow(
                    conn, Q.get_run_by_client_request, tenant_id=tenant_id, client_request_id=spec.client_request_id)
            else:
                await execute(conn, Q.lock_tenant_submits, tenant_id=tenant_id)
                # A retried submit is answered before any quota: it creates nothing.
                existing = None if spec.client_request_id is None else await fetchrow(
                    conn, Q.get_run_by_client_request, tenant_id=tenant_id,
                    client_request_id=spec.client_request_id)
                row = None
                if existing is None:
                    await self._check_quota(conn, tenant_id, quota)
                    row = await self._insert_run(conn, tenant_id, spec, digest, step, trace)
                    assert row is not None, "the tenant's lock admits one submit of an id at a time"
            if row is not None:
                if created is not None:
                    await created(conn, row)
                return Submitted(RunRow.of(row), True)
        if existing is None:  # deleted between the two statements: retention never deletes runs
            raise Unavailable("submit raced with a concurrent change; retry")
        if not content_hash_matches(bytes(existing["submit_hash"]), spec.submit_identity()):
            raise AlreadyExists(
                "client_request_id was already used with a different payload",
                client_request_id=spec.client_request_id, run_id=existing["id"],
            )
        return Submitted(RunRow.of(existing), False)

    async def _insert_run(self, conn: asyncpg.Connection, tenant_id: str, spec: SubmitSpec, digest: bytes | None,
                          fair_step: float, trace: Trace) -> Record | None:
        sealed = spec.sealed
        return await fetchrow(
            conn, Q.submit_run, run_id=sealed.run_id if sealed else uuid7(), tenant_id=tenant_id,
            agent_name=spec.agent_name, agent_version=spec.agent_version,
            input=sealed.input if sealed else spec.input, labels=spec.labels,
            key_id=sealed.key_id if sealed else None, wrapped_key=sealed.wrapped_key if sealed else None,
            sensitive=sealed.sensitive if sealed else None,
            max_attempts=spec.max_attempts, max_steps=spec.max_steps, max_tokens=spec.max_tokens,
            max_cost_usd=spec.max_cost_usd, deadline_at=spec.deadline_at,
            client_request_id=spec.client_request_id, submit_hash=digest, event_id=uuid7(),
            priority=spec.priority, concurrency_key=spec.concurrency_key, concurrency_max=spec.concurrency_max,
            retry_of_run_id=spec.retry_of, fair_step=fair_step, **trace_params(trace))

    async def _check_quota(self, conn: asyncpg.Connection, tenant_id: str, quota: SubmitQuota) -> None:
        """Under the tenant's submit lock: raises QuotaExceeded when this submit would pass a quota."""
        counts = await fetchrow(conn, Q.submit_quota, tenant_id=tenant_id, max_queued=quota.max_queued_runs,
                                max_rate=quota.max_submits_per_s)
        assert counts is not None
        if quota.max_queued_runs and counts["queued"] >= quota.max_queued_runs:
            raise QuotaExceeded(
                f"tenant {tenant_id!r} has {quota.max_queued_runs} queued runs, its limit (max_queued_runs); "
                "retry once some have started", retry_after_s=self.settings.queue_full_retry_after_ms / 1000,
                limit="max_queued_runs", tenant=tenant_id, max=quota.max_queued_runs)
        if quota.max_submits_per_s and counts["recent"] >= quota.max_submits_per_s:
            raise QuotaExceeded(
                f"tenant {tenant_id!r} submitted {quota.max_submits_per_s} runs in the last second, its limit "
                "(max_submits_per_s)", retry_after_s=counts["rate_retry_s"] or 0.001,
                limit="max_submits_per_s", tenant=tenant_id, max=quota.max_submits_per_s)

    @db_call
    async def run_for_request(self, tenant_id: str, client_request_id: str) -> RunRow | None:
        """The tenant's run submitted with `client_request_id`, if any."""
        async with self.db.tenant_tx(tenant_id) as conn:
            row = await fetchrow(conn, Q.get_run_by_client_request, tenant_id=tenant_id,
                                 client_request_id=client_request_id)
        return RunRow.of(row) if row is not None else None

    @db_call
    async def get_run(self, tenant_id: str, run_id: uuid.UUID) -> RunRow:
        async with self.db.tenant_tx(tenant_id) as conn:
            row = await fetchrow(conn, Q.get_run, run_id=run_id, tenant_id=tenant_id)
        if row is None:
            raise NotFound(f"run {run_id} not found", run_id=run_id)
        return RunRow.of(row)

    @db_call
    async def list_runs(self, tenant_id: str, where: RunFilter, *, after: tuple[dt.datetime, uuid.UUID] | None,
                        limit: int) -> list[RunRow]:
        async with self.db.tenant_tx(tenant_id) as conn:
            rows = await fetch(conn, Q.list_runs, tenant_id=tenant_id, **where.params(),
                               after_created_at=after[0] if after else None, after_id=after[1] if after else None,
                               limit=limit)
        return [RunRow.of(row) for row in rows]

    @db_call
    async def cancel_run(self, tenant_id: str, run_id: uuid.UUID, *, reason: str, request_id: str | None = None,
                         trace: Trace = NO_TRACE, audit: AuditEntry | None = None,
                         keep_children: bool = False) -> RunRow:
        """Ends a run, or flags a leased one for its holder; audited when it changes the run
        (a repeated cancel changes nothing and writes no audit row). Its unended descendants
        (through children not spawned detached) are cancelled with it, in its transaction:
        locked deepest first and the run last, the order in which a child that ends locks
        itself and then its parent (migration 0014). A `request_id` names the run's own cancel
        event: a retry answers the run; the same id with another reason is ALREADY_EXISTS.
        `keep_children`: the run alone (bound by its request_id too)."""
        named = None if request_id is None else (request_event_id(run_id, "CancelRun", request_id), content_hash(
            {"reason": reason, **({"keep_children": True} if keep_children else {})}))
        async with self.db.tenant_tx(tenant_id) as conn:
            if await fetchrow(conn, Q.get_run, run_id=run_id, tenant_id=tenant_id) is None:
                raise NotFound(f"run {run_id} not found", run_id=run_id)
            if named is not None and await replayed_request(conn, named[0], "CancelRun", named[1]):
                return RunRow.of(await lock_tenant_run(conn, tenant_id, run_id))
            for descendant in [] if keep_children else await ChildStore.cancellable_descendants(conn, run_id):
                child = await fetchrow(conn, Q.lock_run, run_id=descendant)
                if child is not None and child["tenant_id"] == tenant_id:
                    await self._cancel_locked(conn, child, f"parent {run_id} cancelled: {reason}", trace)
            run = await lock_tenant_run(conn, tenant_id, run_id)
            updated = await self._cancel_locked(conn, run, reason, trace, named=named)
            if audit is not None and updated is not run:
                await self._audit_run(conn, audit, "run.cancel", run, updated, trace)
            return RunRow.of(updated)

    async def _cancel_locked(self, conn: asyncpg.Connection, run: Any, reason: str, trace: Trace, *,
                             named: tuple[uuid.UUID, bytes] | None = None) -> Any:
        """Cancels the locked `run`: ends it, or flags it when leased; `run` itself when nothing changes.
        `named`: the event id and request hash of a CancelRun that names its request."""
        event_id, bound = (None, None) if named is None else (named[0], ("CancelRun", named[1]))
        status = RunStatus(run["status"])
        if status in TERMINAL and run["cancel_requested_at"] is not None:
            return run  # cancelled already: a retried cancel answers with the outcome
        if status in LEASED:
            if run["cancel_requested_at"] is not None:
                return run  # already flagged: cancelling twice is not an error
            transition(status, Op.REQUEST_CANCEL)
            updated = await fetchrow(conn, Q.request_cancel, run_id=run["id"], reason=reason)
            assert updated is not None
            await insert_event(conn, updated, "agent.cancel_requested", {"reason": reason}, trace,
                              event_id=event_id, bound=bound)
            return updated
        target = transition(status, Op.CANCEL)
        updated = await fetchrow(conn, Q.end_run, run_id=run["id"], status=target.value,
                                 reason=f"cancelled: {reason}", cancel=True, cancel_reason=reason)
        assert updated is not None
        await insert_event(conn, updated, "agent.run_cancelled",
                          {"reason": reason, "intents_in_doubt": updated["doubted_intents"]}, trace,
                          event_id=event_id, bound=bound)
        return updated

    @db_call
    async def signal_run(self, tenant_id: str, run_id: uuid.UUID, *, name: str, payload: Any,
                         request_id: str | None, trace: Trace = NO_TRACE) -> Signalled:
        """Queues a signal for a run that has not ended (docs/design.md §signals).

        Idempotent by `request_id` per run: the same id with the same name and
        payload answers with the signal queued first (even once the run has
        ended); with another name or payload, ALREADY_EXISTS. Under the run's
        row lock, so it meets the FinishRun that parks the run on one row.
        """
        signal_id = uuid7()
        request_id = request_id or str(signal_id)
        signal_identity = {"name": name, "payload": payload}
        digest = content_hash(signal_identity)
        async with self.db.tenant_tx(tenant_id) as conn:
            run = await lock_tenant_run(conn, tenant_id, run_id)
            existing = await fetchrow(conn, Q.signal_by_request, run_id=run_id, request_id=request_id)
            if existing is not None:
                if not content_hash_matches(bytes(existing["request_hash"]), signal_identity):
                    raise AlreadyExists("request_id was already used for another signal to this run",
                                        request_id=request_id, signal_id=existing["signal_id"])
                return Signalled(SignalRow.of_row(existing), RunRow.of(run), False, False)
            if RunStatus(run["status"]) in TERMINAL:
                raise RunEnded(f"run {run_id} is {run['status']}: it takes no more signals", run_id=run_id,
                               status=run["status"])
            row = await fetchrow(conn, Q.insert_signal, signal_id=signal_id, run_id=run_id, tenant_id=tenant_id,
                                 name=name, payload=payload, request_id=request_id, request_hash=digest)
            assert row is not None
            woke = run["status"] == RunStatus.QUEUED and run["awaiting_signal"] == name
            updated = await fetchrow(conn, Q.lock_run, run_id=run_id)
            assert updated is not None
            await insert_event(conn, updated, "agent.signal_received",
                              {"seq": row["id"], "signal_id": str(signal_id), "name": name,
                               "request_id": request_id, "woke": woke}, trace)
            return Signalled(SignalRow.of_row(row), RunRow.of(updated), True, woke)

    @staticmethod
    async def _audit_run(conn: asyncpg.Connection, audit: AuditEntry, action: str, before: Record,
                         after: Record, trace: Trace, *, step_key: str | None = None,
                         evidence: dict[str, Any] | None = None,
                         extra: tuple[dict[str, Any], dict[str, Any]] | None = None) -> None:
        state_before, state_after = run_state(before) or {}, run_state(after) or {}
        if extra is not None:
            state_before, state_after = {**state_before, **extra[0]}, {**state_after, **extra[1]}
        await write_audit(conn, audit, tenant_id=after["tenant_id"], action=action, run_id=after["id"],
                          step_key=step_key, before=state_before, after=state_after, evidence=evidence,
                          trace=trace, run_version=after["version"], fencing_token=after["fencing_token"])

    @db_call
    async def resume_run(self, tenant_id: str, run_id: uuid.UUID, *, human_input: dict[str, Any],
                         request_id: str | None = None, trace: Trace = NO_TRACE,
                         audit: AuditEntry | None = None) -> RunRow:
        """A person's answer to a paused run. A `request_id` names it: a retry whose first attempt
        committed answers the run as it is now (never INVALID_TRANSITION); the same id with another
        answer is ALREADY_EXISTS. The request hash is over the plain answer (sealing is not
        deterministic)."""
        event_id, bound = None, None
        if request_id is not None:
            plain = {**human_input, "input": await self.keys.plain(run_id, human_input.get("input"))}
            event_id = request_event_id(run_id, "ResumeRun", request_id)
            bound = ("ResumeRun", content_hash(plain))
        async with self.db.tenant_tx(tenant_id) as conn:
            run = await lock_tenant_run(conn, tenant_id, run_id)
            if event_id is not None and bound is not None and await replayed_request(conn, event_id, *bound):
                return RunRow.of(run)
            transition(run["status"], Op.RESUME)
            updated = await fetchrow(conn, Q.resume_run, run_id=run_id, human_input=human_input)
            assert updated is not None
            await insert_event(conn, updated, "agent.run_resumed",
                              {"decision": human_input.get("decision"),
                               "operator": human_input.get("operator")}, trace, event_id=event_id, bound=bound)
            if audit is not None:
                action = "run.reject" if human_input.get("decision") == "REJECT" else "run.resume"
                await self._audit_run(conn, audit, action, run, updated, trace,
                                      evidence={"decision": human_input.get("decision")})
            await execute(conn, Q.notify_work, agent_name=updated["agent_name"])
            return RunRow.of(updated)

    @db_call
    async def resolve_tool_execution(
        self, tenant_id: str, run_id: uuid.UUID, *, step_key: str, outcome: ResolveOutcome, result: Any,
        remote_resource_id: str | None, evidence: dict[str, Any], resolved_by: str, event_id: uuid.UUID | None,
        trace: Trace = NO_TRACE, audit: AuditEntry | None = None,
    ) -> Resolved:
        """Applies evidence to an IN_DOUBT ledger row, atomically with the run's move
        (docs/design.md §in-doubt).

        SUCCEEDED writes the result and a new checkpoint (the latest state with
        the result recorded under tool_results[step_key] and pending_tool cleared),
        like Tx2, and re-queues the run. NOT_EXECUTED closes the row (kept, with
        evidence) and re-queues. UNKNOWN records the evidence and keeps the pause.

        A run on checkpoint schema 2 or later keeps tool answers in the ledger
        only: SUCCEEDED's checkpoint is the latest state without pending_tool and
        with journal_len counting a "result" journal entry appended with it;
        NOT_EXECUTED appends that entry without a checkpoint (the next holder
        learns of it through the lease's journal_length).
        """
        event_id = event_id or uuid7()
        # Over the plain values: the edge seals marked ones anew at each attempt (a fresh nonce).
        binding = sha256_of({"run_id": str(run_id), "step_key": step_key, "outcome": outcome,
                             "result": await self.keys.plain(run_id, result),
                             "remote_resource_id": remote_resource_id,
                             "evidence": await self.keys.plain(run_id, evidence),
                             "resolved_by": resolved_by})
        async with self.db.tenant_tx(tenant_id) as conn:
            previous = await fetchrow(conn, Q.event_by_id, event_id=event_id)
            if previous is not None:
                if previous["run_id"] != run_id or previous["event_type"] != "agent.tool_resolved":
                    raise InvalidArgument("event_id", "already used for another write")
                if previous["write_hash"] is not None and bytes(previous["write_hash"]) != binding:
                    raise AlreadyExists("event_id was already used for another resolution (another payload); "
                                        "nothing was written", field="event_id")
                run = await lock_tenant_run(conn, tenant_id, run_id)
                execution = await fetchrow(conn, Q.tool_execution_for_step, run_id=run_id, step_key=step_key)
                return Resolved(RunRow.of(run), ExecutionRow.of(execution))  # type: ignore[arg-type]
            run = before = await lock_tenant_run(conn, tenant_id, run_id)
            transition(run["status"], _RESOLVE_OP[outcome])
            execution = await fetchrow(conn, Q.lock_tool_execution, run_id=run_id, step_key=step_key)
            if execution is None:
                raise NotFound(f"no tool execution for step {step_key!r} of run {run_id}", step_key=step_key)
            if execution["status"] != "IN_DOUBT":
                raise InvalidTransition(
                    f"tool execution {step_key!r} is {execution['status']}, only IN_DOUBT rows are resolved",
                    status=execution["status"],
                )
            execution = await fetchrow(
                conn, Q.resolve_tool_execution, run_id=run_id, step_key=step_key,
                status="IN_DOUBT" if outcome == "UNKNOWN" else outcome,
                response=result if outcome == "SUCCEEDED" else None, remote_resource_id=remote_resource_id,
                evidence=evidence, resolved_by=resolved_by)
            assert execution is not None
            if outcome != "UNKNOWN":
                run = await self._requeue_resolved(conn, run, execution, step_key=step_key, outcome=outcome,
                                                   result=result, remote_resource_id=remote_resource_id,
                                                   resolved_by=resolved_by, event_id=event_id)
            await insert_event(conn, run, "agent.tool_resolved",
                              {"step_key": step_key, "outcome": outcome, "resolved_by": resolved_by,
                               "evidence": evidence}, trace, event_id=event_id,
                              bound=("ResolveToolExecution", binding))
            if audit is not None:
                await self._audit_run(conn, audit, "tool.resolve", before, run, trace, step_key=step_key,
                                      evidence={"outcome": outcome, "evidence": evidence,
                                                "remote_resource_id": remote_resource_id},
                                      extra=({"execution": "IN_DOUBT"}, {"execution": execution["status"]}))
            return Resolved(RunRow.of(run), ExecutionRow.of(execution))

    async def _requeue_resolved(self, conn: asyncpg.Connection, run: Record, execution: Record, *, step_key: str,
                                outcome: ResolveOutcome, result: Any, remote_resource_id: str | None,
                                resolved_by: str, event_id: uuid.UUID) -> Record:
        """A definite resolution's checkpoint (SUCCEEDED), journal entry (schema 2) and the run back to QUEUED."""
        run_id = run["id"]
        version = run["version"]
        latest = await fetchrow(conn, Q.latest_checkpoint, run_id=run_id)
        schema_version = latest["schema_version"] if latest else run["checkpoint_schema_version"]
        journaled = schema_version >= 2
        if outcome == "SUCCEEDED":
            state = dict(latest["state_json"]) if latest else {}
            state.pop("pending_tool", None)
            if journaled:
                state["journal_len"] = run["journal_length"] + 1
            else:
                results = dict(state.get("tool_results") or {})
                results[step_key] = {"status": "SUCCEEDED", "response": result,
                                     "remote_resource_id": remote_resource_id, "resolved_by": resolved_by}
                state["tool_results"] = results
            version += 1
            await execute(conn, Q.insert_checkpoint, run_id=run_id, version=version, state=state,
                          state_hash=sha256_of(state), schema_version=schema_version,
                          fencing_token=run["fencing_token"], event_id=event_id)
        if journaled:
            detail: dict[str, Any] = {"status": outcome, "resolved_by": resolved_by}
            if outcome == "SUCCEEDED":
                detail["remote_resource_id"] = remote_resource_id
            await execute(conn, Q.append_journal_entry, run_id=run_id, seq=run["journal_length"] + 1, kind="result",
                          step_key=step_key, node="", tool=execution["tool_name"], detail=detail,
                          fencing_token=run["fencing_token"], run_version=version)
        requeued = await fetchrow(conn, Q.requeue_resolved, run_id=run_id, version=version,
                                  journal_added=1 if journaled else 0)
        assert requeued is not None
        await execute(conn, Q.notify_work, agent_name=requeued["agent_name"])
        return requeued

    @db_call
    async def record_export(self, tenant_id: str, run_id: uuid.UUID, *, parts: frozenset[str], audit: AuditEntry,
                            trace: Trace = NO_TRACE) -> None:
        """The audit row (and event) of an export of the run's history, before any of it is read."""
        await self._record_read(tenant_id, run_id, "run.export", {"parts": sorted(parts)}, audit, trace)

    @db_call
    async def record_reveal(self, tenant_id: str, run_id: uuid.UUID, *, rpc: str, audit: AuditEntry,
                            trace: Trace = NO_TRACE) -> None:
        """The audit row (and event) of a read that shows the run's sensitive values, before the read."""
        await self._record_read(tenant_id, run_id, "run.reveal", {"rpc": rpc}, audit, trace)

    async def _record_read(self, tenant_id: str, run_id: uuid.UUID, action: str, evidence: dict[str, Any],
                           audit: AuditEntry, trace: Trace) -> None:
        async with self.db.tenant_tx(tenant_id) as conn:
            run = await fetchrow(conn, Q.get_run, run_id=run_id, tenant_id=tenant_id)
            if run is None:
                raise NotFound(f"run {run_id} not found", run_id=run_id)
            state = run_state(run)
            await write_audit(conn, audit, tenant_id=tenant_id, action=action, run_id=run_id, before=state,
                              after=state, evidence=evidence, trace=trace,
                              run_version=run["version"], fencing_token=run["fencing_token"])

    @db_call
    async def history(self, tenant_id: str, run_id: uuid.UUID, *, parts: frozenset[str] = frozenset(HISTORY_PARTS),
                      cursor: HistoryCursor = HISTORY_START, page_size: int = 100,
                      page_bytes: int = 4 << 20) -> HistoryPage:
        """One page of a run's history: up to `page_size` items of each part in `parts`, after `cursor`.

        The page stops adding items past `page_bytes` of JSON (one item at least, so
        every page moves on). Returns the page and the cursor of the next one
        (`exhausted` when nothing is left). One snapshot for the whole page.
        """
        async with self.db.tenant_tx(tenant_id, isolation="repeatable_read", readonly=True) as conn:
            run = await fetchrow(conn, Q.get_run, run_id=run_id, tenant_id=tenant_id)
            if run is None:
                raise NotFound(f"run {run_id} not found", run_id=run_id)
            page_rows = await self._history_rows(conn, run_id, parts, cursor, page_size + 1)
        taken: dict[str, list[Record]] = {part: [] for part in HISTORY_PARTS}
        used = 0
        more: dict[str, bool] = {}
        for part in HISTORY_PARTS:
            rows = page_rows.get(part, [])
            for row in rows[:page_size]:
                size = row["page_bytes"] or 0
                if used and used + size > page_bytes:
                    break
                taken[part].append(row)
                used += size
            more[part] = len(taken[part]) < len(rows)
        last = {part: taken[part][-1] if taken[part] else None for part in HISTORY_PARTS}
        checkpoints, executions, events = last["checkpoints"], last["tool_executions"], last["events"]
        entry = last["journal"]
        next_cursor = HistoryCursor(
            checkpoints=None if "checkpoints" not in page_rows or not more["checkpoints"] else (
                checkpoints["version"] if checkpoints else cursor.checkpoints),
            tool_executions=None if "tool_executions" not in page_rows or not more["tool_executions"] else (
                (executions["outbound_intent_at"], executions["id"]) if executions else cursor.tool_executions),
            events=None if "events" not in page_rows or not more["events"] else (
                events["id"] if events else cursor.events),
            journal=None if "journal" not in page_rows or not more["journal"] else (
                entry["seq"] if entry else cursor.journal),
        )
        history = History(run=RunRow.of(run), checkpoints=[CheckpointRow.of(r) for r in taken["checkpoints"]],
                           executions=[ExecutionRow.of(r) for r in taken["tool_executions"]],
                           events=[EventRow.of(r) for r in taken["events"]],
                           journal=[JournalRow(*r) for r in taken["journal"]])
        return HistoryPage(history, next_cursor)

    @staticmethod
    async def _history_rows(conn: asyncpg.Connection, run_id: uuid.UUID, parts: frozenset[str],
                            cursor: HistoryCursor, limit: int) -> dict[str, list[Record]]:
        """Up to `limit` rows of each part asked for and not exhausted, after its cursor."""
        page_rows: dict[str, list[Record]] = {}
        if "checkpoints" in parts and cursor.checkpoints is not None:
            page_rows["checkpoints"] = await fetch(conn, Q.history_checkpoints, run_id=run_id,
                                                   after_version=cursor.checkpoints, limit=limit)
        after = cursor.tool_executions
        if "tool_executions" in parts and after is not None:
            after_at, after_id = after if isinstance(after, tuple) else (None, None)
            page_rows["tool_executions"] = await fetch(conn, Q.history_tool_executions, run_id=run_id,
                                                       after_at=after_at, after_id=after_id, limit=limit)
        if "events" in parts and cursor.events is not None:
            page_rows["events"] = await fetch(conn, Q.history_events, run_id=run_id, after_id=cursor.events,
                                              limit=limit)
        if "journal" in parts and cursor.journal is not None:
            page_rows["journal"] = await fetch(conn, Q.history_journal, run_id=run_id, after_seq=cursor.journal,
                                               limit=limit)
        return page_rows

    @db_call
    async def global_stats(self) -> GlobalStats:
        async with self.work_pool.acquire() as conn:
            row = await fetchrow(conn, Q.global_stats)
        assert row is not None
        return GlobalStats.of(row)

    @db_call
    async def primary_reachable(self) -> bool:
        """Whether each pool's session answers from a primary that takes writes. A pool whose session
        is on a standby (or a read-only server) drops all its sessions: they reconnect through the
        DSN (with target_session_attrs=read-write, to whichever host is the primary now)."""
        writable = True
        for pool in {id(p): p for p in (self.pool, self.work_pool)}.values():
            if not await fetchval(pool, Q.primary_probe):
                await pool.expire_connections()
                DB_STATS.pools_expired += 1
                writable = False
        return writable

    @db_call
    async def db_health(self, *, slow_ms: float, top: int) -> DbHealth:
        """Database health for operators, in read-only transactions; pg_stat_statements only where it
        is installed and loaded (a server without it in shared_preload_libraries refuses to read it)."""
        async with self.work_pool.acquire() as conn:
            async with conn.transaction(readonly=True):
                server = await fetchrow(conn, Q.db_health_server)
                tables = await fetch(conn, Q.db_health_tables)
            assert server is not None
            health = DbHealth(xid_age=server["xid_age"], wal_bytes=server["wal_bytes"],
                              db_clock_s=server["db_clock_s"], tables=[DbTableHealth.of(r) for r in tables])
            if not server["statements_installed"]:
                return dataclasses.replace(health, statements_problem="pg_stat_statements is not installed")
            try:
                async with conn.transaction(readonly=True):
                    row = await fetchrow(conn, Q.db_slow_statements, slow_ms=slow_ms, top=top)
            except (asyncpg.ObjectNotInPrerequisiteStateError, asyncpg.UndefinedTableError,
                    asyncpg.InsufficientPrivilegeError) as exc:
                return dataclasses.replace(health, statements_problem=f"pg_stat_statements: {exc}")
        assert row is not None
        return dataclasses.replace(health, slow_count=row["slow_count"], slowest=list(row["slowest"]))

    @db_call
    async def tenant_stats(self, tenant_id: str) -> TenantStats:
        async with self.db.tenant_tx(tenant_id) as conn:
            row = await fetchrow(conn, Q.tenant_stats, tenant_id=tenant_id)
        assert row is not None
        return TenantStats.of(row)

    @db_call
    async def prune_checkpoints(self, *, after: uuid.UUID, batch_runs: int, keep_last: int,
                                max_versions_per_run: int) -> Pruned:
        """One pruning statement over the runs after `after` (docs/design.md §checkpoints).

        `behind` counts runs with more to prune than this statement took.
        """
        async with self.work_pool.acquire() as conn:
            row = await fetchrow(conn, Q.prune_checkpoints, after_id=after, batch_runs=batch_runs,
                                 keep_last=keep_last, max_versions=max_versions_per_run)
        assert row is not None
        return Pruned(row["last_id"], row["runs"], row["deleted"], row["behind"])

    @db_call
    async def retention_purge(self, *, max_runs: int, dry_run: bool, after_finished: dt.datetime | None,
                              after_id: uuid.UUID | None) -> Purged:
        """One retention batch (migration 0012's agentrt_retention_purge: one short transaction)."""
        async with self.work_pool.acquire() as conn:
            row = await fetchrow(conn, Q.retention_purge, max_runs=max_runs, dry_run=dry_run,
                                 after_finished=after_finished, after_id=after_id)
        assert row is not None
        return Purged(*row.values())

    # The policies are operator settings under row-level security (migration 0019): read and written in
    # the admin scope, whatever pool the store has (the CLI's has no scope).
    @db_call
    async def retention_policies(self) -> list[Record]:
        async with self.db.admin_tx("retention list") as conn:
            return await fetch(conn, Q.list_retention_policies)

    @db_call
    async def set_retention_policy(self, tenant_id: str, keep_days: int) -> Record:
        async with self.db.admin_tx("retention set") as conn:
            row = await fetchrow(conn, Q.set_retention_policy, tenant_id=tenant_id, keep_days=keep_days)
        assert row is not None
        return row

    @db_call
    async def clear_retention_policy(self, tenant_id: str) -> bool:
        async with self.db.admin_tx("retention clear") as conn:
            return await fetchval(conn, Q.clear_retention_policy, tenant_id=tenant_id) is not None

    @db_call
    async def counter(self, name: str) -> int:
        async with self.work_pool.acquire() as conn:
            value = await fetchval(conn, Q.get_counter, name=name)
        return int(value or 0)


__all__ = ["RunStore"]
