"""The `agentrt` command. Each subcommand imports its service lazily.

Failures print one readable line on stderr and exit non-zero; never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_ERROR = 1
EXIT_USAGE = 2


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def cmd_migrate(args: argparse.Namespace) -> int:
    import asyncpg

    from scheduler.migrate import available_migrations, migrate
    from shared.config import SchedulerSettings

    settings = SchedulerSettings(**({"database_url": args.database_url} if args.database_url else {}))

    async def run() -> list[int]:
        conn = await asyncpg.connect(settings.database_url, timeout=10)
        try:
            return await migrate(conn)
        finally:
            await conn.close()

    applied = asyncio.run(run())
    known = len(available_migrations())
    print(f"schema at version {known}; applied {applied if applied else 'nothing (up to date)'}")
    return 0


def cmd_scheduler(args: argparse.Namespace) -> int:
    from scheduler.server import serve
    from shared.config import SchedulerSettings

    overrides: dict[str, Any] = {}
    if args.database_url:
        overrides["database_url"] = args.database_url
    if args.listen:
        overrides["listen_addr"] = args.listen
    settings = SchedulerSettings(**overrides)
    _setup_logging(settings.log_level)
    asyncio.run(serve(settings))
    return 0


def cmd_executor(args: argparse.Namespace) -> int:
    from executor.config import ExecutorSettings
    from executor.main import serve

    overrides: dict[str, Any] = {}
    if args.scheduler:
        overrides["scheduler_addr"] = args.scheduler
    if args.agents:
        overrides["agents_path"] = args.agents
    if args.slots:
        overrides["slots"] = args.slots
    settings = ExecutorSettings(**overrides)
    _setup_logging(settings.log_level)
    asyncio.run(serve(settings))
    return 0


def cmd_mocktool(args: argparse.Namespace) -> int:
    from executor.mocktool import run_server

    _setup_logging("INFO")
    asyncio.run(run_server(args.host, args.port, args.db, latency_ms=args.latency_ms))
    return 0


def cmd_reconcile(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from executor.config import ExecutorSettings
    from executor.main import reconcile

    overrides: dict[str, Any] = {"reconcile_tenants": [t for t in args.tenants.split(",") if t]}
    if args.scheduler:
        overrides["scheduler_addr"] = args.scheduler
    if args.agents:
        overrides["agents_path"] = args.agents
    settings = ExecutorSettings(**overrides)
    _setup_logging(settings.log_level)
    report = asyncio.run(reconcile(settings, once=args.once))
    print(json.dumps(dataclasses.asdict(report), sort_keys=True))
    return 0


def _relay_settings(args: argparse.Namespace) -> Any:
    from relay.config import RelaySettings

    overrides: dict[str, Any] = {}
    for option, field in (("database_url", "database_url"), ("kafka_bootstrap", "kafka_bootstrap"),
                          ("health_addr", "health_addr")):
        if getattr(args, option, None):
            overrides[field] = getattr(args, option)
    return RelaySettings(**overrides)


def cmd_relay(args: argparse.Namespace) -> int:
    from relay.main import serve

    settings = _relay_settings(args)
    _setup_logging(settings.log_level)
    logging.getLogger("aiokafka").setLevel(settings.kafka_log_level.upper())
    asyncio.run(serve(settings))
    return 0


def cmd_outbox(args: argparse.Namespace) -> int:
    import getpass

    from relay import admin

    settings = _relay_settings(args)
    if args.action == "status":
        result: Any = asyncio.run(admin.status(settings))
    elif args.action == "parked":
        state = None if args.state == "all" else args.state
        result = asyncio.run(admin.list_parked(settings, state, args.limit))
    else:
        operator = args.operator or getpass.getuser()
        action = admin.retry if args.action == "retry" else admin.skip
        result = asyncio.run(action(settings, args.outbox_id, operator, args.note))
    print(admin.dumps(result))
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    from shared.devstack import run_dev

    return run_dev(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrt", description="Durable runtime for long AI-agent tasks.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("migrate", help="apply database migrations (safe from several replicas at once)")
    p.add_argument("--database-url", help="PostgreSQL URL (default: AGENTRT_DATABASE_URL)")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("scheduler", help="run the scheduler (RunService + WorkService over gRPC)")
    p.add_argument("--database-url", help="PostgreSQL URL (default: AGENTRT_DATABASE_URL)")
    p.add_argument("--listen", help="host:port (default: AGENTRT_LISTEN_ADDR or 0.0.0.0:50051)")
    p.set_defaults(func=cmd_scheduler)

    p = sub.add_parser("executor", help="run an executor (claims fenced work from the scheduler)")
    p.add_argument("--scheduler", help="scheduler host:port (default: AGENTRT_SCHEDULER_ADDR or 127.0.0.1:50051)")
    p.add_argument("--agents", help="agent definitions: a directory or comma-separated files "
                                    "(default: AGENTRT_AGENTS_PATH)")
    p.add_argument("--slots", type=int, help="concurrent runs (default: AGENTRT_SLOTS or 4)")
    p.set_defaults(func=cmd_executor)

    p = sub.add_parser("mocktool", help="the mock tool HTTP server (test infrastructure, SQLite store)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--db", type=Path, required=True, help="SQLite file recording every request")
    p.add_argument("--latency-ms", type=int, default=0)
    p.set_defaults(func=cmd_mocktool)

    p = sub.add_parser("reconcile", help="resolve PAUSED_INDOUBT tool calls through their lookup contracts")
    p.add_argument("--tenants", required=True, help="comma-separated tenants to sweep")
    p.add_argument("--scheduler", help="scheduler host:port (default: AGENTRT_SCHEDULER_ADDR or 127.0.0.1:50051)")
    p.add_argument("--agents", help="agent definitions (default: AGENTRT_AGENTS_PATH)")
    p.add_argument("--once", action="store_true", help="one sweep, print its report as JSON, exit")
    p.set_defaults(func=cmd_reconcile)

    p = sub.add_parser("relay", help="run the relay (outbox rows to Kafka as CloudEvents, per-run order)")
    p.add_argument("--database-url", help="PostgreSQL URL (default: AGENTRT_DATABASE_URL)")
    p.add_argument("--kafka-bootstrap", help="host:port[,host:port] (default: AGENTRT_KAFKA_BOOTSTRAP)")
    p.add_argument("--health-addr", help="gRPC health host:port (default: AGENTRT_HEALTH_ADDR or 0.0.0.0:50053)")
    p.set_defaults(func=cmd_relay)

    p = sub.add_parser("outbox", help="operate on the outbox: status, parked rows, retry or skip one")
    p.add_argument("--database-url", help="PostgreSQL URL (default: AGENTRT_DATABASE_URL)")
    outbox = p.add_subparsers(dest="action", required=True)
    outbox.add_parser("status", help="events waiting, oldest age, parked rows, relays and their shards")
    q = outbox.add_parser("parked", help="list parked rows")
    q.add_argument("--state", default="PARKED", choices=["PARKED", "RETRY", "SKIPPED", "DELIVERED", "all"])
    q.add_argument("--limit", type=int, default=100)
    for action, text in (("retry", "let the relay try a parked row again"),
                         ("skip", "drop a parked row for good; its run's later events flow again")):
        q = outbox.add_parser(action, help=text)
        q.add_argument("outbox_id", type=int, help="outbox id of the parked row")
        q.add_argument("--operator", help="who decides (default: the OS user)")
        q.add_argument("--note", required=action == "skip", default="",
                       help="why (required for skip; kept with the row)")
    p.set_defaults(func=cmd_outbox)

    p = sub.add_parser("dev", help="embedded PostgreSQL + migrations + the services, for local development")
    p.add_argument("--data-dir", type=Path, default=Path(".agentrt"), help="kept between runs (default .agentrt)")
    p.add_argument("--database-url", help="use this PostgreSQL instead of the embedded one")
    p.add_argument("--listen", default="127.0.0.1:50051", help="scheduler address (default 127.0.0.1:50051)")
    p.add_argument("--exit-after", type=float, default=0.0,
                   help="stop after this many seconds once healthy (0 = run until Ctrl-C)")
    p.set_defaults(func=cmd_dev)

    from shared.cli_runs import add_commands as add_run_commands

    add_run_commands(sub)
    return parser


def _one_line(exc: BaseException) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "settings"
        return f"invalid setting {field}: {first['msg']}"
    from shared.errors import AgentrtError

    if isinstance(exc, AgentrtError):
        return f"{exc.reason}: {exc.message}" if exc.reason != "INVALID_ARGUMENT" else exc.message
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        print(f"agentrt {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
