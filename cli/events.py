"""`agentrt events tail`: agent events (CloudEvents) from Kafka, pretty-printed or as JSON lines.

Bootstrap and topic from --bootstrap / --topic, else AGENTRT_KAFKA_BOOTSTRAP /
AGENTRT_TOPIC, else the `relay:` section of AGENTRT_CONFIG_FILE (what the relay
publishes to), else the broker of this directory's `agentrt dev` session
(.agentrt/client.json). Reads without a consumer group, so tailing moves no one's offsets.
--max and --timeout bound it for scripts; Ctrl-C ends it quietly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any, ClassVar

from cli import local_config
from shared.cloudevents import AgentEvent
from shared.errors import AgentrtError, InvalidArgument, Unavailable
from shared.kafka_client import KafkaClientSettings

PAYLOAD_WIDTH = 100


class TailSettings(KafkaClientSettings):
    # The relay's section: one config file tells both where events go.
    section: ClassVar[str] = "relay"

    topic: str = "agentrt.events"


class TooFewEvents(AgentrtError):
    reason = "TIMEOUT"


def _line(event: AgentEvent) -> str:
    payload = json.dumps(event.payload, sort_keys=True, separators=(",", ":"), default=str)
    if len(payload) > PAYLOAD_WIDTH:
        payload = payload[:PAYLOAD_WIDTH - 1] + "…"
    clock = event.time.strftime("%H:%M:%S.%f")[:-3]
    return (f"{clock}  {event.type:26} {event.subject}  {event.tenant_id:10} v{event.run_version:<4} "
            f"fence {event.fencing_token:<3} {payload}")


def _wanted(args: argparse.Namespace, event: AgentEvent) -> bool:
    if args.run and event.subject not in args.run:
        return False
    if args.type and event.type not in args.type:
        return False
    return not args.tenant_filter or event.tenant_id in args.tenant_filter


async def _tail(args: argparse.Namespace, settings: TailSettings) -> int:
    # Imported here: the Kafka client is this command's alone, and every service parses this CLI to start.
    from shared.client.event_tail import EventTail, KafkaUnreachable, Unreadable, event_as_json

    tail = EventTail(settings, settings.topic, from_beginning=args.from_beginning)
    try:
        await tail.start()
    except KafkaUnreachable as exc:
        raise Unavailable(str(exc)) from None
    deadline = time.monotonic() + args.timeout if args.timeout else None
    printed = 0
    try:
        while deadline is None or time.monotonic() < deadline:
            wait = 0.5 if deadline is None else max(0.01, min(0.5, deadline - time.monotonic()))
            for item in await tail.poll(wait):
                if isinstance(item, Unreadable):
                    print(f"skipped a record that is not an agent event at {item.topic}/{item.partition}"
                          f"@{item.offset}: {item.problem}", file=sys.stderr, flush=True)
                    continue
                if not _wanted(args, item):
                    continue
                print(json.dumps(event_as_json(item), sort_keys=True, default=str) if args.json else _line(item),
                      flush=True)
                printed += 1
                if args.max and printed >= args.max:
                    return 0
    finally:
        await tail.stop()
    if args.max:
        raise TooFewEvents(f"{printed} of {args.max} events within {args.timeout:g}s on topic {settings.topic}")
    return 0


def cmd_tail(args: argparse.Namespace) -> int:
    if args.max is not None and args.max < 1:
        raise InvalidArgument("--max", "must be at least 1")
    if args.timeout is not None and args.timeout <= 0:
        raise InvalidArgument("--timeout", "must be a positive number of seconds")
    overrides: dict[str, Any] = {}
    if args.bootstrap:
        overrides["kafka_bootstrap"] = args.bootstrap
    if args.topic:
        overrides["topic"] = args.topic
    settings = TailSettings(**overrides)
    bootstrap = local_config.load().get("kafka_bootstrap")
    if bootstrap and "kafka_bootstrap" not in settings.model_fields_set:
        # Neither flag, environment nor config file named one: the broker of this directory's
        # `agentrt dev` session (its port changes every session).
        settings = TailSettings(**overrides, kafka_bootstrap=bootstrap)
    logging.getLogger("aiokafka").setLevel(settings.kafka_log_level)  # broker trouble is reported once, below
    try:
        return asyncio.run(_tail(args, settings))
    except KeyboardInterrupt:
        return 0


def add_commands(sub: Any) -> None:
    events = sub.add_parser("events", help="agent events on Kafka").add_subparsers(dest="events_command",
                                                                                    required=True)
    p = events.add_parser("tail", help="print agent events (CloudEvents) as they arrive")
    p.add_argument("--bootstrap", help="Kafka host:port[,host:port] (default AGENTRT_KAFKA_BOOTSTRAP, "
                                         "else .agentrt/client.json of `agentrt dev`)")
    p.add_argument("--topic", help="topic (default AGENTRT_TOPIC or agentrt.events)")
    p.add_argument("--from-beginning", action="store_true", help="everything on the topic, not only new events")
    p.add_argument("--run", action="append", help="only this run id (repeatable)")
    p.add_argument("--type", action="append", help="only this event type, e.g. agent.run_completed (repeatable)")
    p.add_argument("--tenant", dest="tenant_filter", action="append", help="only this tenant (repeatable)")
    p.add_argument("--json", action="store_true", help="one CloudEvents JSON object per line")
    p.add_argument("--max", type=int, help="exit 0 after this many events (non-zero if --timeout comes first)")
    p.add_argument("--timeout", type=float, help="stop after this many seconds")
    p.set_defaults(func=cmd_tail)
