"""The one version agentrt reports: the installed distribution's metadata (pyproject.toml's `version`).

`agentrt --version`, every service's `--version`, GetStats's server_version and the OpenTelemetry
`service.version` resource attribute all read it here, so they cannot disagree.
"""

from __future__ import annotations

from functools import cache
from importlib import metadata

DISTRIBUTION = "agentrt"
UNKNOWN = "0+unknown"  # run from a source tree that was never installed (`pip install -e .` fixes it)


@cache
def agentrt_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN
