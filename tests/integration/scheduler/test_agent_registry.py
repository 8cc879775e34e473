"""The agent registry: executors register the agents they serve; SubmitRun refuses agents nobody serves
(FAILED_PRECONDITION, AGENT_NOT_REGISTERED) unless told to queue them, and checks inputs against the
served version's input schema (INVALID_ARGUMENT with the JSON path). Registrations lapse by database time."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest
from executor_support import executor, write_agent
from helpers import run_agentrt, without_settings
from support import reason_of, rpc_error, scheduler_stack

from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[3]
ORDER_SCHEMA = {"type": "object", "properties": {"order_id": {"type": "integer"}}, "required": ["order_id"]}


def registration(name: str, version: str, schema: dict | None = None, tools: tuple[str, ...] = ()):
    return ws.AgentRegistration(name=name, version=version, tool_names=list(tools),
                                input_schema_json=json.dumps(schema) if schema is not None else "")


async def register(stack, worker: str, *agents, ttl_ms: int = 60_000):
    return await stack.work.RegisterAgents(ws.RegisterAgentsRequest(worker_id=worker, agents=list(agents),
                                                                    ttl_ms=ttl_ms))


async def submit(stack, agent: str, payload: dict, version: str = "", **extra):
    return await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name=agent, agent_version=version,
                                                          input_json=json.dumps(payload), **extra),
                                      metadata=stack.md())


async def counts(db) -> tuple[int, int]:
    return (await db.fetchval("SELECT count(*) FROM agent_runs"), await db.fetchval("SELECT count(*) FROM outbox"))


async def test_an_agent_nobody_serves_is_refused_and_nothing_is_written(db_url, db):
    async with scheduler_stack(db_url, require_registered_agents=True) as stack:
        error = await rpc_error(submit(stack, "returns", {"order_id": 1}))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and reason_of(error) == "AGENT_NOT_REGISTERED"
        assert error.details().startswith("no live executor serves agent 'returns'")
        # The API's hint names the request field (the CLI swaps in its flag: the CLI test below).
        assert error.details().endswith("or set allow_unregistered in the SubmitRunRequest to queue the run")
        assert await counts(db) == (0, 0)
        queued = await submit(stack, "returns", {"order_id": 1}, allow_unregistered=True)  # deployed later
        assert queued.created and queued.run.agent_name == "returns"


async def test_registered_versions_admit_submits_and_inputs_must_match_their_schema(db_url, db):
    async with scheduler_stack(db_url, require_registered_agents=True) as stack:
        await register(stack, "exec-a", registration("returns", "9", {"type": "object"}),
                       registration("returns", "10", ORDER_SCHEMA, ("orders.get",)))
        latest = await submit(stack, "returns", {"order_id": 7})  # no version: the last in natural order (10)
        assert latest.created
        error = await rpc_error(submit(stack, "returns", {"order_id": "seven"}))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == ("input_json: $.order_id: 'seven' is not of type 'integer' "
                                   "(the input schema of returns version 10)")
        missing = await rpc_error(submit(stack, "returns", {}, version="10"))
        assert "$: 'order_id' is a required property" in missing.details()
        assert (await submit(stack, "returns", {"anything": True}, version="9")).created  # 9's schema allows it
        other = await rpc_error(submit(stack, "returns", {"order_id": 1}, version="11"))
        assert reason_of(other) == "AGENT_NOT_REGISTERED"
        assert "version '11' of agent 'returns' (versions served: 9, 10)" in other.details()
        assert "set allow_unregistered in the SubmitRunRequest" in other.details()
        # A queued submit of an unserved version still creates its run; a served one's input is still checked.
        assert (await submit(stack, "returns", {"order_id": 1}, version="11", allow_unregistered=True)).created
        bad = await rpc_error(submit(stack, "returns", {"order_id": "x"}, allow_unregistered=True))
        assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert await db.fetchval("SELECT count(*) FROM agent_runs") == 3


async def test_registrations_lapse_by_database_time_and_a_withdrawal_counts_at_once(db_url, db):
    async with scheduler_stack(db_url, require_registered_agents=True) as stack:
        await register(stack, "short-lived", registration("pinger", "1"), ttl_ms=1_000)
        await register(stack, "steady", registration("steady", "1"))
        assert (await submit(stack, "pinger", {})).created
        deadline = time.monotonic() + 30
        while True:  # the registration lapses one second later by the database clock
            try:
                await submit(stack, "pinger", {})
            except grpc.aio.AioRpcError as exc:
                assert reason_of(exc) == "AGENT_NOT_REGISTERED"
                break
            assert time.monotonic() < deadline, "the registration never lapsed"
        lapsed_at = await db.fetchval("SELECT expires_at FROM agent_registry WHERE worker_id = 'short-lived'")
        assert lapsed_at <= await db.fetchval("SELECT clock_timestamp()")
        await register(stack, "steady")  # an empty list withdraws what it served
        assert reason_of(await rpc_error(submit(stack, "steady", {}))) == "AGENT_NOT_REGISTERED"


async def test_a_retried_submit_gets_its_run_back_even_when_the_agent_went_away(db_url, db):
    async with scheduler_stack(db_url, require_registered_agents=True) as stack:
        await register(stack, "exec-a", registration("returns", "1"))
        first = await submit(stack, "returns", {"order_id": 1}, client_request_id="order-1")
        await register(stack, "exec-a")
        again = await submit(stack, "returns", {"order_id": 1}, client_request_id="order-1")
        assert (again.run.run_id, again.created) == (first.run.run_id, False)
        other = await rpc_error(submit(stack, "returns", {"order_id": 2}, client_request_id="order-2"))
        assert reason_of(other) == "AGENT_NOT_REGISTERED"
        # The schema changed since (a stricter version 2): the retry still gets its run, a new submit does not.
        await register(stack, "exec-b", registration("returns", "2", {**ORDER_SCHEMA, "required": ["order_id", "sku"]}))
        again = await submit(stack, "returns", {"order_id": 1}, client_request_id="order-1")
        assert (again.run.run_id, again.created) == (first.run.run_id, False)
        fresh = await rpc_error(submit(stack, "returns", {"order_id": 1}, client_request_id="order-3"))
        assert fresh.code() == grpc.StatusCode.INVALID_ARGUMENT and "'sku' is a required property" in fresh.details()


def agent(name: str, version: str, **extra):
    return {"name": name, "version": version, "decider": {"kind": "scripted", "plan": [{"id": "done", "finish": 1}]},
            **extra}


async def test_an_executor_registers_its_agents_while_it_lives_and_withdraws_them_when_it_stops(db_url, db,
                                                                                                  tmp_path):
    agents = tmp_path / "agents"
    write_agent(agents, agent("hello", "1", input_schema=ORDER_SCHEMA))
    write_agent(agents, agent("hello", "2"))
    async with scheduler_stack(db_url, require_registered_agents=True) as stack:
        async with executor(stack, agents, worker_id="exec-reg", registration_ttl_ms=3_000):
            listed = await stack.runs.ListAgents(rs.ListAgentsRequest(), metadata=stack.md())
            assert [(a.name, a.version, list(a.executors)) for a in listed.agents] == [
                ("hello", "1", ["exec-reg"]), ("hello", "2", ["exec-reg"])]
            assert json.loads(listed.agents[0].input_schema_json) == ORDER_SCHEMA
            assert listed.agents[0].HasField("last_seen") and not listed.agents[1].input_schema_json
            bad = await rpc_error(submit(stack, "hello", {"order_id": "x"}, version="1"))
            assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
            first = await db.fetchval("SELECT max(registered_at) FROM agent_registry")
            deadline = time.monotonic() + 30
            while await db.fetchval("SELECT max(registered_at) FROM agent_registry") == first:  # refreshed
                assert time.monotonic() < deadline, "the executor never refreshed its registration"
                await db.execute("SELECT pg_sleep(0.1)")
        assert await db.fetchval("SELECT count(*) FROM agent_registry") == 0  # withdrawn at stop
        assert (await stack.runs.ListAgents(rs.ListAgentsRequest(), metadata=stack.md())).agents == []


async def cli(*args: str, addr: str) -> tuple[int, str, str]:
    """The real CLI as a process (the scheduler answers from this test's event loop meanwhile)."""
    code, out, err = await run_agentrt(*args, "--addr", addr, "--tenant", "acme", env=without_settings())
    return code, out.strip(), err.strip()


async def test_the_cli_lists_agents_and_says_why_a_submit_is_refused(db_url, db):
    async with scheduler_stack(db_url, require_registered_agents=True) as stack:
        assert await cli("agents", "list", addr=stack.addr) == (0, "no agents: no live executor has registered any",
                                                                 "")
        await register(stack, "exec-a", registration("returns", "1", ORDER_SCHEMA, ("orders.get",)))
        assert await cli("agents", "list", addr=stack.addr) == (
            0, "returns 1  executors: exec-a  tools: orders.get  (input schema)", "")
        code, out, _ = await cli("agents", "list", "--json", addr=stack.addr)
        assert code == 0 and json.loads(out)["agents"][0]["input_schema"] == ORDER_SCHEMA
        assert await cli("runs", "submit", "nobody", addr=stack.addr) == (
            1, "", "agentrt runs: error: AGENT_NOT_REGISTERED: no live executor serves agent 'nobody'; deploy it, "
                   "or submit with --allow-unregistered to queue the run")
        assert await cli("runs", "submit", "nobody", "--agent-version", "3", addr=stack.addr) == (
            1, "", "agentrt runs: error: AGENT_NOT_REGISTERED: no live executor serves version '3' of agent 'nobody' "
                   "(versions served: none); deploy it, or submit with --allow-unregistered to queue the run")
        code, out, _ = await cli("runs", "submit", "nobody", "--allow-unregistered", addr=stack.addr)
        assert code == 0 and out.startswith("submitted: ")
        assert await cli("runs", "submit", "returns", "--input", '{"order_id": "x"}', addr=stack.addr) == (
            1, "", "agentrt runs: error: input_json: $.order_id: 'x' is not of type 'integer' "
                   "(the input schema of returns version 1)")
