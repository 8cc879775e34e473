"""`.agentrt/client.json`: what a local client needs to reach the `agentrt dev` stack.

`agentrt dev` writes it (mode 0600: it holds the session's admin key and the
executor token) once the stack is up and marks it stopped at the end. Every
`agentrt` command run in the directory that holds `.agentrt/` reads it, for
each setting only when nothing more explicit gave one:

    command-line flag  >  AGENTRT_* environment variable (or config file)  >  .agentrt/client.json  >  built-in default

Its credentials go only to its own scheduler: a command pointed at another
address (by flag or environment) takes nothing from the file. A file that is
not this user's, or that others may read or write, is ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

FILE_NAME = "client.json"
DEFAULT_DIR = ".agentrt"
# Where the approval commands of the session's runs are written (beside client.json).
APPROVALS_FILE = "approvals.txt"


def path(data_dir: Path | None = None) -> Path:
    return (data_dir if data_dir is not None else Path.cwd() / DEFAULT_DIR) / FILE_NAME


def write(data_dir: Path, values: dict[str, Any]) -> Path:
    """Written through a 0600 file descriptor, so the secrets are never readable by others, even briefly."""
    target = path(data_dir)
    temporary = target.with_suffix(".tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(values, handle, indent=2)
        handle.write("\n")
    os.replace(temporary, target)
    return target


def load() -> dict[str, Any]:
    """The running session's settings from ./.agentrt/client.json; {} when there is none, it is
    unreadable, or its session has stopped (a stopped session's key is revoked anyway)."""
    target = path()
    try:
        info = target.stat()
        # Only a file `agentrt dev` could have written for this user: it decides where commands
        # (and their credentials) go, so one another user could write or read is ignored.
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            return {}
        values = json.loads(target.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(values, dict) or values.get("stopped"):
        return {}
    return values


def leftover_key_id(data_dir: Path) -> str | None:
    """The key id of a session in `data_dir` that was killed before it could revoke its key."""
    try:
        values = json.loads(path(data_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(values, dict) or values.get("stopped"):
        return None
    return values.get("api_key_id") or None


def for_scheduler(addr: str | None) -> dict[str, Any]:
    """The file's settings when `addr` (the explicitly chosen scheduler, or None) is its scheduler."""
    values = load()
    if not values or (addr and addr != values.get("scheduler_addr")):
        return {}
    return values
