"""Evidence records (docs/design.md §acceptance-and-evidence): one JSON file per repetition, and the summary.

Without such a record a recovery claim is only "design intent" (docs/design.md §acceptance-and-evidence).
Field names follow the template; the Kubernetes fields are recorded as not
applicable, since the suite runs processes on one host.
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib.metadata
import json
import platform
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devstack.acceptance.procs import REPO_ROOT

MAX_ROWS = 200  # per query or log excerpt in a record; the full logs stay in the artifacts directory


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, float | int | str | bool) or value is None:
        return value
    if hasattr(value, "items"):  # asyncpg.Record
        return {str(k): jsonable(v) for k, v in value.items()}
    return str(value)


@functools.cache
def git_commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD") or "unknown", "dirty_files": len(status.splitlines())}


@functools.cache
def component_versions(postgres_bin: str, broker_binary: str) -> dict[str, str]:
    def first_line(*argv: str) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            return f"unknown ({exc})"
        return out.strip().splitlines()[0] if out.strip() else "unknown"

    def dist(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return {
        "python": sys.version.split()[0],
        "postgres": first_line(f"{postgres_bin}/postgres", "--version"),
        "broker": first_line(broker_binary, "--version"),
        "agentrt": dist("agentrt"), "grpcio": dist("grpcio"), "asyncpg": dist("asyncpg"),
        "aiokafka": dist("aiokafka"), "aiohttp": dist("aiohttp"),
        "kernel": platform.release(), "machine": platform.machine(),
    }


@dataclass
class Check:
    name: str
    ok: bool
    detail: Any = None


@dataclass
class Evidence:
    experiment_id: str
    title: str
    repetition: int
    expected_invariant: str
    fault_injection_point: str
    git_commit: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    kubernetes_version: str = "not applicable: OS processes on one host, no Kubernetes"
    worker_image_digest: str = "not applicable: the working tree at git_commit"
    run_ids: list[str] = field(default_factory=list)
    tenant_id: str = ""
    lease_duration_ms: int = 0
    heartbeat_interval_ms: int = 0
    method: dict[str, Any] = field(default_factory=dict)  # how the fault was made (e.g. netns or SIGSTOP)
    commands_executed: list[str] = field(default_factory=list)
    log_paths: dict[str, str] = field(default_factory=dict)
    processes: list[dict[str, Any]] = field(default_factory=list)
    postgres_queries_and_results: list[dict[str, Any]] = field(default_factory=list)
    mock_tool_request_log: list[dict[str, Any]] = field(default_factory=list)
    broker_messages: dict[str, Any] = field(default_factory=dict)
    observed_result: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    pass_or_fail: str = "FAIL"
    error: str | None = None
    started_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat())
    duration_s: float = 0.0
    _t0: float = field(default_factory=time.monotonic, repr=False)

    def check(self, name: str, ok: Any, detail: Any = None) -> bool:
        self.checks.append(Check(name, bool(ok), jsonable(detail)))
        return bool(ok)

    def query(self, sql: str, params: tuple[Any, ...], rows: list[Any], note: str = "") -> None:
        self.postgres_queries_and_results.append({
            "note": note, "query": " ".join(sql.split()), "params": jsonable(list(params)),
            "row_count": len(rows), "rows": jsonable(rows[:MAX_ROWS])})

    def observe(self, **facts: Any) -> None:
        self.observed_result.update(jsonable(facts))

    def finish(self) -> Evidence:
        self.duration_s = round(time.monotonic() - self._t0, 2)
        self.pass_or_fail = "PASS" if self.error is None and self.checks and all(c.ok for c in self.checks) \
            else "FAIL"
        return self

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("_t0", None)
        return jsonable(data)  # type: ignore[no-any-return]

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "evidence.json"
        path.write_text(json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n")
        return path


def summary_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_exp: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_exp.setdefault(record["experiment_id"], []).append(record)
    rows = []
    for exp_id in sorted(by_exp, key=lambda e: (len(e), e)):
        items = by_exp[exp_id]
        passed = sum(1 for r in items if r["pass_or_fail"] == "PASS")
        durations = [r["duration_s"] for r in items]
        rows.append({"experiment": exp_id, "title": items[0]["title"], "repetitions": len(items),
                     "passed": passed, "failed": len(items) - passed,
                     "mean_s": round(sum(durations) / len(durations), 1), "max_s": max(durations),
                     "injection": items[0]["fault_injection_point"],
                     "method": ", ".join(sorted({str(r.get("method", {}).get("kind", "")) for r in items} - {""}))})
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    headers = ["exp", "title", "reps", "pass", "fail", "mean s", "max s", "fault made by"]
    body = [[r["experiment"], r["title"], str(r["repetitions"]), str(r["passed"]), str(r["failed"]),
             f"{r['mean_s']:.1f}", f"{r['max_s']:.1f}", (r["method"] or r["injection"])[:80]] for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in body)) if body else len(h) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*line) for line in body]
    return "\n".join(lines)
