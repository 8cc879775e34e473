"""Checkpoint schema migrations: each registered step turns one schema version's state into the next's.

load_state migrates a claimed checkpoint through registered steps only, then
validates it; anything else is refused (UnsupportedCheckpoint), never read as
zero values (docs/design.md §checkpoints). Schema 1 kept the history inline;
its migration moves it into the run's journal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from executor import checkpoint
from executor.journal import records_from_schema_1

log = logging.getLogger(__name__)

# from-version -> function turning that version's state into the next version's.
Migration = Callable[[dict[str, Any]], dict[str, Any]]
MIGRATIONS: dict[int, Migration] = {}


def _from_schema_1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 kept the history inline: it becomes the run's first journal entries, written with the
    next checkpoint (the run's journal is empty until then), and the checkpoint keeps only what is current."""
    records = records_from_schema_1(data)
    log.warning("checkpoint migrated from schema 1 to 2 (cursor %s): %d history entries move to the journal",
                data.get("cursor"), len(records))
    return {**data, "journal_len": len(records), "pending_journal": records}


MIGRATIONS[1] = _from_schema_1


def load_state(state_json: dict[str, Any], schema_version: int) -> checkpoint.State:
    """Migrates (only through registered steps) and validates; refuses anything else."""
    version = schema_version
    data = dict(state_json)
    while version != checkpoint.SCHEMA_VERSION:
        migrate = MIGRATIONS.get(version) if version < checkpoint.SCHEMA_VERSION else None
        if migrate is None:
            known = ", ".join(str(v) for v in sorted(MIGRATIONS)) or "none"
            raise checkpoint.UnsupportedCheckpoint(
                f"checkpoint schema version {schema_version} is not supported by this executor "
                f"(it writes version {checkpoint.SCHEMA_VERSION}; registered migrations from: {known})")
        data = migrate(data)
        version += 1
    try:
        return checkpoint.State.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(state)"
        raise checkpoint.UnsupportedCheckpoint(
            f"checkpoint (schema version {schema_version}) does not match schema version "
            f"{checkpoint.SCHEMA_VERSION}: {field}: {first['msg']}") from None
