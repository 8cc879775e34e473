"""Data keys of runs and schedules with sensitive values (security/sealing.py): create, unwrap (cached), rotate.

A data key is unwrapped with the keyring once per scheduler process and run (bounded cache);
rotation re-wraps keys in batches under FOR UPDATE SKIP LOCKED, one short transaction each,
so submits, claims and reads go on meanwhile (they never lock a key row).
"""

from __future__ import annotations

import os
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scheduler.security.sealing import (
    KeyError_,
    Keyring,
    RunKey,
    Sensitivity,
    Unopened,
    has_sealed,
    load_keyring,
    transform,
)
from scheduler.store.core import WORK_SCOPE, Database, Repository, db_call, log
from scheduler.store.queries import Q
from shared.canonical import canonical_json
from shared.db import Query, execute, fetch, fetchrow
from shared.errors import EncryptionKeyMissing, SealedValueInvalid

_NO_KEY = object()


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else canonical_json(value)


@dataclass(frozen=True)
class NewKey:
    """A fresh run data key: plain (to seal the input with) and wrapped (to store)."""

    key: RunKey
    key_id: str
    wrapped: bytes


@dataclass(frozen=True)
class Rotated:
    rewrapped: int
    remaining: dict[str, int]  # keys per KEK id after the pass


class KeyStore(Repository):
    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._keyring: Keyring | object | None = _NO_KEY
        self._keys: OrderedDict[uuid.UUID, RunKey | None] = OrderedDict()
        # Called with the field of every sealed value that did not open (the server counts them:
        # agentrt_sealed_value_failures_total).
        self.on_integrity_failure: Callable[[str], None] | None = None

    def integrity_failure(self, field: str, owner: str) -> SealedValueInvalid:
        """The one place a sealed value that does not open is logged and counted; the caller raises the
        error (or, where one bad value must not hold up the rest, skips it)."""
        log.warning("sealed value integrity failure: %s of %s does not open under its data key "
                    "(copied from another run or altered at rest)", field, owner)
        if self.on_integrity_failure is not None:
            self.on_integrity_failure(field)
        return SealedValueInvalid(field, owner)

    def keyring(self) -> Keyring:
        if self._keyring is _NO_KEY:
            secret = self.settings.encryption_keys
            self._keyring = load_keyring(self.settings.encryption_keys_file,
                                         secret.get_secret_value() if secret is not None else None)
        if not isinstance(self._keyring, Keyring):
            raise EncryptionKeyMissing(
                "the agent marks sensitive fields but the scheduler has no encryption keys "
                "(set encryption_keys_file or AGENTRT_ENCRYPTION_KEYS)")
        return self._keyring

    def new_run_key(self, run_id: uuid.UUID, sensitivity: Sensitivity) -> NewKey:
        data_key = os.urandom(32)
        key_id, wrapped = self.keyring().wrap(data_key)
        key = RunKey(run_id, data_key, sensitivity)
        self._remember(run_id, key)
        return NewKey(key, key_id, wrapped)

    def schedule_key(self, schedule_id: uuid.UUID, key_id: str | None, wrapped: bytes | None) -> RunKey | None:
        """A schedule's plain data key (its id the associated data, as a run's is); None: nothing sealed."""
        if key_id is None or wrapped is None:
            return None
        try:
            plain = self.keyring().unwrap(key_id, bytes(wrapped))
        except KeyError_ as exc:
            raise EncryptionKeyMissing(f"schedule {schedule_id}: {exc}") from None
        return RunKey(schedule_id, plain, Sensitivity())

    def _remember(self, run_id: uuid.UUID, key: RunKey | None) -> None:
        cache = self._keys
        cache[run_id] = key
        cache.move_to_end(run_id)
        while len(cache) > self.settings.data_key_cache_size:
            cache.popitem(last=False)

    def known_keyless(self, run_id: uuid.UUID) -> None:
        """The run holds no data key (its claim read so): `run_key` answers None without a query. A run's
        key is written with the run itself, never later, so this stays true."""
        self._remember(run_id, None)

    def keyless(self, run_id: uuid.UUID) -> bool:
        """Whether the run is known (from the cache) to hold no data key; False when not known."""
        return run_id in self._keys and self._keys[run_id] is None

    @db_call
    async def run_key(self, run_id: uuid.UUID) -> RunKey | None:
        """The run's plain data key; None: it holds no sealed values."""
        cache = self._keys
        if run_id in cache:
            cache.move_to_end(run_id)
            return cache[run_id]
        # The work pool: the caller has already checked the run's tenant (RunService) or holds its lease.
        async with self.work_pool.acquire() as conn:
            row = await fetchrow(conn, Q.run_data_key, run_id=run_id)
            sealed = await fetch(conn, Q.run_sealed_values, run_id=run_id) if row is not None else []
        key = None
        if row is not None:
            try:
                plain = self.keyring().unwrap(row["key_id"], bytes(row["wrapped_key"]))
            except KeyError_ as exc:
                raise EncryptionKeyMissing(f"run {run_id}: {exc}") from None
            key = RunKey(run_id, plain, Sensitivity.of_json(row["sensitive"]))
            # Every marked value the run holds (its input, ledger, signals and human input): a string that
            # contains one is sealed wherever it goes.
            for where, value in (("input_json", row["input"]), *((r["field"], r["value"]) for r in sealed)):
                transform(value, lambda text, k=key, f=where: self._learn(k, f, text))
        self._remember(run_id, key)
        return key

    async def plain(self, run_id: uuid.UUID, value: Any) -> Any:
        """`value` with the run's sealed values opened (what a request hash is taken over)."""
        if self.keyless(run_id):
            return value
        key = await self.run_key(run_id) if has_sealed(canonical_json(value)) else None
        return value if key is None else key.unseal(value)

    def _learn(self, key: RunKey, field: str, sealed: str) -> None:
        """One of the run's sealed values known in the clear; one that does not open is logged, counted and
        skipped (its plain text is no value of this run: every call on the run must not fail for it)."""
        try:
            key.secrets.add(_as_text(key.open(sealed)))
        except Unopened:
            self.integrity_failure(field, f"run {key.run_id}")

    @db_call
    async def rotate_keys(self, *, after: uuid.UUID | None = None, max_batches: int | None = None) -> Rotated:
        """Re-wraps every data key wrapped by another KEK than the keyring's current one: the runs',
        then the schedules' (migration 0018); `max_batches` counts both."""
        ring = self.keyring()
        runs, batches = await self._rotate(ring, "run", Q.data_keys_to_rotate, Q.rewrap_data_keys, "run_id",
                                           "run_ids", after, max_batches)
        schedules, _ = await self._rotate(ring, "schedule", Q.schedule_keys_to_rotate, Q.rewrap_schedule_keys, "id",
                                          "ids", None, None if max_batches is None else max_batches - batches)
        self._keys.clear()
        return Rotated(runs + schedules, await self.data_key_counts())

    async def _rotate(self, ring: Keyring, what: str, select: Query, rewrap: Query, id_column: str, ids_param: str,
                      after: uuid.UUID | None, max_batches: int | None) -> tuple[int, int]:
        """One kind of data key re-wrapped in SKIP LOCKED batches in id order: (keys, batches)."""
        current = ring.current_key_id()
        position, rewrapped, batches = after or uuid.UUID(int=0), 0, 0
        while max_batches is None or batches < max_batches:
            async with self.work_pool.acquire() as conn, conn.transaction():
                await execute(conn, Q.set_scope, scope=WORK_SCOPE)  # every tenant's keys (a CLI's pool has no scope)
                rows = await fetch(conn, select, current_key_id=current, after=position,
                                   batch=self.settings.rotate_batch)
                if not rows:
                    break
                wrapped: list[bytes] = []
                for row in rows:
                    try:
                        plain = ring.unwrap(row["key_id"], bytes(row["wrapped_key"]))
                    except KeyError_ as exc:
                        raise EncryptionKeyMissing(f"{what} {row[id_column]}: {exc}; keep that key in the keyring "
                                                 "until rotation has finished") from None
                    wrapped.append(ring.wrap(plain)[1])
                await execute(conn, rewrap, current_key_id=current, old_key_ids=[r["key_id"] for r in rows],
                              wrapped_keys=wrapped, **{ids_param: [r[id_column] for r in rows]})
            rewrapped += len(rows)
            batches += 1
            position = rows[-1][id_column]
        return rewrapped, batches

    @db_call
    async def data_key_counts(self) -> dict[str, int]:
        async with self.work_pool.acquire() as conn, conn.transaction():
            await execute(conn, Q.set_scope, scope=WORK_SCOPE)
            rows: list[Any] = await fetch(conn, Q.data_key_counts)
        return {r["key_id"]: int(r["keys"]) for r in rows}
