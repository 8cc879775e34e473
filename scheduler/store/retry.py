"""RetryRun's side of the store: a new run from a FAILED or CANCELLED one (migration 0020).

The new run repeats the old one's agent and version, input, labels, priority, budget limits and
max_attempts, in its tenant, and names it in retry_of_run_id. Its deadline is not repeated (an
absolute time, passed by now as a rule). What the agent marks sensitive is never copied sealed
under the old key, nor written in the clear: each sealed value of the old input is opened with
the old run's data key and sealed again under the new run's own (scheduler/security/sealing.py), and the
new run gets a data key whenever the old one had one, so its tool values are sealed as the old
run's were. The run is made by submit_run (tenant quota, fair share), its audit row (run.retry,
on the old run) in the same transaction.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
from asyncpg import Record

from scheduler.security.sealing import Unopened, transform
from scheduler.states import RunStatus
from scheduler.store.auth import run_state, write_audit
from scheduler.store.core import Database, Repository, db_call, request_event_id
from scheduler.store.keys import KeyStore
from scheduler.store.queries import Q
from scheduler.store.rows import Submitted
from scheduler.store.runs import RunStore
from scheduler.store.types import AuditEntry, SealedSubmit, SubmitSpec
from shared.canonical import canonical_json, uuid7
from shared.db import fetchrow
from shared.errors import AlreadyExists, InvalidTransition, NotFound
from shared.tracing import NO_TRACE, Trace

RETRYABLE = frozenset({RunStatus.FAILED, RunStatus.CANCELLED})


def retry_request_id(run_id: uuid.UUID, request_id: str) -> str:
    """The new run's client_request_id for a RetryRun named by `request_id`: the same for every retry of
    the call, so the run it made is found by the tenant's unique request index, for as long as it exists."""
    return f"retry-{request_event_id(run_id, 'RetryRun', request_id)}"


class RetryStore(Repository):
    """RetryRun: a new run from a FAILED or CANCELLED one, submitted through `runs`."""

    def __init__(self, db: Database, runs: RunStore, keys: KeyStore) -> None:
        super().__init__(db)
        self.runs = runs
        self.keys = keys

    @db_call
    async def _old_run(self, tenant_id: str, run_id: uuid.UUID) -> Record:
        async with self.db.tenant_tx(tenant_id, readonly=True) as conn:
            row = await fetchrow(conn, Q.get_run, run_id=run_id, tenant_id=tenant_id)
        if row is None:
            raise NotFound(f"run {run_id} not found", run_id=run_id)
        return row

    async def retry_run(self, tenant_id: str, run_id: uuid.UUID, *, request_id: str | None,
                        trace: Trace = NO_TRACE, audit: AuditEntry | None = None) -> Submitted:
        """A new run from the FAILED or CANCELLED run `run_id`; InvalidTransition for any other status.
        With `request_id`, a retry of the call answers the run its first attempt made (created False)."""
        old = await self._old_run(tenant_id, run_id)
        client_request_id = retry_request_id(run_id, request_id) if request_id else f"generated-{uuid7()}"
        if request_id is not None:
            earlier = await self.runs.run_for_request(tenant_id, client_request_id)
            if earlier is not None:
                if earlier.retry_of_run_id != run_id:
                    raise AlreadyExists("request_id names another request's run", field="request_id",
                                        run_id=earlier.id)
                return Submitted(earlier, False)
        status = RunStatus(old["status"])
        if status not in RETRYABLE:
            raise InvalidTransition(f"run {run_id} is {status.value}: only a FAILED or CANCELLED run can be retried",
                                    run_id=run_id, status=status.value)
        stored, sealed = await self._sealed_again(old, uuid7())
        spec = SubmitSpec(
            agent_name=old["agent_name"], agent_version=old["agent_version"], input=stored,
            client_request_id=client_request_id, max_attempts=old["max_attempts"], labels=dict(old["labels"] or {}),
            max_steps=old["budget_max_steps"], max_tokens=old["budget_max_tokens"],
            max_cost_usd=old["budget_max_cost_usd"], priority=old["priority"],
            concurrency_key=old["concurrency_key"], concurrency_max=old["concurrency_max"], sealed=sealed,
            retry_of=run_id)

        async def audited(conn: asyncpg.Connection, new: Record) -> None:
            if audit is not None:
                state = run_state(old)
                await write_audit(conn, audit, tenant_id=tenant_id, action="run.retry", run_id=run_id, before=state,
                                  after={**(state or {}), "retry_run_id": str(new["id"])},
                                  evidence={"retry_run_id": str(new["id"])}, trace=trace,
                                  run_version=old["version"], fencing_token=old["fencing_token"])

        submitted = await self.runs.submit_run(tenant_id, spec, trace, created=audited)
        if submitted.run.retry_of_run_id != run_id:  # a SubmitRun that chose this client_request_id itself
            raise AlreadyExists("request_id names another request's run", field="request_id",
                                run_id=submitted.run.id)
        return submitted

    async def _sealed_again(self, old: Record, new_id: uuid.UUID) -> tuple[Any, SealedSubmit | None]:
        """The old run's input with each sealed value sealed again under a new data key of `new_id`
        (None: the old run has no data key, its input is copied as it is)."""
        key = await self.keys.run_key(old["id"])
        if key is None:
            return old["input"], None
        made = self.keys.new_run_key(new_id, key.sensitivity)

        def again(text: str) -> Any:
            try:
                plain = key.open(text)
            except Unopened:
                raise self.keys.integrity_failure("input_json", f"run {old['id']}") from None
            made.key.secrets.add(plain if isinstance(plain, str) else canonical_json(plain))
            return made.key.seal(plain)

        stored = transform(old["input"], again)
        return stored, SealedSubmit(run_id=new_id, input=stored, key_id=made.key_id, wrapped_key=made.wrapped,
                                    sensitive=key.sensitivity.to_json())


__all__ = ["RETRYABLE", "RetryStore", "retry_request_id"]
