"""The chart's index upkeep (maintenance.enabled; docs/retention.md "Index upkeep"): a CronJob that
runs `agentrt maintain indexes` with the owner's URL, one pass at a time; its thresholds reach the
command; off when disabled; values that cannot work refused by the schema. (The sweeps of
test_helm_chart.py lock down and size its container, and find no secret in it, like every other.)"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
from kubernetes_validate import utils as kv_utils
from test_helm_console import render
from tests_paths import REPO

from cli.main import build_parser

pytestmark = pytest.mark.helm

CHART_DIR = REPO / "helm" / "agentrt"
NAME = "demo-agentrt-maintenance"  # the release test_helm_console renders
ROLES = {"database": {"roles": {"enabled": True, "scheduler": {"existingSecret": "db-scheduler"},
                                "relay": {"existingSecret": "db-relay"}}}}


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


def cronjobs(chart: helm.Chart, values: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [d for d in render(chart, values) if d["kind"] == "CronJob"]


def container(cronjob: dict[str, Any]) -> dict[str, Any]:
    (c,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return c


def test_a_weekly_pass_as_the_owner_by_default(chart):
    (job,) = cronjobs(chart, None)
    assert job["metadata"]["name"] == NAME
    kubernetes_validate.validate(job, kv_utils.latest_version(), strict=True)
    spec = job["spec"]
    assert spec["schedule"] == "17 3 * * 0" and spec["concurrencyPolicy"] == "Forbid"
    c = container(job)
    assert c["args"] == ["maintain", "indexes", "--bloat", "2", "--min-size-mib", "1"]
    args = build_parser().parse_args(c["args"])  # what the image's entry point makes of them
    assert (args.command, args.maintain_command, args.bloat, args.min_size_mib) == ("maintain", "indexes", 2.0, 1.0)
    env = {e["name"]: e for e in c["env"]}
    assert env["AGENTRT_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "agentrt-database", "key": "url"}


def test_with_least_privilege_roles_it_still_connects_as_the_owner(chart):
    (job,) = cronjobs(chart, ROLES)
    env = {e["name"]: e for e in container(job)["env"]}
    assert env["AGENTRT_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "agentrt-database"


def test_schedule_thresholds_and_time_zone_reach_the_job(chart):
    (job,) = cronjobs(chart, {"maintenance": {"schedule": "@daily", "timeZone": "Europe/Paris", "bloat": 3,
                                              "minSizeMiB": 16}})
    assert (job["spec"]["schedule"], job["spec"]["timeZone"]) == ("@daily", "Europe/Paris")
    args = build_parser().parse_args(container(job)["args"])
    assert (args.bloat, args.min_size_mib) == (3.0, 16.0)


def test_disabled_renders_no_cronjob(chart):
    assert cronjobs(chart, {"maintenance": {"enabled": False}}) == []


@pytest.mark.parametrize("bad", [{"bloat": 1}, {"bloat": 0.5}, {"minSizeMiB": -1}, {"schedule": "weekly"},
                                 {"schedule": "1 2 3"}, {"unknown": True}])
def test_values_that_cannot_work_are_refused(chart, bad):
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"maintenance": bad})
