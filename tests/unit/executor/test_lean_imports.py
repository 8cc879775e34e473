"""An executor pays in memory for every module it imports, per process: the model providers' SDKs
alone are thousands of modules (about 60 MB of RSS). They, and the Kafka client of `agentrt events`,
load only where something uses them (bench executor: executor RSS at 200 runs)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

HEAVY = ("anthropic", "openai", "aiokafka")

PROBE = textwrap.dedent("""
    import json, sys
    import aiohttp
    import cli.main
    import executor.services, executor.worker
    from executor.agents import parse_definition
    from executor.deciders import DeciderRegistry

    cli.main.build_parser()  # every service parses the whole CLI to start
    agents = [parse_definition({{"name": "plan", "version": "1",
                                "decider": {{"kind": "scripted", "plan": [{{"id": "done", "finish": {{}}}}]}}}})]
    DeciderRegistry(agents, None)
    loaded = [name for name in {heavy!r} if name in sys.modules]
    model = {model!r}
    if model:
        agents = [parse_definition({{"name": "m", "version": "1", "decider": {{
            "kind": model, "model": "m-1", "base_url": "http://127.0.0.1:9/v1",
            "api_key_env": "NO_SUCH_KEY_VARIABLE"}}}})]
        try:
            DeciderRegistry(agents, None, default_api_key="k", anthropic_api_key="k")
        except Exception as exc:  # the import happened before any check of the definition
            print(type(exc).__name__, exc, file=sys.stderr)
    print(json.dumps({{"before": loaded, "after": [name for name in {heavy!r} if name in sys.modules]}}))
""")


def _probe(model: str = "") -> dict[str, list[str]]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY, model=model)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_executor_of_scripted_agents_loads_no_model_sdk_and_no_kafka_client() -> None:
    assert _probe() == {"before": [], "after": []}


def test_an_agent_with_a_model_decider_loads_its_sdk() -> None:
    """The lazy import still happens when an agent needs it (the probe above cannot pass by accident)."""
    assert "anthropic" in _probe("anthropic")["after"]
    assert "openai" in _probe("openai")["after"]
