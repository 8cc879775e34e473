"""The Helm chart (helm/agentrt), rendered and linted by Helm's own engine.

helm-python-sdk embeds Helm v4's Go SDK, so no helm binary is needed. Every
rendered manifest is validated against a current Kubernetes schema shipped by
kubernetes-validate, and the chart's promises are checked on the output:
probes, resources and a locked-down security context on every container; the
migrations as a hook Job (or a plain Job, an init container, or nothing);
credentials only from existing Secrets; values.schema.json guarding values;
grace periods longer than the lease; NetworkPolicies, PDBs, HPA and the
checksum/config roll-out annotation; the executors' agents (inline definitions in a
ConfigMap of the chart by default, an existing ConfigMap, modules in the image;
none is refused at render time); TLS on the scheduler's port (an existing Secret or
cert-manager Certificates, mutual TLS, mounted as whole volumes so that renewals reach
the pods) and its authentication (API keys, JWTs, the executors' reconciler key), down to
the settings the components load from the rendered config file.

Each values case is rendered once per module (see `renders`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "helm" / "agentrt"
CI_DIR = CHART_DIR / "ci"
CI_FILES = sorted(CI_DIR.glob("*.yaml"))
CASES = ["defaults", *(p.stem for p in CI_FILES)]
RELEASE = "demo"
NAMESPACE = "agents"
COMPONENTS = ("scheduler", "executor", "relay")
SUBCOMMANDS = {"scheduler", "executor", "relay", "migrate", "maintain"}
# The newest Kubernetes schema that kubernetes-validate ships.
KUBE_VERSION = kv_utils.latest_version()
# Kinds defined by CRDs: no upstream schema, checked structurally instead.
CRD_KINDS = {"ServiceMonitor", "Certificate", "PrometheusRule"}  # PrometheusRule: tests/helm/test_alerts.py
# Env var names that carry credentials: they must come from Secrets.
SECRETISH = re.compile(r"(?i)(password|passwd|secret|token|api_?key|credential|database_url|dsn)")
# Settings whose names look like credentials but are not (the chart writes them to the config file).
NOT_SECRETS = {"api_key_cache_ttl_ms"}


def load_case_values(case: str) -> dict[str, Any] | None:
    if case == "defaults":
        return None
    return yaml.safe_load((CI_DIR / f"{case}.yaml").read_text()) or {}


@dataclass
class Rendered:
    values: dict[str, Any]  # the merged values (chart defaults + the case's file)
    docs: list[dict[str, Any]]
    text: str  # every manifest, as Helm rendered it
    notes: str
    by_template: dict[str, str] = field(default_factory=dict)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def named(self, kind: str, name: str) -> dict[str, Any]:
        found = [d for d in self.of_kind(kind) if d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
        return found[0]

    def deployment(self, component: str) -> dict[str, Any]:
        return self.named("Deployment", f"{fullname(self.values)}-{component}")

    def deployments(self) -> dict[str, dict[str, Any]]:
        return {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in self.of_kind("Deployment")}


Renders = Callable[[str], Rendered]


def fullname(values: dict[str, Any]) -> str:
    return values.get("fullnameOverride") or f"{RELEASE}-agentrt"


def render(chart: helm.Chart, values: dict[str, Any] | None) -> Rendered:
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    texts: list[str] = []
    notes = ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        texts.append(text)
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return Rendered(
        values=chart.merge_values(values),
        docs=docs,
        text="\n".join(texts),
        notes=notes,
        by_template=manifests,
    )


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def renders(chart: helm.Chart) -> Callable[[str], Rendered]:
    """Render each values case once for the whole module."""
    cache: dict[str, Rendered] = {}

    def get(case: str) -> Rendered:
        if case not in cache:
            cache[case] = render(chart, load_case_values(case))
        return cache[case]

    return get


def pod_specs(r: Rendered) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in r.docs:
        if doc["kind"] in ("Deployment", "Job"):
            yield f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"]
        elif doc["kind"] == "CronJob":
            yield f"CronJob/{doc['metadata']['name']}", doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


# cert-manager.io/v1 Certificate: the fields of its CRD's schema the chart may use, strictly (an
# unknown or misspelt field fails, as the API server's structural schema would prune or refuse it).
GO_DURATION = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"
KEY_USAGES = ["signing", "digital signature", "content commitment", "key encipherment", "key agreement",
              "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
              "server auth", "client auth", "code signing", "email protection", "s/mime", "ipsec end system",
              "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc"]
STRINGS = {"type": "array", "items": {"type": "string", "minLength": 1}}
CERTIFICATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "cert-manager.io/v1"},
        "kind": {"const": "Certificate"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["secretName", "issuerRef"],
            "anyOf": [{"required": ["commonName"]}, {"required": ["dnsNames"]}],
            "additionalProperties": False,
            "properties": {
                "secretName": {"type": "string", "minLength": 1},
                "secretTemplate": {"type": "object", "additionalProperties": False, "properties": {
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}},
                "commonName": {"type": "string", "minLength": 1, "maxLength": 64},
                "dnsNames": STRINGS,
                "duration": {"type": "string", "pattern": GO_DURATION},
                "renewBefore": {"type": "string", "pattern": GO_DURATION},
                "privateKey": {"type": "object", "additionalProperties": False, "properties": {
                    "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                    "encoding": {"enum": ["PKCS1", "PKCS8"]},
                    "rotationPolicy": {"enum": ["Never", "Always"]},
                    "size": {"type": "integer"}}},
                "usages": {"type": "array", "items": {"enum": KEY_USAGES}, "uniqueItems": True},
                "issuerRef": {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "kind": {"type": "string"},
                    "group": {"type": "string"}}},
            },
        },
    },
}


def validate_certificate(doc: dict[str, Any]) -> None:
    import jsonschema  # kubernetes-validate's own dependency

    jsonschema.validate(doc, CERTIFICATE_SCHEMA)


# --- Helm's own checks ------------------------------------------------------------------


def test_chart_metadata(chart: helm.Chart) -> None:
    meta = chart.metadata
    assert meta["apiVersion"] == "v2"
    assert chart.name == "agentrt"
    assert meta["appVersion"]
    assert chart.schema is not None, "values.schema.json is missing"


@pytest.mark.parametrize("case", CASES)
def test_strict_lint(case: str) -> None:
    report = helm.lint(
        CHART_DIR, load_case_values(case), strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}"
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 = warning, 3 = error
    assert not problems, problems
    assert not report["errors"], report["errors"]
    assert report["total_charts_linted"] == 1


def test_ci_values_files_exist() -> None:
    assert len(CI_FILES) >= 3, "helm/agentrt/ci/ should hold several values files"


# --- Kubernetes schema --------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_manifests_validate_against_kubernetes_schema(case: str, renders: Renders) -> None:
    r = renders(case)
    assert r.docs
    for doc in r.docs:
        if doc["kind"] == "Certificate":
            validate_certificate(doc)
            continue
        if doc["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {path}: {e.message}")


@pytest.mark.parametrize("case", CASES)
def test_every_object_has_standard_labels_and_namespace(case: str, renders: Renders) -> None:
    for doc in renders(case).docs:
        labels = doc["metadata"]["labels"]
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by"):
            assert key in labels, f"{doc['kind']}/{doc['metadata']['name']} lacks {key}"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert doc["metadata"]["namespace"] == NAMESPACE
        assert len(doc["metadata"]["name"]) <= 63


def test_service_monitor_is_structurally_sound(renders: Renders) -> None:
    r = renders("production-values")
    (sm,) = r.of_kind("ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    assert endpoint["path"] == "/metrics"
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    selector = sm["spec"]["selector"]
    (expr,) = selector["matchExpressions"]
    selected = []
    for svc in r.of_kind("Service"):
        labels = svc["metadata"]["labels"]
        if (
            all(labels.get(k) == v for k, v in selector["matchLabels"].items())
            and labels.get(expr["key"]) in expr["values"]
        ):
            selected.append(svc)
            assert "metrics" in {p["name"] for p in svc["spec"]["ports"]}
    assert {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in selected} == set(COMPONENTS)
    # each Service's metrics port reaches the container port named `metrics`
    for svc in selected:
        (port,) = [p for p in svc["spec"]["ports"] if p["name"] == "metrics"]
        assert port["targetPort"] == "metrics"


def test_service_monitor_only_when_enabled(renders: Renders) -> None:
    assert not renders("defaults").of_kind("ServiceMonitor")


# --- Containers: probes, resources, security ---------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_every_container_is_locked_down_and_sized(case: str, renders: Renders) -> None:
    r = renders(case)
    seen = 0
    for where, pod in pod_specs(r):
        pod_sc = pod.get("securityContext", {})
        assert pod_sc.get("runAsNonRoot") is True, where
        assert pod_sc.get("runAsUser", 0) != 0, where
        assert pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        assert pod.get("automountServiceAccountToken") is False, where
        for c in containers(pod):
            seen += 1
            name = f"{where}/{c['name']}"
            sc = c.get("securityContext", {})
            assert sc.get("runAsNonRoot") is True, name
            assert sc.get("runAsUser", pod_sc.get("runAsUser", 0)) != 0, name
            assert sc.get("readOnlyRootFilesystem") is True, name
            assert sc.get("allowPrivilegeEscalation") is False, name
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], name
            assert not sc.get("capabilities", {}).get("add"), name
            assert sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
            assert not sc.get("privileged"), name
            resources = c.get("resources", {})
            assert resources.get("requests", {}).get("cpu"), f"{name}: no cpu request"
            assert resources.get("requests", {}).get("memory"), f"{name}: no memory request"
            assert resources.get("limits", {}).get("memory"), f"{name}: no memory limit"
            # a read-only root filesystem needs a writable /tmp
            assert "/tmp" in {m["mountPath"] for m in c.get("volumeMounts", [])}, name
    assert seen


@pytest.mark.parametrize("case", CASES)
def test_every_long_running_container_has_probes_that_work_on_its_port(case: str, renders: Renders) -> None:
    """Native gRPC probes on plaintext health ports. Kubelet's gRPC probe cannot speak TLS, so
    the scheduler's probes on its TLS port are tcpSocket probes (no handshake, no client
    certificate needed under mutual TLS)."""
    r = renders(case)
    expected_ports = {"scheduler": 50051, "executor": 50052, "relay": 50053}
    deployments = r.deployments()
    assert deployments
    for component, dep in deployments.items():
        pod = dep["spec"]["template"]["spec"]
        tls_port = component == "scheduler" and r.values["tls"]["enabled"]
        for c in pod["containers"]:
            declared = {p["containerPort"] for p in c["ports"]}
            assert {p["name"] for p in c["ports"]} >= {"metrics"}
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                assert probe in c, f"{component}/{c['name']} has no {probe}"
                handlers = {"grpc", "tcpSocket", "exec", "httpGet"} & set(c[probe])
                assert handlers == ({"tcpSocket"} if tls_port else {"grpc"}), f"{component}: {probe}: {handlers}"
                (handler,) = handlers
                assert c[probe][handler]["port"] == expected_ports[component]
                assert c[probe][handler]["port"] in declared, f"{component}: {probe} port is not a container port"


def test_the_schedulers_readiness_follows_the_primary_and_its_liveness_does_not(chart: helm.Chart,
                                                                               renders: Renders) -> None:
    """docs/ha.md: on a plaintext port readiness asks for RunService (NOT_SERVING while no primary
    takes writes); liveness and startup ask for "" (the process), so a failover restarts nothing.
    With TLS on the scheduler's port every probe is a TCP connect (kubelet's gRPC probe speaks no TLS)."""
    plain = renders("plaintext-dev-values")
    assert not plain.values["tls"]["enabled"]
    scheduler = plain.deployments()["scheduler"]["spec"]["template"]["spec"]["containers"][0]
    assert scheduler["readinessProbe"]["grpc"]["service"] == "agentrt.v1.RunService"
    assert "service" not in scheduler["livenessProbe"]["grpc"]
    assert "service" not in scheduler["startupProbe"]["grpc"]
    for component in ("executor", "relay"):
        container = plain.deployments()[component]["spec"]["template"]["spec"]["containers"][0]
        assert "service" not in container["readinessProbe"]["grpc"], component
    values = load_case_values("plaintext-dev-values") or {}
    values["database"] = {**values.get("database", {}), "readinessFollowsPrimary": False}
    values["config"] = {**values.get("config", {}), "scheduler": {"db_probe_interval_s": 5}}
    off = render(chart, values)
    scheduler = off.deployments()["scheduler"]["spec"]["template"]["spec"]["containers"][0]
    assert "service" not in scheduler["readinessProbe"]["grpc"]
    assert "db_probe_interval_s: 5" in off.text
    with_tls = renders("defaults").deployments()["scheduler"]["spec"]["template"]["spec"]["containers"][0]
    assert set(with_tls["readinessProbe"]) >= {"tcpSocket"}


@pytest.mark.parametrize("case", CASES)
def test_containers_run_the_agentrt_entry_points(case: str, renders: Renders) -> None:
    r = renders(case)
    for component, dep in r.deployments().items():
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert c["args"] == [component]
        assert "command" not in c, "the image's ENTRYPOINT is agentrt"
        assert env_of(c)["AGENTRT_CONFIG_FILE"]["value"] == "/etc/agentrt/config.yaml"
    for _, pod in pod_specs(r):
        for c in containers(pod):
            assert c["args"][0] in SUBCOMMANDS


# --- Migrations ---------------------------------------------------------------------------


def migrate_jobs(r: Rendered) -> list[dict[str, Any]]:
    return [j for j in r.of_kind("Job") if j["metadata"]["labels"]["app.kubernetes.io/component"] == "migrate"]


def test_migrations_are_a_pre_install_pre_upgrade_hook_by_default(renders: Renders) -> None:
    (job,) = migrate_jobs(renders("defaults"))
    annotations = job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    spec = job["spec"]
    assert isinstance(spec["backoffLimit"], int)
    assert spec["ttlSecondsAfterFinished"] > 0
    assert spec["activeDeadlineSeconds"] > 0
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (c,) = pod["containers"]
    assert c["args"] == ["migrate"]
    assert env_of(c)["AGENTRT_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "agentrt-database"
    # A pre-install hook runs before the release's own objects exist: it must not use them.
    assert pod["serviceAccountName"] == "default"
    assert not [v for v in pod.get("volumes", []) if "configMap" in v]


def test_migrations_without_hooks_are_a_plain_job(renders: Renders) -> None:
    r = renders("no-hooks-values")
    (job,) = migrate_jobs(r)
    assert not any(k.startswith("helm.sh/hook") for k in job["metadata"].get("annotations", {}))
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "agentrt-runner"


def test_plain_job_name_changes_with_the_image(chart: helm.Chart) -> None:
    def job_name(tag: str) -> str:
        (job,) = migrate_jobs(render(chart, {"migrations": {"mode": "job"}, "image": {"tag": tag}}))
        return str(job["metadata"]["name"])

    assert job_name("1.0.0") != job_name("1.0.1")
    assert job_name("1.0.0") == job_name("1.0.0")


def test_migrations_as_init_containers(renders: Renders) -> None:
    r = renders("init-container-values")
    assert not migrate_jobs(r)
    deployments = r.deployments()
    for component in ("scheduler", "relay"):
        (init,) = deployments[component]["spec"]["template"]["spec"]["initContainers"]
        assert init["args"] == ["migrate"]
    assert "initContainers" not in deployments["executor"]["spec"]["template"]["spec"]


ROLE_VALUES = {"database": {"roles": {
    "enabled": True, "prefix": "prod_",
    "scheduler": {"existingSecret": "db-scheduler"}, "relay": {"existingSecret": "db-relay", "urlKey": "dsn"},
    "readonly": {"existingSecret": "db-readonly", "passwordKey": "pw"}}}}


def test_each_service_connects_with_its_own_role_secret(chart: helm.Chart) -> None:
    r = render(chart, ROLE_VALUES)
    deployments = r.deployments()

    def url_ref(component: str) -> tuple[str, str]:
        (c,) = deployments[component]["spec"]["template"]["spec"]["containers"]
        sk = env_of(c)["AGENTRT_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
        return sk["name"], sk["key"]

    assert url_ref("scheduler") == ("db-scheduler", "url")
    assert url_ref("relay") == ("db-relay", "dsn")
    # Row-level security binds the scheduler's role: it refuses to start as one it would not bind.
    (scheduler,) = deployments["scheduler"]["spec"]["template"]["spec"]["containers"]
    assert env_of(scheduler)["AGENTRT_REQUIRE_ROW_SECURITY"]["value"] == "true"
    (relay,) = deployments["relay"]["spec"]["template"]["spec"]["containers"]
    assert "AGENTRT_REQUIRE_ROW_SECURITY" not in env_of(relay)
    (executor,) = deployments["executor"]["spec"]["template"]["spec"]["containers"]
    assert "AGENTRT_DATABASE_URL" not in env_of(executor)
    (job,) = migrate_jobs(r)
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["migrate", "--apply-roles"]
    env = env_of(c)
    # The migrations keep the owner's URL and hand each role the password of its own Secret.
    assert env["AGENTRT_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "agentrt-database"
    assert env["AGENTRT_ROLE_PREFIX"]["value"] == "prod_"
    assert env["AGENTRT_SCHEDULER_ROLE_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "db-scheduler", "key": "password"}
    assert env["AGENTRT_READONLY_ROLE_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "db-readonly", "key": "pw"}
    assert "AGENTRT_CONSUMER_ROLE_PASSWORD" not in env  # no Secret: the role gets no password


def test_roles_enabled_without_a_service_secret_is_refused(chart: helm.Chart) -> None:
    with pytest.raises(Exception, match=r"database\.roles\.scheduler\.existingSecret"):
        render(chart, {"database": {"roles": {"enabled": True, "relay": {"existingSecret": "db-relay"}}}})


def test_migrations_can_be_disabled(chart: helm.Chart, renders: Renders) -> None:
    assert not migrate_jobs(render(chart, {"migrations": {"enabled": False}}))
    assert not migrate_jobs(renders("executors-only-values"))


# --- Secrets ------------------------------------------------------------------------------

# A URL with a user:password@ part, or a credential-looking key with a literal value.
CREDENTIAL_LITERAL = re.compile(
    r"[a-z][a-z0-9+.-]*://[^\s/:@]+:[^\s/@]+@"
    r"|^[ \t]*(?:-[ \t]*)?(?:[\w.-]*[_.-])?(?:password|passwd|secret|token|api_?key)[\"']?[ \t]*[:=][ \t]*\S",
    re.IGNORECASE | re.MULTILINE,
)


def test_credential_detector_catches_literals() -> None:
    for leak in ("password: hunter2", "  - kafka_sasl_password: x", "url: postgresql://app:pw@db/agentrt"):
        assert CREDENTIAL_LITERAL.search(leak), leak
    for fine in ("automountServiceAccountToken: false", "secretKeyRef:\n  name: db", "secretName: tls"):
        assert not CREDENTIAL_LITERAL.search(fine), fine


@pytest.mark.parametrize("case", CASES)
def test_no_secret_is_rendered(case: str, renders: Renders) -> None:
    r = renders(case)
    assert not r.of_kind("Secret"), "the chart must never create Secrets"
    assert not CREDENTIAL_LITERAL.search(r.text), CREDENTIAL_LITERAL.search(r.text)
    for where, pod in pod_specs(r):
        for c in containers(pod):
            for e in c.get("env", []):
                if SECRETISH.search(e["name"]) or e["name"].startswith("AGENTRT_KAFKA_SASL_"):
                    assert "value" not in e, f"{where}/{c['name']}: {e['name']} is inline"
                    assert e["valueFrom"]["secretKeyRef"]["name"], e


def test_secret_names_only_appear_as_secret_references(renders: Renders) -> None:
    """Render with values that name existing Secrets: the names appear only where Secrets are referenced."""
    r = renders("production-values")
    names = {"prod-agentrt-database", "prod-kafka-sasl", "prod-kafka-tls", "prod-openai", "prod-anthropic",
             "prod-extra", "prod-reconciler-key", "prod-kek"}
    found: dict[str, list[str]] = {n: [] for n in names}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
        elif isinstance(node, str) and node in names:
            found[node].append(path)

    for doc in r.docs:
        walk(doc, f"{doc['kind']}/{doc['metadata']['name']}")
    for name, paths in found.items():
        assert paths, f"{name} is not referenced"
        for path in paths:
            assert path.endswith(("secretKeyRef.name", "secret.secretName")), path


def test_executors_hold_no_database_credentials(renders: Renders) -> None:
    for case in CASES:
        dep = renders(case).deployments().get("executor")
        if dep is None:
            continue
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        env = env_of(c)
        assert "AGENTRT_DATABASE_URL" not in env
        assert not [k for k in env if k.startswith("AGENTRT_KAFKA_SASL")]
        assert "initContainers" not in dep["spec"]["template"]["spec"]


def test_credentials_come_from_the_named_secrets(renders: Renders) -> None:
    r = renders("production-values")
    deployments = r.deployments()

    def ref(component: str, var: str) -> tuple[str, str]:
        (c,) = deployments[component]["spec"]["template"]["spec"]["containers"]
        sk = env_of(c)[var]["valueFrom"]["secretKeyRef"]
        return sk["name"], sk["key"]

    assert ref("scheduler", "AGENTRT_DATABASE_URL") == ("prod-agentrt-database", "postgres-url")
    assert ref("relay", "AGENTRT_DATABASE_URL") == ("prod-agentrt-database", "postgres-url")
    assert ref("relay", "AGENTRT_KAFKA_SASL_USERNAME") == ("prod-kafka-sasl", "user")
    assert ref("relay", "AGENTRT_KAFKA_SASL_PASSWORD") == ("prod-kafka-sasl", "pass")
    assert ref("executor", "AGENTRT_OPENAI_API_KEY") == ("prod-openai", "key")
    assert ref("executor", "AGENTRT_ANTHROPIC_API_KEY") == ("prod-anthropic", "key")
    assert ref("scheduler", "AGENTRT_ENCRYPTION_KEYS") == ("prod-kek", "ring")  # the scheduler's alone
    for component in ("executor", "relay"):
        (c,) = deployments[component]["spec"]["template"]["spec"]["containers"]
        assert "AGENTRT_ENCRYPTION_KEYS" not in env_of(c)
    relay_pod = deployments["relay"]["spec"]["template"]["spec"]
    (tls,) = [v for v in relay_pod["volumes"] if v["name"] == "kafka-tls"]
    assert tls["secret"]["secretName"] == "prod-kafka-tls"
    assert {i["path"] for i in tls["secret"]["items"]} == {"ca.crt", "tls.crt", "tls.key"}
    config = yaml.safe_load(r.named("ConfigMap", f"{RELEASE}-agentrt-config")["data"]["config.yaml"])
    assert config["relay"]["kafka_ssl_cafile"] == "/etc/agentrt/kafka-tls/ca.crt"
    assert config["relay"]["kafka_sasl_mechanism"] == "SCRAM-SHA-512"
    assert config["relay"]["kafka_security_protocol"] == "SASL_SSL"


# --- values.schema.json -------------------------------------------------------------------

BAD_VALUES = {
    "replicas as a word": "scheduler:\n  replicas: three\n",
    "unknown component": "worker:\n  replicas: 2\n",
    "unknown component key": "executor:\n  replica: 2\n",
    "inline database URL": "database:\n  url: postgresql://agentrt:hunter2@db:5432/agentrt\n",
    "inline Kafka password": ("kafka:\n  sasl:\n    enabled: true\n    existingSecret: k\n    password: hunter2\n"),
    "secret in the ConfigMap": "config:\n  relay:\n    kafka_sasl_password: hunter2\n",
    "inline secret env var": ("defaults:\n  extraEnv:\n    - name: AGENTRT_OPENAI_API_KEY\n      value: sk-123\n"),
    "SASL without a Secret": "kafka:\n  sasl:\n    enabled: true\n",
    "lease too short": "config:\n  scheduler:\n    lease_duration_ms: 10\n",
    "unknown migration mode": "migrations:\n  mode: sometimes\n",
    "probe handler override": "defaults:\n  livenessProbe:\n    exec:\n      command: [true]\n",
    "agent file the executor skips": "executor:\n  agents:\n    definitions:\n      hello: 'format: 1'\n",
    "agent module with a dash": "executor:\n  agents:\n    modules: [my-agents]\n",
    "agents ConfigMap under its old key": "executor:\n  agents:\n    configMap: my-agents\n",
    "unknown auth mode": "auth:\n  mode: basic\n",
    "auth modes in the other order": "auth:\n  mode: jwt,api_key\n",
    "JWT without issuer and audience": "auth:\n  mode: jwt\n  jwt:\n    jwksUrl: https://idp.example.com/jwks\n",
    "JWKS URL that is no URL": "auth:\n  jwt:\n    jwksUrl: idp.example.com/jwks\n",
    "unknown JWT algorithm": "auth:\n  jwt:\n    algorithms: [HS256]\n",
    "inline executor API key": "auth:\n  executorApiKey:\n    key: ak_123\n",
    "TLS enabled as a word": "tls:\n  enabled: 'yes'\n",
    "mutual TLS without TLS": "tls:\n  enabled: false\n  mutual:\n    enabled: true\n",
    "cert-manager without an issuer": "tls:\n  certManager:\n    enabled: true\n",
    "cert-manager issuer of an unknown kind": ("tls:\n  certManager:\n    enabled: true\n    issuerRef:\n"
                                              "      name: ca\n      kind: Vault\n"),
    "certificate duration in days": "tls:\n  certManager:\n    duration: 90d\n",
    "inline TLS key": "tls:\n  key: '-----BEGIN PRIVATE KEY-----'\n",
    "unknown log format": "config:\n  common:\n    log_format: yaml\n",
    "unknown trace exporter": "config:\n  common:\n    otel_exporter: jaeger\n",
}


@pytest.mark.parametrize("bad", sorted(BAD_VALUES))
def test_schema_rejects_bad_values_file(bad: str, chart: helm.Chart, tmp_path: Path) -> None:
    values_file = tmp_path / "bad-values.yaml"
    values_file.write_text(BAD_VALUES[bad])
    values = helm.values_from_yaml(values_file.read_text())
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmError):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    report = helm.lint(CHART_DIR, values, strict=True)
    assert [m for m in report["messages"] if m["severity"] == 3] or report["errors"]


def test_schema_accepts_every_ci_values_file(chart: helm.Chart) -> None:
    chart.validate_schema(None)
    for case in CASES:
        chart.validate_schema(load_case_values(case))


# --- Lease and grace period ---------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_grace_period_outlasts_the_lease(case: str, renders: Renders) -> None:
    r = renders(case)
    lease_ms = r.values["config"]["scheduler"]["lease_duration_ms"]
    for component, dep in r.deployments().items():
        grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace * 1000 > lease_ms, f"{component}: {grace}s <= lease {lease_ms}ms"


def test_grace_period_is_derived_from_the_lease(chart: helm.Chart, renders: Renders) -> None:
    for dep in renders("defaults").deployments().values():
        assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45
    longer = render(chart, {"config": {"scheduler": {"lease_duration_ms": 120_500}}})
    for dep in longer.deployments().values():
        assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 121 + 15
    prod = renders("production-values").deployments()
    assert prod["executor"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 300
    assert prod["scheduler"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 90


def test_grace_period_not_longer_than_the_lease_is_refused(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match="terminationGracePeriodSeconds"):
        render(chart, {"executor": {"terminationGracePeriodSeconds": 30}})


# --- Configuration and roll-outs ----------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_config_map_feeds_every_component(case: str, renders: Renders) -> None:
    r = renders(case)
    cm = r.named("ConfigMap", f"{fullname(r.values)}-config")
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert set(config) == {"common", "scheduler", "executor", "relay"}
    for section in config.values():
        assert not [k for k in section if SECRETISH.search(k) and k not in NOT_SECRETS], section
    assert config["common"]["metrics_addr"] == "0.0.0.0:9464"
    assert config["scheduler"]["listen_addr"] == "0.0.0.0:50051"
    assert config["executor"]["health_addr"] == "0.0.0.0:50052"
    assert config["relay"]["health_addr"] == "0.0.0.0:50053"
    assert config["relay"]["kafka_bootstrap"] == r.values["kafka"]["bootstrapServers"]
    for dep in r.deployments().values():
        pod = dep["spec"]["template"]["spec"]
        (config_volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
        assert config_volume["configMap"]["name"] == cm["metadata"]["name"]


def test_logs_are_json_lines_by_default_and_text_on_request(chart: helm.Chart, renders: Renders) -> None:
    """config.common.log_format reaches every component (the ConfigMap) and the migrations (env)."""
    for values, expected in ((None, "json"), ({"config": {"common": {"log_format": "text"}}}, "text")):
        r = render(chart, values) if values else renders("defaults")
        config = yaml.safe_load(r.named("ConfigMap", f"{fullname(r.values)}-config")["data"]["config.yaml"])
        assert config["common"]["log_format"] == expected
        for job in migrate_jobs(r):
            [container] = containers(job["spec"]["template"]["spec"])
            assert env_of(container)["AGENTRT_LOG_FORMAT"]["value"] == expected


def test_executors_dial_the_scheduler_service(renders: Renders) -> None:
    r = renders("defaults")
    config = yaml.safe_load(r.named("ConfigMap", f"{RELEASE}-agentrt-config")["data"]["config.yaml"])
    svc = r.named("Service", f"{RELEASE}-agentrt-scheduler")
    (grpc,) = [p for p in svc["spec"]["ports"] if p["name"] == "grpc"]
    assert config["executor"]["scheduler_addr"] == f"{RELEASE}-agentrt-scheduler.{NAMESPACE}.svc:{grpc['port']}"
    assert grpc["targetPort"] == "grpc"
    assert svc["spec"]["selector"] == r.deployment("scheduler")["spec"]["selector"]["matchLabels"]
    remote = renders("executors-only-values")
    config = yaml.safe_load(remote.named("ConfigMap", f"{RELEASE}-agentrt-config")["data"]["config.yaml"])
    assert config["executor"]["scheduler_addr"] == "agentrt-scheduler.agentrt-core.svc:50051"
    assert not remote.of_kind("Service")


def checksums(r: Rendered) -> set[str]:
    return {d["spec"]["template"]["metadata"]["annotations"]["checksum/config"] for d in r.deployments().values()}


def test_checksum_config_rolls_pods_when_config_changes(chart: helm.Chart, renders: Renders) -> None:
    base = checksums(renders("defaults"))
    assert len(base) == 1, "every component reads the same ConfigMap"
    changed = checksums(render(chart, {"config": {"common": {"log_level": "DEBUG"}}}))
    assert len(changed) == 1 and changed != base
    bootstrap = checksums(render(chart, {"kafka": {"bootstrapServers": "other:9092"}}))
    assert bootstrap != base
    unrelated = checksums(render(chart, {"scheduler": {"replicas": 5}}))
    assert unrelated == base


def test_selectors_match_pod_labels(renders: Renders) -> None:
    for case in CASES:
        for dep in renders(case).deployments().values():
            selector = dep["spec"]["selector"]["matchLabels"]
            labels = dep["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= labels.items()
            assert "app.kubernetes.io/version" not in selector


def test_component_values_fall_back_to_defaults(renders: Renders) -> None:
    prod = renders("production-values").deployments()
    spec = {c: d["spec"]["template"]["spec"] for c, d in prod.items()}
    # executor.resources sets limits only: the requests come from the executor's own
    # defaults in values.yaml, the limits from the production file
    executor_resources = spec["executor"]["containers"][0]["resources"]
    assert executor_resources["limits"] == {"memory": "4Gi"}
    assert executor_resources["requests"]["memory"] == "512Mi"
    scheduler_resources = spec["scheduler"]["containers"][0]["resources"]
    assert scheduler_resources["requests"] == {"cpu": "500m", "memory": "512Mi"}
    assert scheduler_resources["limits"] == {"memory": "512Mi"}  # from defaults
    for s in spec.values():  # defaults.topologySpreadConstraints reaches every component
        assert s["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert prod["scheduler"]["spec"]["replicas"] == 3
    assert prod["relay"]["spec"]["replicas"] == 2


# --- Scaling and availability ------------------------------------------------------------


def test_hpa_scales_executors(renders: Renders) -> None:
    assert not renders("defaults").of_kind("HorizontalPodAutoscaler")
    r = renders("production-values")
    (hpa,) = r.of_kind("HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    executor = r.deployment("executor")
    assert (target["kind"], target["name"]) == ("Deployment", executor["metadata"]["name"])
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 30)
    assert {m["resource"]["name"] for m in hpa["spec"]["metrics"]} == {"cpu", "memory"}
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 60
    # the HPA owns the executor's replica count
    assert "replicas" not in executor["spec"]
    assert "replicas" in r.deployment("scheduler")["spec"]


def test_pdb_only_when_enabled(renders: Renders) -> None:
    assert not renders("defaults").of_kind("PodDisruptionBudget")
    prod = renders("production-values")
    pdbs = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in prod.of_kind("PodDisruptionBudget")}
    assert set(pdbs) == set(COMPONENTS)
    assert pdbs["scheduler"]["spec"]["minAvailable"] == 2
    assert "maxUnavailable" not in pdbs["scheduler"]["spec"]
    assert pdbs["executor"]["spec"]["maxUnavailable"] == 1
    for component, pdb in pdbs.items():
        assert pdb["spec"]["selector"]["matchLabels"] == prod.deployment(component)["spec"]["selector"]["matchLabels"]
    only = renders("executors-only-values")
    (pdb,) = only.of_kind("PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 2
    assert set(only.deployments()) == {"executor"}


# --- NetworkPolicies ----------------------------------------------------------------------


def policies(r: Rendered) -> dict[str, dict[str, Any]]:
    return {
        p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: p for p in r.of_kind("NetworkPolicy")
    }


def egress_ports(policy: dict[str, Any]) -> set[int]:
    return {p["port"] for rule in policy["spec"]["egress"] for p in rule.get("ports", [])}


@pytest.mark.parametrize("case", CASES)
def test_network_policy_per_component_when_enabled(case: str, renders: Renders) -> None:
    r = renders(case)
    nps = policies(r)
    if not r.values["networkPolicy"]["enabled"]:
        assert not nps
        return
    assert set(nps) == set(r.deployments())
    for component, np in nps.items():
        assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
        assert np["spec"]["podSelector"]["matchLabels"] == r.deployment(component)["spec"]["selector"]["matchLabels"]


def test_network_policies_limit_each_component(renders: Renders) -> None:
    r = renders("defaults")
    nps = policies(r)
    scheduler_labels = r.deployment("scheduler")["spec"]["selector"]["matchLabels"]
    executor_labels = r.deployment("executor")["spec"]["selector"]["matchLabels"]

    # executors: DNS, the scheduler's pods on its gRPC port, and their tools' egress (HTTPS)
    executor_egress = nps["executor"]["spec"]["egress"]
    to_scheduler = [
        rule
        for rule in executor_egress
        if any(peer.get("podSelector", {}).get("matchLabels") == scheduler_labels for peer in rule.get("to", []))
    ]
    assert to_scheduler and {p["port"] for p in to_scheduler[0]["ports"]} == {50051}
    assert egress_ports(nps["executor"]) == {53, 50051, 443}
    assert 5432 not in egress_ports(nps["executor"])

    # the scheduler reaches PostgreSQL, not Kafka; executors may call it
    assert egress_ports(nps["scheduler"]) == {53, 5432}
    scheduler_ingress = nps["scheduler"]["spec"]["ingress"]
    assert any(
        peer.get("podSelector", {}).get("matchLabels") == executor_labels
        for rule in scheduler_ingress
        for peer in rule["from"]
    )

    # the relay reaches PostgreSQL and Kafka
    assert egress_ports(nps["relay"]) == {53, 5432, 9092}

    prod = policies(renders("production-values"))
    assert egress_ports(prod["relay"]) == {53, 5432, 9096}
    (pg_rule,) = [rule for rule in prod["relay"]["spec"]["egress"] if rule["ports"][0]["port"] == 5432]
    assert pg_rule["to"] == [{"ipBlock": {"cidr": "10.20.0.0/24"}}]

    tight = policies(renders("init-container-values"))
    assert egress_ports(tight["executor"]) == {50051}
    assert tight["relay"]["spec"]["ingress"] == []


# --- Agents ---------------------------------------------------------------------------------

AGENTS_DIR = "/etc/agentrt/agents"
NO_AGENTS = "executor.agents: the executors have no agents"


def executor_config(r: Rendered) -> dict[str, Any]:
    config = yaml.safe_load(r.named("ConfigMap", f"{fullname(r.values)}-config")["data"]["config.yaml"])
    return dict(config["executor"])


def agents_volume(r: Rendered) -> dict[str, Any] | None:
    """The executor's agents volume, after checking that it is mounted (read-only) at the agents path."""
    pod = r.deployment("executor")["spec"]["template"]["spec"]
    volumes = [v for v in pod["volumes"] if v["name"] == "agents"]
    mounts = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "agents"]
    if not volumes:
        assert not mounts
        return None
    (mount,) = mounts
    assert mount == {"name": "agents", "mountPath": AGENTS_DIR, "readOnly": True}
    (volume,) = volumes
    return dict(volume)


def load_agents(configmap: dict[str, Any], where: Path) -> list[Any]:
    """Every definition of a rendered ConfigMap, parsed as the executor parses it, then loaded as it loads the
    mounted directory."""
    from executor.agents import AgentCatalog, parse_definition

    parsed = [parse_definition(yaml.safe_load(text), name) for name, text in configmap["data"].items()]
    where.mkdir()
    for name, text in configmap["data"].items():
        (where / name).write_text(text)
    catalog = AgentCatalog.load(str(where))
    assert catalog.names() == sorted(d.name for d in parsed)
    return parsed


def test_default_executors_serve_the_starter_agent_from_the_charts_configmap(renders: Renders,
                                                                             tmp_path: Path) -> None:
    r = renders("defaults")
    assert executor_config(r)["agents_path"] == AGENTS_DIR
    volume = agents_volume(r)
    assert volume == {"name": "agents", "configMap": {"name": f"{RELEASE}-agentrt-agents"}}
    configmap = r.named("ConfigMap", f"{RELEASE}-agentrt-agents")
    assert set(configmap["data"]) == {"hello.yaml"}
    (hello,) = load_agents(configmap, tmp_path / "agents")
    assert (hello.name, hello.version, hello.tools) == ("hello", "1", [])
    assert [node.id for node in hello.decider.plan] == ["pause", "done"]
    executor = r.deployment("executor")["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/agents" in executor
    assert "checksum/agents" not in r.deployment("scheduler")["spec"]["template"]["metadata"]["annotations"]
    assert "agentrt runs submit hello" in r.notes


def test_inline_definitions_merge_with_the_default_and_roll_the_executors(chart: helm.Chart, renders: Renders,
                                                                          tmp_path: Path) -> None:
    demo = (ROOT / "devstack" / "agents" / "after_sales_return.yaml").read_text()
    as_mapping = {"format": 1, "name": "noop", "version": "2", "decider": {"kind": "scripted", "plan": [
        {"id": "done", "finish": None}]}}
    r = render(chart, {"executor": {"agents": {"definitions": {"after_sales_return.yaml": demo,
                                                                "noop.yaml": as_mapping}}}})
    configmap = r.named("ConfigMap", f"{RELEASE}-agentrt-agents")
    assert set(configmap["data"]) == {"hello.yaml", "after_sales_return.yaml", "noop.yaml"}
    assert {d.name for d in load_agents(configmap, tmp_path / "agents")} == {"hello", "after_sales_return", "noop"}
    for doc in r.docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)

    def annotations(rendered: Rendered) -> dict[str, str]:
        return dict(rendered.deployment("executor")["spec"]["template"]["metadata"]["annotations"])

    default = annotations(renders("defaults"))
    changed = annotations(r)
    assert changed["checksum/agents"] != default["checksum/agents"]
    assert changed["checksum/config"] == default["checksum/config"]

    only = render(chart, {"executor": {"agents": {"definitions": {"hello.yaml": None, "noop.yaml": as_mapping}}}})
    assert set(only.named("ConfigMap", f"{RELEASE}-agentrt-agents")["data"]) == {"noop.yaml"}


def test_an_existing_configmap_is_mounted_instead(renders: Renders) -> None:
    r = renders("production-values")
    assert r.values["executor"]["agents"]["existingConfigMap"] == "prod-agent-definitions"
    assert executor_config(r)["agents_path"] == AGENTS_DIR
    assert agents_volume(r) == {"name": "agents", "configMap": {"name": "prod-agent-definitions"}}
    assert not [d for d in r.of_kind("ConfigMap") if d["metadata"]["name"].endswith("-agents")]
    assert "checksum/agents" not in r.deployment("executor")["spec"]["template"]["metadata"]["annotations"]
    assert 'ConfigMap "prod-agent-definitions"' in r.notes


def test_modules_of_code_first_agents_become_the_agents_setting(chart: helm.Chart) -> None:
    r = render(chart, {"image": {"repository": "registry.example.com/my-agents"},
                       "executor": {"agents": {"modules": ["mypkg.agents", "other.agents"]}}})
    assert executor_config(r)["agents_path"] == "mypkg.agents,other.agents"
    assert agents_volume(r) is None
    assert not [d for d in r.of_kind("ConfigMap") if d["metadata"]["name"].endswith("-agents")]
    assert "mypkg.agents, other.agents" in r.notes
    for doc in r.docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("agents", [
    {"definitions": None},
    {"definitions": {"hello.yaml": None}},
    {"definitions": None, "existingConfigMap": "", "modules": []},
])
def test_executors_without_agents_are_refused_at_render_time(agents: dict[str, Any], chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(NO_AGENTS)) as refused:
        render(chart, {"executor": {"agents": agents}})
    for way in ("executor.agents.definitions", "executor.agents.existingConfigMap", "executor.agents.modules"):
        assert way in str(refused.value)


def test_a_configmap_and_modules_combine_and_no_executors_need_no_agents(chart: helm.Chart) -> None:
    both = render(chart, {"executor": {"agents": {"existingConfigMap": "mine", "modules": ["mypkg.agents"]}}})
    assert executor_config(both)["agents_path"] == f"{AGENTS_DIR},mypkg.agents"
    assert agents_volume(both) == {"name": "agents", "configMap": {"name": "mine"}}
    assert not [d for d in both.of_kind("ConfigMap") if d["metadata"]["name"].endswith("-agents")]
    with pytest.raises(helm.HelmRenderError, match=re.escape("name it .yaml")):
        render(chart, {"executor": {"agents": {"definitions": {"x.toml": {"name": "x"}}}}})
    # no executors here: nothing needs agents
    r = render(chart, {"executor": {"enabled": False, "agents": {"definitions": None}}})
    assert set(r.deployments()) == {"scheduler", "relay"}
    assert "agents_path" not in executor_config(r)


# --- NOTES --------------------------------------------------------------------------------


def test_notes_say_how_to_reach_the_api_and_check_health(renders: Renders) -> None:
    notes = renders("defaults").notes
    assert f"port-forward svc/{RELEASE}-agentrt-scheduler 50051:50051" in notes
    assert "grpc.health.v1.Health/Check" in notes
    assert f"{RELEASE}-agentrt-scheduler.{NAMESPACE}.svc:50051" in notes
    assert "executor.replicas" in notes


# --- README -------------------------------------------------------------------------------


def test_readme_install_command_renders(chart: helm.Chart) -> None:
    """The README's `helm install` command, with its --set values, installs a valid release."""
    readme = (CHART_DIR / "README.md").read_text()
    for heading in ("## Install", "### Prerequisites", "PostgreSQL 15+", "Kafka", "### Scaling executors"):
        assert heading in readme
    assert "### Upgrading" in readme
    block = re.search(r"```bash\n(helm install [^`]*?)```", readme)
    assert block, "no helm install command in the README"
    command = block.group(1).replace("\\\n", " ")
    values: dict[str, Any] = {}
    for expression in re.findall(r"--set (\S+)", command):
        expression = expression.replace("'", "")  # the shell strips the quotes
        _deep_update(values, helm.parse_set_string(expression))
    for required in ("image", "database", "kafka"):
        assert required in values, f"the install command does not set {required}"
    r = render(chart, values)
    assert r.values["kafka"]["bootstrapServers"].count(",") >= 1
    for doc in r.docs:
        if doc["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def _deep_update(target: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _deep_update(target[key], value)
        else:
            target[key] = value


@pytest.mark.parametrize("case", CASES)
def test_config_file_keys_are_real_settings(case: str, renders: Renders) -> None:
    """Unknown keys in the config file would be ignored silently: every key the chart writes must exist."""
    from executor.config import ExecutorSettings
    from relay.config import RelaySettings
    from scheduler.config import SchedulerSettings
    from shared.config import ComponentSettings

    classes = {"common": ComponentSettings, "scheduler": SchedulerSettings, "executor": ExecutorSettings,
               "relay": RelaySettings}
    configmaps = [d for d in renders(case).of_kind("ConfigMap") if "config.yaml" in d.get("data", {})]
    assert configmaps, "the chart renders the application config file"
    config = yaml.safe_load(configmaps[0]["data"]["config.yaml"])
    for section, keys in config.items():
        assert section in classes, f"unknown config section {section!r}"
        unknown = sorted(set(keys) - set(classes[section].model_fields))
        assert not unknown, f"{case}: section {section!r} sets keys no setting reads: {unknown}"


def test_executor_token_reaches_scheduler_and_executors_only_from_a_secret(renders: Renders) -> None:
    r = renders("production-values")
    for component, deployment in r.deployments().items():
        env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
        if component in ("scheduler", "executor"):
            ref = env["AGENTRT_WORK_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "prod-executor-token", "key": "token"}
        else:
            assert "AGENTRT_WORK_TOKEN" not in env
    # By default (auth on, no mutual TLS) WorkService is never open: the token comes from
    # "<fullname>-executor-token"; with auth.mode none and no Secret named, there is none.
    for component, deployment in renders("defaults").deployments().items():
        env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
        if component in ("scheduler", "executor"):
            assert env["AGENTRT_WORK_TOKEN"]["valueFrom"]["secretKeyRef"]["name"].endswith("-executor-token")
        else:
            assert "AGENTRT_WORK_TOKEN" not in env
    assert all("AGENTRT_WORK_TOKEN" not in env_of(d["spec"]["template"]["spec"]["containers"][0])
               for d in renders("plaintext-dev-values").deployments().values())


# --- TLS and authentication ---------------------------------------------------------------

TLS_DIR = "/etc/agentrt/tls"
CERT_MANAGER = {"enabled": True, "issuerRef": {"name": "internal-ca"}}
# Settings that name files, by the component that reads them.
FILE_SETTINGS = {
    "scheduler": ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "jwt_jwks_file"),
    "executor": ("scheduler_tls_ca_file", "scheduler_tls_cert_file", "scheduler_tls_key_file"),
}


def app_config(r: Rendered) -> dict[str, Any]:
    return dict(yaml.safe_load(r.named("ConfigMap", f"{fullname(r.values)}-config")["data"]["config.yaml"]))


def file_source(r: Rendered, component: str, path: str) -> tuple[dict[str, Any], str]:
    """The volume a component's file comes from and its key there, after checking that the file is
    really there: its directory is a read-only mount of a whole volume (no subPath, so that a renewed
    certificate reaches the running pod) and the volume projects that file."""
    pod = r.deployment(component)["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    directory, name = path.rsplit("/", 1)
    mounts = [m for m in c["volumeMounts"] if m["mountPath"] == directory]
    assert len(mounts) == 1, f"{component}: {directory} (of {path}) is not mounted"
    (mount,) = mounts
    assert "subPath" not in mount and "subPathExpr" not in mount, f"{component}: {directory} is a subPath mount"
    assert mount["readOnly"] is True, mount
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    source = volume.get("secret") or volume.get("configMap")
    assert source is not None, volume
    items = source.get("items")
    if items is None:
        return volume, name
    found = [i for i in items if i["path"] == name]
    assert len(found) == 1, f"{component}: volume {volume['name']} does not project {name}"
    return volume, str(found[0]["key"])


def secret_of(volume: dict[str, Any]) -> str:
    return str(volume["secret"]["secretName"])


def certificates(r: Rendered) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["labels"]["app.kubernetes.io/component"]: c for c in r.of_kind("Certificate")}


@pytest.mark.parametrize("case", CASES)
def test_every_file_setting_points_into_a_mounted_volume(case: str, renders: Renders) -> None:
    r = renders(case)
    config = app_config(r)
    deployments = r.deployments()
    for component, keys in FILE_SETTINGS.items():
        if component in deployments:
            for key in keys:
                if key in config[component]:
                    file_source(r, component, config[component][key])
    # no Secret is mounted with subPath anywhere: the kubelet would never update the file
    for where, pod in pod_specs(r):
        secret_volumes = {v["name"] for v in pod.get("volumes", []) if "secret" in v}
        for c in containers(pod):
            for m in c.get("volumeMounts", []):
                if m["name"] in secret_volumes:
                    assert "subPath" not in m, f"{where}/{c['name']}: Secret volume {m['name']} mounted with subPath"


def test_default_render_serves_tls_from_the_default_secret(renders: Renders) -> None:
    r = renders("defaults")
    assert r.values["tls"]["enabled"] is True
    config = app_config(r)
    scheduler, executor = config["scheduler"], config["executor"]
    secret = f"{RELEASE}-agentrt-scheduler-tls"
    assert scheduler["tls_cert_file"] == f"{TLS_DIR}/tls.crt"
    assert scheduler["tls_key_file"] == f"{TLS_DIR}/tls.key"
    for setting, key in (("tls_cert_file", "tls.crt"), ("tls_key_file", "tls.key")):
        volume, item = file_source(r, "scheduler", scheduler[setting])
        assert (secret_of(volume), item) == (secret, key)
    assert not {"tls_client_ca_file", "work_client_identities"} & set(scheduler)
    # the executors trust the CA of that Secret, and get nothing else of it (never the scheduler's key)
    volume, item = file_source(r, "executor", executor["scheduler_tls_ca_file"])
    assert (secret_of(volume), item) == (secret, "ca.crt")
    assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert not {"scheduler_insecure", "scheduler_tls_cert_file", "scheduler_tls_server_name"} & set(executor)
    assert not [v for v in r.deployment("relay")["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert not r.of_kind("Certificate")
    assert f'Secret "{secret}"' in r.notes and "wait until it exists" in r.notes
    assert scheduler["auth_mode"] == "api_key"


def test_cert_manager_issues_the_schedulers_certificate(chart: helm.Chart) -> None:
    r = render(chart, {"tls": {"certManager": CERT_MANAGER}})
    (cert,) = r.of_kind("Certificate")
    validate_certificate(cert)
    spec = cert["spec"]
    svc = f"{RELEASE}-agentrt-scheduler"
    assert r.named("Service", svc)
    assert spec["dnsNames"] == [svc, f"{svc}.{NAMESPACE}", f"{svc}.{NAMESPACE}.svc",
                                f"{svc}.{NAMESPACE}.svc.cluster.local"]
    assert spec["secretName"] == f"{RELEASE}-agentrt-scheduler-tls"
    assert spec["issuerRef"] == {"name": "internal-ca", "kind": "Issuer", "group": "cert-manager.io"}
    assert (spec["duration"], spec["renewBefore"]) == ("2160h", "360h")
    assert "server auth" in spec["usages"] and "client auth" not in spec["usages"]
    assert spec["privateKey"] == {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"}
    config = app_config(r)
    # the name the executors dial is one the certificate carries
    assert config["executor"]["scheduler_addr"].rsplit(":", 1)[0] in spec["dnsNames"]
    volume, _ = file_source(r, "scheduler", config["scheduler"]["tls_cert_file"])
    assert secret_of(volume) == spec["secretName"]
    volume, item = file_source(r, "executor", config["executor"]["scheduler_tls_ca_file"])
    assert (secret_of(volume), item) == (spec["secretName"], "ca.crt")
    assert f'Certificate "{cert["metadata"]["name"]}"' in r.notes
    for doc in r.docs:
        if doc["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)

    custom = render(chart, {"tls": {"certManager": {
        "enabled": True, "secretName": "agentrt-grpc-cert", "issuerRef": {"name": "corp", "kind": "ClusterIssuer"},
        "duration": "720h", "renewBefore": "240h", "clusterDomain": "corp.local",
        "extraDnsNames": ["agentrt.example.com"], "privateKey": {"algorithm": "RSA", "size": 3072}}}})
    (cert,) = custom.of_kind("Certificate")
    validate_certificate(cert)
    spec = cert["spec"]
    assert spec["secretName"] == "agentrt-grpc-cert"
    assert spec["issuerRef"] == {"name": "corp", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    assert spec["dnsNames"][-2:] == [f"{svc}.{NAMESPACE}.svc.corp.local", "agentrt.example.com"]
    assert (spec["duration"], spec["renewBefore"]) == ("720h", "240h")
    assert "key encipherment" in spec["usages"]  # an RSA key
    volume, _ = file_source(custom, "scheduler", app_config(custom)["scheduler"]["tls_key_file"])
    assert secret_of(volume) == "agentrt-grpc-cert"

    with pytest.raises(helm.HelmRenderError, match=re.escape("tls.existingSecret and tls.certManager")):
        render(chart, {"tls": {"existingSecret": "mine", "certManager": CERT_MANAGER}})
    # no scheduler here: no server certificate
    assert not render(chart, {"scheduler": {"enabled": False}, "tls": {"certManager": CERT_MANAGER}}).of_kind(
        "Certificate")


def test_mutual_tls_wires_client_ca_executor_certificate_and_identities(chart: helm.Chart,
                                                                         renders: Renders) -> None:
    r = render(chart, {"tls": {"certManager": CERT_MANAGER, "mutual": {"enabled": True}}})
    config = app_config(r)
    scheduler, executor = config["scheduler"], config["executor"]
    certs = certificates(r)
    assert set(certs) == {"scheduler", "executor"}
    for cert in certs.values():
        validate_certificate(cert)
    server, client = certs["scheduler"]["spec"], certs["executor"]["spec"]
    assert client["commonName"] == "executor" and client["dnsNames"] == ["executor"]
    assert "client auth" in client["usages"] and "server auth" not in client["usages"]
    assert client["issuerRef"] == server["issuerRef"]
    assert client["secretName"] == f"{RELEASE}-agentrt-executor-tls"
    # the scheduler requires client certificates from the CA that issued its own, and admits the
    # executors' identity on WorkService
    volume, item = file_source(r, "scheduler", scheduler["tls_client_ca_file"])
    assert (secret_of(volume), item) == (server["secretName"], "ca.crt")
    assert scheduler["work_client_identities"] == ["executor"]
    # the executors present the issued certificate
    for setting, key in (("scheduler_tls_cert_file", "tls.crt"), ("scheduler_tls_key_file", "tls.key")):
        volume, item = file_source(r, "executor", executor[setting])
        assert (secret_of(volume), item) == (client["secretName"], key)
    volume, _ = file_source(r, "executor", executor["scheduler_tls_ca_file"])
    assert secret_of(volume) == server["secretName"]
    assert "scheduler_insecure" not in executor
    assert "-cert client.crt -key client.key" in r.notes

    # without cert-manager: a client CA and an executor certificate of their own
    own = render(chart, {"tls": {"existingSecret": "sched-tls", "mutual": {
        "enabled": True, "clientCaSecret": "clients-ca", "clientCaKey": "bundle.pem",
        "executorSecret": "pool-a-tls", "executorIdentity": "pool-a"}}})
    assert not own.of_kind("Certificate")
    config = app_config(own)
    volume, item = file_source(own, "scheduler", config["scheduler"]["tls_client_ca_file"])
    assert (secret_of(volume), item) == ("clients-ca", "bundle.pem")
    volume, _ = file_source(own, "scheduler", config["scheduler"]["tls_cert_file"])
    assert secret_of(volume) == "sched-tls"
    assert config["scheduler"]["work_client_identities"] == ["pool-a"]
    volume, item = file_source(own, "executor", config["executor"]["scheduler_tls_cert_file"])
    assert (secret_of(volume), item) == ("pool-a-tls", "tls.crt")

    prod = renders("production-values")
    client = certificates(prod)["executor"]["spec"]
    assert client["commonName"] == "agentrt-executor"
    assert app_config(prod)["scheduler"]["work_client_identities"] == ["agentrt-executor"]
    # executors-only: the remote scheduler's CA and an existing client certificate
    remote = renders("executors-only-values")
    executor = app_config(remote)["executor"]
    volume, item = file_source(remote, "executor", executor["scheduler_tls_ca_file"])
    assert (secret_of(volume), item) == ("agentrt-core-ca", "ca.pem")
    volume, _ = file_source(remote, "executor", executor["scheduler_tls_key_file"])
    assert secret_of(volume) == "agentrt-core-executor-tls"
    assert not remote.of_kind("Certificate")

    with pytest.raises(helm.HelmRenderError, match=re.escape("tls.mutual.executorSecret")):
        render(chart, {"tls": {"mutual": {"enabled": True}}})


def test_tls_disabled_renders_plaintext_and_says_so(chart: helm.Chart, renders: Renders) -> None:
    r = renders("plaintext-dev-values")
    config = app_config(r)
    assert config["executor"]["scheduler_insecure"] is True
    assert not [k for k in config["scheduler"] if k.startswith("tls_") or k == "work_client_identities"]
    assert not [k for k in config["executor"] if k.startswith("scheduler_tls_")]
    assert not r.of_kind("Certificate")
    for _, pod in pod_specs(r):
        assert not [v for v in pod.get("volumes", []) if "secret" in v]
    assert "WARNING: tls.enabled is false" in r.notes and "PLAINTEXT" in r.notes
    assert "grpcurl -plaintext" in r.notes and "-cacert" not in r.notes
    # a credential sent in clear needs that flag; the chart never sets it with TLS on
    with_token = render(chart, {"tls": {"enabled": False}, "workToken": {"existingSecret": "token"}})
    assert app_config(with_token)["executor"]["scheduler_insecure"] is True
    assert "--insecure" in with_token.notes
    for case in CASES:
        other = renders(case)
        if other.values["tls"]["enabled"]:
            assert "scheduler_insecure" not in app_config(other)["executor"], case
            assert "tls.enabled is false" not in other.notes, case


def test_auth_mode_none_is_rendered_with_a_loud_warning(chart: helm.Chart, renders: Renders) -> None:
    r = renders("plaintext-dev-values")
    assert app_config(r)["scheduler"]["auth_mode"] == "none"
    assert "WARNING: auth.mode is none" in r.notes
    assert "agentrt keys create" not in r.notes
    with_tls = render(chart, {"auth": {"mode": "none"}})
    assert app_config(with_tls)["scheduler"]["auth_mode"] == "none"
    assert "WARNING: auth.mode is none" in with_tls.notes
    default = renders("defaults")
    assert app_config(default)["scheduler"]["auth_mode"] == "api_key"
    assert "WARNING" not in default.notes


def test_notes_show_how_to_create_the_first_admin_key(renders: Renders) -> None:
    notes = renders("defaults").notes
    assert (f"kubectl -n {NAMESPACE} exec deploy/{RELEASE}-agentrt-scheduler -- sh -c 'agentrt keys create "
            "--tenant T --role admin --name first-admin --database-url \"$AGENTRT_DATABASE_URL\"'") in notes
    assert "prints the key once" in notes


@pytest.mark.parametrize("case", CASES)
def test_notes_commands_parse_with_the_agentrt_cli(case: str, renders: Renders) -> None:
    """Every `agentrt …` command the release notes show (run locally, or in a pod through sh -c)
    is one the CLI accepts, flags included (TLS, credentials)."""
    import shlex

    from cli.main import build_parser

    r = renders(case)
    commands = []
    for line in r.notes.splitlines():
        text = line.strip()
        if " -- sh -c '" in text:
            words = shlex.split(text)
            commands.append(shlex.split(words[words.index("-c") + 1]))
        elif text.startswith("agentrt ") and line.startswith(" "):
            commands.append(shlex.split(text))
    assert bool(commands) == r.values["scheduler"]["enabled"]
    for argv in commands:
        assert argv[0] == "agentrt"
        args = build_parser().parse_args(argv[1:])
        assert callable(args.func), argv


def test_jwt_settings_from_a_jwks_url_or_a_configmap(chart: helm.Chart, renders: Renders) -> None:
    prod = renders("production-values")
    scheduler = app_config(prod)["scheduler"]
    jwt = prod.values["auth"]["jwt"]
    assert scheduler["auth_mode"] == "api_key,jwt"
    assert (scheduler["jwt_issuer"], scheduler["jwt_audience"], scheduler["jwt_jwks_url"]) == (
        jwt["issuer"], jwt["audience"], jwt["jwksUrl"])
    assert scheduler["jwt_algorithms"] == ["RS256"]
    assert (scheduler["jwt_tenant_claim"], scheduler["jwt_roles_claim"]) == ("agentrt_tenants", "realm_access.roles")
    assert scheduler["api_key_cache_ttl_ms"] == 5000
    assert "jwt_jwks_file" not in scheduler
    # the scheduler may reach the JWKS endpoint (its port, where networkPolicy.jwks.to says)
    nps = policies(prod)
    (rule,) = [rule for rule in nps["scheduler"]["spec"]["egress"] if {p["port"] for p in rule["ports"]} == {443}]
    assert rule["to"] == [{"ipBlock": {"cidr": "10.40.0.10/32"}}]
    other_port = render(chart, {"auth": {"mode": "jwt", "jwt": {
        "issuer": "https://idp", "audience": "agentrt", "jwksUrl": "https://idp.example.com:8443/keys"}}})
    assert egress_ports(policies(other_port)["scheduler"]) == {53, 5432, 8443}

    from_configmap = renders("init-container-values")
    scheduler = app_config(from_configmap)["scheduler"]
    assert scheduler["auth_mode"] == "jwt"
    volume, key = file_source(from_configmap, "scheduler", scheduler["jwt_jwks_file"])
    assert (volume["configMap"]["name"], key) == ("agentrt-jwks", "jwks.json")
    assert "jwt_jwks_url" not in scheduler
    assert egress_ports(policies(from_configmap)["scheduler"]) == {5432}

    default = renders("defaults")
    assert not [k for k in app_config(default)["scheduler"] if k.startswith("jwt_") or k == "api_key_cache_ttl_ms"]
    scheduler_pod = default.deployment("scheduler")["spec"]["template"]["spec"]
    assert not [v for v in scheduler_pod["volumes"] if v["name"] == "jwks"]

    for sources in ({}, {"jwksUrl": "https://idp/keys", "jwksConfigMap": "keys"}):
        with pytest.raises(helm.HelmRenderError, match=re.escape("auth.jwt.jwksUrl")):
            render(chart, {"auth": {"mode": "jwt", "jwt": {"issuer": "https://idp", "audience": "a", **sources}}})


def test_executor_reconciler_key_comes_from_its_secret(renders: Renders) -> None:
    prod = renders("production-values").deployments()
    env = {c: env_of(d["spec"]["template"]["spec"]["containers"][0]) for c, d in prod.items()}
    assert env["executor"]["AGENTRT_RUN_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "prod-reconciler-key", "key": "key"}
    assert "AGENTRT_RUN_API_KEY" not in env["scheduler"] and "AGENTRT_RUN_API_KEY" not in env["relay"]
    assert app_config(renders("production-values"))["executor"]["reconcile_tenants"] == ["acme", "globex"]
    for case in CASES:
        if not renders(case).values["auth"]["executorApiKey"]["existingSecret"]:
            for d in renders(case).deployments().values():
                assert "AGENTRT_RUN_API_KEY" not in env_of(d["spec"]["template"]["spec"]["containers"][0])


@pytest.mark.parametrize(("section", "key", "value"), [
    ("scheduler", "auth_mode", "none"),
    ("scheduler", "tls_cert_file", "/elsewhere/tls.crt"),
    ("scheduler", "work_client_identities", ["anyone"]),
    ("executor", "scheduler_insecure", True),
    ("executor", "scheduler_tls_ca_file", "/elsewhere/ca.crt"),
])
def test_security_settings_are_set_only_through_their_values(section: str, key: str, value: Any,
                                                              chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(f"config.{section}.{key}")):
        render(chart, {"config": {section: {key: value}}})


def load_pod_settings(r: Rendered, component: str, where: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The component's settings as its pod's process builds them: the rendered config file, and its
    container's env (each secretKeyRef standing for a Secret's value); the settings' own checks run."""
    import os

    from executor.config import ExecutorSettings
    from scheduler.config import SchedulerSettings

    config_file = where / f"{component}-config.yaml"
    config_file.write_text(r.named("ConfigMap", f"{fullname(r.values)}-config")["data"]["config.yaml"])
    (c,) = r.deployment(component)["spec"]["template"]["spec"]["containers"]
    for name in list(os.environ):
        if name.startswith("AGENTRT_"):
            monkeypatch.delenv(name)
    for e in c["env"]:
        if e["name"] == "AGENTRT_CONFIG_FILE":
            monkeypatch.setenv(e["name"], str(config_file))
        elif "value" in e:
            monkeypatch.setenv(e["name"], e["value"])
        else:
            monkeypatch.setenv(e["name"], f"from-secret-{e['valueFrom']['secretKeyRef']['name']}")
    cls = {"scheduler": SchedulerSettings, "executor": ExecutorSettings}[component]
    return cls()


@pytest.mark.parametrize("case", CASES)
def test_components_accept_the_settings_the_chart_renders(case: str, renders: Renders, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    r = renders(case)
    tls = r.values["tls"]
    deployments = r.deployments()
    if "scheduler" in deployments:
        scheduler = load_pod_settings(r, "scheduler", tmp_path, monkeypatch)
        assert scheduler.auth_mode == r.values["auth"]["mode"]
        server_tls = scheduler.server_tls
        assert (server_tls is not None) == tls["enabled"]
        if server_tls is not None:
            assert (server_tls.client_ca_file is not None) == tls["mutual"]["enabled"]
    if "executor" in deployments:
        executor = load_pod_settings(r, "executor", tmp_path, monkeypatch)
        client_tls = executor.scheduler_tls
        assert (client_tls is not None) == tls["enabled"]
        assert executor.scheduler_insecure == (not tls["enabled"])
        if client_tls is not None:
            assert (client_tls.cert_file is not None) == tls["mutual"]["enabled"]


def test_plaintext_with_a_credential_is_accepted_only_because_the_chart_says_so(
        chart: helm.Chart, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = render(chart, {"tls": {"enabled": False}, "workToken": {"existingSecret": "token"}})
    executor = load_pod_settings(r, "executor", tmp_path, monkeypatch)
    assert executor.work_token is not None and executor.scheduler_tls is None and executor.scheduler_insecure
    # the same pod without the chart's explicit scheduler_insecure is refused by the executor
    config = app_config(r)
    del config["executor"]["scheduler_insecure"]
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("AGENTRT_CONFIG_FILE", str(edited))
    from executor.config import ExecutorSettings

    with pytest.raises(ValueError, match="in clear"):
        ExecutorSettings()


def _issue(subject: str, dns_names: list[str], usage: Any,
           ca: tuple[Any, Any] | None = None) -> tuple[bytes, bytes, Any]:
    """A PEM certificate and key (signed by `ca`, else a self-signed CA), as a cert-manager CA issuer would."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1)))
    if ca is None:
        builder = builder.issuer_name(name).add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        signer = key
    else:
        ca_cert, signer = ca
        builder = (builder.issuer_name(ca_cert.subject)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), False))
        if dns_names:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), False)
    cert = builder.sign(signer, hashes.SHA256())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem, (cert, key)


def test_the_probes_and_certificates_work_against_a_real_mutual_tls_port(chart: helm.Chart, tmp_path: Path) -> None:
    """With the files laid out as the chart mounts them (certificates issued for the names the
    rendered Certificates ask for), a gRPC server on the scheduler's credentials: kubelet's plaintext
    gRPC probe would fail on it (hence tcpSocket), a TCP connect succeeds without any certificate, and
    an executor configured by the chart (CA, client certificate, the host it dials) gets SERVING."""
    import asyncio
    import socket

    import grpc
    from cryptography.x509.oid import ExtendedKeyUsageOID
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    from shared.transport import ClientTls, ServerTls, open_channel, server_credentials

    r = render(chart, {"tls": {"certManager": CERT_MANAGER, "mutual": {"enabled": True}}})
    config = app_config(r)
    certs = certificates(r)
    root = tmp_path / "pod"

    def place(path: str, data: bytes) -> str:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return str(target)

    ca_pem, _, ca = _issue("agentrt test CA", [], None)
    server = certs["scheduler"]["spec"]
    server_pem, server_key, _ = _issue(server["dnsNames"][0], server["dnsNames"], ExtendedKeyUsageOID.SERVER_AUTH, ca)
    client = certs["executor"]["spec"]
    client_pem, client_key, _ = _issue(client["commonName"], client.get("dnsNames", []),
                                       ExtendedKeyUsageOID.CLIENT_AUTH, ca)
    s, e = config["scheduler"], config["executor"]
    server_tls = ServerTls(place(s["tls_cert_file"], server_pem), place(s["tls_key_file"], server_key),
                           place(s["tls_client_ca_file"], ca_pem))
    host = e["scheduler_addr"].rsplit(":", 1)[0]
    executor_tls = ClientTls(place(e["scheduler_tls_ca_file"], ca_pem), place(e["scheduler_tls_cert_file"], client_pem),
                             place(e["scheduler_tls_key_file"], client_key), server_name=host)

    async def scenario() -> None:
        srv = grpc.aio.server()
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, srv)
        port = srv.add_secure_port("127.0.0.1:0", server_credentials(server_tls))
        await srv.start()
        await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        addr = f"127.0.0.1:{port}"
        try:
            async def check(tls: ClientTls | None) -> Any:
                async with open_channel(addr, tls) as channel:
                    return await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)

            with pytest.raises(grpc.aio.AioRpcError):  # what kubelet's native gRPC probe does: plaintext
                await check(None)
            with socket.create_connection(("127.0.0.1", port), timeout=3):  # the tcpSocket probe
                pass
            assert (await check(executor_tls)).status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError):  # mutual TLS: no client certificate, no call
                await check(ClientTls(executor_tls.ca_file, server_name=host))
        finally:
            await srv.stop(None)

    asyncio.run(scenario())
