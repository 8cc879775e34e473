"""One claimed run as its holder knows it, and the fenced writes it makes under that lease.

The driver and the tool-call code share one RunLease per claim. Every write
names the lease (run, worker, fencing token) and the run version this holder
last saw, and is pointless once the lease has lapsed (`give_up_at`): the
scheduler refuses a stale fence or version, so the holder's view moves only
with writes that committed (docs/design.md §leases-and-fencing,
§checkpoints). A write that commits carries the journal entries the holder
had not yet written, and from then on they are the run's (§journal).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from executor import journal
from executor.checkpoint import SCHEMA_VERSION, Finished, State
from executor.client import WorkClient
from executor.faults import Faults
from executor.lease import HeldLease
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.logs import payload_digest

log = logging.getLogger(__name__)


def reason_digest(reason: str) -> str:
    """` (reason N bytes, sha256:…)` for a log line, or nothing for no reason."""
    return f" (reason {payload_digest(reason)})" if reason else ""


def run_end(finished: Finished) -> ws.RunEnd:
    """A decided end, as the last Tx2 carries it (CompleteToolCall.end)."""
    return ws.RunEnd(
        outcome=ws.FINISH_OUTCOME_COMPLETED if finished.outcome == "COMPLETED" else ws.FINISH_OUTCOME_FAILED,
        reason=finished.reason[:4000], result_json=json.dumps(finished.result) if finished.result is not None
        else "", error_class=finished.error_class)


class RunLease:
    """The run's per-lease state: lease ref, version, status, saved checkpoint, journal mark, open step."""

    def __init__(self, claim: ws.Lease, held: HeldLease, client: WorkClient, faults: Faults) -> None:
        self.claim = claim  # the ClaimWork answer: the run, its checkpoint, open ledger rows, limits
        self.run = claim.run
        self.held = held
        self.client = client
        self.faults = faults
        self.version = self.run.version
        self.status = self.run.status
        self.saved: dict[str, Any] | None = None  # the latest checkpoint's state, as committed
        self.journal_written = 0  # the run's journal entries written (by anyone) as far as this holder knows
        self.open_step = ""  # the step whose intent (Tx1) this holder recorded and has not closed
        # Signals (seqs) the state took in: consumed by the next SaveCheckpoint, with the entries recording them.
        self.consume: list[int] = []

    @property
    def ref(self) -> ws.LeaseRef:
        return self.held.ref

    @property
    def fencing_token(self) -> int:
        return self.held.fencing_token

    @property
    def give_up_at(self) -> float:
        return self.held.give_up_at()

    def alive(self) -> bool:
        return self.held.alive()

    # ------------------------------------------------------------------ the holder's view

    def unwritten(self, state: State) -> list[pb.JournalEntry]:
        """The journal entries `state` records that this holder has not written yet."""
        return journal.to_proto(r for r in state.pending_journal if r.seq > self.journal_written)

    def written(self, state: State) -> State:
        """After a write that carried `state`'s entries: they are the run's now."""
        self.journal_written = state.journal_len
        return state.model_copy(update={"pending_journal": []}) if state.pending_journal else state

    def intent_recorded(self, step_key: str) -> None:
        """Tx1 of `step_key` committed (the run waits on that tool call)."""
        self.status, self.open_step = pb.RUN_STATUS_WAITING_TOOL, step_key

    def committed(self, version: int, saved: dict[str, Any], status: pb.RunStatus, state: State, *,
                  open_step: str = "") -> State:
        """A Tx2 (with the next Tx1 when `open_step` is set) committed `state` as checkpoint `version`."""
        self.version, self.saved, self.status, self.open_step = version, saved, status, open_step
        return self.written(state)

    # ------------------------------------------------------------------ writes

    async def persist(self, state: State) -> State:
        """Saves `state` as the next checkpoint, with its unwritten journal entries; nothing if unchanged."""
        data = state.to_json_dict()
        entries = self.unwritten(state)
        if data == self.saved and not entries:
            return state
        if self.consume:
            self.faults.hit("before_signal_consume_commit", self.run.run_id)
        reply = await self.client.save_checkpoint(self.ref, self.version, data, SCHEMA_VERSION,
                                                  state.cursor, self.give_up_at, journal=entries,
                                                  consume_signal_seqs=self.consume)
        self.version, self.saved, self.consume = reply.version, data, []
        self.faults.hit("after_checkpoint_commit", self.run.run_id)
        return self.written(state)

    async def finish(self, outcome: ws.FinishOutcome, reason: str = "", *, result: Any = None,
                     sleep_ms: int = 0, error_class: str = "", pause_when_exhausted: bool = False,
                     wait_signal: str = "", signals_seen: int = 0, wait_children: bool = False) -> None:
        request = ws.FinishRunRequest(
            lease=self.ref, expected_version=self.version, outcome=outcome, reason=reason[:4000],
            result_json=json.dumps(result) if result is not None else "", sleep_ms=sleep_ms,
            error_class=error_class, pause_when_exhausted=pause_when_exhausted, wait_signal=wait_signal,
            signals_seen=signals_seen if wait_signal else 0, wait_children=wait_children)
        reply = await self.client.finish_run(request, self.give_up_at)
        # A reason may quote a tool's answer or a prompt built from the input: never its text in a log.
        log.info("run %s -> %s%s%s", self.run.run_id, pb.RunStatus.Name(reply.status),
                 f" {error_class}" if error_class else "", reason_digest(reason))

    async def mark_in_doubt(self, step_key: str, code: str, detail: str) -> None:
        """Freezes the run on `step_key`, whose outcome nobody can tell (docs/design.md §in-doubt)."""
        await self.client.mark_tool_in_doubt(self.ref, step_key, code, detail, self.give_up_at)
