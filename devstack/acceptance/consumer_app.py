"""A downstream service for the suite: shared.client.consumer.EventConsumer applying each event to a business table.

    python -m devstack.acceptance.consumer_app    (settings: AGENTRT_* as for ConsumerSettings)

`acceptance_effects` has no unique key on purpose: an event applied twice would
show up as two rows. The dedupe is the library's consumed_events row, written
in the same transaction.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import asyncpg

from shared.client.consumer import ConsumerSettings, EventConsumer
from shared.cloudevents import AgentEvent
from shared.logs import setup_logging
from shared.tracing import setup_tracing

log = logging.getLogger("acceptance.consumer")

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS acceptance_effects (
  event_id uuid NOT NULL, run_id uuid NOT NULL, event_type text NOT NULL, sequence bigint NOT NULL,
  topic text NOT NULL, kafka_partition int NOT NULL, kafka_offset bigint NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT clock_timestamp())
"""


async def apply(event: AgentEvent, conn: asyncpg.Connection) -> None:
    await conn.execute(
        "INSERT INTO acceptance_effects (event_id, run_id, event_type, sequence, topic, kafka_partition, "
        "kafka_offset) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        event.id, event.run_id, event.type, event.sequence, event.topic, event.partition, event.offset)


async def main() -> None:
    overrides: dict[str, Any] = {}  # everything from AGENTRT_* (the lab sets them)
    settings = ConsumerSettings(**overrides)
    setup_logging(settings.log_level, settings.log_format, settings.service_name)
    # OTEL_TRACES_EXPORTER=otlp (or otel_exporter) exports the handler spans, as in every service.
    setup_tracing(settings.tracing())  # flushed at exit (bounded, shared/otlp.py)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    consumer = EventConsumer(settings, apply)
    await consumer.start()
    try:
        await consumer.ensure_schema()
        async with consumer.pool.acquire() as conn:
            await conn.execute(EFFECTS_DDL)
        log.info("consumer ready: group %s, topics %s", settings.group_id, ",".join(settings.topics))
        await consumer.run(stopping)
    finally:
        await consumer.stop()
        log.info("consumer stopped: %s", consumer.stats)


if __name__ == "__main__":
    asyncio.run(main())
