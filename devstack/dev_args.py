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
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidArgument("--listen", f"{args.listen!r} is not host:port")
    if args.console not in ("", "none"):
        host, _, port = args.console.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgument("--console", f"{args.console!r} is not host:port (or none)")
    if args.agents:
        from executor.agents import AgentCatalog, DefinitionError

        try:  # here, with one line, rather than as an executor that exits at start
            AgentCatalog.load(args.agents)
        except DefinitionError as exc:
            raise InvalidArgument("--agents", str(exc)) from None


def ports_given(args: argparse.Namespace) -> list[int]:
    """The loopback ports the command line names (--listen, --console): the session's own picks avoid them."""
    return [int(addr.rpartition(":")[2]) for addr in (args.listen, args.console) if addr not in ("", "none")]
