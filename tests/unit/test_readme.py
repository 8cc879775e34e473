from tests_paths import REPO

from shared.config import SchedulerSettings


def test_readme_documents_every_scheduler_setting():
    readme = (REPO / "README.md").read_text()
    missing = [name for name in SchedulerSettings.model_fields if f"`{name}`" not in readme and name != "service_name"]
    assert not missing, f"README configuration table lacks: {missing}"


def test_ci_runs_the_readme_test_command():
    assert "make test" in (REPO / ".ci" / "run").read_text()
    assert "make test" in (REPO / "README.md").read_text()
