"""The agent registry, executor side: the agents this process serves, registered with the scheduler while it lives.

The scheduler refuses a submit for an agent (or version) that no live executor
has registered, and checks the input against the agent's input schema
(docs/design.md §agents). A registration lapses after its ttl by database
time, so an executor that dies stops counting within one ttl; a clean stop
withdraws its agents at once. A scheduler too old to know RegisterAgents
answers UNIMPLEMENTED: the executor works on and asks again once per ttl
(a rolling upgrade brings a scheduler that knows it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from executor.agents import AgentCatalog, AgentDefinition
from executor.client import WorkClient
from executor.shutdown import Shutdown, Stopped
from shared.canonical import canonical_json
from shared.errors import AgentrtError, ExecutorTokenRequired
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.sensitive import sensitivity_of

log = logging.getLogger(__name__)


def registrations(catalog: AgentCatalog) -> list[ws.AgentRegistration]:
    return [ws.AgentRegistration(name=a.name, version=a.version, tool_names=[t.name for t in a.tools],
                                 input_schema_json=canonical_json(a.input_schema) if a.input_schema else "",
                                 default_priority=a.priority or 0,
                                 concurrency_key=a.concurrency.key if a.concurrency else "",
                                 concurrency_max=a.concurrency.max if a.concurrency else 0,
                                 sensitive_json=_sensitive(a),
                                 signals_json=canonical_json(a.signals) if a.signals else "",
                                 resume_input_schema_json=canonical_json(a.resume_input_schema)
                                 if a.resume_input_schema else "")
            for a in sorted(catalog.all(), key=lambda a: (a.name, a.version))]


def _sensitive(agent: AgentDefinition) -> str:
    spec = sensitivity_of(agent.input_schema, [(t.name, t.input_schema, t.output_schema) for t in agent.tools])
    return canonical_json(spec) if spec["input"] or spec["tools"] else ""


class Registration:
    """Registers at start, refreshes every third of the ttl, withdraws at stop."""

    def __init__(self, client: WorkClient, catalog: AgentCatalog, worker_id: str, ttl_ms: int,
                 shutdown: Shutdown) -> None:
        self.client, self.worker_id, self.ttl_ms, self.shutdown = client, worker_id, ttl_ms, shutdown
        self.agents = registrations(catalog)
        self.registered = asyncio.Event()  # set once the scheduler has the agents
        self.supported = True  # False while the scheduler answers UNIMPLEMENTED

    async def register_once(self, first: bool = False) -> bool:
        """`first`: the call at start, where a refused executor token ends the process with one line
        (no retry can fix a missing or wrong token; the refresh loop keeps retrying other failures)."""
        try:
            answer = await self.client.register_agents(self.worker_id, self.agents, self.ttl_ms)
        except ExecutorTokenRequired as exc:
            if first:
                raise ExecutorTokenRequired(
                    "the scheduler refuses this executor's token (missing or wrong): set AGENTRT_WORK_TOKEN "
                    "to the scheduler's work_token, or start the executor in the directory where `agentrt dev` "
                    "runs (it reads .agentrt/client.json)") from None
            log.warning("registering agents failed (%s: %s); trying again", exc.reason, exc.message)
            return False
        except AgentrtError as exc:
            log.warning("registering agents failed (%s: %s); trying again", exc.reason, exc.message)
            return False
        if answer is None:
            if self.supported:
                log.info("the scheduler has no agent registry (RegisterAgents unimplemented); asking again "
                         "every %d ms", self.ttl_ms)
            self.supported = False
            return False
        self.supported = True
        self.registered.set()
        return True

    async def run(self) -> None:
        """The refresh loop (a named task of the worker); ends at shutdown."""
        every = self.ttl_ms / 3000
        while not self.shutdown.stopping.is_set():
            ok = await self.register_once()
            pause = every if ok else (self.ttl_ms / 1000 if not self.supported else min(every, 1.0))
            with contextlib.suppress(Stopped):
                await self.shutdown.race(asyncio.sleep(pause), self.shutdown.stopping)

    async def withdraw(self) -> None:
        if not (self.supported and self.registered.is_set()):
            return
        try:
            await asyncio.wait_for(self.client.register_agents(self.worker_id, [], self.ttl_ms), 2.0)
        except (AgentrtError, TimeoutError) as exc:
            log.warning("withdrawing agents failed (%s); they lapse within %d ms", exc, self.ttl_ms)
