"""Shard leases: which shards of the outbox this relay may publish, with their fencing tokens.

Every `lease/3` the relay renews its membership and its shards, then moves
towards its fair share (ceil(shards / live relays)): it takes free or expired
shards when it has too few, and hands back its highest shards when it has too
many (after the round in flight, so the next owner starts from marked rows).

The database decides expiry; locally a shard counts as usable only until
`started + lease - margin` on the monotonic clock, where `started` is taken
before the renewal was sent. So a relay whose renewals stall stops publishing
before another relay can take its shards over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from relay.config import RelaySettings
from relay.store import RelayStore
from shared.errors import Unavailable

log = logging.getLogger(__name__)


@dataclass
class HeldShard:
    fencing_token: int
    usable_until: float  # time.monotonic()


class ShardLeases:
    def __init__(self, store: RelayStore, settings: RelaySettings, round_lock: asyncio.Lock,
                 on_acquired: asyncio.Event) -> None:
        self.store = store
        self.settings = settings
        self.relay_id = settings.relay_id
        self._round_lock = round_lock
        self._on_acquired = on_acquired
        self._held: dict[int, HeldShard] = {}
        # Set by the loop: waits for its mark in flight before shards are handed back.
        self.before_release: Callable[[], Awaitable[None]] | None = None
        self.live_members = 1
        self._margin = settings.shard_lease_ms / 1000 / 5

    def usable(self) -> dict[int, int]:
        """Shard → fencing token, for shards whose local lease has time left."""
        now = time.monotonic()
        return {shard: held.fencing_token for shard, held in self._held.items() if held.usable_until > now}

    @property
    def held_count(self) -> int:
        return len(self._held)

    async def tick(self) -> None:
        s = self.settings
        ttl = s.shard_lease_ms
        started = time.monotonic()
        usable_until = started + ttl / 1000 - self._margin
        self.live_members = await self.store.heartbeat_member(self.relay_id, ttl)
        renewed = await self.store.renew_shards(self.relay_id, ttl,
                                                {k: v.fencing_token for k, v in self._held.items()})
        lost = set(self._held) - set(renewed)
        if lost:
            log.warning("relay %s lost shards %s (taken over after its lease lapsed)", self.relay_id, sorted(lost))
        self._held = {shard: HeldShard(token, usable_until) for shard, token in renewed.items()}

        target = math.ceil(s.shard_count / max(self.live_members, 1))
        if len(self._held) < target:
            acquired = await self.store.acquire_shards(self.relay_id, ttl, target - len(self._held))
            if acquired:
                log.info("relay %s acquired shards %s", self.relay_id, sorted(acquired))
                for shard, token in acquired.items():
                    self._held[shard] = HeldShard(token, usable_until)
                self._on_acquired.set()
        elif len(self._held) > target:
            extra = sorted(self._held)[target:]
            await self.release(extra)

    async def release(self, shards: list[int]) -> None:
        if not shards:
            return
        # Wait for the round in flight: the next owner must find its rows marked.
        async with self._round_lock:
            for shard in shards:
                self._held.pop(shard, None)
            if self.before_release is not None:
                try:
                    await self.before_release()
                except Unavailable as exc:
                    log.warning("handing back shards with a failed mark (%s): duplicates will follow", exc)
        released = await self.store.release_shards(self.relay_id, shards)
        log.info("relay %s released shards %s", self.relay_id, released)

    async def release_all(self) -> None:
        await self.release(sorted(self._held))

    async def run(self, stopping: asyncio.Event) -> None:
        interval = self.settings.shard_lease_ms / 1000 / 3
        while not stopping.is_set():
            try:
                await self.tick()
            except Unavailable as exc:
                # Leases lapse locally on their own; nothing else to do until the database is back.
                log.warning("relay %s cannot renew its shard leases: %s", self.relay_id, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), interval)
