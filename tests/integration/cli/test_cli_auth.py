"""`agentrt keys …`, `agentrt audit list` and the connection flags, as an operator would use them:
bootstrap a key with the database URL, manage keys over the API, act, read the trail."""

from __future__ import annotations

import json

import pytest
from helpers import run_agentrt, without_settings
from support import TENANT, scheduler_stack

from devstack.certs import make_authority

pytestmark = pytest.mark.integration


async def agentrt(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    return await run_agentrt(*args, env=without_settings(env))


async def test_keys_and_audit_from_the_cli(db_url):
    code, out, err = await agentrt("keys", "create", "--database-url", db_url, "--tenant", TENANT, "--role", "admin",
                                   "--name", "ops", "--ticket", "OPS-1")
    assert code == 0, err
    admin = out.strip()
    assert admin.startswith("agrt_") and "shown once" in err
    async with scheduler_stack(db_url, auth_mode="api_key", api_key_cache_ttl_ms=0, work_token="w") as stack:
        addr = ["--addr", stack.addr]
        as_admin = {"AGENTRT_API_KEY": admin}
        code, out, err = await agentrt("keys", "create", "--role", "submitter", "--name", "checkout", "--expires",
                                       "90d", "--json", *addr, env=as_admin)
        assert code == 0, err
        created = json.loads(out)
        submitter = created["secret"]
        assert created["role"] == "submitter" and created["tenants"] == [TENANT] and created["expires_at"]
        code, out, err = await agentrt("runs", "submit", "demo", "--allow-unregistered", "--json", *addr,
                                       "--api-key", submitter)
        assert code == 0, err
        run = json.loads(out)
        assert run["tenant_id"] == TENANT  # from the key: no --tenant given
        code, out, err = await agentrt("runs", "cancel", run["run_id"], "--reason", "duplicate", "--ticket",
                                       "SUP-3", "--json", *addr, "--api-key", submitter)
        assert code == 0, err
        code, out, err = await agentrt("audit", "list", "--json", *addr, env=as_admin)
        assert code == 0, err
        events = json.loads(out)["events"]
        assert [e["action"] for e in events] == ["run.cancel", "key.create", "key.create"]
        assert events[0]["principal"] == f"key:{created['key_id']}" and events[0]["ticket_id"] == "SUP-3"
        assert events[2]["principal"].startswith("local:") and events[2]["ticket_id"] == "OPS-1"
        code, out, err = await agentrt("audit", "list", "--action", "run.cancel", *addr, env=as_admin)
        assert code == 0 and "run.cancel" in out and "key.create" not in out
        # A submitter may not manage keys; a revoked key is refused; each says so in one line.
        code, _, err = await agentrt("keys", "list", *addr, "--api-key", submitter)
        assert code == 1 and len(err.strip().splitlines()) == 1 and "may not keys.manage" in err
        code, out, err = await agentrt("keys", "revoke", created["key_id"], "--reason", "rotated", *addr, env=as_admin)
        assert code == 0 and "revoked" in out, err
        code, _, err = await agentrt("runs", "list", *addr, "--api-key", submitter)
        assert code == 1 and len(err.strip().splitlines()) == 1 and "revoked" in err
        code, out, _ = await agentrt("keys", "list", "--json", *addr, env=as_admin)
        assert [k["name"] for k in json.loads(out)["keys"]] == ["ops"]  # live keys only by default
        code, _, err = await agentrt("runs", "list", *addr)
        assert code == 1 and len(err.strip().splitlines()) == 1 and "--api-key" in err
        code, out, err = await agentrt("runs", "export", run["run_id"], "--ticket", "LEG-2", *addr, env=as_admin)
        assert code == 0, err
        pages = [json.loads(line) for line in out.splitlines()]
        assert pages[0]["run"]["run_id"] == run["run_id"] and pages[-1]["next_page_token"] == ""
        code, out, err = await agentrt("audit", "list", "--action", "run.export", "--json", *addr, env=as_admin)
        assert [(e["run_id"], e["ticket_id"]) for e in json.loads(out)["events"]] == [(run["run_id"], "LEG-2")]


async def test_bad_key_options_exit_with_one_line(db_url):
    for extra, field in ((["--role", "viewer", "--tenant", "a,b"], "--tenant"),
                         (["--role", "admin", "--tenant", TENANT, "--expires", "soon"], "--expires"),
                         (["--role", "admin"], "--tenant")):
        code, _, err = await agentrt("keys", "create", "--database-url", db_url, "--name", "x", *extra)
        assert code == 1 and len(err.strip().splitlines()) == 1 and field in err, err


async def test_status_warns_about_auth_mode_none_and_the_cli_speaks_tls(db_url, tmp_path):
    async with scheduler_stack(db_url) as stack:
        code, out, err = await agentrt("status", "--addr", stack.addr, "--tenant", TENANT)
        assert code == 0 and "auth_mode none" in err and "auth:       none" in out
    ca = make_authority(tmp_path, "cli-ca")
    server = ca.issue(tmp_path, "localhost", stem="server")
    settings = {"tls_cert_file": str(server.cert), "tls_key_file": str(server.key)}
    async with scheduler_stack(db_url, **settings) as stack:
        addr = ["--addr", stack.addr, "--tenant", TENANT]
        code, out, err = await agentrt("runs", "list", *addr, "--tls-ca", str(ca.cert), "--tls-server-name",
                                       "localhost")
        assert code == 0, err
        code, out, err = await agentrt("status", "--json", *addr, env={"AGENTRT_TLS_CA": str(ca.cert)})
        assert code == 0 and json.loads(out)["services"]["scheduler"]["health"] == "SERVING", err
        code, _, err = await agentrt("runs", "list", *addr, "--timeout", "2")  # plaintext to a TLS port
        assert code == 1 and len(err.strip().splitlines()) == 1
    code, _, err = await agentrt("runs", "list", "--addr", "10.0.0.1:1", "--api-key", "agrt_x")
    assert code == 1 and "in clear" in err  # never sent in clear off this machine unless --insecure
