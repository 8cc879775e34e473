"""A PostgreSQL high-availability cluster on loopback for experiment 10: one etcd and Patroni nodes.

Debian's `etcd-server` and `patroni` (3.0.x) with PostgreSQL 15. PostgreSQL refuses to run as
root, so each Patroni runs as the `postgres` user (`setpriv`), with its data directory, config and
sockets in a directory that user owns; every process is a `Proc` of the lab (one log each),
signalled and stopped by pid, and any postmaster left behind (its Patroni SIGKILLed) is killed by
the pid in its postmaster.pid. Synchronous mode (docs/ha.md): Patroni names the standby in
synchronous_standby_names; `strict` keeps writes waiting while no standby is in sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devstack.acceptance.procs import ExperimentError, Proc, wait_until
from devstack.embedded_pg import free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PATRONI = "/usr/bin/patroni"
PATRONICTL = "/usr/bin/patronictl"
ETCD = "/usr/bin/etcd"
RUN_AS = "postgres"
# Failure detection: a leader key lives `ttl` seconds; loop_wait + 2 * retry_timeout <= ttl.
DCS = {"ttl": 6, "loop_wait": 1, "retry_timeout": 2}


def missing_binaries() -> list[str]:
    """What the experiment needs and this machine lacks (Debian: patroni, etcd-server, postgresql-15)."""
    needed = [PATRONI, PATRONICTL, ETCD, str(PG_BIN / "postgres"), str(PG_BIN / "pg_rewind"), "/usr/bin/setpriv"]
    missing = [path for path in needed if not os.access(path, os.X_OK)]
    try:
        pwd.getpwnam(RUN_AS)
    except KeyError:
        missing.append(f"user {RUN_AS}")
    if os.geteuid() != 0:
        missing.append(f"root (to start PostgreSQL as the {RUN_AS} user)")
    return missing


def versions() -> dict[str, str]:
    def first_line(argv: list[str]) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"unavailable: {exc}"
        return (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr) else ""

    return {"patroni": first_line([PATRONI, "--version"]), "etcd": first_line([ETCD, "--version"]),
            "postgres_ha": first_line([str(PG_BIN / "postgres"), "--version"])}


def _reachable_by_others(path: Path) -> bool:
    """Every directory above `path` lets other users through (the postgres user must reach it)."""
    for parent in [path, *path.parents]:
        try:
            mode = parent.stat().st_mode
        except OSError:
            return False
        if not mode & stat.S_IXOTH:
            return False
    return True


@dataclass
class Node:
    name: str
    pg_port: int
    api_port: int
    home: Path
    proc: Proc | None = None
    starts: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def data_dir(self) -> Path:
        return self.home / f"{self.name}-data"

    @property
    def config(self) -> Path:
        return self.home / f"{self.name}.yml"

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def api(self, path: str) -> tuple[int, dict[str, Any]]:
        """Patroni's REST API: (HTTP status, JSON body); (0, {}) when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}{path}", timeout=2) as reply:
                return reply.status, json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, json.loads(exc.read() or b"{}")
            except ValueError:
                return exc.code, {}
        except (OSError, ValueError):
            return 0, {}

    def is_primary(self) -> bool:
        return self.api("/primary")[0] == 200

    def is_sync_standby(self) -> bool:
        # Patroni's own answer: pg_stat_replication's `sync` alone comes earlier than Patroni's view.
        return self.api("/sync")[0] == 200


class HaCluster:
    def __init__(self, lab: Any, nodes: int = 2, strict: bool = False) -> None:
        self.lab = lab
        self.strict = strict
        self.scope = f"agentrt-e10-{os.getpid()}-{int(time.time())}"
        inside = lab.dir / "ha"
        if _reachable_by_others(lab.dir):
            inside.mkdir(parents=True, exist_ok=True)
            self.home = inside
        else:  # e.g. under pytest's private tmp: a directory of its own, linked from the lab
            self.home = Path(tempfile.mkdtemp(prefix="agentrt-e10-"))
            os.chmod(self.home, 0o755)
            with contextlib.suppress(OSError):
                inside.symlink_to(self.home)
        user = pwd.getpwnam(RUN_AS)
        os.chown(self.home, user.pw_uid, user.pw_gid)
        self.uid, self.gid = user.pw_uid, user.pw_gid
        self.etcd: Proc | None = None
        self.etcd_port = free_port()
        self.nodes = [Node(f"pg{i + 1}", free_port(), free_port(), self.home) for i in range(nodes)]

    # ------------------------------------------------------------------ start

    async def start(self) -> HaCluster:
        peer = free_port()
        etcd_dir = self.lab.dir / "etcd-data"
        self.etcd = self.lab.spawn("etcd", [
            ETCD, "--name", "e10", "--data-dir", str(etcd_dir),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"e10=http://127.0.0.1:{peer}", "--initial-cluster-state", "new"], {})
        await wait_until(lambda: self._etcd_healthy(), 30, "etcd to answer /health", interval=0.1)
        first = self.nodes[0]
        await self.start_node(first)
        await wait_until(first.is_primary, 60, f"{first.name} to bootstrap and lead", interval=0.2)
        for node in self.nodes[1:]:
            await self.start_node(node)
        await self.wait_in_sync(90)
        return self

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.etcd_port}/health", timeout=2) as reply:
                return reply.status == 200 and json.loads(reply.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def _config(self, node: Node) -> dict[str, Any]:
        return {
            "scope": self.scope, "namespace": "/agentrt/", "name": node.name,
            "restapi": {"listen": f"127.0.0.1:{node.api_port}", "connect_address": f"127.0.0.1:{node.api_port}"},
            "etcd3": {"hosts": f"127.0.0.1:{self.etcd_port}"},
            "bootstrap": {
                "dcs": {**DCS, "maximum_lag_on_failover": 16 << 20, "synchronous_mode": True,
                        "synchronous_mode_strict": self.strict,
                        "postgresql": {"use_pg_rewind": True, "use_slots": True, "parameters": {
                            # pg_rewind needs hint bits in the WAL (or data checksums).
                            "wal_log_hints": "on", "synchronous_commit": "on", "max_connections": 200,
                            "max_wal_senders": 10, "max_replication_slots": 10, "wal_keep_size": "256MB",
                            "hot_standby": "on"}}},
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}", "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.data_dir), "bin_dir": str(PG_BIN),
                "pgpass": str(self.home / f"{node.name}.pgpass"),
                "authentication": {"superuser": {"username": "postgres", "password": "postgres"},
                                   "replication": {"username": "replicator", "password": "replicator"}},
                "parameters": {"unix_socket_directories": str(self.home)},
                # Replication and pg_rewind connect over TCP; the lab trusts loopback.
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                           "host replication all 127.0.0.1/32 trust"],
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }

    async def start_node(self, node: Node) -> Proc:
        node.config.write_text(yaml.safe_dump(self._config(node), sort_keys=False))
        os.chown(node.config, self.uid, self.gid)
        prefix = ["setpriv", f"--reuid={RUN_AS}", f"--regid={RUN_AS}", "--init-groups"]
        env = {"HOME": str(self.home), "PGPASSFILE": str(self.home / f"{node.name}.pgpass")}
        offset = len(node.proc.log()) if node.proc is not None else 0
        node.proc = self.lab.spawn(f"patroni-{node.name}" + (f"-{node.starts + 1}" if node.starts else ""),
                                   [PATRONI, str(node.config)], env, prefix)
        node.starts += 1
        node.history.append({"event": "patroni started", "pid": node.proc.pid, "at": time.time()})
        await wait_until(lambda: node.api("/health")[0] != 0 or not node.proc or not node.proc.alive(), 60,
                         f"{node.name}'s REST API", interval=0.1)
        if not node.proc.alive():
            raise ExperimentError(f"{node.name}'s Patroni exited: {node.proc.log()[offset:][-1500:]}")
        return node.proc

    # ------------------------------------------------------------------ state

    def dsn(self, database: str = "postgres", order: list[Node] | None = None) -> str:
        """The multi-host DSN the services use: every node, the session on the one taking writes."""
        hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in (order or self.nodes))
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def leader(self) -> Node | None:
        leaders = [n for n in self.nodes if n.is_primary()]
        return leaders[0] if len(leaders) == 1 else None

    def replicas(self) -> list[Node]:
        return [n for n in self.nodes if not n.is_primary()]

    async def wait_leader(self, within: float, other_than: Node | None = None) -> Node:
        def probe() -> Node | None:
            leader = self.leader()
            return leader if leader is not None and leader is not other_than else None

        return await wait_until(probe, within, "a single Patroni leader" + (
            f" other than {other_than.name}" if other_than else ""), interval=0.1)

    async def wait_in_sync(self, within: float) -> Node:
        """A leader and a synchronous standby, as Patroni sees them (GET /sync answers 200)."""
        leader = await self.wait_leader(within)

        def synced() -> bool:
            return any(n.is_sync_standby() for n in self.nodes if n is not leader)

        await wait_until(synced, within, "a synchronous standby (Patroni /sync)", interval=0.2)
        return leader

    def patronictl(self, *args: str) -> tuple[int, str]:
        """patronictl as the postgres user; its output too (it exits 0 even when it refuses)."""
        node = self.nodes[0]
        argv = ["setpriv", f"--reuid={RUN_AS}", f"--regid={RUN_AS}", "--init-groups", PATRONICTL,
                "-c", str(node.config), *args]
        self.lab.commands.add(" ".join(argv))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.home,
                              env={**os.environ, "HOME": str(self.home)})
        return done.returncode, done.stdout + done.stderr

    # ------------------------------------------------------------------ faults

    async def switchover(self, leader: Node, candidate: Node) -> dict[str, Any]:
        started = time.monotonic()
        code, out = await asyncio.to_thread(self.patronictl, "switchover", self.scope, "--leader", leader.name,
                                            "--candidate", candidate.name, "--force")
        (self.lab.dir / "patronictl-switchover.txt").write_text(out)
        if code != 0 or "Successfully switched over" not in out:
            raise ExperimentError(f"patronictl switchover refused or failed (exit {code}): {out[-1500:]}")
        await self.wait_leader(60, other_than=leader)
        return {"exit": code, "output_tail": out.strip().splitlines()[-3:],
                "seconds_until_new_leader": round(time.monotonic() - started, 2)}

    def kill(self, node: Node) -> dict[str, Any]:
        """SIGKILL of the node's Patroni and its postmaster (the host is gone)."""
        postmaster = node.postmaster_pid()
        killed: dict[str, Any] = {"node": node.name, "patroni_pid": node.proc.pid if node.proc else None,
                                  "postmaster_pid": postmaster}
        if node.proc is not None:
            node.proc.kill()
        if postmaster is not None:
            self.lab.commands.add(f"kill -KILL {postmaster}  # {node.name}'s postmaster")
            with contextlib.suppress(ProcessLookupError):
                os.kill(postmaster, signal.SIGKILL)
        node.history.append({"event": "SIGKILL patroni and postmaster", **killed, "at": time.time()})
        return killed

    async def rejoin(self, node: Node, within: float = 90) -> dict[str, Any]:
        """The old primary back: Patroni rewinds it (pg_rewind) and it follows the new leader."""
        await self._wait_gone(node)
        started = time.monotonic()
        proc = await self.start_node(node)
        await wait_until(lambda: node.api("/replica")[0] == 200, within, f"{node.name} to run as a replica",
                         interval=0.2)
        await wait_until(node.is_sync_standby, within, f"{node.name} to be the synchronous standby again",
                         interval=0.2)
        log = proc.log()
        return {"seconds_until_sync_standby": round(time.monotonic() - started, 2),
                "pg_rewind_used": "rewind" in log.lower(), "log_mentions": [
                    line.strip()[:200] for line in log.splitlines() if "rewind" in line.lower()][:6]}

    async def _wait_gone(self, node: Node) -> None:
        """Until the killed postmaster's backends have exited (they notice their parent's death)."""
        def gone() -> bool:
            done = subprocess.run(["pgrep", "-u", RUN_AS, "-f", f"-D {node.data_dir}"], capture_output=True)
            return done.returncode != 0

        with contextlib.suppress(ExperimentError):
            await wait_until(gone, 20, f"{node.name}'s old processes to exit", interval=0.1)

    # ------------------------------------------------------------------ stop

    async def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.alive():
                await asyncio.to_thread(node.proc.stop, 20)
            pid = node.postmaster_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    self.lab.commands.add(f"kill -KILL {pid}  # {node.name}'s postmaster left behind")
        if self.etcd is not None:
            await asyncio.to_thread(self.etcd.stop, 10)
        for node in self.nodes:
            shutil.rmtree(node.data_dir, ignore_errors=True)
        shutil.rmtree(self.lab.dir / "etcd-data", ignore_errors=True)
        if self.home != self.lab.dir / "ha":
            for path in self.home.glob("*.yml"):
                with contextlib.suppress(OSError):
                    shutil.copy(path, self.lab.dir / path.name)
            shutil.rmtree(self.home, ignore_errors=True)
