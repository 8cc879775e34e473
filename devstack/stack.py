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

from devstack import demo, summary
from devstack.cli_events import TailSettings
from devstack.embedded_pg import EmbeddedPostgres, free_port, pid_alive
from devstack.kafka_testing import TansuBroker
from devstack.services import Service, ServiceFailed
from devstack.watch import EventCounter, View
from shared.client.event_tail import KafkaUnreachable
from shared.client.runs import AgentrtClient
from shared.errors import AgentrtError, InvalidArgument

EXAMPLE_MODULE = "devstack.examples.refund_triage"  # a code-first agent every dev executor serves too
# Dev-sized timings (a killed executor's runs are taken over within seconds).
# An AGENTRT_* variable set in your environment wins over these.
DEV_DEFAULTS = {
    "AGENTRT_LEASE_DURATION_MS": "5000",
    "AGENTRT_BACKOFF_BASE_MS": "200",
    "AGENTRT_BACKOFF_CAP_MS": "2000",
    "AGENTRT_BACKOFF_JITTER_MS": "100",
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


def validate(args: argparse.Namespace) -> None:
    if args.runs < 0:
        raise InvalidArgument("--runs", "must be 0 or more")
    if not 1 <= args.executors <= 16:
        raise InvalidArgument("--executors", "must be between 1 and 16")
    if args.chaos_interval <= 0:
        raise InvalidArgument("--chaos-interval", "must be a positive number of seconds")
    if args.timeout <= 0:
        raise InvalidArgument("--timeout", "must be a positive number of seconds")
    if not 0 <= args.tool_latency_ms <= 60_000:
        raise InvalidArgument("--tool-latency-ms", "must be between 0 and 60000")
    if args.exit_when_done and args.runs == 0:
        raise InvalidArgument("--exit-when-done", "needs --runs N with N > 0")
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidArgument("--listen", f"{args.listen!r} is not host:port")


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

    def say(self, text: str) -> None:
        if self.view is not None and self.live_view:
            self.view.note(text)
        else:
            print(text, flush=True)

    # ------------------------------------------------------------------ lifecycle

    async def main(self) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        code = 1
        try:
            await self.start_all()
            code = await self.supervise(stop)
        except (ServiceFailed, KafkaUnreachable) as exc:
            print(f"agentrt dev: error: {exc}", file=sys.stderr, flush=True)
            code = 1
        finally:
            await self.stop_all()
        return code

    def child_env(self, **forced: str) -> dict[str, str]:
        return {**DEV_DEFAULTS, **os.environ, "AGENTRT_DATABASE_URL": self.database_url,
                "AGENTRT_KAFKA_BOOTSTRAP": self.kafka_bootstrap, **forced}

    async def start_all(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.database_url = self.args.database_url or await asyncio.to_thread(self._start_postgres)
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
        await self._migrate()

        listen = self.args.listen
        await self._make_key()
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
        await self.scheduler.wait_healthy(STARTUP_TIMEOUT_S)
        print(f"scheduler serving on {listen} (health + reflection on); logs in {self.log_dir}", flush=True)

        self.agent = demo.install_agent(self.data_dir / "agents", self.mock_url)
        tenant = self.args.tenant
        for n in range(1, self.args.executors + 1):
            health = f"127.0.0.1:{free_port()}"
            executor = Service(f"exec-{n}", ["executor"], self.child_env(
                # The demo's definition file, and the code-first example (devstack/examples) by module name.
                AGENTRT_SCHEDULER_ADDR=listen, AGENTRT_AGENTS_PATH=f"{self.data_dir / 'agents'},{EXAMPLE_MODULE}",
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
        await asyncio.gather(mock.wait_healthy(STARTUP_TIMEOUT_S), self.relay.wait_healthy(STARTUP_TIMEOUT_S),
                             *(e.wait_healthy(STARTUP_TIMEOUT_S) for e in self.executors))
        await self.mock_faults("DELETE")  # what an earlier session queued and no call consumed
        print(f"mock tool server on {self.mock_url}; relay → {self.topic}; "
              f"{len(self.executors)} executors serving agent {demo.AGENT_NAME}", flush=True)
        self.events = EventCounter(tail_settings, self.topic)
        await self.events.start()
        self.write_state()

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
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "devstack.cli", "keys", "create", "--database-url", self.database_url,
            "--role", "admin", "--tenant", "*", "--name", f"agentrt-dev {self.session}", "--expires", "7d",
            "--reason", "agentrt dev session", "--json", env=self.child_env(), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise ServiceFailed(f"keys create failed: {err.decode(errors='replace').strip()[-300:]}")
        self.api_key = json.loads(out)["secret"]
        key_file = self.data_dir / "api_key"
        key_file.write_text(self.api_key + "\n")
        key_file.chmod(0o600)
        print(f"admin API key of this session (every tenant) in {key_file}; for the CLI: "
              f"export AGENTRT_API_KEY=$(cat {key_file})", flush=True)

    async def _migrate(self) -> None:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "devstack.cli", "migrate",
                                                    env=self.child_env(), stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        text = out.decode(errors="replace").strip()
        if proc.returncode != 0:
            raise ServiceFailed(f"migrate failed: {text.splitlines()[-1] if text else proc.returncode}")
        print(text, flush=True)

    async def stop_all(self) -> None:
        if self.events is not None:
            with contextlib.suppress(Exception):
                await self.events.stop()
        order = [*self.executors, self.relay, self.scheduler,
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
        print(f"stopped {stopped}{', then ' + extra if extra else ''}", flush=True)
        self.write_state(stopped=True)

    def write_state(self, stopped: bool = False) -> None:
        """<data-dir>/stack.json: addresses and pids, for scripts and for `agentrt … --addr`."""
        state = {
            "session": self.session, "tenant": self.args.tenant, "stopped": stopped,
            "scheduler_addr": self.args.listen, "kafka_bootstrap": self.kafka_bootstrap, "topic": self.topic,
            "database_url": self.database_url, "mock_url": self.mock_url, "logs": str(self.log_dir),
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

    def cli(self, *words: str) -> str:
        return f"agentrt {' '.join(words)} --tenant {self.args.tenant} --addr {self.args.listen}"

    def key_hint(self) -> list[str]:
        if not self.api_key:
            return []
        return [f"  export AGENTRT_API_KEY=$(cat {self.data_dir / 'api_key'})   # the CLI's credential"]

    def announce_approvals(self) -> None:
        for run in self.runs:
            if run.outcome(auto_approve=self.args.auto_approve) == demo.AWAITING_APPROVAL and not run.announced:
                run.announced = True
                self.say(f"run {run.run_id} waits for approval (refund {run.input['refund_amount']}): "
                         + self.cli("runs", "resume", run.run_id, "--approve"))

    def hints(self) -> list[str]:
        return ["every demo run is completed or waiting for approval; the stack keeps running. Try:",
                *self.key_hint(),
                "  " + self.cli("runs", "list"),
                "  " + self.cli("status"),
                f"  agentrt events tail --bootstrap {self.kafka_bootstrap} --from-beginning",
                "Ctrl-C stops everything."]

    def check_services(self) -> None:
        for service in self.services:
            if not service.alive:
                raise ServiceFailed(f"{service.name} exited with {service.exited_with}; see {service.log_path}")

    async def refresh(self, client: AgentrtClient) -> None:
        assert self.view is not None
        try:
            self.view.stats = await client.stats()
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
