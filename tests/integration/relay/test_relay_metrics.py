"""The relay serves Prometheus metrics on metrics_addr (the Helm chart's ServiceMonitor scrapes them)."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from relay_support import insert_events, make_run, pending_count, relay_settings, running_relay, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


async def test_relay_metrics_count_what_it_published(db_url, db, kafka_bootstrap):
    run_id = await make_run(db)
    await insert_events(db, run_id, 7)
    settings = relay_settings(db_url, kafka_bootstrap, metrics_addr="127.0.0.1:0")
    async with running_relay(settings) as relay:
        await wait_until(lambda: _none_pending(db), 30, "every row published")
        assert relay.metrics_port
        text = await asyncio.to_thread(scrape, relay.metrics_port)
    assert "agentrt_relay_published_total 7.0" in text
    assert "agentrt_relay_broker_healthy 1.0" in text
    assert "agentrt_relay_shards_held" in text


async def _none_pending(db) -> bool:
    return await pending_count(db) == 0
