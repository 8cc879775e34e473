"""GetStats reports the scheduler's release (issue 26), the same version `agentrt --version` prints."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from support import scheduler_stack

from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.version import agentrt_version

pytestmark = pytest.mark.integration


async def test_get_stats_names_the_version_the_cli_prints(db_url):
    proc = await asyncio.create_subprocess_exec(str(Path(sys.executable).parent / "agentrt"), "--version",
                                                stdout=asyncio.subprocess.PIPE)
    printed = (await asyncio.wait_for(proc.communicate(), 60))[0].decode().split()
    async with scheduler_stack(db_url) as stack:
        stats = await stack.runs.GetStats(rs.GetStatsRequest(), metadata=stack.md())
    assert stats.server_version == agentrt_version() == printed[1]
    assert printed[0] == "agentrt"
