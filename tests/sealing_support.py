"""Sealed values in tests: a marked agent (payer), its secrets, a keyring and the raw rows of every table.

Shared by the sensitive-value tests of the scheduler and of the whole stack.
"""

from __future__ import annotations

import base64
import json
import os

from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

SECRET = "4111-1111-SECRET-card-7c1e"
TOKEN = "tok-OUTPUT-secret-93ab"
SENSITIVE = {"input": [["card"]], "tools": {"pay.charge": {"input": [["card"]], "output": [["token"]]}}}
SCHEMA = {"type": "object", "properties": {"card": {"type": "string", "x-agentrt-sensitive": True},
                                           "amount": {"type": "integer"}}}


def keyring(current: str, **keys: bytes) -> str:
    return json.dumps({"current": current, "keys": {k: base64.b64encode(v).decode() for k, v in keys.items()}})


K1, K2 = os.urandom(32), os.urandom(32)


async def register(stack) -> None:
    await stack.work.RegisterAgents(ws.RegisterAgentsRequest(worker_id="w1", ttl_ms=60_000, agents=[
        ws.AgentRegistration(name="payer", version="1", tool_names=["pay.charge"], input_schema_json=json.dumps(SCHEMA),
                             sensitive_json=json.dumps(SENSITIVE))]))


async def submit(stack, **payload) -> str:
    reply = await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="payer", input_json=json.dumps(payload)),
                                       metadata=stack.md())
    return reply.run.run_id


async def raw_tables(db) -> str:
    """Every row of every table, as PostgreSQL prints it."""
    names = await db.fetch("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    parts = []
    for row in names:
        parts.append(await db.fetchval(f'SELECT coalesce(string_agg(t::text, E"\\n"), \'\') FROM "{row[0]}" t'
                                       .replace('E"\\n"', "E'\\n'")))
    return "\n".join(parts)
