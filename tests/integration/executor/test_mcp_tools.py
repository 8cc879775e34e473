"""MCP servers as ledgered tools, against a real MCP server built with the SDK (tests/mcp_orders.py), over
streamable HTTP on loopback and over stdio: a run calls them end to end; the server killed mid-call of a
non-idempotent tool leaves the step IN_DOUBT until its lookup tool settles it; a stale holder's late
call carries its old fencing token in _meta and is refused."""

import asyncio
import json
import os
import signal
import sqlite3
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import mcp_orders
import pytest
from executor_support import executor, history, scripted_agent, wait_for, wait_status, write_agent
from openai_stub import OpenAIStub, tool_call
from support import scheduler_stack, submit

from devstack.embedded_pg import free_port
from executor.agents import McpServerAddress, McpTool
from executor.tools.base import ToolCallContext
from executor.tools.mcp import McpToolAdapter
from shared.gen.agentrt.v1 import common_pb2 as pb

pytestmark = pytest.mark.integration
SERVER = Path(__file__).resolve().parents[2] / "mcp_orders.py"
LEASE_MS = 1000


class OrderDesk:
    """The test MCP server's store (its own SQLite file), and its HTTP process when it has one."""

    def __init__(self, tmp_path: Path, transport: str) -> None:
        self.path = tmp_path / "orders.sqlite"
        self.transport = transport
        self.port = free_port()
        self.proc: asyncio.subprocess.Process | None = None
        self.log = tmp_path / "mcp-server.log"

    @property
    def server(self) -> dict:
        if self.transport == "http":
            return {"url": f"http://127.0.0.1:{self.port}/mcp", "headers": {"Authorization": "Bearer desk-token"}}
        return {"command": [sys.executable, str(SERVER), "--db", str(self.path), "--stdio"]}

    def rows(self, sql, *args):
        db = sqlite3.connect(str(self.path), timeout=10)
        try:
            return db.execute(sql, args).fetchall()
        finally:
            db.close()

    def hold_next(self, tool: str = "create_order", seconds: float = 60.0, phase: str = "after") -> None:
        self.execute("INSERT INTO holds (tool, remaining, seconds, phase) VALUES (?, 1, ?, ?)", tool, seconds, phase)

    def release(self, tool: str) -> None:
        self.execute("UPDATE holds SET released = 1 WHERE tool = ?", tool)

    def execute(self, sql, *args):
        db = sqlite3.connect(str(self.path), timeout=10)
        try:
            db.execute(sql, args)
            db.commit()
        finally:
            db.close()

    async def start(self) -> None:
        if self.transport != "http":
            return
        with open(self.log, "ab") as log:  # noqa: ASYNC230 - a log file for the child, closed at once
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, str(SERVER), "--db", str(self.path), "--port", str(self.port), stdout=log,
                stderr=log)

        async def listening():
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                return False
            writer.close()
            return True

        await wait_for(listening, 30, "the MCP server to listen")

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await asyncio.wait_for(self.proc.wait(), 10)


@asynccontextmanager
async def order_desk(tmp_path, transport):
    desk = OrderDesk(tmp_path, transport)
    mcp_orders.connect(str(desk.path)).close()  # the server's own schema, so the test can arrange holds
    await desk.start()
    try:
        yield desk
    finally:
        await desk.stop()


def mcp_agent(desk, plan, **entry):
    tools = [{"kind": "mcp", "server": desk.server, "timeout_s": 30,
              "tools": {"create_order": {"lookup_tool": "find_order", "fenced": True}}, **entry}]
    return scripted_agent("shop", plan, tools)


ORDER_PLAN = [
    {"id": "stock", "tool": "get_stock", "args": {"item": "${input.item}"}},
    {"id": "order", "tool": "create_order", "args": {"item": "${input.item}", "qty": "${input.qty}"}},
    {"id": "done", "finish": {"order": "${results.order.response.id}", "stock": "${results.stock.response.stock}"}},
]


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_a_run_calls_mcp_tools_end_to_end(db_url, tmp_path, transport):
    agents = tmp_path / "agents"
    plan = [ORDER_PLAN[0], {"id": "nope", "tool": "reject", "args": {"reason": "no"}, "on_failure": "continue"},
            *ORDER_PLAN[1:]]
    async with order_desk(tmp_path, transport) as desk, scheduler_stack(db_url) as stack:
        write_agent(agents, mcp_agent(desk, plan))
        run = await submit(stack, agent="shop", payload={"item": "pen", "qty": 2})
        async with executor(stack, agents) as worker:
            final = await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED,
                                      pb.RUN_STATUS_PAUSED_INDOUBT)
            served = worker.catalog.get("shop")
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
        assert json.loads(final.result_json) == {"order": "order-1", "stock": 7}
        # Listed at start, with the server's schemas and the contracts its annotations and the agent give.
        assert {t.name for t in served.tools} == {"get_stock", "create_order", "find_order", "reject", "protocol_error"}
        assert served.tool("create_order").input_schema["required"] == ["item", "qty"]
        assert served.tool("get_stock").contract.idempotent and not served.tool("create_order").contract.idempotent
        assert served.tool("create_order").contract.lookup and served.tool("create_order").contract.fenced
        rows = {r.tool_name: r for r in (await history(stack, run.run_id)).tool_executions}
        assert rows["get_stock"].status == pb.TOOL_EXECUTION_STATUS_SUCCEEDED
        assert (rows["reject"].status, rows["reject"].error_code) == (pb.TOOL_EXECUTION_STATUS_FAILED, "tool_error")
        order = rows["create_order"]
        assert order.status == pb.TOOL_EXECUTION_STATUS_SUCCEEDED and order.remote_resource_id == "order-1"
        # The ledger's keys travelled in the request's _meta.
        [(key, fence, run_id, meta)] = desk.rows(
            "SELECT idempotency_key, fence, run_id, meta FROM calls WHERE tool = 'create_order'")
        assert (key, fence, run_id) == (order.idempotency_key, order.fencing_token, run.run_id)
        assert json.loads(meta)["agentrt/step-key"] == order.step_key
        if transport == "http":  # the server entry's headers went with the request
            assert json.loads(meta)["http:authorization"] == "Bearer desk-token"
        assert desk.rows("SELECT id, idempotency_key FROM orders") == [("order-1", order.idempotency_key)]


async def test_a_model_sees_the_servers_tools_and_its_calls_go_through_the_ledger(db_url, tmp_path):
    agents = tmp_path / "agents"
    stub = OpenAIStub([tool_call("create_order", {"item": "mug", "qty": 1}),
                       tool_call("agentrt_finish", {"result": {"done": True}}, call_id="call_2")])
    async with stub, order_desk(tmp_path, "http") as desk, scheduler_stack(db_url) as stack:
        served = {"kind": "mcp", "server": desk.server, "include": ["get_stock", "create_order"]}
        write_agent(agents, {"name": "shop", "version": "1", "tools": [served],
                             "decider": {"kind": "openai", "base_url": stub.url, "model": "m"}})
        run = await submit(stack, agent="shop", payload={"task": "order a mug"})
        async with executor(stack, agents, openai_api_key="sk-test"):
            final = await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED,
                                      pb.RUN_STATUS_PAUSED_INDOUBT)
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
        offered = {t["function"]["name"]: t["function"] for t in stub.requests[0]["tools"]}
        assert offered["create_order"]["parameters"]["required"] == ["item", "qty"]  # the server's own schema
        assert "get_stock" in offered and "find_order" not in offered and "reject" not in offered
        [row] = (await history(stack, run.run_id)).tool_executions
        assert row.tool_name == "create_order" and row.status == pb.TOOL_EXECUTION_STATUS_SUCCEEDED
        answer = next(m for m in stub.requests[1]["messages"] if m["role"] == "tool")
        assert json.loads(answer["content"])["response"]["id"] == "order-1"  # the model saw the server's answer
        assert desk.rows("SELECT idempotency_key FROM orders") == [(row.idempotency_key,)]


async def test_answers_and_errors_of_a_real_server_map_onto_the_error_table(tmp_path):
    async with order_desk(tmp_path, "stdio") as desk:
        address = McpServerAddress(**desk.server)
        ctx = ToolCallContext(run_id="run-1", tenant_id="t", step_key="s/attempt-1", idempotency_key="k1",
                              fencing_token=1)

        async def call(name, args, idempotent=False, server=address):
            tool = McpTool(kind="mcp", name=name, server=server, remote_name=name, connect_timeout_s=5,
                           contract={"idempotent": idempotent})
            return await McpToolAdapter(tool).call(args, ctx)

        assert (await call("get_stock", {"item": "pen"})).response == {"item": "pen", "stock": 7}
        assert (await call("reject", {"reason": "no"})).error_code == "tool_error"  # isError: it said it failed
        assert (await call("no_such_tool", {})).error_code == "tool_error"  # MCPServer answers isError too
        refused = await call("protocol_error", {"code": -32602})
        assert (refused.error_code, refused.evidence) == ("refused", {"mcp_error": -32602})  # never reached a tool
        assert (await call("protocol_error", {"code": -32603})).error_code == "server_error"  # unknown outcome
        assert (await call("protocol_error", {"code": -32603}, idempotent=True)).error_code == "retried_unknown"
        missing = McpServerAddress(command=[str(tmp_path / "no-such-server")])
        assert (await call("get_stock", {"item": "pen"}, server=missing)).error_code == "connect_failed"
        assert desk.rows("SELECT tool, outcome FROM calls ORDER BY seq") == [
            ("get_stock", "answered"), ("reject", "rejected"), ("protocol_error", "error"),
            ("protocol_error", "error"), ("protocol_error", "error")]


async def reconcile_once(stack, agents):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "reconcile", "--once", "--tenants", "tenant-a",
        "--scheduler", stack.addr, "--agents", str(agents),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1])


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_the_server_killed_mid_call_leaves_the_step_in_doubt_until_its_lookup_settles_it(
        db_url, tmp_path, transport):
    agents = tmp_path / "agents"
    async with order_desk(tmp_path, transport) as desk, scheduler_stack(db_url) as stack:
        write_agent(agents, mcp_agent(desk, ORDER_PLAN))
        desk.hold_next()
        run = await submit(stack, agent="shop", payload={"item": "ink", "qty": 3})
        async with executor(stack, agents):
            async def holding():
                return desk.rows("SELECT pid FROM calls WHERE outcome = 'holding'")

            [(pid,)] = await wait_for(holding, 30, "create_order to act and hold")
            os.kill(pid, signal.SIGKILL)  # the order is placed; its answer never comes
            paused = await wait_status(stack, run.run_id, pb.RUN_STATUS_PAUSED_INDOUBT, pb.RUN_STATUS_FAILED,
                                       pb.RUN_STATUS_COMPLETED)
        assert paused.status == pb.RUN_STATUS_PAUSED_INDOUBT, paused.terminal_reason
        rows = {r.tool_name: r for r in (await history(stack, run.run_id)).tool_executions}
        row = rows["create_order"]
        assert row.status == pb.TOOL_EXECUTION_STATUS_IN_DOUBT and row.error_code == "connection_reset"
        assert paused.pause_reason.startswith("tool outcome unknown: connection_reset")
        # Over HTTP the SDK cancels the call from inside (never this task's own cancellation); over stdio
        # it answers CONNECTION_CLOSED. Both are the same unknown outcome.
        assert ("cancelled under the call" if transport == "http" else "MCPError -32000") in paused.pause_reason

        if desk.proc is not None:  # the HTTP server restarts on its port; stdio starts a process per call
            await desk.proc.wait()
            await desk.start()
        report = await reconcile_once(stack, agents)
        assert (report["succeeded"], report["undecided"], report["no_lookup"]) == (1, 0, 0)
        settled = {r.tool_name: r for r in (await history(stack, run.run_id)).tool_executions}["create_order"]
        assert settled.status == pb.TOOL_EXECUTION_STATUS_SUCCEEDED and settled.remote_resource_id == "order-1"
        assert json.loads(settled.reconciliation_evidence_json)["lookup"] == "found"
        async with executor(stack, agents):
            final = await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED)
        assert json.loads(final.result_json) == {"order": "order-1", "stock": 7}
        # Placed once, looked up once (the lookup carried the reconciler's raised fence), never resent.
        assert desk.rows("SELECT count(*) FROM orders") == [(1,)]
        assert desk.rows("SELECT count(*) FROM calls WHERE tool = 'create_order'") == [(1,)]
        assert desk.rows("SELECT fence FROM calls WHERE tool = 'find_order'") == [(row.fencing_token + 1,)]


async def test_an_idempotent_tools_unknown_outcome_is_retried_after_the_server_restarts(db_url, tmp_path):
    agents = tmp_path / "agents"
    async with order_desk(tmp_path, "http") as desk, scheduler_stack(db_url) as stack:
        write_agent(agents, mcp_agent(desk, ORDER_PLAN))
        desk.hold_next("get_stock")
        run = await submit(stack, agent="shop", payload={"item": "ink", "qty": 3})
        async with executor(stack, agents):
            async def holding():
                return desk.rows("SELECT pid FROM calls WHERE outcome = 'holding'")

            [(pid,)] = await wait_for(holding, 30, "get_stock to hold")
            os.kill(pid, signal.SIGKILL)
            await desk.proc.wait()
            await desk.start()  # a new process on the same port: the next call reaches it
            final = await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED,
                                      pb.RUN_STATUS_PAUSED_INDOUBT)
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
        stock = [r for r in (await history(stack, run.run_id)).tool_executions if r.tool_name == "get_stock"]
        first, *between, last = [(r.step_key, r.status, r.error_code) for r in stock]
        assert first == ("stock/attempt-1", pb.TOOL_EXECUTION_STATUS_FAILED, "retried_unknown")  # not in doubt
        # Attempts made while the server was still down found nothing listening: nothing was sent.
        assert all(status == pb.TOOL_EXECUTION_STATUS_FAILED and code == "connect_failed"
                   for _, status, code in between)
        assert last == (f"stock/attempt-{len(stock)}", pb.TOOL_EXECUTION_STATUS_SUCCEEDED, "")
        assert desk.rows("SELECT count(*) FROM orders") == [(1,)]


async def test_a_call_that_times_out_after_acting_is_in_doubt_though_the_server_cancelled_it(db_url, tmp_path):
    agents = tmp_path / "agents"
    async with order_desk(tmp_path, "http") as desk, scheduler_stack(db_url) as stack:
        definition = mcp_agent(desk, ORDER_PLAN)
        definition["tools"][0]["tools"]["create_order"]["timeout_s"] = 1
        write_agent(agents, definition)
        desk.hold_next()  # acts, then does not answer in time
        run = await submit(stack, agent="shop", payload={"item": "ink", "qty": 3})
        async with executor(stack, agents):
            paused = await wait_status(stack, run.run_id, pb.RUN_STATUS_PAUSED_INDOUBT, pb.RUN_STATUS_FAILED,
                                       pb.RUN_STATUS_COMPLETED)
        assert paused.status == pb.RUN_STATUS_PAUSED_INDOUBT
        assert paused.pause_reason.startswith("tool outcome unknown: timeout")

        async def cancelled():
            return desk.rows("SELECT outcome FROM calls WHERE tool = 'create_order' AND outcome = 'cancelled'")

        await wait_for(cancelled, 10, "the server's handler to be cancelled")  # notifications/cancelled arrived
        assert desk.rows("SELECT count(*) FROM orders") == [(1,)]  # yet the order had been placed
        report = await reconcile_once(stack, agents)
        assert report["succeeded"] == 1


async def spawn_executor(stack, agents, tmp_path):
    env = {**os.environ, "AGENTRT_SCHEDULER_ADDR": stack.addr, "AGENTRT_AGENTS_PATH": str(agents),
           "AGENTRT_HEALTH_ADDR": "", "AGENTRT_CLAIM_WAIT_MS": "300", "AGENTRT_WORKER_ID": "exec-a"}
    log = open(tmp_path / "executor-a.log", "wb")  # noqa: ASYNC230 - closed by the test
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "cli", "executor", env=env,
                                                stdout=log, stderr=log)
    return proc, log


async def test_a_stale_holders_late_call_carries_its_old_fence_and_is_refused(db_url, db, tmp_path):
    agents = tmp_path / "agents"
    async with order_desk(tmp_path, "http") as desk, scheduler_stack(db_url, lease_duration_ms=LEASE_MS) as stack:
        write_agent(agents, mcp_agent(desk, [ORDER_PLAN[1], {"id": "done", "finish": "${results.order.response.id}"}]))
        desk.hold_next("create_order", phase="before")  # A's request is delayed on its way, unexamined
        run = await submit(stack, agent="shop", payload={"item": "cap", "qty": 1})
        proc, log = await spawn_executor(stack, agents, tmp_path)
        try:
            async def delayed():
                return desk.rows("SELECT seq FROM calls WHERE tool = 'create_order' AND outcome = 'waiting'")

            [(seq,)] = await wait_for(delayed, 60, "executor A's create_order to be on its way")
            await wait_for(lambda: _stopped(proc.pid), 10, "executor A to stop")  # A stalls, its lease lapses
            # B takes the run over: its lookup (fence 2) finds nothing and raises the server's fence, so
            # attempt 1 is proven not executed, and attempt 2 places the order.
            async with executor(stack, agents):
                final = await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED,
                                          pb.RUN_STATUS_PAUSED_INDOUBT)
            assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
            first, second = [r for r in (await history(stack, run.run_id)).tool_executions
                             if r.tool_name == "create_order"]
            assert (first.status, second.status) == (pb.TOOL_EXECUTION_STATUS_NOT_EXECUTED,
                                                     pb.TOOL_EXECUTION_STATUS_SUCCEEDED)
            desk.release("create_order")  # A's delayed request arrives now, after the takeover

            async def examined():
                rows = desk.rows("SELECT fence, outcome, meta, idempotency_key FROM calls WHERE seq = ?", seq)
                return rows if rows and rows[0][1] != "waiting" else None

            [(fence, outcome, meta, key)] = await wait_for(examined, 30, "A's late call to be examined")
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            log.close()
        assert key == first.idempotency_key and fence == first.fencing_token < second.fencing_token
        assert outcome == "stale_fence" and json.loads(meta)["agentrt/fencing-token"] == first.fencing_token
        assert desk.rows("SELECT id, idempotency_key FROM orders") == [("order-1", second.idempotency_key)]
        row = await db.fetchrow("SELECT status FROM tool_executions WHERE idempotency_key = $1",
                                first.idempotency_key)
        assert row["status"] == "NOT_EXECUTED"


async def _stopped(pid):
    os.kill(pid, signal.SIGSTOP)
    return _is_stopped(pid)


def _is_stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


async def test_an_unreachable_server_stops_the_executor_with_one_line(db_url, tmp_path):
    agents = tmp_path / "agents"
    port = free_port()
    write_agent(agents, scripted_agent("shop", [{"id": "x", "tool": "create_order", "args": {}}], [
        {"kind": "mcp", "server": {"url": f"http://127.0.0.1:{port}/mcp"}, "connect_timeout_s": 2}]))
    started = time.monotonic()
    async with scheduler_stack(db_url) as stack:
        env = {**os.environ, "AGENTRT_SCHEDULER_ADDR": stack.addr, "AGENTRT_AGENTS_PATH": str(agents),
               "AGENTRT_HEALTH_ADDR": ""}
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "cli", "executor", env=env,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    last = err.decode().strip().splitlines()[-1]
    assert proc.returncode != 0
    assert last.startswith("agentrt executor: error: ") and "tools.mcp.0.server: cannot list the tools of" in last
    assert time.monotonic() - started < 60
