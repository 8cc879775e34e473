"""The reference pages under docs/ against the code: every setting, every CLI command, every metric and
the role table are documented where a reader looks for them, and the README keeps the test command CI
runs."""
import re

from metric_names import exported_metric_names
from tests_paths import REPO

from scheduler.config import SchedulerSettings

DOCS = REPO / "docs"


def test_configuration_page_documents_every_scheduler_setting():
    page = (DOCS / "configuration.md").read_text()
    missing = [name for name in SchedulerSettings.model_fields if f"`{name}`" not in page and name != "service_name"]
    assert not missing, f"docs/configuration.md lacks: {missing}"


def test_ci_runs_the_readme_test_command():
    assert "make test" in (REPO / ".ci" / "run").read_text()
    assert "make test" in (REPO / "README.md").read_text()


def test_configuration_page_documents_every_executor_and_relay_setting():
    from executor.config import ExecutorSettings
    from relay.config import RelaySettings

    page = (DOCS / "configuration.md").read_text()
    for settings in (ExecutorSettings, RelaySettings):
        missing = [name for name in settings.model_fields if f"`{name}`" not in page and name != "service_name"]
        assert not missing, f"docs/configuration.md lacks {settings.__name__} settings: {missing}"


def test_cli_reference_names_every_command():
    from cli.main import build_parser

    reference = (DOCS / "cli.md").read_text()
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    missing = []
    for name, sub in commands.items():
        nested = [a for a in sub._actions if getattr(a, "choices", None) and a.dest.endswith("_command")]
        words = [f"agentrt {name} {child}" for a in nested for child in a.choices] or [f"agentrt {name}"]
        missing += [w for w in words if w not in reference]
    assert not missing, f"docs/cli.md lacks: {missing}"


def test_keys_page_prints_the_role_table_of_the_code():
    from scheduler.security.rbac import markdown_table

    assert markdown_table() in (DOCS / "keys-and-tls.md").read_text()


def test_metrics_page_names_every_exported_metric_and_no_other():
    exported = exported_metric_names()
    page = (DOCS / "metrics.md").read_text() + (DOCS / "observability.md").read_text()
    # Prose names a family by its prefix (`agentrt_db_table_*`): those are no metric names.
    named = {name for name in re.findall(r"\bagentrt_[a-z0-9_]+", page) if not name.endswith("_")}

    def documented(sample: str) -> bool:  # a counter by its _total, a histogram by its base name
        base = re.sub(r"_(created|bucket|sum|count)$", "", sample)
        return sample in named or base in named or f"{base}_total" in named

    missing = {sample for sample in exported if not documented(sample)}
    assert not missing, f"docs/metrics.md lacks: {missing}"
    unknown = {name for name in named if name not in exported and f"{name}_bucket" not in exported}
    assert not unknown, f"docs/metrics.md names metrics nothing exports: {unknown}"


def test_errors_page_maps_every_reason_to_its_code():
    """Each typed error of shared/errors.py is a row of docs/errors.md with its gRPC code."""
    from shared.errors import STATUS_CODES, AgentrtError, ResourceExhausted

    rows = [line for line in (DOCS / "errors.md").read_text().splitlines() if line.startswith("| ")]
    # The two bases no handler raises: any other AgentrtError is INTERNAL, and RESOURCE_EXHAUSTED is
    # only answered as QUOTA_EXCEEDED or TOOL_RATE_LIMITED.
    wrong = []
    for cls, code in STATUS_CODES.items():
        if cls in (AgentrtError, ResourceExhausted):
            continue
        if not any(line.rstrip().endswith(f"| {cls.reason} |") and code.name in line for line in rows):
            wrong.append(f"{cls.__name__}: {code.name} / {cls.reason}")
    assert not wrong, f"docs/errors.md lacks rows: {wrong}"


def test_api_reference_names_every_rpc():
    from shared.gen.agentrt.v1 import run_service_pb2, work_service_pb2

    page = (DOCS / "rpcs.md").read_text()
    missing = [f"{service.name}.{method.name}"
               for module in (run_service_pb2, work_service_pb2)
               for service in module.DESCRIPTOR.services_by_name.values()
               for method in service.methods if not re.search(rf"\b{method.name}\b", page)]
    assert not missing, f"docs/rpcs.md lacks: {missing}"
