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
