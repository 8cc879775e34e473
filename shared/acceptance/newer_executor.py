"""A "newer executor image" for experiment 5: checkpoint schema version 2, with an explicit migration from 1.

    python -m shared.acceptance.newer_executor      (the same settings as `agentrt executor`)

The migration is the kind a real schema bump registers in
executor.checkpoint.MIGRATIONS: a function from the old state to the new one.
Here it leaves a visible trace in the state's `exceptions` list (who migrated,
from which version), so the evidence can show the checkpoint went through it
rather than being parsed as if it were new. Everything else is the executor as
built; SCHEMA_VERSION is set before the driver imports it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import executor.checkpoint as checkpoint

NEW_SCHEMA_VERSION = 2
log = logging.getLogger("acceptance.newer_executor")


def migrate_1_to_2(state: dict[str, Any]) -> dict[str, Any]:
    migrated = dict(state)
    migrated["exceptions"] = [*state.get("exceptions", []),
                              {"kind": "schema_migration", "from_schema": 1, "to_schema": NEW_SCHEMA_VERSION,
                               "by": "acceptance.newer_executor"}]
    log.warning("checkpoint migrated from schema 1 to %d (cursor %s)", NEW_SCHEMA_VERSION, state.get("cursor"))
    return migrated


def main() -> int:
    checkpoint.SCHEMA_VERSION = NEW_SCHEMA_VERSION
    checkpoint.MIGRATIONS[1] = migrate_1_to_2
    from shared.cli import main as cli_main  # imports the driver, which reads SCHEMA_VERSION now

    return cli_main(["executor"])


if __name__ == "__main__":
    sys.exit(main())
