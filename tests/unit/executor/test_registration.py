"""executor/registration.py against a scheduler that answers UNIMPLEMENTED first, then knows the registry."""

from __future__ import annotations

import asyncio
import time

from executor.agents import AgentCatalog, parse_definition
from executor.registration import Registration, registrations
from executor.shutdown import Shutdown
from shared.gen.agentrt.v1 import work_service_pb2 as ws

AGENT = parse_definition({"name": "a", "version": "2", "input_schema": {"type": "object"},
                          "decider": {"kind": "scripted", "plan": [{"id": "done", "finish": 1}]}})


class Scheduler:
    """A WorkClient's register_agents as a scheduler mid-upgrade answers it: None (UNIMPLEMENTED) at first."""

    def __init__(self, unimplemented: int) -> None:
        self.unimplemented = unimplemented
        self.calls: list[tuple[str, list[ws.AgentRegistration], int]] = []

    async def register_agents(self, worker_id: str, agents: list[ws.AgentRegistration],
                              ttl_ms: int) -> ws.RegisterAgentsResponse | None:
        self.calls.append((worker_id, list(agents), ttl_ms))
        if len(self.calls) <= self.unimplemented:
            return None
        return ws.RegisterAgentsResponse()


def test_registrations_name_every_agent_version_with_its_schema_and_tools() -> None:
    [item] = registrations(AgentCatalog([AGENT]))
    assert (item.name, item.version, item.input_schema_json, list(item.tool_names)) == ("a", "2",
                                                                                       '{"type":"object"}', [])


def test_an_unimplemented_answer_is_asked_again_and_the_agents_withdrawn_at_stop() -> None:
    async def scenario() -> tuple[Scheduler, bool, bool]:
        scheduler, shutdown = Scheduler(unimplemented=1), Shutdown()
        registration = Registration(scheduler, AgentCatalog([AGENT]), "w1", 1_000, shutdown)  # type: ignore[arg-type]
        assert not await registration.register_once() and not registration.supported
        task = asyncio.create_task(registration.run())
        deadline = time.monotonic() + 10
        while not registration.registered.is_set():
            assert time.monotonic() < deadline, "never asked again"
            await asyncio.sleep(0.05)
        shutdown.begin_stopping()
        await asyncio.wait_for(task, 5)
        await registration.withdraw()
        return scheduler, registration.supported, registration.registered.is_set()

    scheduler, supported, registered = asyncio.run(scenario())
    assert supported and registered
    assert [len(agents) for _, agents, _ in scheduler.calls[:2]] == [1, 1]
    assert scheduler.calls[-1][1] == []  # withdrawn
    assert {worker for worker, _, _ in scheduler.calls} == {"w1"} and {ttl for *_, ttl in scheduler.calls} == {1000}
