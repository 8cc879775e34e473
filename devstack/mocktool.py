"""A mock tool HTTP server with its own persistent store (SQLite), for tests, the demo and fault injection.

    python -m devstack.mocktool --port P --db PATH   (or `agentrt mocktool`)

Every request it receives is recorded (idempotency key, fence, run, time,
request, outcome, result) in its own SQLite file, never the runtime's tables.
It dedupes by (tool, Idempotency-Key), refuses a stale X-Fencing-Token (per
run, or per key without X-Agentrt-Run-Id) with 409 {"error": "stale_fence"},
and answers lookups by key.

Endpoints:
  POST /tools/{tool}                 execute (JSON body)
  GET  /lookup/{tool}?key=K          200 {"found": true, "response": ...} | 404 {"found": false}
  POST /_faults {tool, mode, count, latency_ms, hold_ms}   queue failure modes for a tool
  DELETE /_faults                    drop every queued failure mode
  POST /_config {tool, fenced}       a tool that does not check fences
  GET  /_stats?tool=T&key=K          {"requests": n, "executions": m}
  GET  /_requests?tool=T             every recorded request
  GET  /healthz

Failure modes: latency, timeout_after_execute, rate_limit (429 before executing),
error_before (500, nothing done), error_after (executes, then 500), reset_before,
reset_after (connection dropped), refuse (422, nothing done), lookup_unknown (503).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)
MODES = frozenset({"latency", "timeout_after_execute", "rate_limit", "error_before", "error_after", "reset_before",
                   "reset_after", "refuse", "lookup_unknown"})
_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
  id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, tool TEXT NOT NULL, idempotency_key TEXT,
  fence INTEGER, run_id TEXT, step_key TEXT, received_at REAL NOT NULL, request_json TEXT,
  outcome TEXT NOT NULL, http_status INTEGER NOT NULL, result_json TEXT);
CREATE INDEX IF NOT EXISTS requests_key ON requests (tool, idempotency_key);
CREATE TABLE IF NOT EXISTS executions (
  tool TEXT NOT NULL, idempotency_key TEXT NOT NULL, result_json TEXT NOT NULL, fence INTEGER,
  executed_at REAL NOT NULL, PRIMARY KEY (tool, idempotency_key));
CREATE TABLE IF NOT EXISTS fences (scope TEXT PRIMARY KEY, fence INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS faults (
  id INTEGER PRIMARY KEY AUTOINCREMENT, tool TEXT NOT NULL, mode TEXT NOT NULL, remaining INTEGER NOT NULL,
  latency_ms INTEGER NOT NULL DEFAULT 0, hold_ms INTEGER NOT NULL DEFAULT 30000);
CREATE TABLE IF NOT EXISTS unfenced_tools (tool TEXT PRIMARY KEY);
"""


class MockStore:
    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)

    def record(self, kind: str, tool: str, headers: dict[str, Any], request: Any, outcome: str, status: int,
               result: Any = None) -> None:
        self.db.execute(
            "INSERT INTO requests (kind, tool, idempotency_key, fence, run_id, step_key, received_at, request_json,"
            " outcome, http_status, result_json) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (kind, tool, headers.get("key"), headers.get("fence"), headers.get("run"), headers.get("step"),
             time.time(), json.dumps(request) if request is not None else None, outcome, status,
             json.dumps(result) if result is not None else None))

    def take_fault(self, tool: str, lookup: bool) -> sqlite3.Row | None:
        clause = "mode = 'lookup_unknown'" if lookup else "mode <> 'lookup_unknown'"
        row = self.db.execute(f"SELECT id, mode, latency_ms, hold_ms FROM faults WHERE tool = ? AND remaining > 0 "
                              f"AND {clause} ORDER BY id LIMIT 1", (tool,)).fetchone()
        if row is not None:
            self.db.execute("UPDATE faults SET remaining = remaining - 1 WHERE id = ?", (row[0],))
        return row

    def stale(self, tool: str, scope: str, fence: int | None) -> bool:
        """Raises the scope's fence to `fence`; True when `fence` is older than one already seen."""
        if fence is None or self.db.execute("SELECT 1 FROM unfenced_tools WHERE tool = ?", (tool,)).fetchone():
            return False
        row = self.db.execute("SELECT fence FROM fences WHERE scope = ?", (scope,)).fetchone()
        if row is not None and fence < row[0]:
            return True
        self.db.execute("INSERT INTO fences (scope, fence) VALUES (?, ?) ON CONFLICT (scope) DO UPDATE "
                        "SET fence = max(fence, excluded.fence)", (scope, fence))
        return False

    def execution(self, tool: str, key: str) -> Any:
        row = self.db.execute("SELECT result_json FROM executions WHERE tool = ? AND idempotency_key = ?",
                              (tool, key)).fetchone()
        return json.loads(row[0]) if row else None

    def execute(self, tool: str, key: str, request: Any, fence: int | None) -> tuple[Any, bool]:
        """(result, executed_now). A repeated key returns the stored result and executes nothing."""
        existing = self.execution(tool, key)
        if existing is not None:
            return existing, False
        count = self.db.execute("SELECT count(*) FROM executions WHERE tool = ?", (tool,)).fetchone()[0]
        result = {"id": f"{tool}-{count + 1}", "tool": tool, "request": request, "fence": fence}
        self.db.execute("INSERT INTO executions (tool, idempotency_key, result_json, fence, executed_at) "
                        "VALUES (?,?,?,?,?)", (tool, key, json.dumps(result), fence, time.time()))
        return result, True


def _headers(request: web.Request) -> dict[str, Any]:
    fence = request.headers.get("X-Fencing-Token")
    return {"key": request.headers.get("Idempotency-Key") or request.query.get("key"),
            "fence": int(fence) if fence and fence.isdigit() else None,
            "run": request.headers.get("X-Agentrt-Run-Id"), "step": request.headers.get("X-Agentrt-Step-Key")}


def _reset(request: web.Request) -> web.Response:
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=500)


class MockToolApp:
    def __init__(self, store: MockStore, latency_ms: int = 0) -> None:
        self.store = store
        self.latency_ms = latency_ms
        self.app = web.Application()
        self.app.add_routes([
            web.post("/tools/{tool}", self.call), web.get("/lookup/{tool}", self.lookup),
            web.post("/_faults", self.faults), web.delete("/_faults", self.clear_faults),
            web.post("/_config", self.config), web.get("/_stats", self.stats),
            web.get("/_requests", self.requests), web.get("/healthz", self.healthz)])

    async def call(self, request: web.Request) -> web.StreamResponse:
        tool, h = request.match_info["tool"], _headers(request)
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not h["key"] or not isinstance(body, dict):
            self.store.record("call", tool, h, body, "bad_request", 400)
            return web.json_response({"error": "Idempotency-Key and a JSON object body are required"}, status=400)
        fault = self.store.take_fault(tool, lookup=False)
        mode = fault[1] if fault else None
        delay = self.latency_ms + (fault[2] if fault else 0)
        if delay:
            await asyncio.sleep(delay / 1000)
        if self.store.stale(tool, h["run"] or f"key:{h['key']}", h["fence"]):
            self.store.record("call", tool, h, body, "stale_fence", 409)
            return web.json_response({"error": "stale_fence"}, status=409)
        before = {"rate_limit": 429, "error_before": 500, "refuse": 422, "reset_before": 0}
        if mode in before:
            self.store.record("call", tool, h, body, mode, before[mode])
            if mode == "reset_before":
                return _reset(request)
            headers = {"Retry-After": "1"} if mode == "rate_limit" else None
            return web.json_response({"error": mode}, status=before[mode], headers=headers)
        result, executed = self.store.execute(tool, h["key"], body, h["fence"])
        status = 500 if mode == "error_after" else 200
        self.store.record("call", tool, h, body, "executed" if executed else "duplicate", status, result)
        if mode == "reset_after":
            return _reset(request)
        if mode == "timeout_after_execute":
            await asyncio.sleep(fault[3] / 1000 if fault else 30)
        if mode == "error_after":
            return web.json_response({"error": "internal"}, status=500)
        return web.json_response(result)

    async def lookup(self, request: web.Request) -> web.Response:
        tool, h = request.match_info["tool"], _headers(request)
        h["key"] = request.query.get("key") or h["key"]  # the key asked about, not the caller's own
        if not h["key"]:
            return web.json_response({"error": "key is required"}, status=400)
        if self.store.take_fault(tool, lookup=True) is not None:
            self.store.record("lookup", tool, h, None, "lookup_unknown", 503)
            return web.json_response({"error": "unavailable"}, status=503)
        if self.store.stale(tool, h["run"] or f"key:{h['key']}", h["fence"]):
            self.store.record("lookup", tool, h, None, "stale_fence", 409)
            return web.json_response({"error": "stale_fence"}, status=409)
        result = self.store.execution(tool, h["key"])
        self.store.record("lookup", tool, h, None, "found" if result is not None else "not_found",
                          200 if result is not None else 404, result)
        if result is None:
            return web.json_response({"found": False}, status=404)
        return web.json_response({"found": True, "response": result})

    async def faults(self, request: web.Request) -> web.Response:
        spec = await request.json()
        if spec.get("mode") not in MODES or not spec.get("tool"):
            return web.json_response({"error": f"tool and mode (one of {sorted(MODES)}) are required"}, status=400)
        self.store.db.execute("INSERT INTO faults (tool, mode, remaining, latency_ms, hold_ms) VALUES (?,?,?,?,?)",
                              (spec["tool"], spec["mode"], int(spec.get("count", 1)), int(spec.get("latency_ms", 0)),
                               int(spec.get("hold_ms", 30_000))))
        return web.json_response({"ok": True})

    async def clear_faults(self, request: web.Request) -> web.Response:
        cleared = self.store.db.execute("DELETE FROM faults WHERE remaining > 0").rowcount
        return web.json_response({"cleared": cleared})

    async def config(self, request: web.Request) -> web.Response:
        spec = await request.json()
        if spec.get("fenced") is False:
            self.store.db.execute("INSERT OR IGNORE INTO unfenced_tools (tool) VALUES (?)", (spec["tool"],))
        else:
            self.store.db.execute("DELETE FROM unfenced_tools WHERE tool = ?", (spec["tool"],))
        return web.json_response({"ok": True})

    async def stats(self, request: web.Request) -> web.Response:
        where, args = "", []
        for column, name in (("tool", "tool"), ("idempotency_key", "key")):
            if request.query.get(name):
                where += f" AND {column} = ?"
                args.append(request.query[name])
        db = self.store.db
        requests = db.execute(f"SELECT count(*) FROM requests WHERE kind = 'call'{where}", args).fetchone()[0]
        executions = db.execute(f"SELECT count(*) FROM executions WHERE 1 = 1{where}", args).fetchone()[0]
        return web.json_response({"requests": requests, "executions": executions})

    async def requests(self, request: web.Request) -> web.Response:
        cursor = self.store.db.execute(
            "SELECT id, kind, tool, idempotency_key, fence, run_id, step_key, received_at, request_json, outcome, "
            "http_status, result_json FROM requests WHERE (? IS NULL OR tool = ?) ORDER BY id",
            (request.query.get("tool"), request.query.get("tool")))
        names = [c[0] for c in cursor.description]
        return web.json_response([dict(zip(names, row, strict=True)) for row in cursor.fetchall()])

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})


class MockToolServer:
    """The server in-process (tests): `await start()` returns the bound port."""

    def __init__(self, db_path: Path, host: str = "127.0.0.1", port: int = 0, latency_ms: int = 0) -> None:
        self.store = MockStore(db_path)
        self.app = MockToolApp(self.store, latency_ms)
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> int:
        self._runner = web.AppRunner(self.app.app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.store.db.close()


async def run_server(host: str, port: int, db: Path, latency_ms: int = 0) -> None:
    server = MockToolServer(db, host, port, latency_ms)
    await server.start()
    log.info("mock tool server on %s (store %s)", server.url, db)
    print(f"listening on {server.url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m devstack.mocktool")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--latency-ms", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level="INFO")
    try:
        asyncio.run(run_server(args.host, args.port, args.db, args.latency_ms))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
