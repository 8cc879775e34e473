"""The first hour of a new user (issue 15), through the real `agentrt` command against a live scheduler:
an empty runs list, the outbox's database named on the subcommand (or not at all), a bad run id, and the
starter agent a default Helm install serves."""

import json

import pytest
import yaml
from executor_support import executor
from helpers import run_agentrt, without_settings
from support import scheduler_stack, submit
from tests_paths import REPO

pytestmark = pytest.mark.integration

NO_DATABASE = ("agentrt outbox: error: --database-url: name the outbox's PostgreSQL with --database-url, "
               "AGENTRT_DATABASE_URL or the config file's relay section")


async def agentrt(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run `python -m cli ARGS` with no AGENTRT_* settings but those in `env`."""
    return await run_agentrt(*args, env=without_settings(env))


async def test_runs_list_of_a_tenant_without_runs_says_so(db_url):
    async with scheduler_stack(db_url) as stack:
        code, out, err = await agentrt("runs", "list", "--tenant", "acme", "--addr", stack.addr)
        assert (code, out, err) == (0, "no runs for tenant acme\n", "")

        await submit(stack)  # tenant-a's run: still none for acme, and none matching a filter for tenant-a
        code, out, err = await agentrt("runs", "list", "--tenant", "acme", "--addr", stack.addr)
        assert (code, out, err) == (0, "no runs for tenant acme\n", "")
        code, out, err = await agentrt("runs", "list", "--tenant", "tenant-a", "--status", "RUNNING",
                                       "--agent", "nobody", "--addr", stack.addr)
        assert (code, out, err) == (0, "no runs for tenant tenant-a with status RUNNING; agent nobody\n", "")
        code, out, err = await agentrt("runs", "list", "--tenant", "acme", "--json", "--addr", stack.addr)
        assert code == 0 and json.loads(out) == {"runs": [], "next_page_token": ""}
        code, out, err = await agentrt("runs", "list", "--tenant", "tenant-a", "--addr", stack.addr)
        assert code == 0 and out.startswith("RUN_ID") and len(out.splitlines()) == 2, err


async def test_runs_get_of_a_bad_run_id_names_the_field_once(db_url):
    async with scheduler_stack(db_url) as stack:
        code, out, err = await agentrt("runs", "get", "not-a-run", "--tenant", "acme", "--addr", stack.addr)
        assert (code, out) == (1, "")
        assert err == "agentrt runs: error: run_id: is not a UUID: 'not-a-run'\n"


@pytest.mark.parametrize("where", ["after the action", "before the action", "from the environment"])
async def test_outbox_status_takes_the_database_url(where, db_url):
    async with scheduler_stack(db_url) as stack:
        await submit(stack)  # one event in the outbox, and no relay to take it
        args, env = {
            "after the action": (["outbox", "status", "--database-url", db_url], None),
            "before the action": (["outbox", "--database-url", db_url, "status"], None),
            "from the environment": (["outbox", "status"], {"AGENTRT_DATABASE_URL": db_url}),
        }[where]
        code, out, err = await agentrt(*args, env=env)
        assert code == 0, err
        status = json.loads(out)
        assert status["pending"] == 1 and status["parked"] == 0 and status["relays"] == []


async def test_outbox_subcommands_take_the_database_url(db_url):
    code, out, err = await agentrt("outbox", "parked", "--state", "all", "--database-url", db_url)
    assert (code, json.loads(out), err) == (0, [], "")
    code, out, err = await agentrt("outbox", "retry", "12345", "--database-url", db_url)
    assert code == 1 and out == "" and len(err.splitlines()) == 1 and "Traceback" not in err
    code, out, err = await agentrt("outbox", "skip", "12345", "--note", "gone", "--database-url", db_url)
    assert code == 1 and out == "" and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("action", [["status"], ["parked"], ["retry", "1"], ["skip", "1", "--note", "x"]])
async def test_outbox_without_a_database_url_is_one_readable_line(action):
    code, out, err = await agentrt("outbox", *action)
    assert (code, out, err) == (1, "", NO_DATABASE + "\n")


async def test_the_charts_starter_agent_completes_a_run_submitted_through_the_cli(db_url, tmp_path):
    """What a default `helm install` serves (executor.agents.definitions in helm/agentrt/values.yaml), loaded
    from a directory as the executors load the mounted ConfigMap."""
    values = yaml.safe_load((REPO / "helm" / "agentrt" / "values.yaml").read_text())
    agents = tmp_path / "agents"
    agents.mkdir()
    for name, text in values["executor"]["agents"]["definitions"].items():
        (agents / name).write_text(text)
    async with scheduler_stack(db_url) as stack, executor(stack, agents):
        code, out, err = await agentrt("runs", "submit", "hello", "--input", '{"name": "Ada"}', "--tenant", "demo",
                                       "--json", "--addr", stack.addr)
        assert code == 0, err
        run_id = json.loads(out)["run_id"]
        code, out, err = await agentrt("runs", "watch", run_id, "--tenant", "demo", "--json", "--addr", stack.addr)
        assert code == 0, err
        last = json.loads(out.strip().splitlines()[-1])
    assert last["status"] == "COMPLETED", last
    assert last["result"] == {"greeting": "hello from agentrt", "run_id": run_id, "input": {"name": "Ada"}}
