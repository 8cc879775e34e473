"""shared/db.py: the one database module the services share."""

import pytest

from scheduler.store.migrate import available_migrations
from shared.db import SCHEMA_VERSION, load_queries, parse_named_queries


def test_the_shared_schema_version_is_the_newest_migration():
    assert SCHEMA_VERSION == len(available_migrations()) == available_migrations()[-1].version


def test_named_queries_drop_comment_lines_and_the_semicolon(tmp_path):
    path = tmp_path / "q.sql"
    path.write_text("-- name: one\n-- what it does\nSELECT 1;\n\n-- name: two\nSELECT 2;\n-- trailing\n")
    assert load_queries(path) == {"one": "SELECT 1", "two": "SELECT 2"}


def test_a_query_name_given_twice_is_refused():
    with pytest.raises(ValueError, match="duplicate query name 'a'"):
        parse_named_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")
