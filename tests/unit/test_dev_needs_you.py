"""The dev view's "needs you" panel: the approval commands stay on screen whatever scrolls past
in the notes, and the same commands are in .agentrt/approvals.txt. Checked on the screen as
rich draws it (a recording console), through DevStack's own announce/say/render path."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from cli.main import build_parser
from devstack import demo
from devstack.stack import DevStack
from devstack.watch import View


def waiting_run(index: int) -> demo.DemoRun:
    run = demo.DemoRun(index=index, request_id=f"r{index}", input={"refund_amount": 780.0}, needs_approval=True)
    run.run_id, run.status, run.step = f"run-{index}", "PAUSED_HUMAN", f"{demo.APPROVAL_NODE}/attempt-1"
    return run


def screen(view: View) -> str:
    console = Console(record=True, width=160, force_terminal=True)
    console.print(view.render())
    return console.export_text()


def test_the_needs_you_panel_keeps_the_commands_and_the_file_has_them(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the session's .agentrt/ is here: commands need no --addr/--tenant/key
    args = build_parser().parse_args(["dev"])
    stack = DevStack(args)
    stack.data_dir.mkdir(parents=True)
    stack.live_view = True
    runs = [waiting_run(4), waiting_run(9), demo.DemoRun(index=1, request_id="r1", input={}, needs_approval=False)]
    stack.runs = runs
    stack.view = View(stack.session, "demo", False, runs, [], None)

    stack.announce_approvals()
    for n in range(30):  # far more notes than the view keeps
        stack.say(f"chaos: SIGKILL exec-1 (pid {n})")
    text = screen(stack.view)
    assert "needs you (2)" in text
    for run_id in ("run-4", "run-9"):
        assert f"agentrt runs resume {run_id} --approve" in text
    lines = (stack.data_dir / "approvals.txt").read_text().splitlines()
    assert [x for x in lines if x.startswith("agentrt ")] == [
        "agentrt runs resume run-4 --approve   # refund 780.0", "agentrt runs resume run-9 --approve   # refund 780.0"]

    # Approved elsewhere: gone from the panel and from the file.
    runs[0].status = "COMPLETED"
    stack.announce_approvals()
    text = screen(stack.view)
    assert "needs you (1)" in text and "run-4" not in text and "agentrt runs resume run-9 --approve" in text
    assert "run-4" not in (stack.data_dir / "approvals.txt").read_text()


def test_elsewhere_the_commands_spell_out_address_and_tenant(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["dev", "--data-dir", str(tmp_path / "elsewhere"), "--listen", "127.0.0.1:5999"])
    stack = DevStack(args)
    assert stack.cli("runs", "resume", "X", "--approve") == \
        "agentrt runs resume X --approve --tenant demo --addr 127.0.0.1:5999"


def test_client_json_is_used_only_when_private_to_this_user(tmp_path: Path, monkeypatch) -> None:
    from cli import local_config

    monkeypatch.chdir(tmp_path)
    data_dir = tmp_path / ".agentrt"
    data_dir.mkdir()
    target = local_config.write(data_dir, {"scheduler_addr": "127.0.0.1:5999", "api_key": "k", "tenant": "demo"})
    assert (target.stat().st_mode & 0o777) == 0o600
    assert local_config.for_scheduler(None)["api_key"] == "k"
    assert local_config.for_scheduler("127.0.0.1:5999")["tenant"] == "demo"
    assert local_config.for_scheduler("10.0.0.1:50051") == {}, "never another scheduler's credentials"
    target.chmod(0o644)
    assert local_config.load() == {}, "a file others may read is ignored"
    target.chmod(0o600)
    local_config.write(data_dir, {"scheduler_addr": "127.0.0.1:5999", "stopped": True})
    assert local_config.load() == {}, "a stopped session's file is ignored"
