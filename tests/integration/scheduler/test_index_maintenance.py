"""Index upkeep (scheduler/background/maintenance.py, `agentrt maintain indexes`) on a real PostgreSQL.

The bloat is made the way the soak makes it: time-ordered keys inserted at the right edge, a
retention that deletes everything old but a half percent that lingers, VACUUM after each round.
The index then grows round after round while its rows do not; the pass finds it, rebuilds it online
while writes go on, and a second pass finds nothing to do.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg
import pytest
from helpers import run_agentrt, without_settings

from scheduler.background.maintenance import index_sizes, maintain_indexes
from shared.errors import InvalidArgument, PermissionDenied

pytestmark = pytest.mark.integration


async def make_sparse(db: asyncpg.Connection, rounds: int = 24, per_round: int = 10_000) -> int:
    """A table `sparse` whose primary key sparse pages have bloated; returns its live row count."""
    await db.execute("CREATE TABLE sparse (id bigint PRIMARY KEY, lingers boolean NOT NULL, pad text)")
    for r in range(rounds):
        start = r * per_round
        # every 200th row lingers (0.5%), as runs paused in doubt do beside the ones retention deletes
        await db.execute("INSERT INTO sparse SELECT g, g % 200 = 7, repeat('x', 40) "
                         "FROM generate_series($1::bigint, $2::bigint) g", start, start + per_round - 1)
        await db.execute("DELETE FROM sparse WHERE id < $1 AND NOT lingers", start - 2 * per_round)
        await db.execute("VACUUM sparse")
    await db.execute("ANALYZE sparse")
    return int(await db.fetchval("SELECT count(*) FROM sparse"))


def by_name(sizes, name):
    return next(size for size in sizes if size.index == name)


async def test_a_fresh_index_is_estimated_near_its_size_and_a_sparse_one_far_above(db):
    await db.execute("CREATE TABLE dense (id uuid PRIMARY KEY, at timestamptz NOT NULL, name text NOT NULL)")
    await db.execute("CREATE INDEX dense_at_name ON dense (at, name)")
    await db.execute("INSERT INTO dense SELECT gen_random_uuid(), clock_timestamp(), md5(g::text) "
                     "FROM generate_series(1, 50000) g")
    await db.execute("VACUUM ANALYZE dense")
    await make_sparse(db)
    sizes = await index_sizes(db)
    # keys in order fill pages as a fresh build does; random keys split pages in halves and settle
    # near 70% full: both stay well under the default threshold (2)
    assert 0.8 <= by_name(sizes, "dense_at_name").bloat <= 1.2, by_name(sizes, "dense_at_name")
    assert 1.0 <= by_name(sizes, "dense_pkey").bloat <= 1.6, by_name(sizes, "dense_pkey")
    assert by_name(sizes, "sparse_pkey").bloat >= 3, by_name(sizes, "sparse_pkey")
    runtime = {size.table for size in sizes}
    assert {"agent_runs", "tool_executions", "outbox", "run_journal"} <= runtime  # the runtime's own are measured


async def test_a_pass_rebuilds_the_bloated_index_online_and_a_second_pass_does_nothing(db, db_url):
    live = await make_sparse(db)
    before = by_name(await index_sizes(db), "sparse_pkey")

    dry = await maintain_indexes(db, min_bytes=0, dry_run=True)
    assert [entry["index"] for entry in dry.rebuilt] == ["sparse_pkey"]
    assert by_name(await index_sizes(db), "sparse_pkey").bytes == before.bytes  # a dry run changes nothing

    writer = await asyncpg.connect(db_url)
    written, stop = [], asyncio.Event()

    async def write() -> None:  # writes go on while the index is rebuilt: the rebuild blocks none
        next_id = 10_000_000
        while not stop.is_set():
            await writer.execute("INSERT INTO sparse VALUES ($1, false, 'during')", next_id)
            written.append(next_id)
            next_id += 1
            await asyncio.sleep(0.002)

    task = asyncio.create_task(write())
    try:
        report = await maintain_indexes(db, min_bytes=0)
    finally:
        stop.set()
        await task
        await writer.close()
    [rebuilt] = report.rebuilt
    assert rebuilt["index"] == "sparse_pkey" and rebuilt["bytes_before"] == before.bytes
    assert rebuilt["bytes_after"] * 3 <= before.bytes, rebuilt
    assert written, "no write went in while the index was rebuilt"
    assert await db.fetchval("SELECT indisvalid FROM pg_index WHERE indexrelid = 'sparse_pkey'::regclass")
    await db.execute("SET enable_seqscan = off")  # every row is found through the rebuilt index
    assert await db.fetchval("SELECT count(*) FROM sparse WHERE id >= 0") == live + len(written)
    assert await db.fetchval("SELECT count(*) FROM sparse WHERE id = ANY($1::bigint[])", written) == len(written)

    await db.execute("VACUUM ANALYZE sparse")
    again = await maintain_indexes(db, min_bytes=0)
    assert again.rebuilt == [] and again.dropped == []


async def test_what_an_interrupted_rebuild_left_is_dropped(db):
    await db.execute("CREATE TABLE twice (id int NOT NULL)")
    await db.execute("INSERT INTO twice VALUES (1), (1)")
    with pytest.raises(asyncpg.UniqueViolationError):  # a concurrent build that fails stays, invalid
        await db.execute("CREATE UNIQUE INDEX CONCURRENTLY twice_pkey_ccnew ON twice (id)")
    dry = await maintain_indexes(db, dry_run=True)
    assert [entry["index"] for entry in dry.dropped] == ["twice_pkey_ccnew"]
    assert await db.fetchval("SELECT to_regclass('twice_pkey_ccnew') IS NOT NULL")
    report = await maintain_indexes(db)
    assert [entry["index"] for entry in report.dropped] == ["twice_pkey_ccnew"]
    assert await db.fetchval("SELECT to_regclass('twice_pkey_ccnew') IS NULL")


async def test_a_role_that_does_not_own_the_table_is_refused_and_nothing_changes(db, db_url):
    await make_sparse(db, rounds=12)
    role = f"agentrt_t_maint_{uuid.uuid4().hex[:8]}"
    await db.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        await db.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"')
        before = by_name(await index_sizes(db), "sparse_pkey").bytes
        host = db_url.split("@", 1)[1]
        stranger = await asyncpg.connect(f"postgresql://{role}@{host}")
        try:
            with pytest.raises(PermissionDenied, match="owner"):
                await maintain_indexes(stranger, min_bytes=0)
        finally:
            await stranger.close()
        assert by_name(await index_sizes(db), "sparse_pkey").bytes == before
    finally:
        await db.execute(f'REVOKE ALL ON ALL TABLES IN SCHEMA public FROM "{role}"')
        await db.execute(f'DROP ROLE "{role}"')


async def test_bad_thresholds_are_refused(db):
    with pytest.raises(InvalidArgument, match="bloat"):
        await maintain_indexes(db, bloat=1.0)
    with pytest.raises(InvalidArgument, match="min_bytes"):
        await maintain_indexes(db, min_bytes=-1)


async def test_the_cli_reports_rebuilds_and_refuses_bad_input_in_one_line(db, db_url):
    await make_sparse(db, rounds=12)
    env = without_settings()
    code, out, err = await run_agentrt("maintain", "indexes", "--dry-run", "--min-size-mib", "0",
                                       "--database-url", db_url, env=env)
    assert code == 0, err
    report = json.loads(out)
    assert report["dry_run"] is True and [e["index"] for e in report["rebuilt"]] == ["sparse_pkey"]
    assert any(i["index"] == "agent_runs_pkey" for i in report["indexes"])

    code, out, err = await run_agentrt("maintain", "indexes", "--min-size-mib", "0", "--database-url", db_url,
                                       env=env)
    assert code == 0, err
    [rebuilt] = json.loads(out)["rebuilt"]
    assert rebuilt["bytes_after"] < rebuilt["bytes_before"]

    for words, field in ((("--bloat", "0.5"), "--bloat"), (("--min-size-mib", "-2"), "--min-size-mib"),
                         (("--bloat", "many"), "--bloat")):
        code, out, err = await run_agentrt("maintain", "indexes", *words, "--database-url", db_url, env=env)
        assert code != 0 and out == "" and len(err.strip().splitlines()) == 1 and field in err, (words, err)
