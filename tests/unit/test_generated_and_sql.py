import re
import subprocess
import sys

from tests_paths import REPO

from scheduler.migrate import available_migrations
from scheduler.queries import SQL_DIR, Q
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
