"""A loopback port picked for one service is never handed to another.

CI once saw `agentrt dev --listen 127.0.0.1:P` start its broker on P too: the test had picked P, nothing
listened on it yet, and the OS offered it again to the broker's bind(0). The class is "two picks made
before either side binds"; free_port closes it for one process (never the same port twice) and for ports
named elsewhere (reserve_ports, which `agentrt dev` calls with --listen and --console before it picks any).
"""

from __future__ import annotations

import argparse
import socket
from typing import ClassVar

import pytest

from cli.main import build_parser
from devstack import dev_args, embedded_pg
from shared.errors import InvalidArgument


class ScriptedSocket:
    """The OS's answers to bind(0), in order: the picking rule is what is tested here."""

    answers: ClassVar[list[int]] = []

    def __init__(self, *_: object) -> None:
        self.port = 0

    def __enter__(self) -> ScriptedSocket:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def bind(self, _addr: tuple[str, int]) -> None:
        self.port = ScriptedSocket.answers.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> type[ScriptedSocket]:
    monkeypatch.setattr(embedded_pg, "_TAKEN", set())
    monkeypatch.setattr(embedded_pg.socket, "socket", ScriptedSocket)
    return ScriptedSocket


def test_the_os_offering_a_handed_out_or_reserved_port_again_gets_another(scripted: type[ScriptedSocket]) -> None:
    scripted.answers = [40001, 40001, 40002, 40003, 40002, 40004]
    embedded_pg.reserve_ports(40003)
    assert [embedded_pg.free_port() for _ in range(3)] == [40001, 40002, 40004]
    assert scripted.answers == []


def test_an_os_that_only_offers_taken_ports_is_refused_with_a_line(scripted: type[ScriptedSocket]) -> None:
    scripted.answers = [40001] * 65
    assert embedded_pg.free_port() == 40001
    with pytest.raises(RuntimeError, match="no free loopback port"):
        embedded_pg.free_port()


def test_real_picks_are_distinct_bindable_and_avoid_the_reserved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded_pg, "_TAKEN", set())
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        reserved = held.getsockname()[1]
    embedded_pg.reserve_ports(reserved)
    picks = [embedded_pg.free_port() for _ in range(200)]
    assert len(set(picks)) == 200 and reserved not in picks
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", picks[-1]))


@pytest.mark.parametrize(("listen", "console", "given"), [
    ("127.0.0.1:50051", "", [50051]),
    ("127.0.0.1:50051", "none", [50051]),
    ("localhost:7000", "127.0.0.1:8080", [7000, 8080]),
])
def test_dev_reserves_every_port_its_command_line_names(listen: str, console: str, given: list[int]) -> None:
    assert dev_args.ports_given(argparse.Namespace(listen=listen, console=console)) == given


def dev_args_of(*argv: str) -> argparse.Namespace:
    """`agentrt dev`'s arguments as its own parser reads them."""
    return build_parser().parse_args(["dev", *argv])


@pytest.mark.parametrize(("argv", "field"), [
    (["--listen", "50051"], "--listen"),
    (["--listen", "127.0.0.1:"], "--listen"),
    (["--listen", ":50051"], "--listen"),
    (["--listen", "127.0.0.1:port"], "--listen"),
    (["--console", "8080"], "--console"),
    (["--console", "127.0.0.1:-1"], "--console"),
])
def test_dev_refuses_an_address_that_is_not_host_port_naming_the_flag(argv: list[str], field: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        dev_args.validate(dev_args_of(*argv))
    assert refused.value.field == field
    dev_args.validate(dev_args_of())  # the defaults pass: each refusal above is its one bad value
