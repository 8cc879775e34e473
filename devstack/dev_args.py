"""The checks of `agentrt dev`'s arguments: each bad one is refused with one line naming it,
before anything starts."""

from __future__ import annotations

import argparse

from shared.errors import InvalidArgument


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
    if _port_of(args.listen) is None:
        raise InvalidArgument("--listen", f"{args.listen!r} is not host:port")
    if args.console not in ("", "none") and _port_of(args.console) is None:
        raise InvalidArgument("--console", f"{args.console!r} is not host:port (or none)")
    if args.agents:
        from executor.agents import AgentCatalog, DefinitionError

        try:  # here, with one line, rather than as an executor that exits at start
            AgentCatalog.load(args.agents)
        except DefinitionError as exc:
            raise InvalidArgument("--agents", str(exc)) from None


def _port_of(address: str) -> int | None:
    """The port of host:port, or None when `address` is not one."""
    host, _, port = address.rpartition(":")
    return int(port) if host and port.isdigit() else None


def ports_given(args: argparse.Namespace) -> list[int]:
    """The ports the command line names (--listen, --console, validated): the session's own picks avoid them."""
    ports = (_port_of(address) for address in (args.listen, args.console) if address not in ("", "none"))
    return [port for port in ports if port is not None]
