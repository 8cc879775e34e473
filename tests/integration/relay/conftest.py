"""Kafka fixtures for the relay tests: one Tansu broker per session, or AGENTRT_TEST_KAFKA_BOOTSTRAP.

Tests that stop, kill or freeze a broker get their own (`private_broker`) so
they never disturb the shared one; with an external broker they are skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from devstack.kafka_testing import TEST_BOOTSTRAP_ENV, TansuBroker, kafka_for_tests


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log_path = tmp_path_factory.mktemp("tansu") / "tansu.log"
    with kafka_for_tests(log_path=log_path) as (bootstrap, _broker):
        yield bootstrap


@pytest.fixture
def private_broker(tmp_path) -> Iterator[TansuBroker]:
    if os.environ.get(TEST_BOOTSTRAP_ENV):
        pytest.skip("needs a broker the test can stop and restart (unset AGENTRT_TEST_KAFKA_BOOTSTRAP)")
    broker = TansuBroker(log_path=tmp_path / "tansu.log").start()
    try:
        yield broker
    finally:
        if broker.running:
            try:
                broker.resume()
            except (AssertionError, ProcessLookupError):
                pass
        broker.stop()
