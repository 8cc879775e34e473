"""`agentrt dev`: the whole runtime on one machine, then the after-sales demo on it.

Start order: PostgreSQL (embedded, data kept in --data-dir; or AGENTRT_DATABASE_URL)
→ Kafka (embedded Tansu; or AGENTRT_KAFKA_BOOTSTRAP) → migrations → scheduler,
mock tool server, relay → executors → the events reader → the demo runs.
Every service is its own process, in its own session (a terminal's Ctrl-C
reaches only `agentrt dev`). Ctrl-C / SIGTERM, --exit-after or --exit-when-done
stop them in the reverse order, each by its pid: executors, relay, scheduler,
mock tool server, broker, PostgreSQL. Nothing is left running.

--chaos SIGKILLs a random executor every --chaos-interval seconds (the relay
every fourth time) and starts it again, and every third time makes the label
service drop its connection after creating a label, so some runs go in doubt
and the executors' reconciler settles them by lookup.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.live import Live

from cli import local_config
from cli.events import TailSettings
from devstack import demo, summary
from devstack.dev_args import ports_given, validate
from devstack.embedded_pg import EmbeddedPostgres, free_port, pid_alive, reserve_ports
from devstack.kafka_testing import TansuBroker
from devstack.services import Service, ServiceFailed, start_console
from devstack.watch import EventCounter, View
from shared.client.event_tail import KafkaUnreachable
from shared.client.runs import AgentrtClient
from shared.errors import AgentrtError

EXAMPLE_MODULE = "devstack.examples.refund_triage"  # a code-first agent every dev executor serves too
# Dev-sized timings (a killed executor's runs are taken over within seconds).
# An AGENTRT_* variable set in your environment wins over these.
DEV_DEFAULTS = {
    "AGENTRT_LEASE_DURATION_MS": "5000",
    "AGENTRT_BACKOFF_BASE_MS": "200", "AGENTRT_BACKOFF_CAP_MS": "2000", "AGENTRT_BACKOFF_JITTER_MS": "100",
    "AGENTRT_SHUTDOWN_GRACE_S": "3",
    "AGENTRT_CLAIM_WAIT_MS": "2000",
    "AGENTRT_SLOTS": "8",
    "AGENTRT_RECONCILE_INTERVAL_S": "2",
    "AGENTRT_SHARD_LEASE_MS": "3000",
    "AGENTRT_SHARD_COUNT": "4",
    "AGENTRT_IDLE_POLL_MS": "200",
    "AGENTRT_KAFKA_REQUEST_TIMEOUT_MS": "5000",
}
REFRESH_S = 0.5
PLAIN_EVERY_S = 5.0
STARTUP_TIMEOUT_S = 60.0
KEY_LIFETIME = "12h"  # the session's every-tenant admin key: revoked at stop, expires anyway after this


class StartInterrupted(Exception):
    """Ctrl-C / SIGTERM while the stack was starting: stop what started, say so in one line."""


def wait_gone(pid: int, within_s: float) -> None:
    """pg_ctl returns once postmaster.pid is gone; the postmaster itself exits a moment later."""
    deadline = time.monotonic() + within_s
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def run_dev(args: argparse.Namespace) -> int:
    validate(args)
    return asyncio.run(DevStack(args).main())


class DevStack:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.data_dir: Path = args.data_dir.resolve()
        self.log_dir = self.data_dir / "logs"
        self.session = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]
        self.console = Console()
        self.live_view = self.console.is_terminal and not args.plain
        self.pg: EmbeddedPostgres | None = None
        self.broker: TansuBroker | None = None
        self.database_url = ""
        self.kafka_bootstrap = ""
        self.topic = ""
        self.mock_url = ""
        self.services: list[Service] = []
        self.executors: list[Service] = []
        self.relay: Service | None = None
        self.scheduler: Service | None = None
        self.console_service: Service | None = None  # the operator console (--console)
        self.events: EventCounter | None = None
        self.agent: Any = None
        self.runs: list[demo.DemoRun] = []
        self.chaos = summary.ChaosCounts() if args.chaos else None
        self.view: View | None = None
        self.broker_pid: int | None = None
        self.postgres_pid: int | None = None
        self.settled_once = False
        self.api_key: str | None = None  # the session's admin key (--auth api_key)
        self.work_token: str | None = None  # the session's executor token (--auth api_key)
        self.api_key_id: str | None = None  # revoked at stop
        self.stop = asyncio.Event()  # set by Ctrl-C / SIGTERM
        self.leftover_key_id = local_config.leftover_key_id(self.data_dir)
        self.paused: list[Any] = []  # the tenant's other runs waiting for a person (RunInfo), newest first
        self.announced: set[str] = set()  # of those, the ones --plain has printed

    def say(self, text: str) -> None:
        if self.view is not None and self.live_view:
            self.view.note(text)
        else:
            print(text, flush=True)

    # ------------------------------------------------------------------ lifecycle

    async def main(self) -> int:
        stop = self.stop
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        code = 1
        try:
            await self.start_all()
            code = await self.supervise(stop)
        except StartInterrupted:
            print("agentrt dev: interrupted while starting; stopping what had started", file=sys.stderr, flush=True)
            code = 1 if self.args.exit_when_done else 0  # as any stop
        except (ServiceFailed, KafkaUnreachable) as exc:
            if stop.is_set():  # a stage that failed because of the interruption is no error of its own
                print("agentrt dev: interrupted while starting; stopping what had started", file=sys.stderr,
                      flush=True)
                code = 1 if self.args.exit_when_done else 0
            else:
                print(f"agentrt dev: error: {exc}", file=sys.stderr, flush=True)
                code = 1
        finally:
            await self.stop_all()
        return code

    def starting(self) -> None:
        """Between start stages: a Ctrl-C that arrived ends the start here."""
        if self.stop.is_set():
            raise StartInterrupted()

    async def unless_stopped(self, work: Any) -> Any:
        """Awaits `work` (a coroutine that may be cancelled, such as a health wait) unless Ctrl-C comes first."""
        task = asyncio.ensure_future(work)
        stopped = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise StartInterrupted()
        return task.result()

    def child_env(self, **forced: str) -> dict[str, str]:
        return {**DEV_DEFAULTS, **os.environ, "AGENTRT_DATABASE_URL": self.database_url,
                "AGENTRT_KAFKA_BOOTSTRAP": self.kafka_bootstrap, **forced}

    async def start_all(self) -> None:
        reserve_ports(*ports_given(self.args))  # no port picked below is --listen's or --console's
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.database_url = self.args.database_url or await asyncio.to_thread(self._start_postgres)
        self.starting()
        if self.args.kafka_bootstrap:
            self.kafka_bootstrap = self.args.kafka_bootstrap
        else:
            self.broker = TansuBroker(log_path=self.log_dir / "tansu.log")
            await asyncio.to_thread(self.broker.start)
            self.kafka_bootstrap = self.broker.bootstrap
            self.broker_pid = self.broker.pid
            print(f"embedded Kafka-protocol broker (Tansu) on {self.kafka_bootstrap} (pid {self.broker.pid})",
                  flush=True)
        tail_settings = TailSettings(kafka_bootstrap=self.kafka_bootstrap)
        self.topic = tail_settings.topic
        self.starting()
        await self._migrate()
        self.starting()

        listen = self.args.listen
        await self._make_key()
        self.starting()
        # With authentication on, WorkService takes a session token too (the scheduler refuses to leave it open).
        self.work_token = secrets.token_hex(24) if self.args.auth != "none" else None
        work = {"AGENTRT_WORK_TOKEN": self.work_token} if self.work_token else {}
        self.scheduler = Service("scheduler", ["scheduler"], self.child_env(
            AGENTRT_LISTEN_ADDR=listen, AGENTRT_AUTH_MODE=self.args.auth, **work), self.log_dir, health_addr=listen)
        mock_port = free_port()
        self.mock_url = f"http://127.0.0.1:{mock_port}"
        latency = self.args.tool_latency_ms
        mock = Service("mocktool", ["mocktool", "--port", str(mock_port), "--db",
                                    str(self.data_dir / "mocktool.sqlite"), "--latency-ms", str(latency)],
                       self.child_env(), self.log_dir, health_url=f"{self.mock_url}/healthz")
        relay_health = f"127.0.0.1:{free_port()}"
        self.relay = Service("relay", ["relay"], self.child_env(AGENTRT_HEALTH_ADDR=relay_health), self.log_dir,
                             health_addr=relay_health, stop_timeout_s=20)
        for service in (self.scheduler, mock, self.relay):
            service.start()
        self.services = [self.scheduler, mock, self.relay]
        await self.unless_stopped(self.scheduler.wait_healthy(STARTUP_TIMEOUT_S))
        print(f"scheduler serving on {listen} (health + reflection on); logs in {self.log_dir}", flush=True)
        if self.leftover_key_id and self.leftover_key_id != self.api_key_id:
            await self.revoke_key(self.leftover_key_id, "started (the earlier session was not stopped)")

        self.agent = demo.install_agent(self.data_dir / "agents", self.mock_url)
        tenant = self.args.tenant
        for n in range(1, self.args.executors + 1):
            health = f"127.0.0.1:{free_port()}"
            executor = Service(f"exec-{n}", ["executor"], self.child_env(
                # The demo's definition file, and the code-first example (devstack/examples) by module name.
                # Then the user's own agents (--agents), beside the demo.
                AGENTRT_SCHEDULER_ADDR=listen, AGENTRT_AGENTS_PATH=",".join(
                    [str(self.data_dir / "agents"), EXAMPLE_MODULE, *([self.args.agents] if self.args.agents else [])]),
                AGENTRT_EXAMPLE_TOOLS_URL=self.mock_url,
                AGENTRT_HEALTH_ADDR=health, AGENTRT_RECONCILE_TENANTS=json.dumps([tenant]),
                # The reconciler acts with the session's key and WorkService calls carry the session's
                # token, in clear over loopback (chosen here).
                **({"AGENTRT_RUN_API_KEY": self.api_key, "AGENTRT_SCHEDULER_INSECURE": "true", **work}
                   if self.api_key else {})), self.log_dir,
                health_addr=health, stop_timeout_s=20)
            executor.start({"AGENTRT_WORKER_ID": f"exec-{n}.1"})
            self.executors.append(executor)
        self.services[2:2] = self.executors
        await self.unless_stopped(asyncio.gather(
            mock.wait_healthy(STARTUP_TIMEOUT_S), self.relay.wait_healthy(STARTUP_TIMEOUT_S),
            *(e.wait_healthy(STARTUP_TIMEOUT_S) for e in self.executors)))
        self.starting()
        await self.mock_faults("DELETE")  # what an earlier session queued and no call consumed
        print(f"mock tool server on {self.mock_url}; relay → {self.topic}; "
              f"{len(self.executors)} executors serving agent {demo.AGENT_NAME}"
              + (f" and your agents from {self.args.agents} (restart `agentrt dev` after changing them)"
                 if self.args.agents else ""), flush=True)
        await start_console(self)  # the operator console, as self.console_service (--console none: none)
        self.events = EventCounter(tail_settings, self.topic)
        await self.events.start()
        self.write_state()
        self.write_client_config()

    def _start_postgres(self) -> str:
        port_file = self.data_dir / "pg.port"
        port = int(port_file.read_text()) if port_file.exists() else None
        self.pg = EmbeddedPostgres(self.data_dir / "pg", port=port)
        self.pg.start()
        port_file.write_text(str(self.pg.port))
        exists = subprocess.run([str(self.pg.bin_dir / "psql"), self.pg.url("postgres"), "-tAc",
                                 "SELECT 1 FROM pg_database WHERE datname = 'agentrt'"],
                                capture_output=True, text=True, check=True).stdout.strip()
        if exists != "1":
            subprocess.run([str(self.pg.bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(self.pg.port),
                            "-U", "postgres", "agentrt"], check=True, capture_output=True)
        url = self.pg.url("agentrt")
        self.postgres_pid = self.pg.pid()
        print(f"embedded PostgreSQL on {url} (data in {self.pg.data_dir})", flush=True)
        return url

    async def _make_key(self) -> None:
        """--auth api_key: a fresh admin key of every tenant for this session, in <data-dir>/api_key."""
        if self.args.auth != "api_key":
            print("auth_mode none: anyone who reaches the scheduler may act for every tenant", flush=True)
            return
        # Short-lived, and revoked at stop: a key of every tenant should not outlive its session.
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cli", "keys", "create", "--database-url", self.database_url,
            "--role", "admin", "--tenant", "*", "--name", f"agentrt-dev {self.session}", "--expires", KEY_LIFETIME,
            "--reason", "agentrt dev session", "--json", env=self.child_env(), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise ServiceFailed(f"keys create failed: {err.decode(errors='replace').strip()[-300:]}")
        created = json.loads(out)
        self.api_key, self.api_key_id = created["secret"], created["key_id"]
        key_file = self.data_dir / "api_key"
        key_file.write_text(self.api_key + "\n")
        key_file.chmod(0o600)
        print(f"admin API key of this session (every tenant, revoked at stop) in {key_file}; every `agentrt` "
              f"command run here finds it, with the stack's addresses, in {local_config.path(self.data_dir)}",
              flush=True)

    def write_client_config(self, stopped: bool = False) -> None:
        """<data-dir>/client.json (0600): what `agentrt` commands run here need (cli/local_config.py)."""
        if self.args.data_dir.resolve() != (Path.cwd() / local_config.DEFAULT_DIR).resolve():
            note = f"; commands find it when run in {self.data_dir.parent}"
        else:
            note = ""
        values: dict[str, Any] = {
            "session": self.session, "stopped": stopped, "scheduler_addr": self.args.listen,
            "kafka_bootstrap": self.kafka_bootstrap, "topic": self.topic,
            # The default tenant of commands run here (the session's key may act for every tenant).
            "tenant": self.args.tenant, "auth_mode": self.args.auth,
            "approvals_file": str(self.data_dir / local_config.APPROVALS_FILE),
        }
        if not stopped:
            values.update({"api_key": self.api_key, "api_key_id": self.api_key_id, "work_token": self.work_token})
        target = local_config.write(self.data_dir, values)
        if not stopped:
            print(f"client settings in {target} (mode 0600){note}", flush=True)

    async def revoke_key(self, key_id: str | None = None, why: str = "stopped") -> None:
        """At stop, while the scheduler still serves: the session's key is refused from now on. At start,
        `key_id` is the key of an earlier session that never stopped (killed): revoked with this one's."""
        key_id = key_id or self.api_key_id
        if not (self.api_key and key_id and self.scheduler is not None and self.scheduler.alive):
            return
        try:
            async with AgentrtClient(self.args.listen, tenant=self.args.tenant, api_key=self.api_key,
                                     timeout_s=5, max_retries=1) as client:
                await client.revoke_key(key_id, reason=f"agentrt dev session {self.session} {why}")
        except AgentrtError as exc:
            if key_id == self.api_key_id:  # an earlier session's key may be gone or in another database
                print(f"could not revoke the key {key_id} ({exc.reason}); it expires within {KEY_LIFETIME}",
                      flush=True)

    async def _migrate(self) -> None:
        # Own session, as every service: a terminal's Ctrl-C reaches only `agentrt dev`, which
        # lets the migration finish (it is short and transactional) and then stops.
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "cli", "migrate",
                                                    env=self.child_env(), stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        out, _ = await proc.communicate()
        text = out.decode(errors="replace").strip()
        if proc.returncode != 0:
            raise ServiceFailed(f"migrate failed: {text.splitlines()[-1] if text else proc.returncode}")
        print(text, flush=True)

    async def stop_all(self) -> None:
        if self.events is not None:
            with contextlib.suppress(Exception):
                await self.events.stop()
        await self.revoke_key()
        order = [*self.executors, self.console_service, self.relay, self.scheduler,
                 *(s for s in self.services if s.name == "mocktool")]
        await asyncio.gather(*(e.stop() for e in self.executors))
        for service in order[len(self.executors):]:
            if service is not None:
                await service.stop()
        if self.broker is not None:
            await asyncio.to_thread(self.broker.stop)
        if self.pg is not None:
            await asyncio.to_thread(self.pg.stop)
            if self.postgres_pid:
                await asyncio.to_thread(wait_gone, self.postgres_pid, 15)
        stopped = ", ".join(s.name for s in order if s is not None)
        extra = " and ".join(x for x in ("the broker" if self.broker else "",
                                         "embedded PostgreSQL" if self.pg else "") if x)
        if stopped or extra:
            print("stopped " + (f"{stopped}, then {extra}" if stopped and extra else stopped or extra), flush=True)
        self.write_state(stopped=True)
        if self.api_key is not None or self.scheduler is not None:
            self.write_client_config(stopped=True)

    def write_state(self, stopped: bool = False) -> None:
        """<data-dir>/stack.json: addresses and pids, for scripts and for `agentrt … --addr`."""
        state = {
            "session": self.session, "tenant": self.args.tenant, "stopped": stopped,
            "scheduler_addr": self.args.listen, "kafka_bootstrap": self.kafka_bootstrap, "topic": self.topic,
            "database_url": self.database_url, "mock_url": self.mock_url, "logs": str(self.log_dir),
            "console_url": self.console_service.url if self.console_service else "",
            "pids": {s.name: s.pid for s in self.services},
            "health": {s.name: s.health_addr or s.health_url for s in self.services},
            "broker_pid": self.broker_pid, "postgres_pid": self.postgres_pid,
            "auth_mode": self.args.auth, "api_key_file": str(self.data_dir / "api_key") if self.api_key else None,
            "runs": [r.run_id for r in self.runs],
        }
        (self.data_dir / "stack.json").write_text(json.dumps(state, indent=2))

    # ------------------------------------------------------------------ the session

    async def supervise(self, stop: asyncio.Event) -> int:
        args = self.args
        async with AgentrtClient(args.listen, tenant=args.tenant, api_key=self.api_key, timeout_s=10,
                                 max_retries=3) as client:
            reader_stop = asyncio.Event()
            assert self.events is not None
            reader = asyncio.create_task(self.events.run(reader_stop), name="events-reader")
            threshold = demo.approval_threshold(self.agent)
            self.runs = demo.demo_runs(args.runs, self.session, threshold)
            self.view = View(self.session, args.tenant, args.auto_approve, self.runs, self.services, self.events)
            if stop.is_set():  # Ctrl-C while starting: submit nothing
                self.runs.clear()
            if self.runs:
                await demo.submit_all(client, self.runs, self.session)
                print(f"submitted {len(self.runs)} runs of {demo.AGENT_NAME} (tenant {args.tenant}); "
                      f"{sum(r.needs_approval for r in self.runs)} have refunds above {threshold:g} and wait for "
                      "approval" + (" (approved by --auto-approve)" if args.auto_approve else ""), flush=True)
                self.write_state()
            chaos_stop = asyncio.Event()
            chaos = (asyncio.create_task(self.chaos_loop(chaos_stop), name="chaos") if self.chaos else None)
            try:
                code = await self.watch(client, stop, chaos_stop)
            finally:
                chaos_stop.set()
                if chaos is not None:
                    await chaos
            if self.runs and all(s.alive for s in (self.scheduler,) if s is not None):
                # A person who pressed Ctrl-C gets the summary at once; a script waits for the last events.
                await self.wait_for_events(client, reader, within_s=30 if args.exit_when_done else 3)
                report = await summary.build(client, self.runs, self.mock_url, self.agent, self.events,
                                             self.chaos, auto_approve=args.auto_approve)
                for line in summary.text(report):
                    print(line, flush=True)
                if args.summary_json:
                    await asyncio.to_thread(Path(args.summary_json).write_text,
                                            json.dumps(report, indent=2, default=str))
                if args.exit_when_done and not report["ok"]:
                    code = 1
            reader_stop.set()
            await reader
        return code

    async def watch(self, client: AgentrtClient, stop: asyncio.Event, chaos_stop: asyncio.Event) -> int:
        args, view = self.args, self.view
        assert view is not None
        started = time.monotonic()
        deadline = started + args.timeout if args.exit_when_done else None
        live = Live(view.render(), console=self.console, refresh_per_second=4) if self.live_view else None
        last_plain = 0.0
        with live if live is not None else contextlib.nullcontext():
            while not stop.is_set():
                self.check_services()
                await self.refresh(client)
                if live is not None:
                    live.update(view.render())
                elif time.monotonic() - last_plain >= PLAIN_EVERY_S:
                    print(view.line(), flush=True)
                    last_plain = time.monotonic()
                self.announce_approvals()
                outcomes = view.outcomes()
                settled = outcomes[demo.IN_PROGRESS] == 0
                if settled and self.runs:
                    chaos_stop.set()  # let the last events flow without a relay restart in the way
                    if not self.settled_once and not args.exit_when_done:
                        self.settled_once = True
                        for line in self.hints():
                            self.say(line)
                if args.exit_when_done and settled:
                    return 0 if outcomes[demo.UNEXPECTED] == 0 else 1
                if deadline is not None and time.monotonic() > deadline:
                    print(f"agentrt dev: not done within --timeout {args.timeout:g}s", file=sys.stderr, flush=True)
                    return 1
                if args.exit_after and time.monotonic() - started >= args.exit_after:
                    return 0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), REFRESH_S)
        print("stopping (signal)", flush=True)
        return 1 if args.exit_when_done else 0

    def here(self) -> bool:
        """Is --data-dir the .agentrt/ of the current directory (where commands find client.json)?"""
        return self.data_dir == (Path.cwd() / local_config.DEFAULT_DIR).resolve()

    def cli(self, *words: str) -> str:
        """A command that works as printed: run here, client.json gives the address, the session's key
        and its default tenant; run elsewhere, they are spelled out (with key_hint's export)."""
        if self.here():
            return f"agentrt {' '.join(words)}"
        return f"agentrt {' '.join(words)} --tenant {self.args.tenant} --addr {self.args.listen}"

    def key_hint(self) -> list[str]:
        if not self.api_key or self.here():
            return []
        return [f"  export AGENTRT_API_KEY=$(cat {self.data_dir / 'api_key'})   # the CLI's credential"]

    def announce_approvals(self) -> None:
        waiting = [run for run in self.runs
                   if run.outcome(auto_approve=self.args.auto_approve) == demo.AWAITING_APPROVAL]
        lines = [f"{self.cli('runs', 'resume', run.run_id, '--approve')}   # refund {run.input['refund_amount']}"
                 for run in waiting]
        # Your own agents' runs (agentrt dev --agents, or submitted by hand) that wait for a person.
        lines += [f"{self.cli('runs', 'resume', run.run_id, '--approve')}   # {run.agent_name}" for run in self.paused]
        for run in waiting:
            if not run.announced:
                run.announced = True
                if not self.live_view:  # the live view shows them in its "needs you" panel instead
                    print(f"run {run.run_id} waits for approval (refund {run.input['refund_amount']}): "
                          + self.cli("runs", "resume", run.run_id, "--approve"), flush=True)
        for other in self.paused:
            if other.run_id not in self.announced and not self.live_view:
                print(f"run {other.run_id} of {other.agent_name} waits for a person: "
                      + self.cli("runs", "resume", other.run_id, "--approve"), flush=True)
            self.announced.add(other.run_id)
        if self.view is not None and lines != self.view.needs_you:
            self.view.needs_you = lines
            self.write_approvals(lines)

    def write_approvals(self, lines: list[str]) -> None:
        """<data-dir>/approvals.txt: the commands that approve what waits now (empty when nothing does)."""
        where = "" if self.here() else "# run where AGENTRT_API_KEY is exported (see above)\n"
        text = (f"# runs of session {self.session} waiting for approval; each line works as printed"
                + (f" in {Path.cwd()}" if self.here() else "") + "\n" + where + "".join(f"{line}\n" for line in lines))
        (self.data_dir / local_config.APPROVALS_FILE).write_text(text)

    def hints(self) -> list[str]:
        return ["every demo run is completed or waiting for approval; the stack keeps running. Try:",
                *self.key_hint(),
                "  " + self.cli("runs", "list"),
                "  " + self.cli("status"),
                "  agentrt events tail --from-beginning" if self.here()
                else f"  agentrt events tail --bootstrap {self.kafka_bootstrap} --from-beginning",
                "Ctrl-C stops everything."]

    def check_services(self) -> None:
        for service in self.services:
            if not service.alive:
                raise ServiceFailed(f"{service.name} exited with {service.exited_with}; see {service.log_path}")

    async def refresh(self, client: AgentrtClient) -> None:
        assert self.view is not None
        try:
            self.view.stats = await client.stats()
            ours = {r.run_id for r in self.runs}
            paused, _ = await client.list(statuses=["PAUSED_HUMAN"], page_size=50)
            self.paused = [r for r in paused if r.run_id not in ours]
            open_runs = [r for r in self.runs if r.run_id and r.status not in ("COMPLETED", "FAILED", "CANCELLED")]
            for start in range(0, len(open_runs), 50):
                batch = open_runs[start:start + 50]
                for run, info in zip(batch, await asyncio.gather(*(client.get(r.run_id) for r in batch)),
                                     strict=True):
                    run.update(info)
            if self.args.auto_approve:
                for run in self.runs:
                    if (run.status == "PAUSED_HUMAN" and run.needs_approval and not run.resumed
                            and run.step.startswith(demo.APPROVAL_NODE)):
                        run.update(await client.resume(run.run_id, operator="agentrt-dev", approve=True,
                                                       comment="agentrt dev --auto-approve"))
                        run.resumed = True
                        self.say(f"approved run {run.run_id} (refund {run.input['refund_amount']})")
        except AgentrtError as exc:
            self.say(f"scheduler: {exc.reason}: {exc.message}")

    async def wait_for_events(self, client: AgentrtClient, reader: asyncio.Task[None], within_s: float = 30) -> None:
        """Until every event of the session's runs is published and read back (or within_s passes)."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline and not reader.done():
            found = await summary.histories(client, self.runs)
            check = summary.event_check(found, self.events)
            if not check["pending"] and not check["missing"]:
                return
            await asyncio.sleep(0.3)

    # ------------------------------------------------------------------ chaos

    async def chaos_loop(self, stop: asyncio.Event) -> None:
        assert self.chaos is not None and self.relay is not None
        rng = random.Random()
        tick = 0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.args.chaos_interval)
            if stop.is_set():
                await self.mock_faults("DELETE")
                return
            tick += 1
            if tick % 4 == 0:
                victim = self.relay
                self.chaos.relay_kills += 1
                extra: dict[str, str] = {}
            else:
                victim = rng.choice(self.executors)
                self.chaos.executor_kills += 1
                extra = {"AGENTRT_WORKER_ID": f"{victim.name}.{victim.incarnation + 1}"}
            pid = victim.kill()
            victim.start(extra)
            self.say(f"chaos: SIGKILL {victim.name} (pid {pid}); started again as pid {victim.pid}")
            self.write_state()
            if tick % 3 == 0:
                await self.drop_a_label_answer()

    async def mock_faults(self, method: str, fault: dict[str, Any] | None = None) -> bool:
        try:
            async with aiohttp.ClientSession() as session, session.request(
                    method, f"{self.mock_url}/_faults", json=fault, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                resp.raise_for_status()
                return True
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self.say(f"mock tool server: {method} /_faults failed: {exc}")
            return False

    async def drop_a_label_answer(self) -> None:
        assert self.chaos is not None
        if not await self.mock_faults("POST", {"tool": demo.NON_IDEMPOTENT_TOOL, "mode": "reset_after", "count": 1}):
            return
        self.chaos.tool_faults += 1
        self.say(f"chaos: the next {demo.NON_IDEMPOTENT_TOOL} call creates its label, then drops the connection")
