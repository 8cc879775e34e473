from tests_paths import REPO

from scheduler.config import SchedulerSettings


def test_readme_documents_every_scheduler_setting():
    readme = (REPO / "README.md").read_text()
    missing = [name for name in SchedulerSettings.model_fields if f"`{name}`" not in readme and name != "service_name"]
    assert not missing, f"README configuration table lacks: {missing}"


def test_ci_runs_the_readme_test_command():
    assert "make test" in (REPO / ".ci" / "run").read_text()
    assert "make test" in (REPO / "README.md").read_text()


def test_readme_documents_every_executor_and_relay_setting():
    from executor.config import ExecutorSettings
    from relay.config import RelaySettings

    readme = (REPO / "README.md").read_text()
    for settings in (ExecutorSettings, RelaySettings):
        missing = [name for name in settings.model_fields if f"`{name}`" not in readme and name != "service_name"]
        assert not missing, f"README lacks {settings.__name__} settings: {missing}"


def test_readme_cli_reference_names_every_command():
    from devstack.cli import build_parser

    readme = (REPO / "README.md").read_text()
    reference = readme.split("## CLI reference", 1)[1].split("\n## ", 1)[0]
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    missing = []
    for name, sub in commands.items():
        nested = [a for a in sub._actions if getattr(a, "choices", None) and a.dest.endswith("_command")]
        words = [f"agentrt {name} {child}" for a in nested for child in a.choices] or [f"agentrt {name}"]
        missing += [w for w in words if w not in reference]
    assert not missing, f"README CLI reference lacks: {missing}"


def test_readme_prints_the_role_table_of_the_code():
    from scheduler.roles import markdown_table

    assert markdown_table() in (REPO / "README.md").read_text()
