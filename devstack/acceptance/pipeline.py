"""The whole event path under load, for experiments 4, 7, 8 and the soak: runs → outbox → relay → Kafka → consumer.

Also a raw topic reader (assigned partitions, no consumer group) that sees
every record the broker holds, duplicates included.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from devstack.acceptance.evidence import jsonable
from devstack.acceptance.lab import Lab, MockTool
from devstack.acceptance.procs import Proc, wait_until
from devstack.kafka_testing import TansuBroker
from shared.cloudevents import AgentEvent, MalformedEvent

REJOINED = "partitions assigned:"  # shared.client.consumer logs it on every (re)assignment


class TopicReader:
    """Reads one topic from the beginning and keeps (event id, partition, offset) of every record."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.seen: list[tuple[uuid.UUID, int, int]] = []
        self._consumer: AIOKafkaConsumer | None = None
        self._partitions: list[TopicPartition] = []

    async def start(self) -> TopicReader:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, enable_idempotence=False)
        await producer.start()
        try:  # asking for partitions creates the topic on Tansu
            self._partitions = [TopicPartition(self.topic, p) for p in await producer.partitions_for(self.topic)]
        finally:
            await producer.stop()
        self._consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                          auto_offset_reset="earliest", fetch_max_wait_ms=50)
        await self._consumer.start()
        self._consumer.assign(self._partitions)
        await self._consumer.seek_to_beginning(*self._partitions)
        return self

    async def poll(self) -> int:
        assert self._consumer is not None
        try:
            batches = await self._consumer.getmany(timeout_ms=100)
        except KafkaError:
            return 0
        added = 0
        for records in batches.values():
            for record in records:
                try:
                    event = AgentEvent.from_record(record)
                except MalformedEvent:
                    continue
                self.seen.append((event.id, record.partition, record.offset))
                added += 1
        return added

    async def caught_up(self) -> bool:
        """True once every partition's position reached its end offset (reads what arrives meanwhile)."""
        assert self._consumer is not None
        await self.poll()
        ends = await self._consumer.end_offsets(self._partitions)
        for tp, end in ends.items():
            if await self._consumer.position(tp) < end:
                return False
        return True

    def counts(self) -> collections.Counter[uuid.UUID]:
        return collections.Counter(event_id for event_id, _, _ in self.seen)

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        try:
            await consumer.stop()
        except (KafkaError, OSError):
            pass
        except asyncio.CancelledError:
            # aiokafka's fetcher can surface its own cancelled retry when its broker is gone.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise


class Pipeline:
    """Scheduler, executors, mock tool, broker, relay and consumer of one lab, and the checks over them."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.topic = f"acc.e{lab.ev.experiment_id}.{uuid.uuid4().hex[:8]}"
        self.mock: MockTool | None = None
        self.broker: TansuBroker | None = None
        self.relay: Proc | None = None
        self.consumer: Proc | None = None
        self.executors: list[Proc] = []
        self.consumer_url = ""
        self.agents_dir: Path = lab.dir / "agents"

    async def start_core(self) -> MockTool:
        await self.lab.runtime_database()
        await self.lab.scheduler()
        self.mock = await self.lab.mocktool()
        return self.mock

    async def start_executors(self, count: int, slots: int = 6) -> None:
        for i in range(count):
            self.executors.append(await self.lab.executor(f"executor-{i + 1}", self.agents_dir, slots=slots))

    async def start_events(self, relay: bool = True, **relay_settings: Any) -> None:
        self.broker = await self.lab.broker()
        self.consumer_url = await self.lab.database("_consumer")
        self.consumer = await self.lab.consumer("consumer", self.consumer_url, self.broker.bootstrap, self.topic)
        if relay:
            self.relay = await self.lab.relay("relay", self.broker.bootstrap, self.topic, **relay_settings)

    async def consumer_rows(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        try:
            conn = await asyncpg.connect(self.consumer_url, timeout=5)
        except (OSError, asyncpg.PostgresError):
            return []
        try:
            return list(await conn.fetch(sql, *args))
        except asyncpg.UndefinedTableError:
            return []
        finally:
            await conn.close()

    async def applied(self) -> collections.Counter[uuid.UUID]:
        rows = await self.consumer_rows("SELECT event_id, count(*) AS n FROM acceptance_effects GROUP BY event_id")
        return collections.Counter({r["event_id"]: r["n"] for r in rows})

    async def outbox_ids(self) -> set[uuid.UUID]:
        return {r["event_id"] for r in await self.lab.fetch("SELECT event_id FROM outbox")}

    async def pending(self) -> int:
        return int(await self.lab.value("SELECT count(*) FROM outbox WHERE published_at IS NULL") or 0)

    async def statuses(self, run_ids: list[str]) -> collections.Counter[str]:
        rows = await self.lab.fetch("SELECT status FROM agent_runs WHERE id = ANY($1::uuid[])",
                                    [uuid.UUID(r) for r in run_ids])
        return collections.Counter(r["status"] for r in rows)

    async def wait_runs_settled(self, run_ids: list[str], within: float) -> collections.Counter[str]:
        settled = ("COMPLETED", "FAILED", "CANCELLED", "PAUSED_HUMAN", "PAUSED_INDOUBT")

        async def done() -> collections.Counter[str] | None:
            counts = await self.statuses(run_ids)
            return counts if sum(counts[s] for s in settled) == len(run_ids) else None

        return await wait_until(done, within, f"all {len(run_ids)} runs to settle", interval=0.25)

    async def wait_delivered(self, within: float) -> None:
        """Every outbox row published and applied by the consumer."""
        await wait_until(lambda: self._all_published(), within, "every outbox row to be published", interval=0.25)

        async def applied_all() -> bool:
            return (await self.outbox_ids()) <= set(await self.applied())

        try:
            await wait_until(applied_all, within, "the consumer to apply every event", interval=0.25)
        except Exception:
            with contextlib.suppress(Exception):  # the evidence of the failure, never a second failure
                await self.record_unapplied()
            raise

    async def record_unapplied(self) -> None:
        """Into the evidence, before the databases go: the published events the consumer has not
        applied (up to 50, with their run, type, sequence and publish time) and how far it got, so a
        consumer that is only late can be told from an event that is lost."""
        applied = await self.applied()
        missing = [e for e in await self.outbox_ids() if e not in applied]
        rows = await self.lab.fetch(
            "SELECT event_id, run_id, event_type, id, created_at, published_at FROM outbox "
            "WHERE event_id = ANY($1::uuid[]) ORDER BY id LIMIT 50", missing[:5000])
        consumed = await self.consumer_rows("SELECT count(*) AS n, max(consumed_at) AS last FROM consumed_events")
        self.lab.ev.observe(unapplied={
            "count": len(missing), "applied_distinct": len(applied),
            "consumer_rows": dict(consumed[0]) if consumed else None,
            "first": [dict(r) for r in rows]})

    async def _all_published(self) -> bool:
        return await self.pending() == 0

    async def check_delivery(self, reader: TopicReader | None = None) -> None:
        """Evidence + checks: every row published, every event applied exactly once."""
        ev = self.lab.ev
        outbox = await self.outbox_ids()
        applied = await self.applied()
        pending = await self.pending()
        twice = {str(k): v for k, v in applied.items() if v > 1}
        missing = [str(e) for e in outbox - set(applied)][:20]
        consumed = await self.consumer_rows("SELECT count(*) AS n, count(DISTINCT event_id) AS d FROM consumed_events")
        broker: dict[str, Any] = {"topic": self.topic, "bootstrap": self.broker.bootstrap if self.broker else None}
        if reader is not None:
            counts = reader.counts()
            broker.update(records_read=len(reader.seen), distinct_events=len(counts),
                          published_more_than_once=sum(1 for n in counts.values() if n > 1),
                          sample=[{"event_id": str(e), "partition": p, "offset": o} for e, p, o in reader.seen[:30]])
        ev.broker_messages = jsonable(broker)
        ev.observe(outbox_rows=len(outbox), outbox_pending=pending, events_applied=sum(applied.values()),
                   distinct_events_applied=len(applied), applied_twice=twice, not_applied=missing,
                   consumed_events=dict(consumed[0]) if consumed else None)
        ev.query("SELECT count(*) FROM outbox WHERE published_at IS NULL", (), [{"count": pending}],
                 "runtime database: unpublished rows")
        ev.query("SELECT event_id, count(*) FROM acceptance_effects GROUP BY event_id HAVING count(*) > 1", (),
                 [{"event_id": k, "count": v} for k, v in twice.items()], "consumer database: events applied twice")
        ev.check("every outbox row published", pending == 0, pending)
        ev.check("every event applied by the consumer", not missing, missing)
        ev.check("no event applied twice", not twice, twice)
        ev.check("consumed_events: one row per applied event",
                 bool(consumed) and consumed[0]["n"] == consumed[0]["d"] == len(applied),
                 dict(consumed[0]) if consumed else None)

    async def start_broker_again(self, port: int, lab: Lab) -> TansuBroker:
        """Starts Tansu on `port` with the relay held until the consumer has rejoined its group there.

        A restarted Tansu has an empty log and no group offsets. Until the consumer rejoins, it
        fetches at its old positions, and a log the relay had already refilled past them would
        skip records (a memory-storage artefact: Kafka keeps both). After the rejoin it starts
        from the earliest offset. A relay or consumer that is not running is not waited for.
        """
        relay, consumer = self.relay, self.consumer
        held = relay is not None and relay.alive()
        joins = consumer.log().count(REJOINED) if consumer is not None else 0
        if held:
            assert relay is not None
            relay.signal(signal.SIGSTOP)
        try:
            self.broker = await lab.broker(port=port)
            if consumer is not None and consumer.alive():
                await wait_until(lambda: consumer.log().count(REJOINED) > joins or not consumer.alive(), 60,
                                 "the consumer to rejoin its group on the restarted broker", interval=0.1)
        finally:
            if held and relay is not None and relay.alive():
                relay.signal(signal.SIGCONT)
        return self.broker

    def alive_check(self, procs: list[Proc], what: str) -> None:
        states = {p.name: {"pid": p.pid, "alive": p.alive(), "starts": sum(1 for h in p.history
                                                                          if h["event"] == "started")}
                  for p in procs}
        self.lab.ev.check(what, all(s["alive"] for s in states.values()), states)


async def read_all(reader: TopicReader, within: float = 30) -> None:
    await wait_until(reader.caught_up, within, "the topic reader to reach the end of every partition", interval=0)
