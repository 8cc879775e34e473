"""`agentrt schedules …`: create, update, list, pause, resume and delete schedules (RunService)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cli.runs import _common, _json_arg, _print_json, _runner
from shared.client.runs import AgentrtClient
from shared.errors import InvalidArgument
from shared.gen.agentrt.v1 import run_service_pb2 as rs

OVERLAPS = {"skip": rs.SCHEDULE_OVERLAP_SKIP, "buffer_one": rs.SCHEDULE_OVERLAP_BUFFER_ONE,
            "allow_all": rs.SCHEDULE_OVERLAP_ALLOW_ALL}
_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _interval_ms(text: str) -> int:
    """`90s`, `5m`, `1h`, `1d`, or milliseconds."""
    number, unit = (text[:-1], text[-1]) if text and text[-1] in _UNITS else (text, "")
    if not number.isdigit():
        raise InvalidArgument("--every", "give a number with s, m, h or d (e.g. 5m), or milliseconds")
    return int(number) * _UNITS.get(unit, 1)


def _spec(args: argparse.Namespace) -> rs.ScheduleSpec:
    payload = _json_arg("--input", args.input) or {}
    if not isinstance(payload, dict):
        raise InvalidArgument("--input", "must be a JSON object")
    labels = dict(label.split("=", 1) for label in args.label or [] if "=" in label)
    return rs.ScheduleSpec(agent_name=args.agent, agent_version=args.agent_version or "",
                           input_json=json.dumps(payload), labels=labels,
                           interval_ms=_interval_ms(args.every) if args.every else 0,
                           cron=args.cron or "", time_zone=args.tz or "", overlap=OVERLAPS[args.overlap],
                           catch_up_window_ms=args.catch_up_ms, jitter_ms=args.jitter_ms)


def _print_schedule(args: argparse.Namespace, schedule: dict[str, Any], note: str = "") -> None:
    if args.json:
        _print_json(schedule)
        return
    spec = schedule.get("spec", {})
    when = f"every {spec['interval_ms']} ms" if spec.get("interval_ms") else f"cron {spec.get('cron')!r} " \
        f"{spec.get('time_zone') or 'UTC'}"
    print(f"{note}{schedule['schedule_id']}  {schedule['name']}  {spec.get('agent_name')}  {when}  "
          f"{'paused' if schedule.get('paused') else 'next ' + str(schedule.get('next_fire_at'))}  "
          f"fires {schedule.get('fires', 0)} skipped {schedule.get('skipped', 0)}")


async def _create(args: argparse.Namespace, client: AgentrtClient) -> None:
    schedule, created = await client.create_schedule(args.name, _spec(args))
    _print_schedule(args, {**schedule, "created": created} if args.json else schedule,
                    "" if created else "already exists: ")


async def _update(args: argparse.Namespace, client: AgentrtClient) -> None:
    _print_schedule(args, await client.update_schedule(args.schedule_id, _spec(args)))


async def _list(args: argparse.Namespace, client: AgentrtClient) -> None:
    schedules = await client.list_schedules()
    if args.json:
        _print_json({"schedules": schedules})
        return
    if not schedules:
        print("no schedules")
    for schedule in schedules:
        _print_schedule(args, schedule)


async def _pause(args: argparse.Namespace, client: AgentrtClient) -> None:
    _print_schedule(args, await client.pause_schedule(args.schedule_id, True))


async def _resume(args: argparse.Namespace, client: AgentrtClient) -> None:
    _print_schedule(args, await client.pause_schedule(args.schedule_id, False))


async def _delete(args: argparse.Namespace, client: AgentrtClient) -> None:
    _print_schedule(args, await client.delete_schedule(args.schedule_id), "deleted: ")


def _spec_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("agent")
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--every", help="an interval: 30s, 5m, 1h, 1d (or milliseconds)")
    when.add_argument("--cron", help="five fields: minute hour day-of-month month day-of-week")
    p.add_argument("--tz", help="IANA time zone of --cron (default UTC)")
    p.add_argument("--input", help="JSON object, or @file.json")
    p.add_argument("--label", action="append", help="k=v (repeatable)")
    p.add_argument("--agent-version")
    p.add_argument("--overlap", choices=sorted(OVERLAPS), default="skip",
                   help="while the last run has not ended: skip the fire, buffer one, or allow all")
    p.add_argument("--catch-up-ms", type=int, default=0, help="missed fires within this window are made")
    p.add_argument("--jitter-ms", type=int, default=0)


def add_commands(sub: Any) -> None:
    schedules = sub.add_parser("schedules", help="runs submitted on a schedule").add_subparsers(
        dest="schedules_command", required=True)
    p = schedules.add_parser("create", help="create a schedule (the same name and spec: already exists)")
    _common(p)
    p.add_argument("name")
    _spec_flags(p)
    p.set_defaults(func=_runner(_create))
    p = schedules.add_parser("update", help="replace a schedule's spec (the next fire counts from now)")
    _common(p)
    p.add_argument("schedule_id")
    _spec_flags(p)
    p.set_defaults(func=_runner(_update))
    for name, handler, text in (("pause", _pause, "stop firing"), ("resume", _resume, "fire again from now on"),
                                ("delete", _delete, "delete a schedule (its runs stay)")):
        p = schedules.add_parser(name, help=text)
        _common(p)
        p.add_argument("schedule_id")
        p.set_defaults(func=_runner(handler))
    p = schedules.add_parser("list", help="the tenant's schedules")
    _common(p)
    p.set_defaults(func=_runner(_list))
