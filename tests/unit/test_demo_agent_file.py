"""The demo agent file: valid as shipped, one non-idempotent tool, a lookup on every tool, and the same
file with the `openai` decider in place of the plan."""

import yaml

from devstack import demo
from executor.agents import OpenAIDecider, load_file, parse_definition


def test_the_shipped_file_is_valid_and_its_contracts_are_what_the_demo_claims():
    agent = load_file(demo.AGENT_FILE)
    assert agent.name == demo.AGENT_NAME
    assert [t.name for t in agent.tools if not t.contract.idempotent] == [demo.NON_IDEMPOTENT_TOOL]
    # A lookup plus a fence on every tool: a takeover settles any step by lookup, never freezes it.
    assert all(t.contract.lookup and t.contract.retry_after_not_found for t in agent.tools)
    assert demo.approval_threshold(agent) == 500


def test_install_points_every_tool_at_the_given_mock_server(tmp_path):
    agent = demo.install_agent(tmp_path, "http://127.0.0.1:6553")
    urls = [u for t in agent.tools for u in (t.url, t.lookup_url)]  # type: ignore[union-attr]
    assert urls and all(u.startswith("http://127.0.0.1:6553/") for u in urls)


def test_the_same_file_names_the_openai_decider_instead():
    data = yaml.safe_load(demo.AGENT_FILE.read_text())
    data["decider"] = {"kind": "openai", "base_url": "https://api.openai.com/v1", "model": "gpt-4o-mini",
                       "api_key_env": "OPENAI_API_KEY"}
    agent = parse_definition(data, "after_sales_return.yaml")
    assert isinstance(agent.decider, OpenAIDecider)
    assert "above 500" in agent.prompt.system and "agentrt_wait_for_input" in agent.prompt.system


def test_every_fifth_demo_run_needs_approval():
    runs = demo.demo_runs(10, "s", 500)
    assert [r.index for r in runs if r.needs_approval] == [4, 9]
    assert len({r.request_id for r in runs}) == 10
