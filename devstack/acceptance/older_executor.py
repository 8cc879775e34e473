"""An "older executor image" for experiment 5: checkpoint schema 1, as agentrt wrote it before schema 2.

    python -m devstack.acceptance.older_executor      (the same settings as `agentrt executor`)

Schema 1 kept the whole history, every tool answer, the operator inputs and
the exceptions inside each checkpoint, and wrote no journal. This image is the
executor as built with exactly that storage: SCHEMA_VERSION 1, checkpoints
that carry the history inline, and no journal entries sent. It reads its own
schema-1 checkpoints as they are and refuses newer ones, like the old image did.
"""

from __future__ import annotations

import sys
from typing import Any

import executor.checkpoint as checkpoint
import executor.migrations as migrations

OLD_SCHEMA_VERSION = 1


def _schema_1_dict(self: checkpoint.State) -> dict[str, Any]:
    return self.model_dump(mode="json", exclude_none=True, exclude={"journal_len", "pending_journal", "agent_state"})


def main() -> int:
    checkpoint.SCHEMA_VERSION = OLD_SCHEMA_VERSION
    migrations.MIGRATIONS.clear()
    checkpoint.State.to_json_dict = _schema_1_dict  # type: ignore[method-assign]
    import executor.runlease as runlease  # reads SCHEMA_VERSION now
    import executor.toolcalls as toolcalls

    toolcalls.SCHEMA_VERSION = runlease.SCHEMA_VERSION = OLD_SCHEMA_VERSION
    runlease.RunLease.unwritten = lambda self, state: []  # type: ignore[method-assign,assignment,misc]
    # As `agentrt executor` does, without importing the CLI (which imports this suite).
    from executor.config import ExecutorSettings
    from executor.main import serve
    from shared.event_loop import run as run_loop
    from shared.logs import setup_logging

    settings = ExecutorSettings()
    setup_logging(settings.log_level, settings.log_format, settings.service_name)
    run_loop(serve(settings), settings.event_loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
