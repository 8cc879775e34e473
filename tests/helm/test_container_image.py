"""The Dockerfile, checked as text (no Docker engine runs here, so it is not built).

Checks: multi-stage; the final stage runs as a numeric non-root user from a
sane WORKDIR with ENTRYPOINT ["agentrt"]; it installs every package the
pyproject ships but the dev stack (devstack/), on a Python the project supports;
.dockerignore lets exactly those in; and the agentrt subcommands named by the
Dockerfile, the chart and the CLI agree. What the image's packages make when
built (no devstack/, a CLI that says `agentrt dev` is not there) is built and run
here from the same list of directories.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import WITHOUT_CHECKOUT

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
TEMPLATES = ROOT / "helm" / "agentrt" / "templates"
SUBCOMMANDS = {"scheduler", "executor", "relay", "migrate", "console", "maintain"}
# In the wheel (`agentrt dev` for a developer's machine) but not in the image.
DEV_ONLY_PACKAGES = {"devstack"}
# What the chart runs with arguments of its own after the subcommand (`maintain indexes --bloat ...`).
WITH_ARGUMENTS = {"maintain": ["maintain", "indexes"]}


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Instructions per stage, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, "dangling line continuation"

    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        args = args.strip()
        if keyword == "FROM":
            parts = args.split()
            parts = [p for p in parts if not p.startswith("--platform")]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=parts[0], name=name))
        elif not stages:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            key, _, value = args.partition("=")
            global_args[key] = value
        else:
            stages[-1].instructions.append((keyword, args))
    return global_args, stages


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], list[Stage]]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def final(dockerfile: tuple[dict[str, str], list[Stage]]) -> Stage:
    return dockerfile[1][-1]


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def group(pattern: str, text: str) -> str:
    """The first group of pattern's first match in text; fails the test when nothing matches."""
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not found in {text[:200]!r}"
    return match.group(1)


def resolve(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value)


def test_multi_stage_build(dockerfile: tuple[dict[str, str], list[Stage]], final: Stage) -> None:
    _, stages = dockerfile
    assert len(stages) >= 2
    names = {s.name for s in stages[:-1]}
    copied_from = {group(r"--from=(\S+)", c) for c in final.all("COPY") if "--from=" in c}
    assert copied_from and copied_from <= names, "the final stage copies from an earlier stage"
    # the final stage installs nothing itself: no pip, no compilers
    assert not [r for r in final.all("RUN") if "pip" in r or "apt-get" in r]


def test_final_stage_runs_as_non_root(final: Stage) -> None:
    user = final.last("USER")
    assert user, "the final stage sets no USER"
    uid, _, gid = user.partition(":")
    assert uid.isdigit(), "a numeric USER lets Kubernetes verify runAsNonRoot"
    assert int(uid) != 0 and uid != "root"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    # The chart runs the pods as the same user.
    values = (ROOT / "helm" / "agentrt" / "values.yaml").read_text()
    assert f"runAsUser: {uid}" in values


def test_final_stage_has_a_sane_workdir(final: Stage) -> None:
    workdir = final.last("WORKDIR")
    assert workdir, "the final stage sets no WORKDIR"
    assert workdir.startswith("/") and workdir not in ("/", "/root", "/tmp")


def test_entrypoint_is_agentrt(final: Stage) -> None:
    entrypoint = final.last("ENTRYPOINT")
    assert entrypoint, "the final stage has no ENTRYPOINT"
    assert json.loads(entrypoint) == ["agentrt"], "exec form, so signals reach agentrt"
    env = " ".join(final.all("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env, "the root filesystem is read-only"
    assert "PATH=" in env


def test_image_installs_every_package_on_a_supported_python(
    dockerfile: tuple[dict[str, str], list[Stage]], pyproject: dict
) -> None:
    global_args, stages = dockerfile
    bases = {resolve(s.base, global_args) for s in stages}
    versions = {m.group(1) for b in bases if (m := re.match(r"python:(\d+\.\d+)", b))}
    assert len(versions) == 1, f"all stages share one Python (the venv is copied): {bases}"
    (version,) = versions
    minimum = group(r"^>=\s*(\d+\.\d+)", pyproject["project"]["requires-python"])
    assert tuple(map(int, version.split("."))) >= tuple(map(int, minimum.split(".")))

    copied = " ".join(c for s in stages for c in s.all("COPY") if "--from=" not in c)
    packages = [p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    for package in packages:
        copies = re.search(rf"(^|\s){package}(\s|/|$)", copied) is not None
        assert copies == (package not in DEV_ONLY_PACKAGES), f"{package}/: copied {copies}"
    assert "pyproject.toml" in copied
    runs = [r for s in stages for r in s.all("RUN")]
    # Dependencies from the hash-pinned lock only, then the project without resolving anything more.
    assert "requirements/base.txt" in copied
    assert any("pip install --require-hashes -r requirements/base.txt" in r for r in runs), runs
    assert any("pip install --no-deps ." in r for r in runs), runs
    assert not any(re.search(r"pip install (?!--)", r) and "--upgrade pip" not in r for r in runs), runs


def test_dockerignore_admits_what_the_build_copies(pyproject: dict) -> None:
    rules = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "**", "start from nothing and admit what the image needs"
    admitted = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert (packages - DEV_ONLY_PACKAGES) | {"pyproject.toml"} <= admitted
    assert not admitted & DEV_ONLY_PACKAGES
    for secretish in (".env", ".git", ".venv"):
        assert secretish not in admitted


def test_console_script_is_agentrt(pyproject: dict) -> None:
    assert pyproject["project"]["scripts"]["agentrt"] == "cli.main:main"


def test_subcommands_agree_between_image_and_chart() -> None:
    # Subcommands the Dockerfile documents (`agentrt scheduler | ... `).
    docker_text = DOCKERFILE.read_text()
    named_by_image = set(re.findall(r"agentrt (scheduler|executor|relay|migrate|console|maintain)\b", docker_text))
    assert named_by_image == SUBCOMMANDS

    # Subcommands the chart's templates pass as container args.
    templates = "\n".join(p.read_text() for p in TEMPLATES.iterdir() if p.is_file())
    in_chart = set(re.findall(r"args:\s*\n\s*-\s*([\w{}$ .]+)", templates))
    literal = {a.strip() for a in in_chart if "{" not in a}
    assert literal == {"migrate", "console", "maintain"}  # the migrations Job, the console, the upkeep CronJob
    # The Deployment template passes its loop variable; the loop runs over these components.
    components = group(r'define "agentrt.components" -}}\s*\n(.*?)\n', templates).split()
    assert set(components) | literal == SUBCOMMANDS
    assert re.search(r"args:\s*\n\s*-\s*\{\{ \$component \}\}", templates)


def test_the_console_script_serves_the_subcommands_the_chart_runs(pyproject: dict) -> None:
    """The entry point the image's ENTRYPOINT runs (`agentrt`, from pyproject's scripts) parses every
    subcommand the chart's containers are started with."""
    module_name, _, _ = pyproject["project"]["scripts"]["agentrt"].partition(":")
    parser = importlib.import_module(module_name).build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    missing = SUBCOMMANDS - set(commands)
    assert not missing, f"the agentrt command has no {sorted(missing)}, which the chart and the image run"
    for sub in SUBCOMMANDS:  # each parses as the chart passes it: settings from env
        assert parser.parse_args(WITH_ARGUMENTS.get(sub, [sub])).command == sub


def test_what_the_image_copies_builds_an_agentrt_without_the_dev_stack(
        dockerfile: tuple[dict[str, str], list[Stage]], tmp_path: Path) -> None:
    """The build stage's `pip install --no-deps .`, over exactly the files its COPY lines bring in:
    the install has no devstack/, serves every subcommand the chart runs, and `agentrt dev` says in
    one line that this install has no dev stack (exit 2) instead of failing on an import."""
    _, stages = dockerfile
    source = tmp_path / "src"
    source.mkdir()
    for copy in (c for s in stages for c in s.all("COPY") if "--from=" not in c):
        *sources, _dest = copy.split()
        for name in sources:
            for path in ROOT.glob(name):
                rel = path.relative_to(ROOT)
                if path.is_dir():
                    shutil.copytree(path, source / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                else:
                    (source / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, source / rel)
    assert not (source / "devstack").exists() and (source / "cli").is_dir()
    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(out), str(source)], check=True, timeout=300,
                   env={**os.environ, "PIP_NO_INDEX": "1"})
    (built,) = out.glob("agentrt-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(built) as archive:
        assert not [n for n in archive.namelist() if n.startswith("devstack/")]
        archive.extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}

    def agentrt(*words: str) -> subprocess.CompletedProcess[str]:
        probe = f"{WITHOUT_CHECKOUT}; import cli.main as c; sys.exit(c.main(sys.argv[1:]))"
        return subprocess.run([sys.executable, "-c", probe, *words], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=120)

    listing = agentrt("--help")
    assert listing.returncode == 0, listing.stderr[-2000:]
    offered = set(re.search(r"\{([\w,-]+)\}", listing.stdout).group(1).split(","))  # type: ignore[union-attr]
    assert SUBCOMMANDS <= offered and not offered & {"mocktool", "acceptance", "chaos"}, offered
    dev = agentrt("dev")
    lines = dev.stderr.strip().splitlines()
    assert dev.returncode == 2 and len(lines) == 1 and "no dev stack" in lines[0], dev.stderr[-2000:]
