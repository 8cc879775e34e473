import asyncio
import urllib.request

import pytest
from support import scheduler_stack, submit

pytestmark = pytest.mark.integration


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


async def test_scheduler_serves_prometheus_metrics(db_url):
    async with scheduler_stack(db_url, metrics_addr="127.0.0.1:0") as stack:
        for _ in range(3):
            await submit(stack)
        port = stack.server.metrics_port
        assert port
        stack.server.metrics.apply(await stack.server.store.global_stats())
        text = await asyncio.to_thread(scrape, port)
    assert 'agentrt_rpc_total{code="OK",method="SubmitRun"} 3.0' in text
    assert 'agentrt_runs{status="QUEUED"} 3.0' in text
    assert "agentrt_outbox_pending 3.0" in text
    assert "agentrt_rpc_seconds_bucket" in text


async def test_scheduler_serves_database_capacity_and_pool_gauges(db_url):
    async with scheduler_stack(db_url, metrics_addr="127.0.0.1:0") as stack:
        port = stack.server.metrics_port
        assert port
        stack.server.metrics.apply(await stack.server.store.global_stats())
        text = await asyncio.to_thread(scrape, port)
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    assert samples["agentrt_db_size_bytes"] > 0
    assert samples["agentrt_db_max_connections"] >= samples["agentrt_db_client_connections"] >= 1
    assert samples["agentrt_db_pool_max_connections"] >= 1
    assert 'agentrt_db_pool_connections{state="idle"}' in samples
