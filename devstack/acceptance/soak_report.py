"""The long soak's figures: per-minute samples, histogram quantiles and the flatness verdict.

Pure functions (no processes, no database), so the verdict's rules are unit-tested on their own
(tests/unit/test_soak_report.py). The soak that feeds them is devstack/acceptance/soak_ha.py.

Flatness compares two windows of the per-minute samples: the baseline (the second sixth of the
soak: minutes 10-20 of 60) and the end (the last sixth: minutes 50-60). Resources (RSS of the
processes that live through the whole soak, table and index sizes) compare the largest sample of
each window, so growth anywhere in the end window shows. Latencies compare the median of the
per-minute figures in each window, so one minute with a failover in it does not decide. A figure
is flat when end <= 1.2 x baseline, or when the two differ by less than the figure's resolution
(NOISE_FLOOR: a few milliseconds of latency on a shared 2-core machine, 1 MiB of RSS or size).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

FLAT_RATIO = 1.2
MAIN_TABLES = ("agent_runs", "agent_checkpoints", "tool_executions", "run_journal", "outbox")
UNITS = {"RSS scheduler": "MiB", "RSS executor-1": "MiB", "size all tables": "MiB",
         **{f"size {t}": "MiB" for t in MAIN_TABLES},
         **{f"{f} {q}": "ms" for f in ("step", "submit to first step", "claim wait") for q in ("p50", "p99")}}
NOISE_FLOOR = {"ms": 5.0, "MiB": 1.0}

_BUCKET = re.compile(r'^agentrt_claim_wait_seconds_bucket\{([^}]*)\} (\S+)$', re.M)
_LE = re.compile(r'le="([^"]+)"')


def claim_wait_buckets(metrics_text: str) -> dict[float, float]:
    """Cumulative counts of agentrt_claim_wait_seconds by upper bound, summed over tenants."""
    buckets: dict[float, float] = {}
    for labels, value in _BUCKET.findall(metrics_text):
        match = _LE.search(labels)
        if match is None:
            continue
        bound = math.inf if match.group(1) == "+Inf" else float(match.group(1))
        buckets[bound] = buckets.get(bound, 0.0) + float(value)
    return buckets


def bucket_quantile(before: Mapping[float, float], after: Mapping[float, float], q: float) -> float | None:
    """The q-quantile of what a cumulative histogram observed between two scrapes (Prometheus's
    histogram_quantile: linear within the bucket; the last finite bound for the +Inf bucket)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower


def _window(samples: Sequence[Mapping[str, Any]], start: float, end: float) -> list[Mapping[str, Any]]:
    """Sample `minute` k covers minutes (k-1, k]: minutes 10-20 are samples 11..20."""
    return [s for s in samples if start < s["minute"] <= end]


def _values(samples: Iterable[Mapping[str, Any]], figure: str) -> list[float]:
    return [float(s["figures"][figure]) for s in samples if s["figures"].get(figure) is not None]


def flatness(samples: Sequence[Mapping[str, Any]], minutes: float, units: Mapping[str, str]) -> list[dict[str, Any]]:
    """One verdict per figure. `units`: figure -> "MiB" (a resource: the windows' largest samples)
    or "ms" (a latency: the windows' medians)."""
    base = _window(samples, minutes / 6, minutes / 3)
    last = _window(samples, minutes - minutes / 6, minutes)
    verdicts: list[dict[str, Any]] = []
    for figure, unit in sorted(units.items()):
        pick = max if unit == "MiB" else statistics.median
        before, after = _values(base, figure), _values(last, figure)
        if not before or not after:
            verdicts.append({"figure": figure, "unit": unit, "baseline": None, "end": None, "ratio": None,
                             "flat": False, "why": "no samples in a window"})
            continue
        b, e = pick(before), pick(after)
        ratio = e / b if b > 0 else (1.0 if e <= 0 else math.inf)
        flat = ratio <= FLAT_RATIO or e - b < NOISE_FLOOR[unit]
        verdicts.append({"figure": figure, "unit": unit, "baseline": round(b, 3), "end": round(e, 3),
                         "ratio": round(ratio, 3) if math.isfinite(ratio) else None, "flat": flat,
                         "samples": [len(before), len(after)]})
    return verdicts


def table(verdicts: Sequence[Mapping[str, Any]], minutes: float) -> str:
    """The verdicts as a Markdown table (the soak prints it and docs/benchmarks.md keeps one)."""
    a, b = minutes / 6, minutes / 3
    lines = [f"| figure | minutes {a:g}-{b:g} | last {a:g} minutes | ratio | flat |", "|---|---:|---:|---:|---|"]
    for v in verdicts:
        unit = v["unit"]
        lines.append(f"| {v['figure']} | {v['baseline']} {unit} | {v['end']} {unit} | "
                     f"{v['ratio'] if v['ratio'] is not None else '-'} | {'yes' if v['flat'] else 'NO'} |")
    return "\n".join(lines)


__all__ = ["FLAT_RATIO", "MAIN_TABLES", "UNITS", "bucket_quantile", "claim_wait_buckets", "flatness", "table"]
