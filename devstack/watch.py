"""Live figures for `agentrt dev`: a Kafka reader of the events topic, and the progress view (rich).

The reader keeps every event id it saw per run (events of other runs too: the
relay may publish a run's first event before its submit call has returned), so
"every event consumed" can be checked against each run's outbox history.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from devstack.demo import AWAITING_APPROVAL, CANCELLED, COMPLETED, IN_PROGRESS, UNEXPECTED, DemoRun
from devstack.services import Service
from shared.client.event_tail import EventTail, Unreadable
from shared.kafka_client import KafkaClientSettings

log = logging.getLogger(__name__)
RATE_WINDOW_S = 5.0
TOOL_DONE = ("agent.tool_succeeded", "agent.tool_failed")


class EventCounter:
    def __init__(self, settings: KafkaClientSettings, topic: str) -> None:
        self.tail = EventTail(settings, topic, from_beginning=False)
        self.topic = topic
        self.ids_by_run: dict[str, set[str]] = collections.defaultdict(set)
        self.types_by_run: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.records = 0  # every record read, duplicates included
        self.duplicates = 0  # the same event id again (at-least-once delivery; consumers dedupe by id)
        self.unreadable = 0
        self.last_error = ""
        self._arrivals: collections.deque[tuple[float, int]] = collections.deque()

    async def start(self) -> None:
        await self.tail.start()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                items = await self.tail.poll(0.2)
            except Exception as exc:  # the broker restarting or a network blip: keep reading
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("events reader: %s", self.last_error)
                await asyncio.sleep(0.5)
                continue
            fresh = 0
            for item in items:
                self.records += 1
                if isinstance(item, Unreadable):
                    self.unreadable += 1
                    continue
                run_id, event_id = item.subject, str(item.id)
                if event_id in self.ids_by_run[run_id]:
                    self.duplicates += 1
                    continue
                self.ids_by_run[run_id].add(event_id)
                self.types_by_run[run_id][item.type] += 1
                fresh += 1
            if fresh:
                self._arrivals.append((time.monotonic(), fresh))

    def rate(self) -> float:
        horizon = time.monotonic() - RATE_WINDOW_S
        while self._arrivals and self._arrivals[0][0] < horizon:
            self._arrivals.popleft()
        return sum(n for _, n in self._arrivals) / RATE_WINDOW_S

    def consumed(self, run_ids: set[str]) -> int:
        return sum(len(self.ids_by_run.get(r, ())) for r in run_ids)

    def count(self, run_ids: set[str], *types: str) -> int:
        return sum(self.types_by_run[r][t] for r in run_ids if r in self.types_by_run for t in types)

    async def stop(self) -> None:
        await self.tail.stop()


@dataclass
class View:
    session: str
    tenant: str
    auto_approve: bool
    runs: list[DemoRun]
    services: list[Service]
    events: EventCounter | None
    stats: dict[str, Any] = field(default_factory=dict)
    notes: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=6))
    # What waits for a person: one line per run, the exact command that approves it. Its own panel,
    # which the scrolling notes never overwrite; the same lines are in .agentrt/approvals.txt.
    needs_you: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def note(self, text: str) -> None:
        self.notes.append(f"{time.strftime('%H:%M:%S')} {text}")

    def outcomes(self) -> collections.Counter[str]:
        return collections.Counter(r.outcome(auto_approve=self.auto_approve) for r in self.runs)

    def run_ids(self) -> set[str]:
        return {r.run_id for r in self.runs if r.run_id}

    def figures(self) -> dict[str, Any]:
        ids = self.run_ids()
        ev = self.events
        return {
            "by_status": dict(collections.Counter(r.status for r in self.runs)),
            "outcomes": dict(self.outcomes()),
            "tool_steps_done": ev.count(ids, *TOOL_DONE) if ev else 0,
            "tool_calls_sent": ev.count(ids, "agent.tool_requested") if ev else 0,
            "events_consumed": ev.consumed(ids) if ev else 0,
            "events_per_s": ev.rate() if ev else 0.0,
            "in_doubt": self.stats.get("in_doubt_runs", 0),
            "outbox_pending": self.stats.get("outbox_pending", 0),
            "outbox_oldest_s": self.stats.get("outbox_oldest_pending_age_s", 0.0),
        }

    def line(self) -> str:
        """The progress as one line, for logs and terminals without live redraw."""
        f = self.figures()
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(f["by_status"].items())) or "none"
        return (f"[{time.monotonic() - self.started:5.0f}s] runs: {statuses} | tool steps {f['tool_steps_done']}, "
                f"calls {f['tool_calls_sent']} | in doubt {f['in_doubt']} | outbox lag {f['outbox_pending']} | "
                f"events consumed {f['events_consumed']} ({f['events_per_s']:.0f}/s)")

    def render(self) -> Group:
        f = self.figures()
        runs = Table(title=f"demo runs (tenant {self.tenant})", show_edge=False, expand=True)
        runs.add_column("status")
        runs.add_column("runs", justify="right")
        for status, count in sorted(f["by_status"].items()):
            runs.add_row(status, str(count))
        outcome_styles = {COMPLETED: "green", AWAITING_APPROVAL: "yellow", IN_PROGRESS: "cyan", UNEXPECTED: "red",
                          CANCELLED: "dim"}
        for outcome, count in sorted(f["outcomes"].items()):
            runs.add_row(Text(outcome, style=outcome_styles.get(outcome, "")), str(count))

        figures = Table(title="progress", show_edge=False, show_header=False, expand=True)
        figures.add_column()
        figures.add_column(justify="right")
        figures.add_row("tool steps done", str(f["tool_steps_done"]))
        figures.add_row("tool calls sent", str(f["tool_calls_sent"]))
        figures.add_row("runs in doubt (tenant)", Text(str(f["in_doubt"]), style="red" if f["in_doubt"] else ""))
        figures.add_row("outbox lag", f"{f['outbox_pending']} ({f['outbox_oldest_s']:.1f}s)")
        figures.add_row("events consumed", str(f["events_consumed"]))
        figures.add_row("events/s", f"{f['events_per_s']:.1f}")
        if self.events and self.events.duplicates:
            figures.add_row("duplicate deliveries", str(self.events.duplicates))

        services = Table(title="services", show_edge=False, expand=True)
        for column in ("service", "pid", "state", "restarts"):
            services.add_column(column)
        for service in self.services:
            state = Text("up", style="green") if service.alive else Text("down", style="red")
            services.add_row(service.name, str(service.pid or "-"), state, str(max(0, service.incarnation - 1)))

        top = Table.grid(expand=True)
        top.add_column(ratio=1)
        top.add_column(ratio=1)
        top.add_column(ratio=1)
        top.add_row(runs, figures, services)
        elapsed = time.monotonic() - self.started
        title = f"agentrt dev · session {self.session} · {elapsed:.0f}s · Ctrl-C stops everything"
        parts: list[Any] = [Panel(top, title=title)]
        if self.needs_you:
            parts.append(Panel(Text("\n".join(self.needs_you)), title=f"needs you ({len(self.needs_you)})",
                               border_style="yellow", title_align="left"))
        if self.notes:
            parts.append(Text("\n".join(self.notes), style="dim"))
        return Group(*parts)
