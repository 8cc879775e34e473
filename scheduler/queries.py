"""Loads scheduler/sql/queries.sql: named blocks `-- name: X`, parsed once at import."""

from __future__ import annotations

from pathlib import Path

from shared.db import load_queries

SQL_DIR = Path(__file__).parent / "sql"
Q = load_queries(SQL_DIR / "queries.sql")
