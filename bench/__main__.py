"""Runs every bench/bench_*.py as its own process (python -m bench [name ...]).

Each benchmark prints, last, one JSON line per figure:
{"bench": ..., "figure": ..., "value": ..., "unit": ..., "baseline": ..., "ratio": ...}
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    wanted = set(argv)
    scripts = sorted(p for p in HERE.glob("bench_*.py") if not wanted or p.stem.removeprefix("bench_") in wanted)
    failed = []
    for script in scripts:
        print(f"== {script.stem}", flush=True)
        result = subprocess.run([sys.executable, "-m", f"bench.{script.stem}"], cwd=HERE.parent)
        if result.returncode != 0:
            failed.append(script.stem)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
