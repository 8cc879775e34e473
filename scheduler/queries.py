"""Loads scheduler/sql/queries.sql: named blocks `-- name: X`, parsed once at import."""

from __future__ import annotations

import re
from pathlib import Path

SQL_DIR = Path(__file__).parent / "sql"
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse_named_queries(text: str) -> dict[str, str]:
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.strip().splitlines() if not line.lstrip().startswith("--")]
        statement = "\n".join(lines).strip().rstrip(";")
        if name in queries:
            raise ValueError(f"duplicate query name {name!r}")
        queries[name] = statement
    return queries


Q = parse_named_queries((SQL_DIR / "queries.sql").read_text(encoding="utf-8"))
