"""Refresh the hash-pinned locks from pyproject.toml (`make lock`; requirements/README.md).

Each lock is pip-compile's output with --generate-hashes for Python 3.11 on Linux x86_64, headed by
a digest of the dependency lists it was compiled from: tests/unit/test_lock.py recomputes that
digest, so editing pyproject.toml without `make lock` fails CI.

pip-compile runs with pip's configuration switched off so that a machine's local wheel cache or
extra index can neither change what is picked nor slip its own hashes into the lock: the locks name
files on PyPI only.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
DIGEST_PREFIX = "# pyproject-dependencies-sha256: "

# lock file -> the extras it carries on top of the base dependencies
LOCKS: dict[str, tuple[str, ...]] = {
    "base.txt": (),  # what ships: the container image and `pip install agentrt`
    "dev-test.txt": ("dev", "test"),  # what `make venv` and CI install: `agentrt dev` and the test tools
}


def dependency_digest(pyproject_text: str, extras: tuple[str, ...]) -> str:
    """sha256 of the dependency lists a lock is compiled from (base, then each extra in order)."""
    project = tomllib.loads(pyproject_text)["project"]
    lists = {"dependencies": project.get("dependencies", []),
             "requires-python": project.get("requires-python", "")}
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        lists[f"extra:{extra}"] = optional[extra]
    return hashlib.sha256(json.dumps(lists, sort_keys=True).encode()).hexdigest()


def compile_lock(name: str, extras: tuple[str, ...]) -> None:
    out = ROOT / "requirements" / name
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    command = [sys.executable, "-m", "piptools", "compile", "--quiet", "--generate-hashes", "--strip-extras",
               "--no-emit-index-url", "--no-emit-find-links", "--resolver=backtracking",
               # setuptools too (grpcio-tools needs it): --require-hashes refuses anything unpinned.
               "--allow-unsafe",
               "--index-url", "https://pypi.org/simple", "--output-file", str(out.relative_to(ROOT))]
    if name != "base.txt":
        # Shared packages get the very versions the image ships.
        command += ["--constraint", "requirements/base.txt"]
    for extra in extras:
        command += ["--extra", extra]
    command.append(str(PYPROJECT.relative_to(ROOT)))
    if out.exists():
        out.unlink()  # a full refresh: newest versions within pyproject's ranges
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    digest = dependency_digest(PYPROJECT.read_text(), extras)
    body = out.read_text()
    out.write_text(f"{DIGEST_PREFIX}{digest}\n# extras: {','.join(extras) or '(none)'}; refresh with `make lock`\n"
                   + body)


def main() -> int:
    wanted = sys.argv[1:] or list(LOCKS)  # `python requirements/lock.py dev-test.txt` refreshes one lock
    for name, extras in LOCKS.items():
        if name not in wanted:
            continue
        print(f"locking requirements/{name} (extras: {', '.join(extras) or 'none'})", flush=True)
        compile_lock(name, extras)
    return 0


if __name__ == "__main__":
    sys.exit(main())
