"""The HA soak's verdict rules (devstack/acceptance/soak_report.py), on hand-made samples."""

from __future__ import annotations

import math

import pytest

from devstack.acceptance import soak_report

METRICS = """# HELP agentrt_claim_wait_seconds How long a QUEUED run waited
agentrt_claim_wait_seconds_bucket{le="0.01",tenant="a"} 10.0
agentrt_claim_wait_seconds_bucket{le="0.1",tenant="a"} 90.0
agentrt_claim_wait_seconds_bucket{le="+Inf",tenant="a"} 100.0
agentrt_claim_wait_seconds_bucket{le="0.01",tenant="b"} 0.0
agentrt_claim_wait_seconds_bucket{le="0.1",tenant="b"} 0.0
agentrt_claim_wait_seconds_bucket{le="+Inf",tenant="b"} 100.0
agentrt_claim_wait_seconds_count{tenant="a"} 100.0
agentrt_rpc_seconds_bucket{le="0.01",method="X"} 5.0
"""


def test_claim_wait_buckets_sum_tenants_and_ignore_other_histograms() -> None:
    assert soak_report.claim_wait_buckets(METRICS) == {0.01: 10.0, 0.1: 90.0, math.inf: 200.0}


def test_bucket_quantile_interpolates_within_the_bucket_of_the_interval() -> None:
    before = {0.01: 0.0, 0.1: 0.0, math.inf: 0.0}
    after = {0.01: 50.0, 0.1: 100.0, math.inf: 100.0}
    assert soak_report.bucket_quantile(before, after, 0.5) == pytest.approx(0.01)
    assert soak_report.bucket_quantile(before, after, 0.75) == pytest.approx(0.055)
    # Only what was observed between the scrapes counts: the first 50 were before.
    assert soak_report.bucket_quantile({0.01: 50.0, 0.1: 50.0, math.inf: 50.0}, after, 0.5) == pytest.approx(0.055)
    # Past the last finite bound: that bound (as Prometheus answers).
    assert soak_report.bucket_quantile(before, {0.01: 0.0, 0.1: 0.0, math.inf: 4.0}, 0.99) == 0.1
    assert soak_report.bucket_quantile(after, after, 0.5) is None


def _samples(values: dict[str, list[float | None]]) -> list[dict[str, object]]:
    minutes = len(next(iter(values.values())))
    return [{"minute": m + 1, "figures": {k: v[m] for k, v in values.items()}} for m in range(minutes)]


def test_flatness_compares_the_second_sixth_with_the_last() -> None:
    growing = [10.0 + m for m in range(60)]  # RSS growing a MiB a minute: 30 vs 69 -> not flat
    steady = [50.0] * 60
    latency = [20.0] * 60
    latency[14] = 5000.0  # one failover minute in the baseline: the median ignores it
    latency[55] = 5000.0  # and one at the end
    verdicts = {v["figure"]: v for v in soak_report.flatness(
        _samples({"grow": growing, "steady": steady, "lat": latency}), 60,
        {"grow": "MiB", "steady": "MiB", "lat": "ms"})}
    assert verdicts["grow"]["baseline"] == 29.0 and verdicts["grow"]["end"] == 69.0  # samples 11-20 and 51-60
    assert not verdicts["grow"]["flat"] and verdicts["grow"]["samples"] == [10, 10]
    assert verdicts["steady"]["flat"] and verdicts["steady"]["ratio"] == 1.0
    assert verdicts["lat"]["flat"] and verdicts["lat"]["baseline"] == verdicts["lat"]["end"] == 20.0


def test_flatness_tolerates_differences_below_the_resolution_only() -> None:
    base, small, large = [2.0] * 60, [2.0] * 50 + [4.0] * 10, [2.0] * 50 + [9.0] * 10
    verdicts = {v["figure"]: v for v in soak_report.flatness(
        _samples({"small": small, "large": large, "base": base}), 60, {"small": "ms", "large": "ms", "base": "ms"})}
    assert verdicts["small"]["ratio"] == 2.0 and verdicts["small"]["flat"]  # 2 ms more: under the 5 ms floor
    assert not verdicts["large"]["flat"]  # 7 ms more and 4.5x


def test_a_figure_without_samples_in_a_window_is_not_called_flat() -> None:
    values: list[float | None] = [1.0] * 60
    for m in range(50, 60):
        values[m] = None
    verdict = soak_report.flatness(_samples({"x": values}), 60, {"x": "MiB"})[0]
    assert verdict["flat"] is False and verdict["why"] == "no samples in a window"
    assert "| x | None MiB | None MiB | - | NO |" in soak_report.table([verdict], 60)
