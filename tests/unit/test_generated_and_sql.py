import re
import subprocess
import sys

from tests_paths import REPO

from scheduler.store.migrate import available_migrations
from scheduler.store.queries import SQL_DIR, Q
from shared.db import parse_named_queries


def test_generated_protobuf_code_is_fresh():
    result = subprocess.run([sys.executable, "proto/generate.py", "--check"], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_named_query_says_why():
    text = (SQL_DIR / "queries.sql").read_text()
    blocks = re.split(r"^-- name: ", text, flags=re.MULTILINE)[1:]
    assert len(blocks) == len(Q)
    for block in blocks:
        name, _, body = block.partition("\n")
        is_trivial_read = body.lstrip().upper().startswith("SELECT") and body.count("\n") <= 2
        assert is_trivial_read or body.lstrip().startswith("--"), f"query {name} has no comment"


def test_duplicate_query_names_are_refused():
    import pytest

    with pytest.raises(ValueError, match="duplicate"):
        parse_named_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


def test_sql_files_have_no_non_breaking_spaces():
    for path in [SQL_DIR / "queries.sql", *sorted((SQL_DIR / "migrations").glob("*.sql"))]:
        assert "\u00a0" not in path.read_text(), path


def test_migrations_are_numbered_without_gaps():
    versions = [m.version for m in available_migrations()]
    assert versions == list(range(1, len(versions) + 1))


# ------------------------------------------------------------------ named parameters (shared/db.py)

def test_named_parameters_become_positional_once_in_order_of_first_use():
    from shared.db import parse_named_queries

    queries = parse_named_queries(
        "-- name: q\n-- a comment: :not_a_param\n"
        "SELECT :b::text, :a, '{}'::jsonb, ':quoted', '-infinity'::timestamptz, :b || 'x:y' FROM t WHERE id = :a;\n")
    assert queries["q"] == "SELECT $1::text, $2, '{}'::jsonb, ':quoted', '-infinity'::timestamptz, $1 || 'x:y' " \
                           "FROM t WHERE id = $2"
    assert queries.q.params == ("b", "a")  # a name used twice is one $n
    assert queries.q.args(a=1, b=2) == [2, 1]


def test_running_a_query_with_a_missing_or_unknown_name_is_refused():
    import pytest

    from shared.db import QueryArgumentError, parse_named_queries

    query = parse_named_queries("-- name: q\nSELECT :a, :b;\n").q
    with pytest.raises(QueryArgumentError, match="missing b"):
        query.args(a=1)
    with pytest.raises(QueryArgumentError, match="unknown c"):
        query.args(a=1, b=2, c=3)
    assert isinstance(QueryArgumentError("x"), TypeError)


def test_positional_queries_are_kept_and_mixing_is_refused():
    import pytest

    from shared.db import parse_named_queries

    queries = parse_named_queries("-- name: p\nSELECT $1, $2::int, 'HH24:MI:SS';\n")
    assert queries["p"] == "SELECT $1, $2::int, 'HH24:MI:SS'" and queries.p.params == ()
    with pytest.raises(ValueError, match="mixes"):
        parse_named_queries("-- name: m\nSELECT $1, :a;\n")


def test_fragments_are_included_before_the_rewrite_and_are_no_queries():
    import pytest

    from shared.db import parse_named_queries

    text = ("-- fragment: inner\n-- why\nr.id = :run_id\n\n"
            "-- fragment: outer\n{inner} AND r.v = :version\n\n"
            "-- name: q\n-- what\nUPDATE t AS r SET v = :version + 1 WHERE {outer} AND '{inner}' <> '';\n")
    queries = parse_named_queries(text)
    assert list(queries) == ["q"]
    assert queries["q"] == "UPDATE t AS r SET v = $1 + 1 WHERE r.id = $2 AND r.v = $1 AND '{inner}' <> ''"
    assert queries.q.params == ("version", "run_id")
    with pytest.raises(ValueError, match="unknown fragment 'nope'"):
        parse_named_queries("-- name: q\nSELECT 1 WHERE {nope};\n")
    with pytest.raises(ValueError, match="duplicate fragment"):
        parse_named_queries("-- fragment: f\n1\n-- fragment: f\n2\n-- name: q\nSELECT {f};\n")


def test_a_fragment_included_for_each_row_of_a_set_reads_its_parameters_from_that_row():
    """`{f@i}`: the same predicate, each `:name` of it (and of the fragments it includes) read from
    the column `i.name`; the statement's own parameters, casts and string literals are left alone."""
    from shared.db import parse_named_queries

    text = ("-- fragment: inner\nr.id = :run_id AND r.k = ':not_a_parameter'\n\n"
            "-- fragment: outer\n{inner} AND r.v = :version::bigint\n\n"
            "-- name: q\n-- what\nUPDATE t AS r SET v = i.version + 1 FROM unnest(:ids::uuid[], :versions::bigint[])"
            " AS i(run_id, version) WHERE {outer@i} AND r.w = :w;\n")
    queries = parse_named_queries(text)
    assert queries["q"] == ("UPDATE t AS r SET v = i.version + 1 FROM unnest($1::uuid[], $2::bigint[]) AS i(run_id, "
                            "version) WHERE r.id = i.run_id AND r.k = ':not_a_parameter' AND r.v = i.version::bigint "
                            "AND r.w = $3")
    assert queries.q.params == ("ids", "versions", "w")


def test_every_fenced_write_uses_the_one_guard():
    text = (SQL_DIR / "queries.sql").read_text()
    blocks = dict(block.partition("\n")[::2] for block in re.split(r"^-- name: ", text, flags=re.MULTILINE)[1:])
    fenced = ("heartbeat", "save_checkpoint", "begin_tool_call", "complete_tool_call", "complete_tool_call_and_end",
              "complete_and_begin_tool_call", "tool_not_executed", "mark_tool_in_doubt", "finish_run",
              "lock_spawning_parent")
    guarded = [name for name, body in blocks.items() if re.search(r"\{fenced_(guard|cas)", body)]
    assert sorted(guarded) == sorted(fenced), "a fenced write is missing from this list, or lost its guard"
    for name in fenced:
        body = blocks[name]
        assert re.search(r"\{fenced_(guard|cas)(@\w+)?\}", body), name
        assert "lease_expires_at > clock_timestamp()" not in body, f"{name} spells the guard out by hand"
    guard = Q["complete_tool_call"]
    for clause in ("r.lease_owner = $", "r.fencing_token = $", "r.version = $", "r.status = ANY($",
                   "r.lease_expires_at > clock_timestamp()", "r.cancel_requested_at IS NULL"):
        assert clause in guard, clause
    for name in ("begin_tool_call", "complete_and_begin_tool_call",
                 "complete_tool_call_and_end"):  # the set forms: judged per element `i`
        for clause in ("r.lease_owner = i.worker_id", "r.fencing_token = i.fencing_token",
                       "r.version = i.expected_version", "r.status = ANY(i.allowed_statuses",
                       "r.lease_expires_at > clock_timestamp()", "r.cancel_requested_at IS NULL"):
            assert clause in Q[name], (name, clause)
    for name in Q:
        assert "{" not in Q[name].replace("'{}'", ""), f"{name}: a fragment was left unincluded"
        assert ":" not in re.sub(r"::\w+|'[^']*'", "", Q[name]), f"{name}: a :name was left unrewritten"
