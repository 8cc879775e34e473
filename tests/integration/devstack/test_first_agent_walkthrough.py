"""docs/first-agent.md, run as written against a real `agentrt dev` stack.

The page's Python file is written to a fresh directory, and its `agentrt`
commands run there in order, through the installed `agentrt` script: `agentrt
dev --agents hello_agents --runs 0` in the background (plus `--listen` on a free
port, the one change: other stacks may hold 50051), then the submit, get,
resume, events tail and the user's own executor, with no address, key, tenant or
bootstrap flag: they come from .agentrt/client.json. The chart values it shows
render with the chart into an executor serving the module.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tests_paths import REPO

from devstack.embedded_pg import free_port

pytestmark = [pytest.mark.integration, pytest.mark.kafka]
DOC = REPO / "docs" / "first-agent.md"
AGENTRT = str(Path(sys.executable).parent / "agentrt")


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def commands() -> list[list[str]]:
    return [shlex.split(line, comments=True) for block in blocks("sh") for line in block.splitlines()
            if line.startswith("agentrt ")]


def user_env() -> dict[str, str]:
    # A shell with no AGENTRT_* of its own: everything comes from .agentrt/client.json.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
    env["PYTHONPATH"] = str(REPO)  # the clone (its .venv installs agentrt too; this keeps the tree's code)
    return env


def wait_for_text(path: Path, needle: str, within_s: float, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if needle in text:
            return text
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before {needle!r}:\n{text[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} not within {within_s}s:\n{path.read_text(errors='replace')[-3000:]}")


def test_the_first_agent_walkthrough_runs_as_written(tmp_path: Path) -> None:
    (python_file,) = [b for b in blocks("python") if b.startswith("# hello_agents.py")]
    (tmp_path / "hello_agents.py").write_text(python_file)
    cmds = commands()
    assert [c[:3] for c in cmds] == [
        ["agentrt", "dev", "--agents"], ["agentrt", "runs", "submit"], ["agentrt", "runs", "get"],
        ["agentrt", "runs", "resume"], ["agentrt", "runs", "get"], ["agentrt", "events", "tail"],
        ["agentrt", "executor", "--agents"]]
    env = user_env()

    def run(argv: list[str], run_id: str = "") -> subprocess.CompletedProcess[str]:
        argv = [AGENTRT if w == "agentrt" else run_id if w == "RUN_ID" else w for w in argv]
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)

    dev_log = tmp_path / "dev.log"
    with open(dev_log, "wb") as out:
        dev = subprocess.Popen([AGENTRT if w == "agentrt" else w for w in cmds[0]]
                               + ["--listen", f"127.0.0.1:{free_port()}"],
                               cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_text(dev_log, "client settings in", 150, dev)
        client_file = tmp_path / ".agentrt" / "client.json"
        assert stat.S_IMODE(client_file.stat().st_mode) == 0o600
        client = json.loads(client_file.read_text())
        assert client["api_key"] and client["work_token"] and client["tenant"] == "demo"

        submitted = run(cmds[1])
        assert submitted.returncode == 0, submitted.stderr
        run_id = re.search(r"submitted: (\S+)", submitted.stdout).group(1)  # type: ignore[union-attr]

        deadline = time.monotonic() + 60
        while "PAUSED_HUMAN" not in (got := run(cmds[2], run_id)).stdout:
            assert got.returncode == 0, got.stderr
            assert time.monotonic() < deadline, got.stdout
            time.sleep(0.5)
        # The dev view's "needs you" list (and .agentrt/approvals.txt) has the command, as printed.
        approvals = tmp_path / ".agentrt" / "approvals.txt"
        wait_for_text(approvals, f"agentrt runs resume {run_id} --approve   # greeter", 30, dev)
        waiting = [line for line in got.stdout.splitlines() if line.startswith("waiting_for")]
        assert waiting and "approval: " in waiting[0] and "voucher.issue" in waiting[0], got.stdout

        resumed = run(cmds[3], run_id)
        assert resumed.returncode == 0, resumed.stderr
        deadline = time.monotonic() + 60
        while "COMPLETED" not in (got := run(cmds[4], run_id)).stdout:
            assert time.monotonic() < deadline, got.stdout
            time.sleep(0.5)
        assert "Hello, Ada!" in got.stdout and '"voucher": "V-' in got.stdout

        tail = run(cmds[5])
        assert tail.returncode == 0, tail.stderr
        assert run_id in tail.stdout

        refused = run(shlex.split("""agentrt runs submit greeter --input '{"name": ""}'"""))
        assert """agentrt runs submit greeter --input '{"name": ""}'""" in DOC.read_text()
        assert refused.returncode == 1 and "input_json: $.name: '' should be non-empty" in refused.stderr, \
            refused.stderr
        assert "input_json: $.name: '' should be non-empty" in DOC.read_text()

        executor_log = tmp_path / "executor.log"
        with open(executor_log, "wb") as out:
            executor = subprocess.Popen([AGENTRT if w == "agentrt" else w for w in cmds[6]], cwd=tmp_path,
                                        env={**env, "AGENTRT_HEALTH_ADDR": f"127.0.0.1:{free_port()}"},
                                        stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for_text(executor_log, "serving greeter", 60, executor)
            # It registered with the session's token: no refusal, and it keeps running.
            assert "EXECUTOR_TOKEN_REQUIRED" not in executor_log.read_text()
        finally:
            executor.send_signal(signal.SIGTERM)
            assert executor.wait(timeout=30) == 0
    finally:
        dev.send_signal(signal.SIGINT)
        try:
            dev.wait(timeout=90)
        finally:
            if dev.poll() is None:
                dev.kill()
    assert dev.returncode == 0, dev_log.read_text()[-3000:]
    stopped = json.loads((tmp_path / ".agentrt" / "client.json").read_text())
    assert stopped["stopped"] is True and "api_key" not in stopped and "work_token" not in stopped


def test_the_walkthrough_chart_values_render_an_executor_serving_the_module() -> None:
    helm = pytest.importorskip("helm_python")
    (values_text,) = blocks("yaml")
    values = yaml.safe_load(values_text)
    (dockerfile,) = blocks("dockerfile")
    assert "COPY hello_agents.py" in dockerfile and dockerfile.startswith("FROM agentrt/agentrt")
    with helm.Chart.load(REPO / "helm" / "agentrt") as chart:
        manifests = chart.render(values, name="hello", namespace="agents", is_install=True)
    docs = [d for path, text in manifests.items() if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config")]
    assert yaml.safe_load(config["data"]["config.yaml"])["executor"]["agents_path"] == "hello_agents"
    (executor,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-executor")]
    assert executor["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/hello-agents:1"
