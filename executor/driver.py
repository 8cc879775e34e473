"""Drives one claimed run under its lease: recover, then decide → persist → act, step by step.

Every step is an OpenTelemetry span; every scheduler call carries its trace
context. A tool call is Tx1 (intent) → send → Tx2 (result + checkpoint), or
MarkToolInDoubt when the outcome is unknown: an unknown outcome freezes the
run, it is never re-sent (docs/design.md §tool-calls, §in-doubt). The run's
per-lease state and the fenced writes made under it live in a RunLease
(executor/runlease.py), shared with the tool-call code.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from typing import Any

from executor import journal
from executor.advance import Action, Advancer, DecideAgain, EndRun, ExecuteTool, Limits, Park, tighter
from executor.agents import AgentDefinition
from executor.checkpoint import State, UnsupportedCheckpoint, Waiting
from executor.deciders.base import DeciderUnavailable
from executor.decisions import DeciderRateLimited, Proposal
from executor.faults import InjectedCrash
from executor.lease import HeldLease
from executor.migrations import load_state
from executor.runlease import RunLease, run_end
from executor.services import Services
from executor.shutdown import Stopped
from executor.signals import answered, end_wait, signal_item, take_in, unanswered
from executor.steps import RunIds, initial_state, next_attempt
from executor.toolcalls import ToolCalls
from executor.wake import wake
from shared import tracing
from shared.errors import AgentrtError, DecisionNotCheckpointed, InvalidArgument, SpawnLimitExceeded, VersionConflict
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.logs import payload_digest

log = logging.getLogger(__name__)
MAX_SLEEP_MS = 366 * 24 * 3600 * 1000
ANSWER_WINDOW = 64  # tool answers kept readable for deciders beyond each node's latest
JOURNAL_PAGE = 5000  # entries per ReadJournal page at claim (the scheduler's maximum; pages are also byte-bounded)


def join_answer(waiting: Waiting, reply: ws.SpawnChildrenResponse, timed_out: bool) -> dict[str, Any]:
    """What a decider sees when a join ends: each child's status and its result or error."""
    children = [{"index": c.index, "run_id": c.run_id, "agent": c.agent_name,
                 "status": pb.RunStatus.Name(c.status).removeprefix("RUN_STATUS_"),
                 "result": json.loads(c.result_json) if c.result_json else None, "error": c.error or None}
                for c in reply.children]
    return {"join": (waiting.spawn or {}).get("join", "all"), "timed_out": timed_out, "children": children}


def _ts(value: Any) -> dt.datetime:
    return value.ToDatetime(tzinfo=dt.UTC)  # type: ignore[no-any-return]


class RunDriver:
    def __init__(self, claim: ws.Lease, held: HeldLease, services: Services, received_at: float) -> None:
        self.claim = claim
        self.run = claim.run
        self.s = services
        self.lease = RunLease(claim, held, services.client, services.faults)
        self.ids = RunIds(self.run.tenant_id, self.run.run_id)
        claimed_db = _ts(claim.lease_expires_at) - dt.timedelta(milliseconds=claim.lease_duration_ms)
        self._clock = (claimed_db, received_at)
        self.sleep_from: dt.datetime | None = None  # a re-issued sleep counts from its checkpoint
        # Signals the claim delivered that the state has not taken in yet (executor/signals.py).
        self.signals: list[pb.Signal] = list(claim.signals)

    # ------------------------------------------------------------------ clocks and reads

    def db_now(self) -> dt.datetime:
        """The database clock, estimated from the claim (never the worker's wall clock)."""
        claimed_db, received_at = self._clock
        return claimed_db + dt.timedelta(seconds=time.monotonic() - received_at)

    def span_attributes(self) -> dict[str, Any]:
        return {tracing.AGENT: self.run.agent_name, tracing.RUN_ID: self.run.run_id,
                tracing.TENANT: self.run.tenant_id, tracing.FENCING_TOKEN: self.lease.fencing_token,
                tracing.RUN_VERSION: self.lease.version, tracing.WORKER: self.s.worker_id}

    def count_usage(self, proposal: Proposal) -> None:
        self.s.counts.used(self.run.tenant_id, self.run.agent_name, proposal.input_tokens, proposal.output_tokens,
                           proposal.tokens, proposal.cost_usd)

    async def load_journal(self, state: State) -> State:
        """A schema-2 run's history, tool results, inputs and exceptions, rebuilt from its journal.

        Read once at claim, a page at a time; only the answers a decider may read
        (each node's latest, the last ANSWER_WINDOW) are fetched from the ledger.
        """
        known = max(state.journal_len, self.claim.journal_length)
        if known == 0:
            return state
        rebuilt = journal.Rebuilt()
        ref = self.lease.ref

        async def read(after_seq: int, page_size: int) -> tuple[list[journal.Item], bool]:
            page = await self.s.client.read_journal(ref, after_seq, page_size, compact=True)
            return json.loads(page.entries_json or "[]"), page.more

        for items in await journal.read_all(read, known, JOURNAL_PAGE):
            for item in items:
                rebuilt.add_item(item)
        wanted = rebuilt.answers_needed(ANSWER_WINDOW)
        if wanted:
            rebuilt.set_answers(await self.s.client.tool_results(ref, wanted))
        loaded = rebuilt.apply(state)
        self.lease.journal_written = loaded.journal_len
        return loaded

    # ------------------------------------------------------------------ the run

    def _agent(self, state: State | None) -> AgentDefinition | None:
        version = self.run.agent_version or (state.versions.agent_version if state else "")
        return self.s.catalog.get(self.run.agent_name, version)

    async def run_lease(self) -> None:
        try:
            await self._run()
        except Stopped:
            log.info("run %s left to lapse at shutdown (fence %d)", self.run.run_id, self.lease.fencing_token)
        except DecisionNotCheckpointed as exc:
            # A refused Tx1 would be refused again after every takeover: stop the loop for a person.
            log.error("run %s: Tx1 refused: %s", self.run.run_id, exc.message)
            if self.lease.status == pb.RUN_STATUS_RUNNING:
                await self.lease.finish(ws.FINISH_OUTCOME_PAUSED_HUMAN,
                                        f"executor error: Tx1 refused: {exc.message}",
                                        error_class="permanent:policy_refused")
        except VersionConflict as exc:  # the next holder starts again from the latest checkpoint
            log.error("run %s: scheduler refused a write (%s): %s", self.run.run_id, exc.reason, exc.message)
        except AgentrtError as exc:
            log.warning("run %s: stopped working on it: %s: %s", self.run.run_id, exc.reason, exc.message)
        except InjectedCrash:
            raise
        except Exception as exc:
            # A bug here would repeat after every takeover: park the run for a person instead.
            log.exception("run %s: executor error", self.run.run_id)
            await self.refuse("executor_error", f"executor error: {type(exc).__name__}: {exc}")

    async def _run(self) -> None:
        state: State | None = None
        if self.claim.HasField("checkpoint"):
            try:
                state = load_state(json.loads(self.claim.checkpoint.state_json),
                                   self.claim.checkpoint.schema_version)
            except UnsupportedCheckpoint as exc:
                self.s.counts.checkpoint_migration_failures += 1
                await self.refuse("checkpoint_unsupported", str(exc))
                return
        agent = self._agent(state)
        if agent is None:
            await self.refuse("agent_not_served", f"agent {self.run.agent_name!r} version "
                              f"{self.run.agent_version or (state and state.versions.agent_version)!r} "
                              "is not served by this executor")
            return
        current: State = state or initial_state(agent)
        if state is not None and self.claim.checkpoint.schema_version >= 2:
            current = await self.load_journal(current)
        if current.versions.agent_version != agent.version:  # an explicit run version wins; say so
            log.warning("run %s: checkpoint written by agent version %s, continuing with %s",
                        self.run.run_id, current.versions.agent_version, agent.version)
        if self.claim.HasField("checkpoint"):
            self.lease.saved = json.loads(self.claim.checkpoint.state_json)
        decider = self.s.deciders.get(agent)
        advancer = Advancer(agent, decider, self.ids, json.loads(self.run.input_json or "{}"),
                            self._limits(agent), self.run.max_attempts, self.db_now, used=self.count_usage)
        calls = ToolCalls(self.lease, self.s, agent, advancer, decider.pure)
        action: Action | None = None
        if self.lease.status == pb.RUN_STATUS_WAITING_TOOL:
            with self.s.tracer.start_as_current_span("agent.takeover", attributes=self.span_attributes()):
                taken = await calls.take_over(current)
            if taken is None:
                return
            current, action = taken
        else:
            current = self.recover(current, advancer)
            if current.waiting is not None and current.waiting.kind == "children":
                ended = await self.end_join(current)
                if ended is None:
                    return
                current = ended
        await self.loop(current, action, advancer, calls)

    async def loop(self, state: State, action: Action | None, advancer: Advancer, calls: ToolCalls) -> None:
        while True:
            # A step whose intent was recorded before the signal (with the previous step's Tx2) is in
            # flight: it is sent and closed like any step in flight; no other step starts.
            in_flight = isinstance(action, ExecuteTool) and action.intent_recorded
            if self.s.shutdown.stopping.is_set() and not in_flight:
                raise Stopped("shutting down")
            with self.s.tracer.start_as_current_span("agent.step", attributes=self.span_attributes()) as span:
                if action is None:
                    state = self.take_in_signals(state, advancer)
                    try:
                        state, action = await self.s.shutdown.race(advancer.advance(state),
                                                                   self.s.shutdown.stopping)
                        state, action = self.wait_met(state, action)
                    except DeciderRateLimited as exc:  # the provider said when: sleep until then, no attempt spent
                        await self.lease.finish(ws.FINISH_OUTCOME_SLEEP, f"model rate limited: {exc}"[:4000],
                                                sleep_ms=min(MAX_SLEEP_MS, max(1, int(exc.retry_after_s * 1000))))
                        return
                    except DeciderUnavailable as exc:  # inference has no side effect: try again later
                        await self.lease.finish(
                            ws.FINISH_OUTCOME_RETRY, f"decider unavailable: {exc}",
                            error_class="retryable_transient:model_unavailable",
                            pause_when_exhausted=advancer.agent.policy.pause_when_attempts_exhausted)
                        return
                    state = await self.lease.persist(state)
                span.set_attribute(tracing.STEP_KEY, state.cursor)
                span.set_attribute(tracing.RUN_VERSION, self.lease.version)
                state = journal.trimmed(state, ANSWER_WINDOW)
                if isinstance(action, ExecuteTool):
                    span.set_attribute(tracing.TOOL, action.decision.tool_name)
                    span.set_attribute("agentrt.decision_hash", action.decision.request_hash)
                    done = await calls.execute(state, action.decision, intent_recorded=action.intent_recorded)
                    if done is None:
                        return
                    state, action = done
                elif isinstance(action, DecideAgain):
                    action = None
                elif isinstance(action, EndRun):
                    self.s.faults.hit("before_finish", self.run.run_id)
                    end = run_end(action.finished)
                    if end.error_class.endswith(":budget_exhausted"):
                        self.s.counts.budget_exhausted += 1
                    await self.lease.finish(end.outcome, end.reason, result=action.finished.result,
                                            error_class=end.error_class)
                    return
                else:
                    assert isinstance(action, Park)
                    await self.park(action)
                    return

    def _limits(self, agent: AgentDefinition) -> Limits:
        budget = self.run.budget
        deadlines = []
        if budget.HasField("deadline"):
            deadlines.append(_ts(budget.deadline))
        if agent.budgets.deadline_s and self.run.HasField("created_at"):
            deadlines.append(_ts(self.run.created_at) + dt.timedelta(seconds=agent.budgets.deadline_s))
        return Limits(max_steps=int(tighter(budget.max_steps, agent.budgets.max_steps)),
                      max_tokens=int(tighter(budget.max_tokens, agent.budgets.max_tokens)),
                      max_cost_usd=float(tighter(budget.max_cost_usd, agent.budgets.max_cost_usd)),
                      deadline=min(deadlines) if deadlines else None)

    def wait_answered(self) -> bool:
        """Has the durable wait in the latest checkpoint ended (sleep elapsed, operator answered)?

        Only FinishRun SLEEP / ResumeRun (and resolves, which never follow a
        wait) move next_attempt_at past the waiting checkpoint's creation: a
        claim never does. So a later next_attempt_at means the wait was
        entered and has ended; an earlier one means the executor died between
        saving the wait and parking the run, and must park it again.
        """
        if not (self.claim.HasField("checkpoint") and self.run.HasField("next_attempt_at")):
            return False
        return _ts(self.run.next_attempt_at) > _ts(self.claim.checkpoint.created_at)

    def take_in_signals(self, state: State, advancer: Advancer) -> State:
        """Before a decision: the delivered signals, recorded in the state and shown to the decider once;
        consumed by the checkpoint that persists the decision (RunLease.consume)."""
        if not self.signals or state.finished or state.waiting or state.pending_tool or state.retry_tool:
            return state
        taken, self.signals = self.signals, []
        self.lease.consume.extend(s.seq for s in taken)
        advancer.delivered = tuple(signal_item(s) for s in taken)
        return take_in(state, taken)

    def wait_met(self, state: State, action: Action | None) -> tuple[State, Action | None]:
        """A decision to wait for a signal already taken in (shown to this decision or an earlier one) that
        no wait has answered: the wait ends at once, answered by the oldest such (recorded in the same
        checkpoint), and the run decides again. Taken in means consumed: else it would never answer it."""
        if not (isinstance(action, Park) and action.waiting.kind == "signal"):
            return state, action
        assert action.waiting.signal
        match = unanswered(state, action.waiting.signal)
        if match is None:
            return state, action
        return answered(state, match), DecideAgain()

    def end_signal_wait(self, state: State, advancer: Advancer) -> State:
        """A claimed signal wait: ends when its signal was delivered or its timeout passed, else stays parked.
        Ending, it consumes every delivered signal; the others are shown to the next decision."""
        started = _ts(self.claim.checkpoint.created_at)
        ended = end_wait(state, self.signals, self.db_now(), started)
        if ended is None:
            self.sleep_from = started
            return state
        state, others = ended
        self.lease.consume.extend(s.seq for s in self.signals)
        advancer.delivered = tuple(signal_item(s) for s in others)
        self.signals = []
        return state

    def recover(self, state: State, advancer: Advancer) -> State:
        """A RUNNING claim: end a wait that has ended, or start the next attempt of a step proven not executed."""
        if state.waiting is not None and state.waiting.kind == "signal":
            return self.end_signal_wait(state, advancer)
        if state.waiting is not None and state.waiting.kind == "children":
            return state  # end_join, which asks the scheduler
        if state.waiting is not None:
            if self.wait_answered():
                human = json.loads(self.run.human_input_json) if self.run.human_input_json else {}
                return wake(state, human, advancer)
            self.sleep_from = _ts(self.claim.checkpoint.created_at)
            return state
        pending = state.pending_tool
        row = self.claim.current_step_execution if self.claim.HasField("current_step_execution") else None
        if pending is not None and row is not None and row.step_key == pending.step_key:
            if row.status == pb.TOOL_EXECUTION_STATUS_NOT_EXECUTED:
                # Proven never to have taken effect: the same decision, as the next attempt.
                state, _ = next_attempt(state, pending, self.ids)
                return state
            return advancer.end(state, "policy_refused",
                                f"ledger row for step {pending.step_key} is "
                                f"{pb.ToolExecutionStatus.Name(row.status)} but the checkpoint still "
                                "holds the decision; not acting on it", policy_pause=True)[0]
        return state

    def remaining_ms(self, waiting: Waiting) -> int:
        """A timer's (or a signal wait's timeout's) time left, counted from its checkpoint when re-issued."""
        sleep_ms = waiting.sleep_ms or 1
        if self.sleep_from is not None:
            due = self.sleep_from + dt.timedelta(milliseconds=sleep_ms)
            sleep_ms = max(1, int((due - self.db_now()).total_seconds() * 1000))
        return min(sleep_ms, MAX_SLEEP_MS)

    async def spawn(self, waiting: Waiting) -> ws.SpawnChildrenResponse | None:
        """SpawnChildren for the wait's spawn (idempotent: a repeat finds the children it made); None when the
        scheduler refused it (an agent nobody serves, an input its schema refuses, a tree past its depth or
        size bound): the run has failed then."""
        spawn = waiting.spawn or {}
        try:
            return await self.s.client.spawn_children(self.lease.ref, waiting.step_key, spawn.get("children", []),
                                                      spawn.get("join", "all"), bool(spawn.get("detach")))
        except (InvalidArgument, SpawnLimitExceeded) as exc:
            await self.lease.finish(ws.FINISH_OUTCOME_FAILED, f"spawn at {waiting.step_key} refused: {exc.message}",
                                    error_class="permanent:spawn_refused")
            return None

    async def end_join(self, state: State) -> State | None:
        """A claimed join: ends when the scheduler says it is met or its timeout passed (the children's
        statuses and results recorded as its answer), else stays parked. None: the spawn was refused."""
        waiting = state.waiting
        assert waiting is not None and waiting.kind == "children"
        started = _ts(self.claim.checkpoint.created_at)
        reply = await self.spawn(waiting)
        if reply is None:
            return None
        timed_out = not reply.join_met and self.db_now() >= started + dt.timedelta(milliseconds=waiting.sleep_ms or 0)
        if not (reply.join_met or timed_out):
            self.sleep_from = started
            return state
        answer = join_answer(waiting, reply, timed_out)
        update: dict[str, Any] = {"waiting": None, "inputs": {**state.inputs, waiting.step_key: answer}}
        if (waiting.spawn or {}).get("share_budget"):  # the children's spend is this run's
            spent = sum(c.cost_usd for c in reply.children)
            update["usage"] = state.usage.model_copy(update={"cost_usd": round(state.usage.cost_usd + spent, 10)})
        return journal.journaled(state, update, lambda seq: journal.answer_record(seq, waiting.step_key, answer))

    async def park(self, park: Park) -> None:
        waiting: Waiting = park.waiting
        if waiting.kind == "children":
            self.s.faults.hit("before_spawn_send", self.run.run_id)
            if await self.spawn(waiting) is None:
                return
            self.s.faults.hit("after_spawn_commit", self.run.run_id)
            timeout_ms = self.remaining_ms(waiting)
            spawn = waiting.spawn or {}
            await self.lease.finish(ws.FINISH_OUTCOME_SLEEP,
                                    f"waiting for {spawn.get('join', 'all')} of {len(spawn.get('children', []))} "
                                    f"children at {waiting.step_key} (timeout {timeout_ms} ms)",
                                    sleep_ms=timeout_ms, wait_children=True)
            return
        if waiting.kind == "sleep":
            sleep_ms = self.remaining_ms(waiting)
            await self.lease.finish(ws.FINISH_OUTCOME_SLEEP, f"sleeping {sleep_ms} ms at {waiting.step_key}",
                                    sleep_ms=sleep_ms)
            return
        if waiting.kind == "signal":
            assert waiting.signal
            # A delivered signal of this name not yet looked at (the wait was decided after the claim):
            # claim again at once rather than sleep past it.
            seen = 0 if any(s.name == waiting.signal for s in self.signals) else self.claim.last_signal_seq
            timeout_ms = self.remaining_ms(waiting)
            await self.lease.finish(ws.FINISH_OUTCOME_SLEEP,
                                    f"waiting for signal {waiting.signal} at {waiting.step_key} "
                                    f"(timeout {timeout_ms} ms)", sleep_ms=timeout_ms,
                                    wait_signal=waiting.signal, signals_seen=seen)
            return
        reason = {"input": f"waiting for input at {waiting.step_key}: {waiting.prompt}",
                  "approval": f"approval required: {waiting.prompt}",
                  "resume": waiting.prompt or "paused"}[waiting.kind]
        await self.lease.finish(ws.FINISH_OUTCOME_PAUSED_HUMAN, reason)

    async def refuse(self, code: str, reason: str) -> None:
        """The executor cannot interpret this run: pause it for a person (freeze a WAITING_TOOL one)."""
        # The reason may quote the checkpoint (a validation error names the values): the run keeps it.
        log.error("run %s: refused (%s); reason %s", self.run.run_id, code, payload_digest(reason))
        claimed_open = self.claim.pending_tool.step_key if self.claim.HasField("pending_tool") else ""
        step_key = self.lease.open_step or claimed_open
        if self.lease.status == pb.RUN_STATUS_WAITING_TOOL and step_key:
            await self.lease.mark_in_doubt(step_key, code, reason)
            return
        await self.lease.finish(ws.FINISH_OUTCOME_PAUSED_HUMAN, reason, error_class=f"permanent:{code}")
