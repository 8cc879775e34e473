"""The `agentrt` command: the services, the operator commands and the client commands.

Each subcommand imports its service lazily. The dev-stack commands (`agentrt dev`, `mocktool`,
`acceptance`, `chaos`) come from devstack/commands.py when that package is installed.

Failures print one readable line on stderr and exit non-zero; never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from shared.event_loop import run_service

# gRPC's C core logs through absl straight to stderr, and by default at INFO: a failed TLS handshake
# printed a raw line before the CLI's own one-line error. ERROR keeps real faults; the variable is read
# once, when grpc is first imported (below this line), and an explicit GRPC_VERBOSITY still wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

EXIT_ERROR = 1
EXIT_USAGE = 2


def _setup_logging(settings: Any) -> None:
    """Text or JSON lines on stderr, as the component's `log_level` and `log_format` say (shared/logs.py)."""
    from shared.logs import capture_native_stderr, setup_logging

    setup_logging(settings.log_level, settings.log_format, settings.service_name)
    if settings.log_format == "json":
        capture_native_stderr()  # gRPC C-core's own lines, as JSON records too


def cmd_migrate(args: argparse.Namespace) -> int:
    import asyncpg

    from scheduler.config import SchedulerSettings
    from scheduler.store.migrate import available_migrations, migrate

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
    if args.apply_roles:
        return _apply_roles(settings.database_url)
    return 0


def _owner_url(args: argparse.Namespace) -> str:
    from scheduler.config import SchedulerSettings

    return args.database_url or SchedulerSettings().database_url


def _apply_roles(database_url: str) -> int:
    import asyncpg

    from scheduler.store.database_roles import DatabaseRoleSettings, apply_roles

    settings = DatabaseRoleSettings()

    async def run() -> list[Any]:
        conn = await asyncpg.connect(database_url, timeout=10)
        try:
            return await apply_roles(conn, settings)
        finally:
            await conn.close()

    for report in asyncio.run(run()):
        print(f"role {report.role}: {'created' if report.created else 'exists'}; privileges set"
              + ("; password set" if report.password_set else "; password unchanged"))
    return 0


def cmd_roles(args: argparse.Namespace) -> int:
    import asyncpg

    from scheduler.store.database_roles import DatabaseRoleSettings, check_roles

    if args.roles_command == "apply":
        return _apply_roles(_owner_url(args))

    async def run() -> list[str]:
        conn = await asyncpg.connect(_owner_url(args), timeout=10)
        try:
            return await check_roles(conn, DatabaseRoleSettings())
        finally:
            await conn.close()

    problems = asyncio.run(run())
    for problem in problems:
        print(problem)
    if problems:
        print(f"agentrt roles check: {len(problems)} problem(s); `agentrt roles apply` fixes them", file=sys.stderr)
        return EXIT_ERROR
    print("roles as they should be")
    return 0


def cmd_scheduler(args: argparse.Namespace) -> int:
    from scheduler.config import SchedulerSettings
    from scheduler.server import serve

    overrides: dict[str, Any] = {}
    if args.database_url:
        overrides["database_url"] = args.database_url
    if args.listen:
        overrides["listen_addr"] = args.listen
    settings = SchedulerSettings(**overrides)
    _setup_logging(settings)
    run_service(serve(settings), settings.event_loop)
    return 0


def modules_from_here() -> None:
    """Agent modules are importable from the current directory, as with `python -m` (the
    `agentrt` script's own directory is what Python puts first on the path otherwise)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def cmd_executor(args: argparse.Namespace) -> int:
    from executor.config import ExecutorSettings
    from executor.main import serve

    modules_from_here()

    overrides: dict[str, Any] = {}
    if args.scheduler:
        overrides["scheduler_addr"] = args.scheduler
    if args.agents:
        overrides["agents_path"] = args.agents
    if args.slots:
        overrides["slots"] = args.slots
    settings = _with_local_session(ExecutorSettings(**overrides), overrides)
    _setup_logging(settings)
    run_service(serve(settings), settings.event_loop)
    return 0


def _with_local_session(settings: Any, overrides: dict[str, Any]) -> Any:
    """An executor started where `agentrt dev` runs joins its stack: the scheduler address and the
    session's executor token from .agentrt/client.json, for what flags, environment and config
    file leave unset (a token goes in clear only over loopback, as the dev stack's own executors do)."""
    from cli import local_config

    given = settings.model_fields_set
    local = local_config.for_scheduler(settings.scheduler_addr if "scheduler_addr" in given else None)
    if not local:
        return settings
    extra: dict[str, Any] = {}
    if "scheduler_addr" not in given:
        extra["scheduler_addr"] = local["scheduler_addr"]
    if "work_token" not in given and local.get("work_token"):
        extra["work_token"] = local["work_token"]
        if "scheduler_insecure" not in given and not settings.scheduler_tls:
            extra["scheduler_insecure"] = True
    return type(settings)(**overrides, **extra) if extra else settings


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
    _setup_logging(settings)
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
    _setup_logging(settings)
    logging.getLogger("aiokafka").setLevel(settings.kafka_log_level.upper())
    run_service(serve(settings), settings.event_loop)
    return 0


def _outbox_settings(args: argparse.Namespace) -> Any:
    """The relay's settings, but the database must be named: the relay's built-in default
    (a local `agentrt` database) is a guess an operator command must not act on."""
    from shared.errors import InvalidArgument

    settings = _relay_settings(args)
    if "database_url" not in settings.model_fields_set:
        raise InvalidArgument("--database-url", "name the outbox's PostgreSQL with --database-url, "
                                                "AGENTRT_DATABASE_URL or the config file's relay section")
    return settings


def cmd_outbox(args: argparse.Namespace) -> int:
    import getpass

    from relay import admin

    settings = _outbox_settings(args)
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


def cmd_console(args: argparse.Namespace) -> int:
    from console.config import ConsoleSettings
    from console.main import serve

    overrides: dict[str, Any] = {}
    for option, field in (("scheduler", "scheduler_addr"), ("listen", "listen_addr"), ("tls_ca", "tls_ca"),
                          ("tls_cert", "tls_cert"), ("tls_key", "tls_key"), ("tls_server_name", "tls_server_name")):
        if getattr(args, option, None):
            overrides[field] = getattr(args, option)
    if args.insecure:
        overrides["insecure"] = True
    settings = ConsoleSettings(**overrides)
    _setup_logging(settings)
    run_service(serve(settings), settings.event_loop)
    return 0


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line naming the command and the problem (no usage dump), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _service_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """migrate, roles, scheduler, executor, console, reconcile."""
    p = sub.add_parser("migrate", help="apply database migrations (safe from several replicas at once)")
    p.add_argument("--database-url", help="PostgreSQL URL of the schema's owner (default: AGENTRT_DATABASE_URL)")
    p.add_argument("--apply-roles", action="store_true",
                   help="then create or update the runtime roles and their privileges (as `agentrt roles apply`)")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("roles", help="the least-privilege database roles of the services (run as the owner)")
    roles = p.add_subparsers(dest="roles_command", required=True)
    for action, text in (("apply", "create the roles if missing and set exactly their privileges"),
                         ("check", "list every difference from the privileges they should have; exit 1 if any")):
        q = roles.add_parser(action, help=text)
        q.add_argument("--database-url", help="PostgreSQL URL of the schema's owner (default: AGENTRT_DATABASE_URL)")
    p.set_defaults(func=cmd_roles)

    p = sub.add_parser("scheduler", help="run the scheduler (RunService + WorkService over gRPC)")
    p.add_argument("--database-url", help="PostgreSQL URL (default: AGENTRT_DATABASE_URL)")
    p.add_argument("--listen", help="host:port (default: AGENTRT_LISTEN_ADDR or 0.0.0.0:50051)")
    p.set_defaults(func=cmd_scheduler)

    p = sub.add_parser("executor", help="run an executor (claims fenced work from the scheduler)")
    p.add_argument("--scheduler", help="scheduler host:port (default: AGENTRT_SCHEDULER_ADDR, the `agentrt dev` "
                                       "session's .agentrt/client.json, or 127.0.0.1:50051)")
    p.add_argument("--agents", help="agents to serve, comma-separated: Python modules of code-first agents "
                                    "(mypkg.agents, importable from here), definition files, or a directory "
                                    "of them (default: AGENTRT_AGENTS_PATH)")
    p.add_argument("--slots", type=int, help="concurrent runs (default: AGENTRT_SLOTS or 4)")
    p.set_defaults(func=cmd_executor)

    p = sub.add_parser("console", help="run the operator console (web pages over the scheduler's RunService)")
    p.add_argument("--scheduler", help="scheduler host:port (default: AGENTRT_CONSOLE_SCHEDULER_ADDR or "
                                       "127.0.0.1:50051)")
    p.add_argument("--listen", help="HTTP host:port (default: AGENTRT_CONSOLE_LISTEN_ADDR or 127.0.0.1:8080)")
    p.add_argument("--tls-ca", help="CA of the scheduler's certificate (default AGENTRT_CONSOLE_TLS_CA): TLS on")
    p.add_argument("--tls-cert", help="client certificate for mutual TLS (default AGENTRT_CONSOLE_TLS_CERT)")
    p.add_argument("--tls-key", help="client key for mutual TLS (default AGENTRT_CONSOLE_TLS_KEY)")
    p.add_argument("--tls-server-name", help="name to check in the scheduler's certificate (default: its host)")
    p.add_argument("--insecure", action="store_true",
                   help="send the signed-in person's credential in clear to a scheduler that is not on loopback")
    p.set_defaults(func=cmd_console)

    p = sub.add_parser("reconcile", help="resolve PAUSED_INDOUBT tool calls through their lookup contracts")
    p.add_argument("--tenants", required=True, help="comma-separated tenants to sweep")
    p.add_argument("--scheduler", help="scheduler host:port (default: AGENTRT_SCHEDULER_ADDR or 127.0.0.1:50051)")
    p.add_argument("--agents", help="agent definitions (default: AGENTRT_AGENTS_PATH)")
    p.add_argument("--once", action="store_true", help="one sweep, print its report as JSON, exit")
    p.set_defaults(func=cmd_reconcile)


def _relay_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """relay, and outbox operations."""
    p = sub.add_parser("relay", help="run the relay (outbox rows to Kafka as CloudEvents, per-run order)")
    p.add_argument("--database-url", help="PostgreSQL URL (default: AGENTRT_DATABASE_URL)")
    p.add_argument("--kafka-bootstrap", help="host:port[,host:port] (default: AGENTRT_KAFKA_BOOTSTRAP)")
    p.add_argument("--health-addr", help="gRPC health host:port (default: AGENTRT_HEALTH_ADDR or 0.0.0.0:50053)")
    p.set_defaults(func=cmd_relay)

    _outbox_command(sub)


def _outbox_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """outbox status | parked | retry | skip; --database-url before or after the action."""
    database_help = "PostgreSQL URL (default: AGENTRT_DATABASE_URL; required)"
    p = sub.add_parser("outbox", help="operate on the outbox: status, parked rows, retry or skip one")
    p.add_argument("--database-url", help=database_help)
    p.set_defaults(func=cmd_outbox)
    outbox = p.add_subparsers(dest="action", required=True)
    actions = {"status": "events waiting, oldest age, parked rows, relays and their shards",
               "parked": "list parked rows",
               "retry": "let the relay try a parked row again",
               "skip": "drop a parked row for good; its run's later events flow again"}
    for action, text in actions.items():
        q = outbox.add_parser(action, help=text)
        # SUPPRESS: when not given here, the value given before the action (or none) stays.
        q.add_argument("--database-url", default=argparse.SUPPRESS, help=database_help)
        if action == "parked":
            q.add_argument("--state", default="PARKED", choices=["PARKED", "RETRY", "SKIPPED", "DELIVERED", "all"])
            q.add_argument("--limit", type=int, default=100)
        elif action in ("retry", "skip"):
            q.add_argument("outbox_id", type=int, help="outbox id of the parked row")
            q.add_argument("--operator", help="who decides (default: the OS user)")
            q.add_argument("--note", required=action == "skip", default="",
                           help="why (required for skip; kept with the row)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="agentrt", description="Durable runtime for long AI-agent tasks.")
    sub = parser.add_subparsers(dest="command", required=True)
    _service_commands(sub)
    _relay_commands(sub)

    from cli.admin import add_commands as add_admin_commands
    from cli.encryption import add_commands as add_encryption_commands
    from cli.events import add_commands as add_event_commands
    from cli.limits import add_commands as add_limit_commands
    from cli.maintain import add_commands as add_maintain_commands
    from cli.retention import add_commands as add_retention_commands
    from cli.runs import add_commands as add_run_commands
    from cli.schedules import add_commands as add_schedule_commands

    add_run_commands(sub)
    add_schedule_commands(sub)
    add_admin_commands(sub)
    add_event_commands(sub)
    add_retention_commands(sub)
    add_encryption_commands(sub)
    add_limit_commands(sub)
    add_maintain_commands(sub)
    _dev_stack_commands(sub)
    _version_options(parser, sub)
    return parser


def _dev_stack_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`agentrt dev`, `mocktool`, `acceptance` and `chaos` belong to the dev stack (devstack/: in the
    wheel and a checkout, not in the container image). It plugs in from the floor above, so nothing
    here names it in an import; an install without it answers `agentrt dev` with one line."""
    try:
        commands = importlib.import_module("devstack.commands")
    except ModuleNotFoundError as exc:
        if exc.name not in ("devstack", "devstack.commands"):
            raise
        p = sub.add_parser("dev", help="the whole runtime on this machine (not in this install: see --help)")
        p.set_defaults(func=_no_dev_stack)
        return
    commands.add_commands(sub)


def _no_dev_stack(args: argparse.Namespace) -> int:
    print("agentrt dev: this install has no dev stack (the container image ships the services only); "
          "run it from a checkout or a wheel install: pipx install 'agentrt[dev]'", file=sys.stderr)
    return EXIT_USAGE


def _version_options(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`agentrt --version` and `agentrt <command> --version` (each service's): the package's one version."""
    from shared.version import agentrt_version

    text = f"agentrt {agentrt_version()}"
    parser.add_argument("--version", action="version", version=text)
    for command in sub.choices.values():
        command.add_argument("--version", action="version", version=text, help="print the version and exit")


def _one_line(exc: BaseException) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "settings"
        return f"invalid setting {field}: {first['msg']}"
    from shared.errors import AgentNotRegistered, AgentrtError, InvalidArgument

    if isinstance(exc, InvalidArgument):
        return exc.message  # "run_id: is not a UUID: ..." names its field once
    if isinstance(exc, AgentNotRegistered):  # the API names its request field; a CLI user needs the flag
        return f"{exc.reason}: {exc.message.replace(AgentNotRegistered.API_HINT, AgentNotRegistered.CLI_HINT)}"
    if isinstance(exc, AgentrtError):
        return f"{exc.reason}: {exc.message}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


EXIT_READER_GONE = 141  # as a process killed by SIGPIPE (128 + 13): what `yes | head` reports


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # here, not at interpreter exit, where a closed pipe could only be reported
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """`agentrt runs export RUN | head`: the reader took what it wanted and closed the pipe. That is
    no error: stop quietly, and point stdout at /dev/null so the exit's own flush has nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_READER_GONE


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise
    except Exception as exc:
        print(f"agentrt {args.command}: error: {_tls_mistake(exc, args) or _one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR


def _tls_mistake(exc: BaseException, args: argparse.Namespace) -> str | None:
    """The two TLS mistakes said plainly: plaintext to a TLS port (the server hangs up: "Socket closed")
    and TLS to a plaintext port (the handshake reads a non-TLS answer: WRONG_VERSION_NUMBER)."""
    from shared.errors import Unavailable

    if not isinstance(exc, Unavailable) or not hasattr(args, "tls_ca"):
        return None
    addr = getattr(args, "addr", None) or os.environ.get("AGENTRT_ADDR") or "the scheduler"
    tls_ca = args.tls_ca or os.environ.get("AGENTRT_TLS_CA")
    text = exc.message
    if not tls_ca and ("Socket closed" in text or "Connection reset" in text):
        return (f"UNAVAILABLE: {addr} hung up on a plaintext connection: it probably serves TLS; "
                "pass its CA with --tls-ca FILE (or AGENTRT_TLS_CA)")
    if tls_ca and "WRONG_VERSION_NUMBER" in text:
        return (f"UNAVAILABLE: {addr} answered the TLS handshake in plaintext: it does not serve TLS; "
                "drop --tls-ca (and AGENTRT_TLS_CA), or turn TLS on at the scheduler")
    if tls_ca and "CERTIFICATE_VERIFY_FAILED" in text:
        return (f"UNAVAILABLE: {addr}'s certificate is not signed by the CA in {tls_ca} "
                "(or does not name the address: --tls-server-name)")
    return None


if __name__ == "__main__":
    sys.exit(main())
