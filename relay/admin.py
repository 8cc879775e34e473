"""Operator commands on the outbox (`agentrt outbox ...`): status, parked rows, retry, skip."""

from __future__ import annotations

import json
from typing import Any

from relay.config import RelaySettings
from relay.store import RelayStore, connect_pool, record_dict


async def _with_store(settings: RelaySettings, action: Any) -> Any:
    pool = await connect_pool(settings.database_url, min_size=1, max_size=2, command_timeout=30)
    try:
        return await action(RelayStore(pool))
    finally:
        await pool.close()


async def status(settings: RelaySettings) -> dict[str, Any]:
    async def action(store: RelayStore) -> dict[str, Any]:
        lag = await store.lag()
        shards = await store.shards()
        members = await store.members()
        return {
            "pending": lag.pending, "oldest_pending_age_s": round(lag.oldest_age_s, 3),
            "parked": lag.parked, "parked_total": lag.parked_total,
            "relays": [record_dict(m) for m in members if m["live"]],
            "shards": {str(r["shard"]): r["owner"] if r["live"] else None for r in shards},
        }

    return dict(await _with_store(settings, action))


async def list_parked(settings: RelaySettings, state: str | None, limit: int) -> list[dict[str, Any]]:
    async def action(store: RelayStore) -> list[dict[str, Any]]:
        return [record_dict(r) for r in await store.list_parked(state, limit)]

    return list(await _with_store(settings, action))


async def retry(settings: RelaySettings, outbox_id: int, operator: str, note: str) -> dict[str, Any]:
    async def action(store: RelayStore) -> dict[str, Any]:
        return record_dict(await store.retry_parked(outbox_id, operator, note))

    return dict(await _with_store(settings, action))


async def skip(settings: RelaySettings, outbox_id: int, operator: str, note: str) -> dict[str, Any]:
    async def action(store: RelayStore) -> dict[str, Any]:
        return record_dict(await store.skip_parked(outbox_id, operator, note))

    return dict(await _with_store(settings, action))


def _plain(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=_plain)
