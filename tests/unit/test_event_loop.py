"""The event_loop setting picks the loop a component runs on."""

import asyncio

import pytest
from pydantic import ValidationError

from executor.config import ExecutorSettings
from shared.event_loop import run, uses_uvloop


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_auto_and_uvloop_run_on_uvloop_when_installed():
    pytest.importorskip("uvloop")
    assert uses_uvloop("auto") and uses_uvloop("uvloop")
    assert run(loop_module(), "auto").startswith("uvloop")
    assert run(loop_module(), "uvloop").startswith("uvloop")


def test_asyncio_runs_on_the_standard_loop():
    assert not uses_uvloop("asyncio")
    assert run(loop_module(), "asyncio").startswith("asyncio")


def test_an_unknown_loop_is_refused(monkeypatch):
    monkeypatch.setenv("AGENTRT_EVENT_LOOP", "tokio")
    with pytest.raises(ValidationError, match="event_loop"):
        ExecutorSettings()


def test_the_relay_keeps_the_stock_loop_unless_told(monkeypatch):
    from relay.config import RelaySettings

    monkeypatch.delenv("AGENTRT_EVENT_LOOP", raising=False)
    assert RelaySettings().event_loop == "asyncio"
    monkeypatch.setenv("AGENTRT_EVENT_LOOP", "uvloop")
    assert RelaySettings().event_loop == "uvloop"


def test_a_service_runs_with_its_startup_heap_frozen_and_a_larger_youngest_generation():
    """In a process of its own: gc state is global, and the suite's must stay as it is."""
    import subprocess
    import sys

    probe = ("import asyncio, gc\n"
             "from shared.event_loop import GEN0_THRESHOLD, run_service\n"
             "async def main():\n"
             "    return gc.get_freeze_count(), gc.get_threshold()[0]\n"
             "frozen, gen0 = run_service(main(), 'asyncio')\n"
             "assert frozen > 1000 and gen0 == GEN0_THRESHOLD, (frozen, gen0)\n"
             "garbage = []\n"
             "garbage.append(garbage)\n"
             "del garbage\n"
             "assert gc.collect() >= 1\n")  # cycles made after the freeze are still collected
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
