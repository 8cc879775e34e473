"""Many runs' fenced writes as one statement: the set form of a write, shared by concurrent calls.

A set-form statement (`begin_tool_call`, `complete_and_begin_tool_call` and `complete_tool_call_and_end`
in scheduler/sql/queries.sql) takes parallel arrays, one element per run's write, judges each element by
the same fenced guard as a write of its own, and returns one row per element it wrote, with that
element's ordinal `n` (from 1). `SetWrite` gathers the calls that reach it in the same turn of the event
loop (the items of one WriteBatch, or concurrent calls of several executors) and sends them as one
statement: one round trip, one plan run, one commit for all of them, where each call alone costs all three.

What each call gets back is what a statement of its own would have given it:

- its row, when its write matched: it committed;
- None, when its write matched nothing (a stale fence, a conflict): nothing of it was written, and the
  caller explains the refusal on its own (scheduler/store/recovery.py), as for any fenced write;
- `ALONE`, when the statement as a whole was refused (a unique key, an assert, a deadlock, any database
  error of one element refuses the whole transaction): nothing was written for anyone, and each caller
  sends its write again by itself (`SetWrite.alone`), so one bad write never refuses its neighbours;
- the error itself when the database was lost (shared.db's CONNECTION_ERRORS), as its own statement
  would have raised it: the caller's `db_call` answers UNAVAILABLE and expires stale sessions, and the
  executor's retry with the same event ids finds what committed.

A caller that leaves (its RPC cancelled) before the statement is sent, even while the statement waits
for a connection, is left out of it.

A run appears at most once per statement (a second write of the same run waits for the next one), and
the elements go in run id order, so two statements tend to lock their runs in one order (a deadlock
between them is a statement refused as a whole, answered as above: nothing is lost). Each write keeps its own
trace context in its rows (traceparent, tracestate); the shared statement's own SQL span (`trace_sql`) is
in the trace of the write that opened it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import asyncpg
from asyncpg import Record

from scheduler.store.core import fenced_write
from scheduler.store.types import NO_JOURNAL, Journal
from shared.db import CONNECTION_ERRORS, Query, fetch
from shared.tracing import annotate

ALONE: Final = object()  # the shared statement was refused as a whole: send this write by itself


@dataclass(slots=True)
class _Pending:
    run_id: uuid.UUID
    values: tuple[Any, ...]
    journal: Journal
    done: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class SetWrite:
    """The calls of one set-form write that arrive together, sent as one statement (module docstring).

    `columns` names the statement's per-element array parameters in the order of each call's
    `values`; `constants` are parameters every element shares (the transition table's sources).
    `journal=False`: the statement appends no journal entries (and takes no journal parameters).
    """

    def __init__(self, pool: asyncpg.Pool, query: Query, columns: Sequence[str], constants: dict[str, Any], *,
                 journal: bool = True, max_items: int = 64) -> None:
        self._pool = pool
        self._query = query
        self._columns = tuple(columns)
        self._journal = journal
        self._constants = constants
        self._max_items = max_items
        self._pending: list[_Pending] = []
        self._scheduled = False
        self._running: set[asyncio.Task[None]] = set()
        self.statements = 0  # shared statements run, and the writes they carried (for tests and benches)
        self.writes = 0
        self.alone_writes = 0  # writes sent again by themselves after their shared statement was refused

    async def write(self, run_id: uuid.UUID, values: tuple[Any, ...], journal: Journal) -> Record | object | None:
        """This call's row, None (matched nothing) or ALONE (send it again by itself)."""
        pending = _Pending(run_id, values, journal)
        self._pending.append(pending)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._start)
        row = await pending.done
        if isinstance(row, Record):
            annotate(tenant_id=row["tenant_id"])  # on the caller's span, as fenced_write does for a write alone
        return row

    async def alone(self, conn: asyncpg.Connection, values: tuple[Any, ...], journal: Journal) -> Record | None:
        """One write as a statement of its own on `conn` (in the caller's transaction, if any)."""
        self.alone_writes += 1
        return await fenced_write(conn, self._query, **self._params([(values, journal)]))

    def _start(self) -> None:
        self._scheduled = False
        batch: list[_Pending] = []
        later: list[_Pending] = []
        runs: set[uuid.UUID] = set()
        for pending in self._pending:
            if pending.done.done():
                continue  # its caller is gone before anything was sent: nothing to write
            if pending.run_id in runs or len(batch) >= self._max_items:
                later.append(pending)
            else:
                runs.add(pending.run_id)
                batch.append(pending)
        self._pending = later
        if later:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._start)
        if batch:
            task = asyncio.ensure_future(self._send(sorted(batch, key=lambda p: p.run_id)))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _send(self, batch: list[_Pending]) -> None:
        live: list[_Pending] = []
        try:
            async with self._pool.acquire() as conn:
                live = [pending for pending in batch if not pending.done.done()]  # gone while waiting: not sent
                if not live:
                    return
                rows = await fetch(conn, self._query, **self._params([(p.values, p.journal) for p in live]))
        except CONNECTION_ERRORS as exc:  # the database is gone: each caller hears it as its own statement would
            _answer(batch, exc)
            return
        except Exception:  # refused as a whole: each caller tries alone, and hears why
            _answer(batch, ALONE)
            return
        except BaseException:  # this task is cancelled (shutdown): what it sent may have committed; alone, each
            _answer(batch, ALONE)  # caller writes or finds its rows
            raise
        self.statements += 1
        self.writes += len(live)
        by_n = {row["n"]: row for row in rows}
        for n, pending in enumerate(live, start=1):
            if not pending.done.done():
                pending.done.set_result(by_n.get(n))

    def _params(self, elements: Sequence[tuple[tuple[Any, ...], Journal]]) -> dict[str, Any]:
        """The statement's parameters: each column's array, and every element's journal entries in
        Journal's own parameters, with `journal_items` saying whose (the element's ordinal)."""
        columns: list[list[Any]] = [[] for _ in self._columns]
        journal: dict[str, list[Any]] = {}
        if self._journal:
            journal = {name: [] for name in ("journal_items", *NO_JOURNAL.params)}
        for n, (values, entries) in enumerate(elements, start=1):
            for column, value in zip(columns, values, strict=True):
                column.append(value)
            if not self._journal:
                assert not entries, "this statement appends no journal entries"
                continue
            journal["journal_items"].extend([n] * len(entries))
            for name, entry_values in entries.params.items():
                journal[name].extend(entry_values)
        return {**self._constants, **dict(zip(self._columns, columns, strict=True)), **journal}


def _answer(batch: list[_Pending], answer: object) -> None:
    """Every caller of `batch` still waiting gets `answer`: ALONE, or the exception to raise."""
    for pending in batch:
        if pending.done.done():
            continue
        if isinstance(answer, BaseException):
            pending.done.set_exception(answer)
        else:
            pending.done.set_result(answer)
