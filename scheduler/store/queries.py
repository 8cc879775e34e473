"""Loads scheduler/sql/queries.sql once at import: named blocks `-- name: X` with `:name`
parameters and `{fragment}` inclusions, rewritten to positional SQL by shared/db.py.

`Q.x` is the `Query` to run by keyword (`shared.db.fetchrow(conn, Q.x, run_id=...)`);
`Q["x"]` is its SQL text, as PostgreSQL takes it (EXPLAIN, PREPARE).
"""

from __future__ import annotations

from pathlib import Path

from shared.db import load_queries

SQL_DIR = Path(__file__).parents[1] / "sql"
Q = load_queries(SQL_DIR / "queries.sql")
