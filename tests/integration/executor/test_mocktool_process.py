"""The mock tool server as its own process: records, dedupes, refuses stale fences, answers lookups."""

import asyncio
import sqlite3
import sys

import aiohttp
import pytest

from devstack.embedded_pg import free_port

pytestmark = pytest.mark.integration


async def test_python_m_devstack_mocktool(tmp_path):
    port, db = free_port(), tmp_path / "mock.sqlite"
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "devstack.mocktool", "--port", str(port),
                                                "--db", str(db), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.DEVNULL)
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert f"127.0.0.1:{port}" in line.decode()
        url = f"http://127.0.0.1:{port}"
        headers = {"Idempotency-Key": "k1", "X-Fencing-Token": "3", "X-Agentrt-Run-Id": "run-1"}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/tools/crm.note", json={"text": "hi"}, headers=headers) as resp:
                first = await resp.json()
                assert resp.status == 200 and first["id"] == "crm.note-1"
            async with http.post(f"{url}/tools/crm.note", json={"text": "hi"}, headers=headers) as resp:
                assert await resp.json() == first  # deduped by key
            stale = {**headers, "Idempotency-Key": "k2", "X-Fencing-Token": "2"}
            async with http.post(f"{url}/tools/crm.note", json={}, headers=stale) as resp:
                assert resp.status == 409 and (await resp.json())["error"] == "stale_fence"
            async with http.get(f"{url}/lookup/crm.note", params={"key": "k1"}, headers=headers) as resp:
                assert resp.status == 200 and (await resp.json())["response"] == first
            async with http.get(f"{url}/lookup/crm.note", params={"key": "k9"}, headers=headers) as resp:
                assert resp.status == 404 and (await resp.json()) == {"found": False}
            async with http.post(f"{url}/_faults", json={"tool": "crm.note", "mode": "rate_limit"}) as resp:
                assert resp.status == 200
            async with http.post(f"{url}/tools/crm.note", json={}, headers={**headers, "Idempotency-Key": "k3"}) \
                    as resp:
                assert resp.status == 429 and resp.headers["Retry-After"] == "1"
            async with http.get(f"{url}/_stats", params={"tool": "crm.note", "key": "k1"}) as resp:
                assert await resp.json() == {"requests": 2, "executions": 1}
    finally:
        proc.terminate()
        await proc.wait()
    # Its own persistent store: every request, with key, fence and outcome, survives the process.
    rows = sqlite3.connect(db).execute("SELECT kind, idempotency_key, fence, outcome FROM requests ORDER BY id")
    assert [tuple(r) for r in rows] == [
        ("call", "k1", 3, "executed"), ("call", "k1", 3, "duplicate"), ("call", "k2", 2, "stale_fence"),
        ("lookup", "k1", 3, "found"), ("lookup", "k9", 3, "not_found"), ("call", "k3", 3, "rate_limit")]
