"""`agentrt acceptance` and `agentrt chaos`: their arguments (options.py) at once, their work imported lazily."""

from __future__ import annotations

import argparse

from devstack.acceptance.options import acceptance_arguments, chaos_arguments, quiet


def cmd_acceptance(args: argparse.Namespace) -> int:
    import asyncio

    quiet()
    from devstack.acceptance.runner import main_async

    return asyncio.run(main_async(args))


def cmd_chaos(args: argparse.Namespace) -> int:
    import asyncio

    quiet()
    if args.ha:  # the long soak on a Patroni cluster
        from devstack.acceptance.soak_ha import main_async
    else:
        from devstack.acceptance.chaos import main_async

    return asyncio.run(main_async(args))


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("acceptance", help="the fault-injection acceptance suite (experiments 1-9, evidence records)")
    acceptance_arguments(p)
    p.set_defaults(func=cmd_acceptance)
    p = sub.add_parser("chaos", help="the chaos soak: runs under random SIGKILLs and restarts, then invariants")
    chaos_arguments(p)
    p.set_defaults(func=cmd_chaos)
