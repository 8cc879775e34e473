"""One experiment's stack: its database, processes, mock tool, broker and evidence, torn down by pid.

A `Suite` owns what the experiments share (the embedded PostgreSQL, the
artifacts directory, versions); a `Lab` is one repetition of one experiment:
a fresh database (migrated by `agentrt migrate`), its own processes and logs,
its own mock tool store, and the evidence record it writes when it closes.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import tempfile
import time
import traceback
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg

from devstack.acceptance.api import SETTLED, STATUS, Api
from devstack.acceptance.evidence import Evidence, component_versions, git_commit, jsonable
from devstack.acceptance.options import LEASE_MS
from devstack.acceptance.procs import PYTHON, CommandLog, ExperimentError, Proc, wait_log, wait_until
from devstack.embedded_pg import POSTGRES_BIN_PATH, EmbeddedPostgres, free_port
from devstack.kafka_testing import TansuBroker, tansu_binary
from shared.db import CONNECTION_ERRORS, init_connection

TENANT = "tenant-acceptance"


def _with_database(url: str, database: str) -> str:
    """`url` naming `database` instead; its query (a multi-host DSN's target_session_attrs) kept."""
    base, _, query = url.partition("?")
    return f"{base.rpartition('/')[0]}/{database}" + (f"?{query}" if query else "")


class Suite:
    """Shared by every experiment of one invocation: the PostgreSQL server and the artifacts directory."""

    def __init__(self, artifacts: Path, lease_ms: int = LEASE_MS, keep_databases: bool = False,
                 ha_strict: bool = False) -> None:
        self.artifacts = artifacts
        self.ha_strict = ha_strict  # experiment 10: Patroni's synchronous_mode_strict
        self.lease_ms = lease_ms
        self.keep_databases = keep_databases
        self.hub = ""  # the network namespace experiment 9 runs in, when it has one
        self._home: Path | None = None
        self.pg: EmbeddedPostgres | None = None
        self.commands = CommandLog()

    async def start(self) -> Suite:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self._home = Path(tempfile.mkdtemp(prefix="agentrt-acceptance-"))
        # fsync on: experiment 7 restarts the server with `-m immediate` and checks committed work survived.
        self.pg = await asyncio.to_thread(EmbeddedPostgres(self._home / "pg", fsync=True).start)
        self.commands.add(f"pg_ctl -D {self.pg.data_dir} start  # embedded PostgreSQL on port {self.pg.port}")
        return self

    @property
    def versions(self) -> dict[str, str]:
        return component_versions(str(POSTGRES_BIN_PATH), tansu_binary())

    async def stop(self) -> None:
        if self.pg is not None:
            await asyncio.to_thread(self.pg.stop, "fast")
        if self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)

    def admin_url(self) -> str:
        assert self.pg is not None
        return self.pg.url("postgres")


class MockTool:
    """The mock tool server process and a reader of its own SQLite store."""

    def __init__(self, proc: Proc, url: str, db_path: Path) -> None:
        self.proc, self.url, self.db_path = proc, url, db_path

    def rows(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        if not self.db_path.exists():
            return []
        conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=10)
        try:
            cursor = conn.execute(sql, args)
            names = [c[0] for c in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        finally:
            conn.close()

    def requests(self, tool: str | None = None) -> list[dict[str, Any]]:
        return self.rows("SELECT id, kind, tool, idempotency_key, fence, run_id, step_key, received_at, outcome, "
                         "http_status FROM requests WHERE (? IS NULL OR tool = ?) ORDER BY id", tool, tool)

    def calls_by_key(self, tool: str | None = None) -> dict[str, int]:
        rows = self.rows("SELECT idempotency_key AS k, count(*) AS n FROM requests WHERE kind = 'call' "
                         "AND (? IS NULL OR tool = ?) GROUP BY idempotency_key", tool, tool)
        return {r["k"]: r["n"] for r in rows}

    def executions(self, tool: str | None = None) -> dict[str, int]:
        rows = self.rows("SELECT idempotency_key AS k, count(*) AS n FROM executions WHERE (? IS NULL OR tool = ?) "
                         "GROUP BY idempotency_key", tool, tool)
        return {r["k"]: r["n"] for r in rows}

    def fault(self, tool: str, mode: str, count: int = 1, latency_ms: int = 0, hold_ms: int = 30_000) -> None:
        body = json.dumps({"tool": tool, "mode": mode, "count": count, "latency_ms": latency_ms,
                           "hold_ms": hold_ms}).encode()
        request = urllib.request.Request(f"{self.url}/_faults", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200
        self.proc.commands.add(f"curl -X POST {self.url}/_faults -d '{body.decode()}'")


class Lab:
    """One repetition of one experiment."""

    def __init__(self, suite: Suite, exp_id: str, title: str, repetition: int, expected: str,
                 injection: str) -> None:
        self.suite = suite
        self.dir = suite.artifacts / f"e{exp_id}-r{repetition}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.commands = CommandLog()
        self.ev = Evidence(experiment_id=exp_id, title=title, repetition=repetition, expected_invariant=expected,
                           fault_injection_point=injection, git_commit=git_commit(), versions=suite.versions,
                           tenant_id=TENANT, lease_duration_ms=suite.lease_ms,
                           heartbeat_interval_ms=suite.lease_ms // 3)
        self.procs: list[Proc] = []
        self.databases: list[str] = []
        self.db_url = ""
        self.db: asyncpg.Connection | None = None
        self.api: Api | None = None
        self.scheduler_addr = ""
        self.pg_url = suite.admin_url()
        self.brokers: list[TansuBroker] = []

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Lab:
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None:
            self.ev.error = f"{type(exc).__name__}: {exc}"
            (self.dir / "error.txt").write_text("".join(traceback.format_exception(exc)))
        await self.close()
        return exc is not None and not isinstance(exc, asyncio.CancelledError | KeyboardInterrupt)

    async def close(self) -> None:
        for proc in reversed(self.procs):
            await asyncio.to_thread(proc.stop, 10)
        for broker in self.brokers:
            await asyncio.to_thread(broker.stop)
        if self.api is not None:
            await self.api.close()
        if self.db is not None and not self.db.is_closed():
            await self.db.close()
        if not self.suite.keep_databases:
            for name in self.databases:
                try:
                    await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                except (OSError, asyncpg.PostgresError) as exc:
                    self.commands.add(f"-- could not drop database {name}: {exc}")
        self.ev.commands_executed = self.commands.entries
        self.ev.processes = [p.summary() for p in self.procs]
        self.ev.log_paths = {p.name: str(p.log_path) for p in self.procs}
        self.ev.log_paths.update({f"broker-{i}": str(b.log_path) for i, b in enumerate(self.brokers)})
        self.ev.finish().write(self.dir)

    # ------------------------------------------------------------------ PostgreSQL

    async def _admin(self, statement: str) -> None:
        conn = await asyncpg.connect(self.pg_url, timeout=30)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    async def database(self, suffix: str = "") -> str:
        name = f"acc_e{self.ev.experiment_id}_r{self.ev.repetition}{suffix}_{uuid.uuid4().hex[:8]}"
        await self._admin(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return _with_database(self.pg_url, name)

    async def runtime_database(self) -> str:
        """A fresh database with agentrt's schema, migrated by the CLI; the lab's SQL connection on it."""
        self.db_url = await self.database()
        argv = [PYTHON, "-m", "cli", "migrate", "--database-url", self.db_url]
        self.commands.add(f"python -m cli migrate --database-url {self.db_url}")
        done = await asyncio.to_thread(_run, argv)
        if done[0] != 0:
            raise ExperimentError(f"migrate failed: {done[1]}")
        await self.reconnect()
        return self.db_url

    async def api_key(self, tenant: str, role: str) -> str:
        """A real API key of `tenant`, made by the CLI as an operator bootstrapping would."""
        argv = [PYTHON, "-m", "cli", "keys", "create", "--database-url", self.db_url, "--tenant", tenant,
                "--role", role, "--name", f"acceptance {tenant}", "--json"]
        self.commands.add(" ".join(argv[1:]))
        done = await asyncio.to_thread(_run_out, argv)
        if done[0] != 0:
            raise ExperimentError(f"keys create failed: {done[2][-300:]}")
        return str(json.loads(done[1])["secret"])

    async def reconnect(self, within: float = 60) -> asyncpg.Connection:
        async def connect() -> asyncpg.Connection | None:
            try:
                conn = await asyncpg.connect(self.db_url, timeout=5)
            except (*CONNECTION_ERRORS, asyncpg.PostgresError):
                return None
            await init_connection(conn)
            return conn

        if self.db is not None and not self.db.is_closed():
            await self.db.close()
        self.db = await wait_until(connect, within, "a connection to PostgreSQL", interval=0.2)
        return self.db

    async def sql(self, query: str, *args: Any, note: str = "") -> list[asyncpg.Record]:
        """Runs a query and records it with its result in the evidence."""
        rows = await self.fetch(query, *args)
        self.ev.query(query, args, [dict(r) for r in rows], note)
        return rows

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        assert self.db is not None
        try:
            return list(await self.db.fetch(query, *args))
        except CONNECTION_ERRORS:  # shared.db's table: a restart, a switchover, a failover
            await self.reconnect()
            return list(await self.db.fetch(query, *args))

    async def value(self, query: str, *args: Any) -> Any:
        rows = await self.fetch(query, *args)
        return rows[0][0] if rows else None

    # ------------------------------------------------------------------ processes

    def spawn(self, name: str, argv: list[str], env: dict[str, str], prefix: list[str] | None = None) -> Proc:
        proc = Proc(name, argv, env, self.dir / f"{name}.log", self.commands, prefix).start()
        self.procs.append(proc)
        return proc

    async def scheduler(self, name: str = "scheduler", listen_host: str = "127.0.0.1", port: int = 0,
                        prefix: list[str] | None = None, **settings: Any) -> Proc:
        port = port or free_port()
        env = {"AGENTRT_DATABASE_URL": self.db_url, "AGENTRT_LISTEN_ADDR": f"{listen_host}:{port}",
               "AGENTRT_LEASE_DURATION_MS": str(self.suite.lease_ms), "AGENTRT_CLAIM_POLL_INTERVAL_MS": "100",
               "AGENTRT_BACKOFF_BASE_MS": "200", "AGENTRT_BACKOFF_CAP_MS": "2000", "AGENTRT_BACKOFF_JITTER_MS": "50",
               "AGENTRT_SHUTDOWN_GRACE_S": "1", "AGENTRT_DB_COMMAND_TIMEOUT_S": "10",
               # The experiments submit runs before (or while no) executor serves them: recovery is
               # under test here, not admission (tests/integration/scheduler/test_agent_registry.py is).
               "AGENTRT_REQUIRE_REGISTERED_AGENTS": "false",
               # Not about authentication; experiment 6 starts its scheduler with auth_mode api_key.
               "AGENTRT_AUTH_MODE": "none"}
        env.update({f"AGENTRT_{k.upper()}": str(v) for k, v in settings.items()})
        proc = self.spawn(name, [PYTHON, "-m", "cli", "scheduler"], env, prefix)
        await wait_log(proc, "scheduler listening on", 60)
        if not self.scheduler_addr:
            self.scheduler_addr = f"127.0.0.1:{port}"
            self.api = Api(self.scheduler_addr)
        return proc

    async def executor(self, name: str, agents: Path, faults: Sequence[str] = (), slots: int = 4,
                       scheduler_addr: str = "", prefix: list[str] | None = None, module: str = "cli",
                       wait: bool = True, **settings: Any) -> Proc:
        env = {"AGENTRT_SCHEDULER_ADDR": scheduler_addr or self.scheduler_addr, "AGENTRT_AGENTS_PATH": str(agents),
               "AGENTRT_WORKER_ID": f"{name}-{uuid.uuid4().hex[:6]}", "AGENTRT_HEALTH_ADDR": "",
               "AGENTRT_SLOTS": str(slots), "AGENTRT_CLAIM_WAIT_MS": "1000", "AGENTRT_RPC_TIMEOUT_S": "5",
               "AGENTRT_SHUTDOWN_GRACE_S": "2"}
        if faults:
            env["AGENTRT_FAULT_POINTS"] = json.dumps(list(faults))
            env["AGENTRT_FAULT_ACTION"] = "sigkill"
        env.update({f"AGENTRT_{k.upper()}": str(v) for k, v in settings.items()})
        argv = [PYTHON, "-m", module] + (["executor"] if module == "cli" else [])
        proc = self.spawn(name, argv, env, prefix)
        if wait:
            await wait_log(proc, "serving", 60)
        return proc

    def worker_id(self, proc: Proc) -> str:
        return proc.env["AGENTRT_WORKER_ID"]

    async def mocktool(self, name: str = "mocktool", host: str = "127.0.0.1", url_host: str = "",
                       prefix: list[str] | None = None) -> MockTool:
        port = free_port()
        db_path = self.dir / f"{name}.sqlite"
        proc = self.spawn(name, [PYTHON, "-m", "cli", "mocktool", "--host", host, "--port", str(port),
                                 "--db", str(db_path)], {}, prefix)
        await wait_log(proc, "listening on", 60)
        return MockTool(proc, f"http://{url_host or ('127.0.0.1' if host == '0.0.0.0' else host)}:{port}", db_path)

    async def broker(self, port: int | None = None) -> TansuBroker:
        broker = TansuBroker(port=port, log_path=self.dir / f"tansu-{len(self.brokers)}.log")
        await asyncio.to_thread(broker.start)
        self.brokers.append(broker)
        self.commands.add(f"tansu broker --listener-url tcp://{broker.bootstrap} --storage-engine memory://tansu/"
                          f"  # pid {broker.pid}")
        return broker

    async def relay(self, name: str, bootstrap: str, topic: str, fault_point: str = "", wait: bool = True,
                    **settings: Any) -> Proc:
        env = {"AGENTRT_DATABASE_URL": self.db_url, "AGENTRT_KAFKA_BOOTSTRAP": bootstrap, "AGENTRT_TOPIC": topic,
               "AGENTRT_RELAY_ID": f"{name}-{uuid.uuid4().hex[:6]}", "AGENTRT_HEALTH_ADDR": "127.0.0.1:0",
               "AGENTRT_SHARD_COUNT": "16", "AGENTRT_SHARD_LEASE_MS": "3000", "AGENTRT_IDLE_POLL_MS": "200",
               "AGENTRT_KAFKA_REQUEST_TIMEOUT_MS": "3000", "AGENTRT_LAG_REPORT_INTERVAL_S": "2",
               "AGENTRT_STARTUP_TIMEOUT_S": "20", "AGENTRT_RETRY_BACKOFF_BASE_MS": "50",
               "AGENTRT_RETRY_BACKOFF_CAP_MS": "1000", "AGENTRT_SHUTDOWN_GRACE_S": "3"}
        if fault_point:
            env["AGENTRT_FAULT_POINT"] = fault_point
        env.update({f"AGENTRT_{k.upper()}": str(v) for k, v in settings.items()})
        proc = self.spawn(name, [PYTHON, "-m", "cli", "relay"], env)
        if wait:
            await wait_log(proc, "started: topic", 60)
        return proc

    async def consumer(self, name: str, database_url: str, bootstrap: str, topic: str) -> Proc:
        env = {"AGENTRT_DATABASE_URL": database_url, "AGENTRT_KAFKA_BOOTSTRAP": bootstrap, "AGENTRT_TOPICS": topic,
               "AGENTRT_GROUP_ID": f"acceptance-{uuid.uuid4().hex[:6]}", "AGENTRT_DEAD_LETTER_TOPIC": f"{topic}.dlq",
               "AGENTRT_FETCH_MAX_WAIT_MS": "50", "AGENTRT_SESSION_TIMEOUT_MS": "6000",
               "AGENTRT_HEARTBEAT_INTERVAL_MS": "1000", "AGENTRT_RETRY_BACKOFF_BASE_MS": "50",
               "AGENTRT_RETRY_BACKOFF_CAP_MS": "1000", "AGENTRT_STARTUP_TIMEOUT_S": "30",
               "AGENTRT_KAFKA_REQUEST_TIMEOUT_MS": "5000"}
        proc = self.spawn(name, [PYTHON, "-m", "devstack.acceptance.consumer_app"], env)
        await wait_log(proc, "consumer ready", 60)
        return proc

    # ------------------------------------------------------------------ runs

    async def submit(self, agent: str, payload: dict[str, Any] | None = None, tenant: str = TENANT) -> str:
        assert self.api is not None
        run = await self.api.submit(tenant, agent, payload or {})
        self.ev.run_ids.append(run.run_id)
        self.commands.add(f"grpc RunService.SubmitRun agent={agent} tenant={tenant} -> run {run.run_id}")
        return str(run.run_id)

    async def wait_settled(self, run_id: str, within: float = 60, statuses: set[int] = SETTLED,
                           tenant: str = TENANT) -> Any:
        assert self.api is not None
        api = self.api
        try:
            return await wait_until(lambda: api.settled(tenant, run_id, statuses), within,
                                    f"run {run_id} in {sorted(STATUS(s) for s in statuses)}", interval=0.1)
        except ExperimentError:
            run = await self.fetch("SELECT status, pause_reason, terminal_reason, fencing_token, version, "
                                   "lease_owner FROM agent_runs WHERE id = $1", uuid.UUID(run_id))
            raise ExperimentError(f"run {run_id} did not settle within {within:g}s: "
                                  f"{jsonable([dict(r) for r in run])}") from None

    async def run_row(self, run_id: str) -> dict[str, Any]:
        rows = await self.fetch("SELECT * FROM agent_runs WHERE id = $1", uuid.UUID(run_id))
        return dict(rows[0]) if rows else {}

    async def snapshot(self, run_id: str, note: str) -> dict[str, Any]:
        """The run's row, checkpoint versions and ledger rows (recorded): what a stale write must not change."""
        rid = uuid.UUID(run_id)
        run = await self.sql("SELECT status, version, fencing_token, lease_owner, current_step_key, updated_at "
                             "FROM agent_runs WHERE id = $1", rid, note=f"{note}: run row")
        checkpoints = await self.sql("SELECT version, fencing_token, schema_version, encode(state_hash, 'hex') AS hash "
                                     "FROM agent_checkpoints WHERE run_id = $1 ORDER BY version", rid,
                                     note=f"{note}: checkpoints")
        ledger = await self.sql("SELECT step_key, tool_name, idempotency_key, status, fencing_token, error_code, "
                                "reconciliation_evidence FROM tool_executions WHERE run_id = $1 ORDER BY step_key",
                                rid, note=f"{note}: tool ledger")
        events = await self.value("SELECT count(*) FROM outbox WHERE run_id = $1", rid)
        return jsonable({"run": dict(run[0]) if run else {}, "checkpoints": [dict(r) for r in checkpoints],
                         "ledger": [dict(r) for r in ledger], "outbox_events": events})

    def record_mock(self, mock: MockTool, tool: str | None = None) -> list[dict[str, Any]]:
        rows = mock.requests(tool)
        self.ev.mock_tool_request_log = jsonable(rows)
        return rows

    def elapsed(self) -> float:
        return time.monotonic() - self.commands.started


def _run_out(argv: list[str]) -> tuple[int, str, str]:
    import subprocess

    from devstack.acceptance.procs import REPO_ROOT, clean_env

    done = subprocess.run(argv, cwd=REPO_ROOT, env=clean_env({}), capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


def _run(argv: list[str]) -> tuple[int, str]:
    import subprocess

    from devstack.acceptance.procs import REPO_ROOT, clean_env

    done = subprocess.run(argv, cwd=REPO_ROOT, env=clean_env({}), capture_output=True, text=True, timeout=120)
    return done.returncode, (done.stdout + done.stderr)[-2000:]
