"""A lost database connection answers UNAVAILABLE from every store method, never INTERNAL.

The store reaches PostgreSQL through a TCP relay on loopback; cutting the relay resets the pooled
connections and refuses new ones, as a database host that went away does. Every read method then
raises `Unavailable` (gRPC UNAVAILABLE, which clients retry), and a sweep over the store's methods
finds none that takes a connection without the `db_call` mapping.
"""
import asyncio
import inspect
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from scheduler.config import SchedulerSettings
from scheduler.store import LeaseRef, RunFilter, Store, connect_pool
from scheduler.store.core import Database, Repository, db_call
from shared.errors import Unavailable

TENANT = "acme"


class Relay:
    """Bytes both ways between loopback clients and the database; `cut` resets every stream and stops
    listening, so a reconnect is refused."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()
        await self.server.wait_closed()


def _through(db_url: str, port: int) -> str:
    parts = urlsplit(db_url)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))


LEASE = LeaseRef(run_id=uuid.uuid4(), worker_id="w-1", fencing_token=1)
READS: dict[str, Callable[[Store], Awaitable[Any]]] = {
    "read_journal": lambda s: s.work.read_journal(LEASE, after_seq=0, page_size=10, page_bytes=1 << 16),
    "read_journal_compact": lambda s: s.work.read_journal_compact(LEASE, after_seq=0, page_size=10, page_bytes=1 << 16),
    "tool_results": lambda s: s.work.tool_results(LEASE, ["step-1"], answer_bytes=1 << 16),
    "get_run": lambda s: s.runs.get_run(TENANT, uuid.uuid4()),
    "list_runs": lambda s: s.runs.list_runs(TENANT, RunFilter(), after=None, limit=10),
    "history": lambda s: s.runs.history(TENANT, uuid.uuid4()),
    "run_tree": lambda s: s.children.run_tree(TENANT, uuid.uuid4(), limit=10),
    "run_for_request": lambda s: s.runs.run_for_request(TENANT, "req-1"),
    "tenant_stats": lambda s: s.runs.tenant_stats(TENANT),
    "tenant_flow": lambda s: s.limits.tenant_flow(TENANT),
    "global_stats": lambda s: s.runs.global_stats(),
    "current_flow": lambda s: s.db.current_flow(),
    "list_schedules": lambda s: s.schedules.list_schedules(TENANT),
    "list_limits": lambda s: s.limits.list_limits(),
    "list_api_keys": lambda s: s.auth.list_api_keys(within=(TENANT,), include_revoked=False, after=None, limit=10),
    "list_audit": lambda s: s.auth.list_audit(tenant_id=TENANT, run_id=None, principal=None, action=None, since=None,
                                              until=None, before_id=None, limit=10),
    "registered_agents": lambda s: s.registry.registered_agents(),
    "live_agent_versions": lambda s: s.registry.live_agent_versions("demo"),
    "key_for_auth": lambda s: s.auth.key_for_auth(uuid.uuid4()),
    "run_key": lambda s: s.keys.run_key(uuid.uuid4()),
    "data_key_counts": lambda s: s.keys.data_key_counts(),
    "retention_policies": lambda s: s.runs.retention_policies(),
    "database_epoch": lambda s: s.auth.database_epoch(),
}


async def test_every_read_answers_unavailable_once_the_connection_is_lost(db_url: str) -> None:
    host, port = urlsplit(db_url).hostname, urlsplit(db_url).port
    if host is None or port is None or host.startswith("/"):
        pytest.fail(f"the test database is not reachable over TCP: {db_url}")
    relay = Relay(host, port)
    url = _through(db_url, await relay.start())
    pool = await connect_pool(url, min_size=2, max_size=2, scope="work")
    try:
        store = Store(pool, SchedulerSettings(database_url=url, limits_refresh_ms=0), work_pool=pool)
        assert await store.auth.database_epoch() > 0  # the relay carries the pool's connections
        assert await store.runs.list_runs(TENANT, RunFilter(), after=None, limit=10) == []
        await relay.cut()
        answers: dict[str, str] = {}
        for name, call in READS.items():
            try:
                await asyncio.wait_for(call(store), timeout=20)
                answers[name] = "answered"
            except Unavailable:
                answers[name] = "UNAVAILABLE"
            except Exception as exc:  # what the RPC layer would answer INTERNAL
                answers[name] = f"{type(exc).__name__}: {exc}"
        wrong = {name: answer for name, answer in answers.items() if answer != "UNAVAILABLE"}
        assert wrong == {}, wrong
    finally:
        pool.terminate()


_DB_CALL = db_call(asyncio.sleep).__code__
_TAKES_A_CONNECTION = re.compile(r"\b(?:pool|work_pool)\.acquire\(|\b(?:tenant_tx|admin_tx)\(")


def test_every_store_method_that_takes_a_connection_maps_its_loss() -> None:
    """The sweep: a public coroutine of any part of the store (the shared Database and every repository a
    Store wires) that acquires a connection itself carries db_call."""
    wired = Store(None, SchedulerSettings(database_url="postgresql://127.0.0.1/unused")).repositories()  # type: ignore[arg-type]
    parts = [Database, *Repository.__subclasses__()]
    assert {type(part) for part in wired.values()} == set(parts[1:]), "a repository the Store does not wire"
    unmapped, swept = [], 0
    for part in parts:
        for name, member in inspect.getmembers(part):
            if name.startswith("_"):
                continue
            function = getattr(member, "__wrapped__", member)
            if not inspect.iscoroutinefunction(function):
                continue
            if not _TAKES_A_CONNECTION.search(inspect.getsource(function)):
                continue
            swept += 1
            if member.__code__ is not _DB_CALL:
                unmapped.append(f"{part.__name__}.{name}")
    assert swept >= 50, swept
    assert unmapped == [], f"store methods that answer INTERNAL on a lost connection: {unmapped}"
