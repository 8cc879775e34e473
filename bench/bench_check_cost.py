"""What the checks of the tables a fenced step writes cost PostgreSQL, statement by statement.

    python -m bench.bench_check_cost [--rounds 9]

Two scratch databases on AGENTRT_BENCH_DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/postgres,
which must be a server on this machine: the figure is read from its backend's /proc entry):

- **shipped**: agentrt's schema as migrated;
- **floor**: the same schema with every CHECK constraint and check trigger of agent_runs, tool_executions,
  run_journal and agent_checkpoints dropped (what no check at all would cost).

In each, a procedure runs one statement shape of the step many times, committing after each (as every
step commits), with synchronous_commit off so the WAL flush is not in the figure. The figure is the
backend's own CPU time (the first field of /proc/<pid>/schedstat, in nanoseconds: time spent waiting
for a core does not count), divided by the statements run; the two databases alternate, and each figure
is the median of the rounds. Shapes: the chained step's UPDATE of agent_runs (version, step key, journal
length, attempt count), a claim and a release (status, lease owner and expiry, fencing token), a journal
INSERT, a ledger intent INSERT with its completion UPDATE, a checkpoint INSERT.

stdout ends with one JSON line per shape: value = shipped µs, baseline = floor µs, ratio = shipped / floor
(1.0 would mean the checks cost nothing). At schema 0022 the chained UPDATE cost about 2.5x its floor;
migration 0023 brought it to about 1.1x (docs/performance/step-profile.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from bench._pg import emit, figure, log, migrated_database, server_url

BENCH = "check_cost"
RUN_ID = "00000000-0000-0000-0000-0000000000b1"
# (shape, procedure calls per sample, units per call, what one unit is)
SHAPES = (
    ("chained_update", 1500, 1, "the chained step's UPDATE of agent_runs"),
    ("claim_release", 750, 2, "a claim or a release UPDATE of agent_runs"),
    ("journal_insert", 1500, 1, "a journal INSERT"),
    ("ledger_intent_and_completion", 800, 1, "a ledger intent INSERT and its completion UPDATE"),
    ("checkpoint_insert", 1500, 1, "a checkpoint INSERT"),
)

PROCEDURE = f"""
CREATE PROCEDURE bench_check_cost(shape text, n integer) LANGUAGE plpgsql AS $$
DECLARE
  rid uuid := '{RUN_ID}';
  base bigint;
  eid uuid;
BEGIN
  SELECT coalesce(max(seq), 0) INTO base FROM run_journal WHERE run_id = rid;
  IF shape = 'checkpoint_insert' THEN
    SELECT coalesce(max(version), 0) INTO base FROM agent_checkpoints WHERE run_id = rid;
  END IF;
  FOR i IN 1..n LOOP
    IF shape = 'chained_update' THEN
      UPDATE agent_runs SET version = version + 1, current_step_key = 'step-' || i,
             journal_length = journal_length + 1, attempt_count = 1, updated_at = clock_timestamp()
       WHERE id = rid;
    ELSIF shape = 'claim_release' THEN
      UPDATE agent_runs SET status = 'RUNNING', lease_owner = 'bench', lease_expires_at = clock_timestamp(),
             fencing_token = fencing_token + 1
       WHERE id = rid;
      COMMIT;
      UPDATE agent_runs SET status = 'QUEUED', lease_owner = NULL, lease_expires_at = NULL WHERE id = rid;
    ELSIF shape = 'journal_insert' THEN
      INSERT INTO run_journal (run_id, seq, kind, detail, fencing_token, run_version)
      VALUES (rid, base + i, 'tool', '{{"ok": true}}', 1, 1);
    ELSIF shape = 'ledger_intent_and_completion' THEN
      eid := gen_random_uuid();
      INSERT INTO tool_executions (id, run_id, step_key, tool_name, idempotency_key, request_json, request_hash,
                                   status, fencing_token, intent_event_id)
      VALUES (eid, rid, eid::text, 'noop', eid::text, '{{"a": 1}}', sha256('x'), 'OUTBOUND_INTENT', 1,
              gen_random_uuid());
      UPDATE tool_executions SET status = 'SUCCEEDED', completed_at = clock_timestamp() WHERE id = eid;
    ELSE
      INSERT INTO agent_checkpoints (run_id, version, state_json, state_hash, schema_version, fencing_token, event_id)
      VALUES (rid, base + i, '{{"cursor": 1}}', sha256('x'), 1, 1, gen_random_uuid());
    END IF;
    COMMIT;
  END LOOP;
END
$$;
"""

# Every CHECK and check trigger of the tables a step writes: what "no check at all" means here.
DROP_CHECKS = """
DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT conrelid::regclass AS rel, conname FROM pg_constraint
            WHERE contype = 'c' AND conrelid::regclass::text IN ('agent_runs', 'tool_executions', 'run_journal',
                                                                  'agent_checkpoints') LOOP
    EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', r.rel, r.conname);
  END LOOP;
  FOR r IN SELECT tgrelid::regclass AS rel, tgname FROM pg_trigger
            WHERE NOT tgisinternal AND tgname LIKE 'agent_runs_check_%' LOOP
    EXECUTE format('DROP TRIGGER %I ON %s', r.tgname, r.rel);
  END LOOP;
END
$$;
"""


def is_local_process(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}/schedstat")


def backend_cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat", encoding="ascii") as stat:
        return int(stat.read().split()[0])


async def prepared(url: str, *, floor: bool) -> tuple[asyncpg.Connection, int]:
    conn = await asyncpg.connect(url)
    if floor:
        await conn.execute(DROP_CHECKS)
    await conn.execute(PROCEDURE)
    await conn.execute("INSERT INTO agent_runs (id, tenant_id, agent_name) VALUES ($1, 'bench', 'bench')", RUN_ID)
    await conn.execute("SET synchronous_commit = off")
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    if not is_local_process(pid):
        raise SystemExit(f"{BENCH}: backend {pid} is not a process on this machine; point "
                         "AGENTRT_BENCH_DATABASE_URL at a local server")
    return conn, pid


async def per_unit_us(conn: asyncpg.Connection, pid: int, shape: str, calls: int, units: int) -> float:
    before = backend_cpu_ns(pid)
    await conn.execute(f"CALL bench_check_cost('{shape}', {calls})")
    return (backend_cpu_ns(pid) - before) / (calls * units) / 1000


async def run(rounds: int) -> list[dict[str, Any]]:
    async with migrated_database("agentrt_bench_checks") as shipped_url, \
            migrated_database("agentrt_bench_floor") as floor_url:
        shipped, shipped_pid = await prepared(shipped_url, floor=False)
        floor, floor_pid = await prepared(floor_url, floor=True)
        try:
            samples: dict[tuple[str, str], list[float]] = {}
            for round_no in range(rounds):
                log(f"round {round_no + 1}/{rounds}")
                for shape, calls, units, _ in SHAPES:
                    order = [("shipped", shipped, shipped_pid), ("floor", floor, floor_pid)]
                    for tree, conn, pid in order if round_no % 2 == 0 else reversed(order):
                        samples.setdefault((tree, shape), []).append(await per_unit_us(conn, pid, shape, calls, units))
        finally:
            await shipped.close()
            await floor.close()
    figures = []
    for shape, _, _, what in SHAPES:
        value = statistics.median(samples[("shipped", shape)])
        base = statistics.median(samples[("floor", shape)])
        figures.append(figure(BENCH, f"{shape}_backend_cpu_us", value, "us", base, value / base,
                              baseline_name=f"{what}, with no CHECK or check trigger (same run)",
                              shipped_rounds=[round(x, 1) for x in samples[("shipped", shape)]],
                              floor_rounds=[round(x, 1) for x in samples[("floor", shape)]]))
        log(f"{what}: {value:.1f} us (no checks: {base:.1f} us, x{value / base:.2f})")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds; each figure is their median")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        print("--rounds: must be 1 or more", file=sys.stderr)
        return 2
    log(f"{BENCH}: backend CPU per committed statement on {urlsplit(server_url()).hostname}, {args.rounds} rounds")
    emit(asyncio.run(run(args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
