"""The chart's console (console.enabled; docs/console.md): off by default; when on, a Deployment with
the trio's locked-down security context, HTTP probes on /healthz, TLS to the scheduler as the executors
have it, a Service, an optional Ingress and a NetworkPolicy that lets it reach the scheduler only; and
the values that cannot work refused at render time."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils
from tests_paths import REPO

pytestmark = pytest.mark.helm

CHART_DIR = REPO / "helm" / "agentrt"
RELEASE, NAMESPACE = "demo", "agents"
NAME = f"{RELEASE}-agentrt-console"
KUBE_VERSION = kv_utils.latest_version()
ON = {"console": {"enabled": True}}


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


def render(chart: helm.Chart, values: dict[str, Any] | None) -> list[dict[str, Any]]:
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [d for path, text in sorted(manifests.items()) if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]


def named(docs: list[dict[str, Any]], kind: str, name: str = NAME) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def test_the_console_is_off_by_default(chart: helm.Chart) -> None:
    docs = render(chart, None)
    assert not [d for d in docs if d["metadata"]["name"] == NAME]


def test_the_console_deployment_is_locked_down_probed_and_reaches_the_scheduler_over_tls(chart: helm.Chart) -> None:
    docs = render(chart, ON)
    for doc in docs:
        if doc["metadata"]["name"] == NAME:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    deployment = named(docs, "Deployment")
    scheduler = named(docs, "Deployment", f"{RELEASE}-agentrt-scheduler")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["args"] == ["console"]
    assert pod["securityContext"] == scheduler["spec"]["template"]["spec"]["securityContext"]
    assert container["securityContext"] == scheduler["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is False
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AGENTRT_CONSOLE_SCHEDULER_ADDR"] == f"{RELEASE}-agentrt-scheduler.{NAMESPACE}.svc:50051"
    assert env["AGENTRT_CONSOLE_TLS_CA"] == "/etc/agentrt/scheduler-ca/ca.crt"
    assert "AGENTRT_CONSOLE_INSECURE" not in env
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["scheduler-ca"] == "/etc/agentrt/scheduler-ca"
    assert container["resources"]["limits"]["memory"] and container["resources"]["requests"]["cpu"]
    service = named(docs, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert not [d for d in docs if d["kind"] == "Ingress"]

    policy = named(docs, "NetworkPolicy")
    [to_scheduler] = [rule for rule in policy["spec"]["egress"] if "to" in rule]
    assert to_scheduler["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "scheduler"
    assert to_scheduler["ports"] == [{"port": 50051, "protocol": "TCP"}]
    scheduler_policy = named(docs, "NetworkPolicy", f"{RELEASE}-agentrt-scheduler")
    admitted = [peer.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component")
                for rule in scheduler_policy["spec"]["ingress"] for peer in rule.get("from", [])]
    assert "console" in admitted


def test_a_session_secret_an_ingress_and_mutual_tls_are_wired(chart: helm.Chart) -> None:
    values = {"console": {"enabled": True, "replicas": 2, "traceUrlTemplate": "https://tempo/trace/{trace_id}",
                          "sessionSecret": {"existingSecret": "console-session"},
                          "clientTlsSecret": "console-client-tls",
                          "ingress": {"enabled": True, "host": "agentrt.example.com", "tlsSecret": "console-tls",
                                      "className": "nginx"}},
              "tls": {"mutual": {"enabled": True, "executorSecret": "executor-tls"}}}
    docs = render(chart, values)
    for doc in docs:
        if doc["metadata"]["name"] == NAME:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    container = named(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["AGENTRT_CONSOLE_SESSION_SECRET"]["valueFrom"]["secretKeyRef"] == {"name": "console-session",
                                                                                   "key": "session-secret"}
    assert env["AGENTRT_CONSOLE_TLS_CERT"]["value"] == "/etc/agentrt/client-tls/tls.crt"
    assert env["AGENTRT_CONSOLE_TRACE_URL_TEMPLATE"]["value"] == "https://tempo/trace/{trace_id}"
    volumes = {v["name"]: v for v in named(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["client-tls"]["secret"]["secretName"] == "console-client-tls"
    ingress = named(docs, "Ingress")
    assert ingress["spec"]["tls"] == [{"hosts": ["agentrt.example.com"], "secretName": "console-tls"}]
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == NAME


def test_plaintext_to_the_scheduler_is_said_explicitly(chart: helm.Chart) -> None:
    docs = render(chart, {**ON, "tls": {"enabled": False}})
    env = {e["name"]: e.get("value") for e in
           named(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AGENTRT_CONSOLE_INSECURE"] == "true" and "AGENTRT_CONSOLE_TLS_CA" not in env


@pytest.mark.parametrize(("values", "refusal"), [
    ({"console": {"enabled": True, "replicas": 2}}, "console.sessionSecret.existingSecret"),
    ({"console": {"enabled": True}, "tls": {"mutual": {"enabled": True, "executorSecret": "executor-tls"}}},
     "console.clientTlsSecret"),
    ({"console": {"enabled": True, "ingress": {"enabled": True}}}, "console.ingress.host"),
])
def test_values_that_cannot_work_are_refused(chart: helm.Chart, values: dict[str, Any], refusal: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=refusal.replace(".", r"\.")):
        render(chart, values)


def test_the_schema_refuses_unknown_console_values(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"console": {"enabled": True, "sesionSecret": {}}})
