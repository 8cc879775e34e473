"""The chart's dashboards and PrometheusRule: real metric names, valid rules, alerts that fire.

`promtool check rules` and `promtool test rules` (prometheusrule_test.yaml: series that make
each alert fire and series just below its threshold) run on the rules the chart renders.
promtool comes with Debian's `prometheus` package; .ci/run installs it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from metric_names import exported_metric_names, names_in

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "helm" / "agentrt"
DASHBOARDS = sorted((CHART_DIR / "dashboards").glob("*.json"))
RUNBOOKS = ROOT / "docs" / "runbooks.md"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
# The design's priority order (docs/runbooks.md keeps it).
ALERT_ORDER = ["AgentrtRunsInDoubtTooLong", "AgentrtOutboxBacklog", "AgentrtFrequentLeaseLoss",
               "AgentrtCheckpointMigrationFailures", "AgentrtBudgetExhaustedRunsHigh", "AgentrtDatabasePoolSaturated",
               "AgentrtDatabaseConnectionsNearLimit", "AgentrtDatabaseSizeHigh", "AgentrtDatabaseXidAgeHigh"]


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART_DIR) as chart:
        manifests = chart.render(values, name="demo", namespace="agents", is_install=True)
    return [d for path, text in manifests.items() if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def rule_groups() -> list[dict[str, Any]]:
    (rule,) = [d for d in render({"prometheusRule": {"enabled": True}}) if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def rules_of(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for g in groups for r in g["rules"]]


def dashboard_exprs(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def test_off_by_default() -> None:
    kinds = [d["kind"] for d in render({})]
    assert "PrometheusRule" not in kinds
    assert not [d for d in render({}) if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]]


def test_dashboards_render_as_configmaps_for_the_grafana_sidecar() -> None:
    docs = render({"dashboards": {"enabled": True, "labelValue": "yes", "annotations": {"grafana_folder": "agentrt"}}})
    maps = {d["metadata"]["name"]: d for d in docs
            if d["kind"] == "ConfigMap" and "-dashboard-" in d["metadata"]["name"]}
    assert sorted(maps) == sorted(f"demo-agentrt-dashboard-{p.stem}" for p in DASHBOARDS)
    for path in DASHBOARDS:
        cm = maps[f"demo-agentrt-dashboard-{path.stem}"]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "yes"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "agentrt"}
        assert json.loads(cm["data"][f"agentrt-{path.stem}.json"]) == json.loads(path.read_text())


def test_every_dashboard_query_names_exported_metrics_only() -> None:
    assert {p.stem for p in DASHBOARDS} >= {"overview", "runs-and-leases", "tools-and-in-doubt", "relay-and-outbox",
                                            "database"}
    exported = exported_metric_names()
    uids = set()
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        uids.add(board["uid"])
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), path.name
        exprs = dashboard_exprs(board)
        assert exprs, path.name
        for expr in exprs:
            named = names_in(expr)
            assert named, f"{path.name}: {expr} names no agentrt metric"
            assert named <= exported, f"{path.name}: {expr} names {sorted(named - exported)}, which nothing exports"
    assert len(uids) == len(DASHBOARDS)


def test_alerts_in_priority_order_with_runbook_sections(rule_groups: list[dict[str, Any]]) -> None:
    rules = rules_of(rule_groups)
    assert [r["alert"] for r in rules] == ALERT_ORDER
    exported = exported_metric_names()
    headings = [line[3:].strip() for line in RUNBOOKS.read_text().splitlines() if line.startswith("## ")]
    assert headings == ALERT_ORDER  # one section per alert, in the same order
    for rule in rules:
        assert names_in(rule["expr"]) <= exported, rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        url = rule["annotations"]["runbook_url"]
        assert url.endswith("docs/runbooks.md#" + rule["alert"].lower()), url


def test_thresholds_come_from_values() -> None:
    (rule,) = [d for d in render({"prometheusRule": {"enabled": True, "inDoubt": {"ageSeconds": 60, "for": "1m"},
                                                     "runbookBaseUrl": "https://wiki.example/rb"}})
               if d["kind"] == "PrometheusRule"]
    first = rules_of(rule["spec"]["groups"])[0]
    assert first["expr"] == "max(agentrt_in_doubt_age_seconds) > 60"
    assert first["for"] == "1m"
    assert first["annotations"]["runbook_url"] == "https://wiki.example/rb#agentrtrunsindoubttoolong"


@needs_promtool
def test_promtool_checks_and_tests_the_rules(rule_groups: list[dict[str, Any]], tmp_path: Path) -> None:
    assert PROMTOOL is not None
    checked = tmp_path / "checked.yaml"
    checked.write_text(yaml.safe_dump({"groups": rule_groups}, sort_keys=False))
    run = subprocess.run([PROMTOOL, "check", "rules", str(checked)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(ALERT_ORDER)} rules found" in run.stdout
    # promtool test compares annotations exactly; the unit tests are about expressions and thresholds.
    bare = [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]}
            for g in rule_groups]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": bare}, sort_keys=False))
    shutil.copy(Path(__file__).with_name("prometheusrule_test.yaml"), tmp_path)
    run = subprocess.run([PROMTOOL, "test", "rules", "prometheusrule_test.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    tested = yaml.safe_load(Path(__file__).with_name("prometheusrule_test.yaml").read_text())
    cases = [case for t in tested["tests"] for case in t["alert_rule_test"]]
    for alert in ALERT_ORDER:  # each alert both fires and stays quiet somewhere in the file
        assert any(c["alertname"] == alert and c["exp_alerts"] for c in cases), alert
        assert any(c["alertname"] == alert and not c["exp_alerts"] for c in cases), alert
