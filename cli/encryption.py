"""`agentrt encryption rotate|status`: the KEKs that wrap the runs' data keys (docs/encryption.md).

`rotate` re-wraps every data key that another KEK than the keyring's current one wraps, in
batches (one short transaction each, rows locked SKIP LOCKED), while the scheduler keeps
serving: it reads with any KEK of its keyring. Keep the old KEK in the keyring until `rotate`
reports nothing left under it; then it can go. The keyring comes from the scheduler's settings
(encryption_keys_file, or AGENTRT_ENCRYPTION_KEYS).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from shared.errors import InvalidArgument


def _with_store(args: argparse.Namespace, action: Any) -> Any:
    from cli.retention import with_store

    batch = getattr(args, "batch", None)
    return with_store(args.database_url, action, **({"rotate_batch": batch} if batch is not None else {}))


def _rotate(args: argparse.Namespace) -> int:
    if args.batch is not None and not 1 <= args.batch <= 10_000:
        raise InvalidArgument("--batch", "must be between 1 and 10000")

    async def act(store: Any) -> dict[str, Any]:
        done = await store.keys.rotate_keys()
        return {"current_key_id": store.keys.keyring().current_key_id(), "rewrapped": done.rewrapped,
                "keys_by_kek": done.remaining}

    print(json.dumps(asyncio.run(_with_store(args, act)), sort_keys=True))
    return 0


def _status(args: argparse.Namespace) -> int:
    async def act(store: Any) -> dict[str, Any]:
        return {"current_key_id": store.keys.keyring().current_key_id(),
                "keys_by_kek": await store.keys.data_key_counts()}

    print(json.dumps(asyncio.run(_with_store(args, act)), sort_keys=True))
    return 0


def cmd_encryption(args: argparse.Namespace) -> int:
    return {"rotate": _rotate, "status": _status}[args.encryption_command](args)


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("encryption", help="the key-encryption keys of sensitive values: rotate, status")
    p.set_defaults(func=cmd_encryption)
    actions = p.add_subparsers(dest="encryption_command", required=True)
    q = actions.add_parser("rotate", help="re-wrap every data key with the keyring's current KEK (online)")
    q.add_argument("--batch", type=int, help="data keys per transaction (default: rotate_batch, 500)")
    q.add_argument("--database-url", help="PostgreSQL URL (default: AGENTRT_DATABASE_URL)")
    q = actions.add_parser("status", help="data keys per KEK id")
    q.add_argument("--database-url", help="PostgreSQL URL (default: AGENTRT_DATABASE_URL)")
