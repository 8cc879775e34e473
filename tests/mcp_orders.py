"""A real MCP server for the tests, built with the `mcp` SDK: an order desk with its own SQLite store.

    python tests/mcp_orders.py --db PATH --port N     (streamable HTTP on 127.0.0.1:N/mcp)
    python tests/mcp_orders.py --db PATH --stdio      (stdio)

Tools: get_stock (readOnlyHint), create_order (no hints: not idempotent; honours agentrt's idempotency
key and fencing token from the request's _meta), find_order (the lookup by idempotency key, which also
raises the run's fence), reject (always isError), protocol_error (a JSON-RPC error). Every call is
recorded in `calls` with the _meta it carried and the server's pid; a row in `holds` makes the next call
of a tool act, then hang (so a test can kill the server mid-call), or (phase `before`) wait unexamined
until the test releases it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent, ToolAnnotations

KEY, FENCE, RUN = "agentrt/idempotency-key", "agentrt/fencing-token", "agentrt/run-id"
SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (seq INTEGER PRIMARY KEY AUTOINCREMENT, tool TEXT, pid INTEGER, run_id TEXT,
    idempotency_key TEXT, fence INTEGER, arguments TEXT, meta TEXT, outcome TEXT);
CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, idempotency_key TEXT UNIQUE, item TEXT, qty INTEGER,
    fence INTEGER);
CREATE TABLE IF NOT EXISTS fences (run_id TEXT PRIMARY KEY, fence INTEGER);
CREATE TABLE IF NOT EXISTS holds (tool TEXT PRIMARY KEY, remaining INTEGER, seconds REAL, phase TEXT DEFAULT 'after',
    released INTEGER DEFAULT 0);
"""


def connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, timeout=10, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(SCHEMA)
    return db


def build(db_path: str) -> MCPServer:
    db = connect(db_path)
    server = MCPServer("orders")

    def meta_of(ctx: Context) -> dict[str, Any]:
        return dict(ctx.request_context.meta or {})

    def record(tool: str, ctx: Context, arguments: dict[str, Any], outcome: str) -> int:
        meta = meta_of(ctx)
        headers = getattr(ctx.request_context.request, "headers", None)  # over HTTP only
        if headers is not None and "authorization" in headers:
            meta["http:authorization"] = headers["authorization"]
        cur = db.execute(
            "INSERT INTO calls (tool, pid, run_id, idempotency_key, fence, arguments, meta, outcome) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (tool, os.getpid(), meta.get(RUN), meta.get(KEY), meta.get(FENCE), json.dumps(arguments),
             json.dumps(meta, default=str), outcome))
        return int(cur.lastrowid or 0)

    def raise_fence(meta: dict[str, Any]) -> bool:
        """Records the run's highest fence; False when `meta` carries a lower one (a stale holder)."""
        run, fence = meta.get(RUN), meta.get(FENCE)
        if run is None or not isinstance(fence, int):
            return True
        row = db.execute("SELECT fence FROM fences WHERE run_id = ?", (run,)).fetchone()
        if row is not None and fence < row[0]:
            return False
        db.execute("INSERT INTO fences VALUES (?, ?) ON CONFLICT (run_id) DO UPDATE SET fence = excluded.fence",
                   (run, fence))
        return True

    def set_outcome(seq: int, outcome: str) -> None:
        db.execute("UPDATE calls SET outcome = ? WHERE seq = ?", (outcome, seq))

    async def maybe_hold(tool: str, seq: int, phase: str = "after") -> None:
        """`after`: acted, not yet answered (the test kills us then). `before`: the request arrived and waits,
        unexamined, until the test releases it (a request delayed on its way)."""
        hold = db.execute("SELECT remaining, seconds FROM holds WHERE tool = ? AND phase = ?", (tool, phase)).fetchone()
        if hold is None or hold[0] <= 0:
            return
        db.execute("UPDATE holds SET remaining = remaining - 1 WHERE tool = ? AND phase = ?", (tool, phase))
        set_outcome(seq, "holding" if phase == "after" else "waiting")
        deadline = asyncio.get_running_loop().time() + hold[1]
        try:
            while asyncio.get_running_loop().time() < deadline:
                released = db.execute("SELECT released FROM holds WHERE tool = ? AND phase = ?",
                                      (tool, phase)).fetchone()
                if released and released[0]:
                    return
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:  # the client gave up (notifications/cancelled)
            set_outcome(seq, "cancelled")
            raise

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def get_stock(item: str, ctx: Context) -> dict[str, Any]:
        """How many of `item` are in stock."""
        await maybe_hold("get_stock", record("get_stock", ctx, {"item": item}, "answered"))
        return {"item": item, "stock": 7}

    @server.tool()
    async def create_order(item: str, qty: int, ctx: Context) -> CallToolResult:
        """Place an order (not idempotent by itself: it honours agentrt's idempotency key and fence)."""
        meta = meta_of(ctx)
        seq = record("create_order", ctx, {"item": item, "qty": qty}, "arrived")
        await maybe_hold("create_order", seq, "before")
        if not raise_fence(meta):
            set_outcome(seq, "stale_fence")
            return CallToolResult(content=[TextContent(type="text", text="stale fencing token")], is_error=True,
                                  _meta={"agentrt/error": "stale_fence"})
        key = meta.get(KEY)
        existing = db.execute("SELECT id, item, qty FROM orders WHERE idempotency_key = ?", (key,)).fetchone()
        if existing is not None:
            set_outcome(seq, "duplicate")
            order = {"id": existing[0], "item": existing[1], "qty": existing[2]}
        else:
            number = db.execute("SELECT count(*) FROM orders").fetchone()[0] + 1
            order = {"id": f"order-{number}", "item": item, "qty": qty}
            db.execute("INSERT INTO orders VALUES (?,?,?,?,?)", (order["id"], key, item, qty, meta.get(FENCE)))
            set_outcome(seq, "executed")
            await maybe_hold("create_order", seq)
        return CallToolResult(content=[TextContent(type="text", text=json.dumps(order))], structured_content=order)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def find_order(idempotency_key: str, ctx: Context) -> dict[str, Any]:
        """The order placed under an idempotency key; raises the run's fence so a late stale call is refused."""
        raise_fence(meta_of(ctx))
        row = db.execute("SELECT id, item, qty FROM orders WHERE idempotency_key = ?", (idempotency_key,)).fetchone()
        record("find_order", ctx, {"idempotency_key": idempotency_key}, "found" if row else "not_found")
        if row is None:
            return {"found": False}
        return {"found": True, "response": {"id": row[0], "item": row[1], "qty": row[2]}}

    @server.tool()
    async def reject(reason: str, ctx: Context) -> str:
        """Always fails (an isError result)."""
        record("reject", ctx, {"reason": reason}, "rejected")
        raise ValueError(f"rejected: {reason}")

    @server.tool()
    async def protocol_error(code: int, ctx: Context) -> str:
        """Answers with a JSON-RPC error of this code instead of a result."""
        record("protocol_error", ctx, {"code": code}, "error")
        raise MCPError(code, f"protocol error {code}")

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--port", type=int)
    parser.add_argument("--stdio", action="store_true")
    args = parser.parse_args()
    server = build(args.db)
    if args.stdio:
        server.run("stdio")
    else:
        print(f"mcp orders on 127.0.0.1:{args.port}", flush=True)
        server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
