"""Release hygiene (issue 26): one version everywhere, a changelog, the operator install documented.

The version is the installed distribution's metadata (pyproject.toml's `version`); `agentrt
--version`, every command's `--version`, the OpenTelemetry `service.version` resource attribute
and (tests/integration/scheduler/test_release_version.py) GetStats's server_version all report it.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from cli import main as cli
from scheduler.config import SchedulerSettings
from shared.tracing import service_resource
from shared.version import agentrt_version

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
AGENTRT = Path(sys.executable).parent / "agentrt"


def test_the_version_is_the_package_metadata() -> None:
    assert agentrt_version() == metadata.version("agentrt") == VERSION


@pytest.mark.parametrize("argv", [["--version"], ["scheduler", "--version"], ["executor", "--version"],
                                  ["relay", "--version"], ["migrate", "--version"]])
def test_the_console_script_and_each_service_print_it(argv: list[str]) -> None:
    result = subprocess.run([str(AGENTRT), *argv], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"agentrt {VERSION}\n", "")


def test_every_command_answers_version(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {"scheduler", "executor", "relay", "migrate", "reconcile", "dev", "runs", "events"} <= set(sub.choices)
    for command in sub.choices:
        with pytest.raises(SystemExit) as exited:
            cli.main([command, "--version"])
        assert exited.value.code == 0
        assert capsys.readouterr().out == f"agentrt {VERSION}\n", command


def test_the_opentelemetry_resource_names_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert service_resource(SchedulerSettings().tracing()).attributes["service.version"] == VERSION
    # A deployment that sets its own (e.g. an image tag) keeps it.
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.version=2026.12-eu")
    assert service_resource(SchedulerSettings().tracing()).attributes["service.version"] == "2026.12-eu"


def test_changelog_keeps_an_unreleased_section_and_the_current_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog")
    assert "keepachangelog.com" in text
    headings = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert headings[0] == "Unreleased"
    assert VERSION in headings, f"CHANGELOG.md has no section for {VERSION}"
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    sections = re.findall(r"^### (\w+)", unreleased, re.M)
    assert sections and set(sections) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    assert len(re.findall(r"^- ", unreleased, re.M)) >= 5


def test_install_page_documents_the_operator_install_of_the_cli() -> None:
    page = (ROOT / "docs" / "install.md").read_text()
    assert "pipx install dist/agentrt-" in page
    assert "agentrt --version" in page
    assert "make lock" in page and "requirements/" in page


def test_helm_tutorial_names_the_kafka_topic_prerequisite() -> None:
    chart_readme = (ROOT / "helm" / "agentrt" / "README.md").read_text()
    helm = (ROOT / "docs" / "helm.md").read_text()
    # The chart README's prerequisite: the events topic (the chart's default kafka.topic) exists first.
    topic = re.search(r"^  topic: (\S+)$", (ROOT / "helm" / "agentrt" / "values.yaml").read_text(), re.M)
    assert topic, "values.yaml has no kafka.topic"
    assert f"`{topic.group(1)}`" in chart_readme and "create topics automatically" in chart_readme
    assert f"`{topic.group(1)}`" in helm and "create topics automatically" in helm
    assert "kafka-topics.sh --create" in helm
