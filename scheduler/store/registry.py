"""The agent registry's reads and writes (docs/design.md §agents): which executor serves which agent version.

Registrations are timed by the database clock, like leases; scheduler/admission.py
decides with them whether a submit is admitted.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from scheduler.admission import LiveVersion
from scheduler.store.core import Repository, db_call
from scheduler.store.queries import Q
from scheduler.store.rows import RegisteredAgentRow
from shared.canonical import canonical_json
from shared.db import fetch, fetchval


@dataclass(frozen=True)
class AgentSpec:
    """One agent version an executor serves (a RegisterAgents item, validated)."""

    name: str
    version: str
    input_schema: dict[str, Any] | None
    tool_names: tuple[str, ...]
    default_priority: int | None = None
    concurrency_key: str | None = None
    concurrency_max: int | None = None
    # The marked paths, and under "declared" the declared signals' and ResumeRun input's schemas
    # ({"signals": {name: schema}, "resume": schema}): what the scheduler must know of a version's payloads.
    sensitive: dict[str, Any] | None = None


class RegistryStore(Repository):
    @db_call
    async def register_agents(self, worker_id: str, *, agents: list[AgentSpec], ttl_ms: int) -> dt.datetime:
        """The whole set `worker_id` serves now (an empty list withdraws it); returns the new expiry."""
        async with self.pool.acquire() as conn:
            expires: dt.datetime = await fetchval(
                conn, Q.register_agents, worker_id=worker_id, ttl_ms=ttl_ms,
                names=[a.name for a in agents], versions=[a.version for a in agents],
                schemas=[canonical_json(a.input_schema) if a.input_schema is not None else "" for a in agents],
                tools=[json.dumps(list(a.tool_names)) for a in agents],
                priorities=[a.default_priority for a in agents],
                concurrency_keys=[a.concurrency_key for a in agents],
                concurrency_maxes=[a.concurrency_max for a in agents],
                sensitives=[canonical_json(a.sensitive) if a.sensitive else "" for a in agents])
        return expires

    @db_call
    async def live_agent_versions(self, agent_name: str) -> dict[str, LiveVersion]:
        """Each version of `agent_name` a live executor serves, with its input schema (None: none declared)
        and default priority."""
        async with self.pool.acquire() as conn:
            rows = await fetch(conn, Q.live_versions, agent_name=agent_name)
        return {row["agent_version"]: LiveVersion(row["input_schema"], row["default_priority"], row["concurrency_key"],
                                                  row["concurrency_max"], row["sensitive"]) for row in rows}

    @db_call
    async def registered_agents(self) -> list[RegisteredAgentRow]:
        async with self.pool.acquire() as conn:
            rows = await fetch(conn, Q.list_agents)
        return [RegisteredAgentRow.of(row, executors=sorted(row["executors"])) for row in rows]
