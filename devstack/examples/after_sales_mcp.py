"""The after-sales desk as an MCP server (the `mcp` SDK), with its own SQLite store: the tools of the
LLM version of the demo (devstack/examples/after_sales_llm.yaml; docs/models.md, "A worked example").

    python -m devstack.examples.after_sales_mcp --db after-sales.sqlite --port 8090   # http://127.0.0.1:8090/mcp
    python -m devstack.examples.after_sales_mcp --db after-sales.sqlite --stdio

Tools:
- `get_order`, `return_policy`, `check_risk`: reads (readOnlyHint), so an unknown outcome is retried.
- `issue_refund`: moves money, so no hints: an unknown outcome freezes the run until `find_refund`
  (its lookup by idempotency key) settles it. Honours agentrt's idempotency key (the same key gives
  the same refund) and fencing token (a request whose fence is older than one already seen for the
  run is refused) from the request's `_meta`.
- `create_ticket`, `notify_customer`: idempotentHint, keyed by the idempotency key.

Every call is recorded in `calls` (tool, run, key, fence) so a test or an operator can count them.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import uuid
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

KEY, FENCE, RUN = "agentrt/idempotency-key", "agentrt/fencing-token", "agentrt/run-id"
SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (seq INTEGER PRIMARY KEY AUTOINCREMENT, tool TEXT, run_id TEXT,
    idempotency_key TEXT, fence INTEGER, arguments TEXT);
CREATE TABLE IF NOT EXISTS refunds (id TEXT PRIMARY KEY, idempotency_key TEXT UNIQUE, order_id INTEGER,
    amount REAL, currency TEXT);
CREATE TABLE IF NOT EXISTS tickets (id TEXT PRIMARY KEY, idempotency_key TEXT UNIQUE, order_id INTEGER,
    summary TEXT);
CREATE TABLE IF NOT EXISTS notices (idempotency_key TEXT PRIMARY KEY, customer_id TEXT, message TEXT);
CREATE TABLE IF NOT EXISTS fences (run_id TEXT PRIMARY KEY, fence INTEGER);
"""
READ = ToolAnnotations(read_only_hint=True)
IDEMPOTENT = ToolAnnotations(read_only_hint=False, idempotent_hint=True)


def connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, timeout=10, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(SCHEMA)
    return db


def fence_holds(db: sqlite3.Connection, ctx: Context, fence: int | None) -> bool:
    """Raises the run's fence to `fence`; False when a newer one was already seen."""
    run = str(dict(ctx.request_context.meta or {}).get(RUN) or "")
    if not run or fence is None:
        return True
    row = db.execute("SELECT fence FROM fences WHERE run_id = ?", (run,)).fetchone()
    if row is not None and row[0] > fence:
        return False
    db.execute("INSERT INTO fences (run_id, fence) VALUES (?, ?) ON CONFLICT (run_id) DO UPDATE "
               "SET fence = max(fence, excluded.fence)", (run, fence))
    return True


def build(db_path: str) -> MCPServer:
    db = connect(db_path)
    server = MCPServer("after-sales")

    def called(tool: str, ctx: Context, arguments: dict[str, Any]) -> tuple[str, int | None]:
        meta = dict(ctx.request_context.meta or {})
        key, fence, run = str(meta.get(KEY) or ""), meta.get(FENCE), str(meta.get(RUN) or "")
        db.execute("INSERT INTO calls (tool, run_id, idempotency_key, fence, arguments) VALUES (?,?,?,?,?)",
                   (tool, run, key, fence, json.dumps(arguments, sort_keys=True)))
        return key, fence if isinstance(fence, int) else None

    @server.tool(annotations=READ, description="An order by id: items, amount paid, customer.")
    def get_order(order_id: int, ctx: Context) -> dict[str, Any]:
        called("get_order", ctx, {"order_id": order_id})
        return {"order_id": order_id, "customer_id": f"cust-{order_id % 10}", "paid": 120.0, "currency": "EUR",
                "items": [{"sku": "shoe-42", "qty": 1}], "delivered_days_ago": 6}

    @server.tool(annotations=READ, description="The return policy that applies to an order.")
    def return_policy(order_id: int, ctx: Context) -> dict[str, Any]:
        called("return_policy", ctx, {"order_id": order_id})
        return {"window_days": 30, "refund": "full, to the original payment method", "label": "prepaid"}

    @server.tool(annotations=READ, description="Risk control's verdict on refunding this amount.")
    def check_risk(customer_id: str, amount: float, ctx: Context) -> dict[str, Any]:
        called("check_risk", ctx, {"customer_id": customer_id, "amount": amount})
        return {"verdict": "review" if amount > 500 else "ok", "score": min(99, int(amount / 10))}

    @server.tool(description="Refunds an amount to the order's payment method. Moves money.")
    def issue_refund(order_id: int, amount: float, currency: str, ctx: Context) -> CallToolResult:
        key, fence = called("issue_refund", ctx, {"order_id": order_id, "amount": amount, "currency": currency})
        if not fence_holds(db, ctx, fence):
            return CallToolResult(content=[TextContent(type="text", text="stale fencing token")], is_error=True,
                                  _meta={"agentrt/error": "stale_fence"})
        row = db.execute("SELECT id FROM refunds WHERE idempotency_key = ?", (key,)).fetchone() if key else None
        refund_id = row[0] if row else f"rf-{uuid.uuid4().hex[:10]}"
        if row is None:
            db.execute("INSERT INTO refunds (id, idempotency_key, order_id, amount, currency) VALUES (?,?,?,?,?)",
                       (refund_id, key or None, order_id, amount, currency))
        refund = {"refund_id": refund_id, "amount": amount, "currency": currency}
        return CallToolResult(content=[TextContent(type="text", text=json.dumps(refund))], structured_content=refund)

    @server.tool(annotations=READ, description="The refund made under an idempotency key, if any (a lookup).")
    def find_refund(ctx: Context, idempotency_key: str = "") -> dict[str, Any]:
        key, fence = called("find_refund", ctx, {"idempotency_key": idempotency_key})
        fence_holds(db, ctx, fence)  # a lookup raises the fence first: a late send of the old holder is refused
        row = db.execute("SELECT id, amount, currency FROM refunds WHERE idempotency_key = ?",
                         (idempotency_key or key,)).fetchone()
        if row is None:
            return {"found": False}
        return {"found": True, "response": {"refund_id": row[0], "amount": row[1], "currency": row[2]}}

    @server.tool(annotations=IDEMPOTENT, description="Opens a support ticket about the return.")
    def create_ticket(order_id: int, summary: str, ctx: Context) -> dict[str, Any]:
        key, _ = called("create_ticket", ctx, {"order_id": order_id, "summary": summary})
        row = db.execute("SELECT id FROM tickets WHERE idempotency_key = ?", (key,)).fetchone() if key else None
        ticket = row[0] if row else f"tk-{uuid.uuid4().hex[:8]}"
        if row is None:
            db.execute("INSERT INTO tickets (id, idempotency_key, order_id, summary) VALUES (?,?,?,?)",
                       (ticket, key or None, order_id, summary))
        return {"ticket_id": ticket}

    @server.tool(annotations=IDEMPOTENT, description="Sends the customer a message.")
    def notify_customer(customer_id: str, message: str, ctx: Context) -> dict[str, Any]:
        key, _ = called("notify_customer", ctx, {"customer_id": customer_id, "message": message})
        db.execute("INSERT INTO notices (idempotency_key, customer_id, message) VALUES (?,?,?) "
                   "ON CONFLICT (idempotency_key) DO NOTHING", (key or uuid.uuid4().hex, customer_id, message))
        return {"sent": True}

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devstack.examples.after_sales_mcp", description=__doc__)
    parser.add_argument("--db", required=True, help="the desk's SQLite file (created if missing)")
    parser.add_argument("--port", type=int, default=8090, help="streamable HTTP on 127.0.0.1:PORT/mcp")
    parser.add_argument("--stdio", action="store_true", help="serve over stdio instead")
    args = parser.parse_args(argv)
    server = build(args.db)
    if args.stdio:
        server.run("stdio")
    else:
        print(f"after-sales MCP server on http://127.0.0.1:{args.port}/mcp", flush=True)
        server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
