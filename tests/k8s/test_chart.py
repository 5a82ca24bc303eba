"""charts/serving on the real test control plane, and its dashboards against a real Prometheus.

The chart is linted, rendered and validated by the API server of the pinned Kubernetes (server-side
dry run, strict field validation, the Prometheus operator's own ServiceMonitor/PodMonitor CRDs);
values that break values.schema.json are refused. `helm install serving charts/serving` then runs
for real: the local kubelet starts the operator from the chart's pod spec with a token of the
chart's ServiceAccount, so a tiny experiment going to Succeeded proves the RBAC is enough, and
`kubectl auth can-i` proves it is no more. `helm test`, `helm upgrade` and `helm uninstall` follow.
Every PromQL expression of every dashboard is evaluated against the Prometheus that scraped that
run's TorchServe, the DCGM-format exporter and the operator.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, sweep, wait_finished
from clusterenv.kubelet import LocalKubelet
from clusterenv.monitoring import DcgmExporter, Prometheus, grafana_expression, panel_queries
from servinglab import servers
from servinglab.api import parse_experiment
from servinglab.api.crd import crd_manifest, sweep_crd_manifest
from servinglab.k8s import builders, credentials, loadbuilders, modelsecrets
from servinglab.k8s.client import PASSING_REFUSALS
from servinglab.k8s.leader import LEASE_NAME
from servinglab.loadgen import wire
from servinglab.models.digests import KEY_ENV as CACHE_KEY_ENV
from servinglab.models.fetch import AUTHORIZATION_ENV, MODEL_URL_ENV, MODEL_URL_KEY
from servinglab.servers.base import PodInputs
from servinglab.servers.podparts import MODEL_CACHE_KEY_FIELD
from support.waiting import eventually

pytestmark = [pytest.mark.k8s]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "serving"
RELEASE = "serving"
OPERATOR = f"{RELEASE}-operator"  # the chart's name for the operator's Deployment, SA, Role, Service
OPERATOR_PODS = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
#: How long the chart's figures and permissions may take to show: the operator's figures appear with
#: Prometheus' next scrape, which on a busy machine can come some seconds after the experiment's status says
#: Succeeded, and a new binding with the API server's next authorisation check.
SETTLE_SECONDS = 20
#: The chart's admission policies (`<operator>-<namespace>-<name>`), each with its binding.
POLICIES = ("pods", "objects", "load-accounts", "job-accounts")


def render(cluster: Cluster, namespace: str, *values: str) -> list[dict[str, Any]]:
    rendered = cluster.helm("template", RELEASE, str(CHART), "-n", namespace, *values).stdout
    return [document for document in yaml.safe_load_all(rendered) if document]


def pinned(name: str) -> str:
    env = (REPO / "hack" / "control-plane.env").read_text()
    match = re.search(rf"^{name}=(\S+)$", env, flags=re.MULTILINE)
    assert match, name
    return match.group(1)


@pytest.fixture(scope="module")
def monitoring_crds(cluster: Cluster) -> None:
    """The Prometheus operator's ServiceMonitor and PodMonitor CRDs, as its module ships them."""
    directory = cluster.binaries.directory / f"prometheus-operator-{pinned('PROMETHEUS_OPERATOR_VERSION')}"
    for crd in sorted(directory.glob("*.yaml")):
        cluster.kubectl.run("apply", "--server-side", "-f", str(crd))
    for name in ("servicemonitors", "podmonitors"):
        cluster.kubectl.wait_established(f"{name}.monitoring.coreos.com")


# -- rendering and validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "values"),
    [
        ("default", []),
        ("all namespaces, monitors", ["--set", "watchAllNamespaces=true", "--set", "serviceMonitor.enabled=true",
                                      "--set", "torchservePodMonitor.enabled=true"]),
        ("two namespaces", ["--set-json", 'watchNamespaces=["NS", "default"]',
                            "--set", "torchservePodMonitor.enabled=true"]),
    ],
)  # fmt: skip
def test_rendered_chart_is_valid_for_the_pinned_kubernetes(
    cluster: Cluster, namespace: str, monitoring_crds: None, variant: str, values: list[str]
) -> None:
    values = [value.replace("NS", namespace) for value in values]
    lint = cluster.helm("lint", "--strict", str(CHART), "-n", namespace, *values)
    assert "0 chart(s) failed" in lint.stdout, variant
    documents = render(cluster, namespace, *values)
    # The API server of the pinned version validates every object, unknown fields included.
    dry_run = cluster.kubectl.run(
        "apply", "--dry-run=server", "--validate=strict", "-f", "-",  # every object names its namespace
        stdin="\n---\n".join(json.dumps(document) for document in documents), check=False,
    )  # fmt: skip
    assert dry_run.returncode == 0, f"{variant}: {dry_run.stderr}"

    kinds = sorted(document["kind"] for document in documents)
    rbac = {document["kind"]: document for document in documents if "Role" in document["kind"]}
    roles = {(d["metadata"]["name"], d["metadata"]["namespace"]): d for d in documents if d["kind"] == "Role"}
    # the leader-election Lease: named, in the operator's own namespace, whatever it watches
    assert roles[(f"{OPERATOR}-leader-election", namespace)]["rules"] == LEASE_RULES
    if variant == "default":
        assert kinds == sorted(  # ConfigMaps: the five dashboards; an admission policy and binding each
            ["CustomResourceDefinition", "CustomResourceDefinition", "ServiceAccount", "Role", "RoleBinding",
             "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service", "ConfigMap",
             "ConfigMap", "ConfigMap", "ConfigMap", "ConfigMap", "Pod", "NetworkPolicy",
             *["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * len(POLICIES)]
        )  # fmt: skip
        assert roles[(OPERATOR, namespace)]["metadata"]["namespace"] == namespace
        # the one cluster-scoped grant of a namespaced install: the GPU queue's watches of nodes and GPU pods
        assert rbac["ClusterRole"]["rules"] == [
            {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list", "watch"]}
        ]
    elif variant.startswith("all"):
        assert {"ClusterRole", "ClusterRoleBinding", "ServiceMonitor", "PodMonitor"} <= set(kinds)
        assert list(roles) == [(f"{OPERATOR}-leader-election", namespace)] and kinds.count("ClusterRole") == 2
        assert "NetworkPolicy" not in kinds  # the namespaces are not known: the README says what to apply
        podmonitor = next(d for d in documents if d["kind"] == "PodMonitor")
        assert podmonitor["spec"]["namespaceSelector"] == {"any": True}
    else:
        assert [ns for name, ns in roles if name == OPERATOR] == [namespace, "default"]
        policies = [d for d in documents if d["kind"] == "NetworkPolicy"]
        assert [policy["metadata"]["namespace"] for policy in policies] == [namespace, "default"]
        policy = policies[0]["spec"]
        assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "server"
        load, operator, prometheus = policy["ingress"]
        assert load == {
            "from": [
                {
                    "podSelector": {
                        "matchLabels": {
                            "app.kubernetes.io/component": "load",
                            "app.kubernetes.io/managed-by": "servinglab-operator",
                        }
                    }
                }
            ]
        }
        assert operator["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": namespace}
        assert operator["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
        assert prometheus["ports"] == [{"port": "metrics"}]  # Prometheus reaches the metrics port only
        podmonitor = next(d for d in documents if d["kind"] == "PodMonitor")
        assert podmonitor["spec"]["namespaceSelector"] == {"matchNames": [namespace, "default"]}

    deployment = next(d for d in documents if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert re.fullmatch(r"servinglab/operator:\d+\.\d+\.\d+", container["image"])
    for document in documents:
        labels = document["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == RELEASE and labels["app.kubernetes.io/managed-by"] == "Helm"
    for dashboard in (d for d in documents if d["kind"] == "ConfigMap"):
        assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((key, text),) = dashboard["data"].items()
        assert json.loads(text)["uid"] == key.removesuffix(".json")


def test_pod_policy_is_bound_to_the_operators_service_account_and_needs_kubernetes_1_30(cluster: Cluster) -> None:
    documents = render(cluster, "ops", "--set", "serviceAccount.name=runner")
    named = {(d["kind"], d["metadata"]["name"]): d for d in documents}
    for policy_name in POLICIES:
        policy = named[("ValidatingAdmissionPolicy", f"{OPERATOR}-ops-{policy_name}")]
        (matched,) = policy["spec"]["matchConditions"]
        if policy_name == "load-accounts":  # the accounts the operator makes for its load Jobs, not its own
            assert '["system:serviceaccount:ops:"]' in matched["expression"]
            assert "endsWith('-load')" in matched["expression"]
        else:
            assert matched["expression"] == 'request.userInfo.username == "system:serviceaccount:ops:runner"'
        binding = named[("ValidatingAdmissionPolicyBinding", policy["metadata"]["name"])]["spec"]
        assert binding.pop("paramRef", None) == (  # job-accounts: each ServiceAccount of the Job's namespace
            {"selector": {}, "parameterNotFoundAction": "Allow"} if policy_name == "job-accounts" else None
        )
        assert binding == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    # ValidatingAdmissionPolicy is GA from 1.30: an older cluster gets a reason, not a half-installed chart
    old = cluster.helm("template", RELEASE, str(CHART), "--kube-version", "1.29.4", check=False)
    assert old.returncode != 0 and "podPolicy.enabled needs ValidatingAdmissionPolicy" in old.stderr, old.stderr
    kinds = {d["kind"] for d in render(cluster, "ops", "--kube-version", "1.29.4", "--set", "podPolicy.enabled=false")}
    assert "ValidatingAdmissionPolicy" not in kinds and "Deployment" in kinds


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"image": {"tag": "latest"}}, "/image/tag"),
        ({"pollSeconds": "fast"}, "/pollSeconds"),
        ({"failingSeconds": 10}, "/failingSeconds"),  # shorter than a refusal the API server lifts by itself
        ({"watchNamespaces": ["Not_A_Namespace"]}, "/watchNamespaces/0"),
        ({"prometheusUrl": "prometheus:9090"}, "/prometheusUrl"),
        ({"gpuResource": "gpu"}, "/gpuResource"),
        ({"replicaCount": 2}, "replicaCount"),
        ({"modelCredentials": [{"secret": "registry", "key": "token"}]}, "/modelCredentials/0"),
        (
            {"modelCredentials": [{"secret": "registry", "key": "token", "hosts": ["https://h/"]}]},
            "/modelCredentials/0/hosts/0",
        ),
        ({"podPolicy": {"allowedImages": ["registry.example.com/a b"]}}, "/podPolicy/allowedImages/0"),
        ({"podPolicy": {"allowedNodeSelectors": {"pool": "bench"}}}, "/podPolicy/allowedNodeSelectors/pool"),
        ({"pricing": {"perGpuProduct": {"Tesla-T4": -0.35}}}, "/pricing/perGpuProduct/Tesla-T4"),
        ({"pricing": {"perNode": {"cpu-0": "cheap"}}}, "/pricing/perNode/cpu-0"),
    ],
)
def test_values_violating_the_schema_are_refused_naming_the_key(
    cluster: Cluster, tmp_path: Path, values: dict[str, Any], named: str
) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    for command in ("lint", "template"):
        result = cluster.helm(command, str(CHART), "-f", str(values_file), check=False)
        assert result.returncode != 0, command
        assert named in result.stdout + result.stderr, (command, result.stdout, result.stderr)


def test_the_operator_is_told_which_secrets_may_be_sent_as_model_credentials(cluster: Cluster) -> None:
    allowed = [{"secret": "registry", "key": "token", "hosts": ["models.example.com", "*.blob.example.net"]}]
    for values, expected in (([], ()), (["--set-json", f"modelCredentials={json.dumps(allowed)}"], allowed)):
        (deployment,) = render(cluster, "default", "--show-only", "templates/deployment.yaml", *values)
        env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        parsed = credentials.parse(env[credentials.ENV])
        assert [entry.model_dump(exclude_defaults=True, mode="json") for entry in parsed] == list(expected)


@pytest.mark.parametrize(
    ("template", "generate"),
    [("customresourcedefinition.yaml", crd_manifest), ("customresourcedefinition-sweeps.yaml", sweep_crd_manifest)],
)
def test_chart_ships_the_crds_generated_from_the_spec_models(
    cluster: Cluster, template: str, generate: Callable[[], dict[str, Any]]
) -> None:
    (shipped,) = render(cluster, "default", "--show-only", f"templates/{template}")
    generated = generate()
    assert shipped["metadata"]["name"] == generated["metadata"]["name"]
    assert shipped["spec"] == json.loads(json.dumps(generated["spec"])), "run `make chart-crd`"
    assert shipped["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


# -- installed for real -------------------------------------------------------------------------------


@dataclass
class Installed:
    namespace: str
    kubelet: LocalKubelet
    prometheus: Prometheus


#: The chart's prices: the experiments below give no spec.cost, so they are priced by their server's node.
PRICING = {"perGpuProduct": {"Tesla-T4": 0.35}, "perNode": {"cpu-0": 0.12}}


@pytest.fixture(scope="module")
def installed(
    cluster: Cluster, monitoring: tuple[DcgmExporter, Prometheus], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    """`helm install serving charts/serving` in a fresh namespace, its operator run by the local kubelet."""
    exporter, prometheus = monitoring
    namespace = f"chart-{uuid.uuid4().hex[:6]}"
    restricted = {"pod-security.kubernetes.io/enforce": "restricted"}  # the operator pod must comply too
    cluster.kubectl.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": restricted}}
    )
    workdir = tmp_path_factory.mktemp("chart")
    scraped: list[str] = []

    def server_started(pod: str, metrics_port: int) -> None:
        exporter.pods.append((namespace, pod))
        scraped.append(f"127.0.0.1:{metrics_port}")
        prometheus.scrape(scraped[-1], {"namespace": namespace, "pod": pod})

    def operator_started(pod: str, metrics_port: int) -> None:
        scraped.append(f"127.0.0.1:{metrics_port}")
        prometheus.scrape(scraped[-1], {"operator_pod": pod})

    api = cluster.api_server(workdir / "ca.crt")
    pods = Path(tempfile.mkdtemp(prefix="pods-"))  # short paths: unix sockets live under it
    kubelet = LocalKubelet(
        cluster.kubectl, namespace, pods, api, workdir / "ca.crt", server_started, on_operator_started=operator_started
    ).start()
    try:
        cluster.helm(
            "install", RELEASE, str(CHART), "-n", namespace, "--take-ownership",
            "--wait", "--timeout", "180s", "--set", "pollSeconds=1", "--set", "unschedulableGraceSeconds=3",
            "--set", f"prometheusUrl={prometheus.url}", "--set-json", f"pricing={json.dumps(PRICING)}",
        )  # fmt: skip
        yield Installed(namespace, kubelet, prometheus)
    finally:
        cluster.helm("uninstall", RELEASE, "-n", namespace, "--wait", check=False)
        kubelet.stop()
        prometheus.forget(scraped)
        cluster.kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)


def operator_log(installed: Installed) -> str:
    logs = sorted(installed.kubelet.workdir.glob("kl-*/operator.log"))
    return "\n".join(path.read_text(errors="replace")[-3000:] for path in logs) + f"\n{installed.kubelet.errors}"


def test_install_creates_the_operator_and_serves_the_crd(cluster: Cluster, installed: Installed) -> None:
    ns = installed.namespace
    status = json.loads(cluster.helm("status", RELEASE, "-n", ns, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    selector = f"app.kubernetes.io/instance={RELEASE}"
    created = {
        (item["kind"], item["metadata"]["name"])
        for kind in ("deployments", "serviceaccounts", "roles", "rolebindings", "services", "configmaps")
        for item in cluster.kubectl.get(kind, "-n", ns, "-l", selector)["items"]
    }
    assert created == {
        ("Deployment", OPERATOR), ("ServiceAccount", OPERATOR), ("Role", OPERATOR), ("RoleBinding", OPERATOR),
        ("Role", f"{OPERATOR}-leader-election"), ("RoleBinding", f"{OPERATOR}-leader-election"),
        ("Service", OPERATOR), ("ConfigMap", f"{RELEASE}-dashboard-torchserve"),
        ("ConfigMap", f"{RELEASE}-dashboard-gpu"), ("ConfigMap", f"{RELEASE}-dashboard-experiments"),
        ("ConfigMap", f"{RELEASE}-dashboard-triton"), ("ConfigMap", f"{RELEASE}-dashboard-litserve"),
    }  # fmt: skip
    deployment = cluster.kubectl.get("deployment", OPERATOR, "-n", ns)
    assert deployment["status"].get("readyReplicas") == 1, deployment["status"]
    crd = cluster.kubectl.get("crd", "servingexperiments.servinglab.dev")
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True"
    assert cluster.kubectl.run("get", "servingexperiments", "-n", ns).returncode == 0


# What the operator does in each namespace it watches, written out independently of the chart: the RBAC
# must be exactly this.
OPERATOR_NEEDS = {
    "servingexperiments.servinglab.dev": {"get", "list", "watch", "create", "patch"},
    "servingexperiments.servinglab.dev/status": {"patch"},
    "servingsweeps.servinglab.dev": {"get", "list", "watch", "patch"},
    "servingsweeps.servinglab.dev/status": {"patch"},
    "servingexperiments.servinglab.dev/finalizers": {"update"},  # OwnerReferencesPermissionEnforcement
    "servingsweeps.servinglab.dev/finalizers": {"update"},
    # leader election: its own Lease by name; a create cannot be limited by name
    "leases.coordination.k8s.io[servinglab-operator]": {"get", "update"},
    "leases.coordination.k8s.io": {"create"},
    "nodes": {"list", "watch"},  # cluster-scoped: the GPU queue's nodes
    "namespaces": {"get"},  # the namespace's own pod defaults (its own Namespace object only)
    "resourcequotas": {"list", "watch"},  # the GPU queue waits within the namespace's GPU quota
    "configmaps": {"get", "create", "patch"},
    "serviceaccounts": {"get", "create", "patch"},
    "services": {"get", "create", "patch", "delete"},
    "deployments.apps": {"get", "create", "patch", "delete"},
    "jobs.batch": {"get", "create", "patch", "delete"},
    "pods": {"list", "watch"},  # cluster-wide: every pod holding GPUs counts against its node
    "roles.rbac.authorization.k8s.io": {"get", "create", "patch"},
    "rolebindings.rbac.authorization.k8s.io": {"get", "create", "patch"},
    "events": {"create"},
    "secrets": {"create"},  # the load pods' generator key; never read back
    "networkpolicies.networking.k8s.io": {"get", "create", "patch"},
}
LEASE_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [LEASE_NAME],
     "verbs": ["get", "update"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
]  # fmt: skip
LEASE_RESOURCES = {"leases.coordination.k8s.io", "leases.coordination.k8s.io[servinglab-operator]"}
LEASE_NEEDS = {resource: verbs for resource, verbs in OPERATOR_NEEDS.items() if resource in LEASE_RESOURCES}
# Granted to every authenticated identity by Kubernetes itself (system:basic-user and friends).
EVERYONE_MAY = {
    "selfsubjectreviews.authentication.k8s.io",
    "selfsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectrulesreviews.authorization.k8s.io",
}


def can_i_list(cluster: Cluster, namespace: str, identity: str) -> dict[str, set[str]]:
    """{resource: verbs} the identity may use in the namespace; a grant limited to named objects is keyed
    `resource[name,...]`."""
    listing = cluster.kubectl.run("auth", "can-i", "--list", "-n", namespace, "--as", identity).stdout
    rules: dict[str, set[str]] = {}
    for line in listing.splitlines()[1:]:
        if not line.strip() or line.startswith(" "):  # non-resource URLs
            continue
        resource = line.split()[0]
        *_, names, verbs = re.findall(r"\[([^\]]*)\]", line)  # [non-resource URLs] [resource names] [verbs]
        key = f"{resource}[{','.join(names.split())}]" if names.strip() else resource
        rules.setdefault(key, set()).update(verbs.split())
    return {resource: verbs for resource, verbs in rules.items() if resource not in EVERYONE_MAY}


def can_i_request(resource: str) -> list[str]:
    """`kubectl auth can-i` arguments for an OPERATOR_NEEDS key: `type[name]` becomes `type/name`,
    `type/subresource` the --subresource flag."""
    name, _, subresource = resource.partition("/")
    if name.endswith("]"):
        name = name[:-1].replace("[", "/")
    return [name, f"--subresource={subresource}"] if subresource else [name]


def can_i(cluster: Cluster, identity: str, *request: str) -> bool:
    result = cluster.kubectl.run("auth", "can-i", *request, "--as", identity, check=False)
    return result.stdout.strip() == "yes"


def test_operator_service_account_can_do_exactly_what_it_needs(cluster: Cluster, installed: Installed) -> None:
    ns = installed.namespace
    identity = f"system:serviceaccount:{ns}:{OPERATOR}"
    assert can_i_list(cluster, ns, identity) == OPERATOR_NEEDS
    for resource, verbs in OPERATOR_NEEDS.items():
        for verb in verbs:
            if resource == "namespaces":  # `can-i` asks about a cluster-scoped kind without the namespace
                continue
            assert can_i(cluster, identity, verb, *can_i_request(resource), "-n", ns), (verb, resource)
    # a Role grants reading its own Namespace object, and no other
    own = cluster.kubectl.run("get", "--raw", f"/api/v1/namespaces/{ns}", "--as", identity, check=False)
    other = cluster.kubectl.run("get", "--raw", "/api/v1/namespaces/default", "--as", identity, check=False)
    assert own.returncode == 0 and other.returncode != 0, (own.stderr, other.stdout)
    for request in (
        ["get", "secrets", "-n", ns],
        ["list", "secrets", "-n", ns],
        ["watch", "secrets", "-n", ns],
        ["patch", "secrets", "-n", ns],
        ["update", "secrets", "-n", ns],
        ["delete", "secrets", "-n", ns],
        ["delete", "networkpolicies.networking.k8s.io", "-n", ns],
        ["create", "secrets", "-n", "default"],
        ["delete", "servingexperiments.servinglab.dev", "-n", ns],
        ["update", "servingexperiments.servinglab.dev", "-n", ns],
        ["delete", "configmaps", "-n", ns],
        ["delete", "pods", "-n", ns],
        ["create", "pods", "-n", ns],
        ["create", "pods", "-n", ns, "--subresource=exec"],
        ["escalate", "roles.rbac.authorization.k8s.io", "-n", ns],
        ["bind", "roles.rbac.authorization.k8s.io", "-n", ns],
        ["create", "deployments.apps", "-n", "default"],
        ["get", "configmaps", "-n", "kube-system"],
        ["list", "servingexperiments.servinglab.dev", "--all-namespaces"],
        ["get", "nodes"],
        ["patch", "nodes"],
        ["create", "namespaces"],
        ["delete", "customresourcedefinitions.apiextensions.k8s.io"],
        ["create", "clusterroles.rbac.authorization.k8s.io"],
        # leader election: no other Lease, and none elsewhere (kube-system's leaders)
        ["get", "leases.coordination.k8s.io/another-lease", "-n", ns],
        ["update", "leases.coordination.k8s.io/another-lease", "-n", ns],
        ["list", "leases.coordination.k8s.io", "-n", ns],
        ["delete", "leases.coordination.k8s.io/servinglab-operator", "-n", ns],
        ["get", "leases.coordination.k8s.io/kube-scheduler", "-n", "kube-system"],
        ["update", "leases.coordination.k8s.io/kube-controller-manager", "-n", "kube-system"],
        ["create", "leases.coordination.k8s.io", "-n", "kube-system"],
    ):
        assert not can_i(cluster, identity, *request), request


def test_all_namespaces_option_grants_the_same_rules_cluster_wide(cluster: Cluster, namespace: str) -> None:
    release = "serving-all"
    cluster.helm(
        "install", release, str(CHART), "-n", namespace, "--set", "watchAllNamespaces=true",
        "--set", "crds.install=false", "--set", "dashboards.enabled=false",
    )  # fmt: skip
    try:
        identity = f"system:serviceaccount:{namespace}:{release}-operator"
        elsewhere = f"other-{uuid.uuid4().hex[:6]}"
        cluster_wide = {
            **{resource: verbs for resource, verbs in OPERATOR_NEEDS.items() if resource not in LEASE_RESOURCES},
            "customresourcedefinitions.apiextensions.k8s.io": {"list", "watch"},
        }
        assert can_i_list(cluster, elsewhere, identity) == cluster_wide
        # the Lease only in the operator's own namespace, where it keeps it
        assert can_i_list(cluster, namespace, identity) == {**cluster_wide, **LEASE_NEEDS}
        assert can_i(cluster, identity, "list", "servingexperiments.servinglab.dev", "--all-namespaces")
        assert not can_i(cluster, identity, "get", "secrets", "-n", elsewhere)
        for verb in ("get", "update", "create"):
            assert not can_i(cluster, identity, verb, "leases.coordination.k8s.io/servinglab-operator", "-n", elsewhere)
            assert not can_i(cluster, identity, verb, "leases.coordination.k8s.io/kube-scheduler", "-n", "kube-system")
        deployment = cluster.kubectl.get("deployment", f"{release}-operator", "-n", namespace)
        assert "--all-namespaces" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    finally:
        cluster.helm("uninstall", release, "-n", namespace, "--wait")
    assert not cluster.kubectl.get("clusterroles", "-l", f"app.kubernetes.io/instance={release}")["items"]


def test_helm_test_checks_the_operators_health(cluster: Cluster, installed: Installed) -> None:
    result = cluster.helm("test", RELEASE, "-n", installed.namespace, "--timeout", "120s", check=False)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{operator_log(installed)}"
    assert re.search(rf"TEST SUITE:\s+{OPERATOR}-test\n(?:.*\n)*?Phase:\s+Succeeded", result.stdout), result.stdout


@pytest.fixture(scope="module")
def finished(cluster: Cluster, installed: Installed) -> dict[str, Any]:
    """A tiny experiment run by the chart's operator; GPU metrics from the chart's prometheusUrl. Beside
    it, a one-trial sweep (the other T4), so the dashboards' sweep panels have a real sweep to show."""
    ns = installed.namespace
    template = experiment("template")["spec"]
    one = {"batchSize": 4, "maxBatchDelayMs": 5, "workers": 1, "precision": "fp32"}
    # optimising cost with no price of its own: the chart's pricing prices its trial (else: InvalidSpec)
    one_trial = sweep("chart-sweep", template, strategy="list", configurations=[one], objective={"optimize": "cost"})
    cluster.kubectl.apply(experiment("chart-e2e"), namespace=ns)
    cluster.kubectl.apply(one_trial, namespace=ns)
    # and LitServe on the CPU node, for its dashboard (awaited by `finished_litserve`)
    on_cpu = {"kind": "litserve", "gpus": 0, "nodeSelector": {}, "tolerations": []}
    cluster.kubectl.apply(experiment("chart-litserve", **on_cpu), namespace=ns)
    body = wait_finished(cluster, ns, "chart-e2e", lambda: operator_log(installed))
    assert condition(body, "Succeeded")["status"] == "True", (body["status"], operator_log(installed))
    cluster.kubectl.wait_for(
        lambda: (cluster.kubectl.get("servingsweep", "chart-sweep", "-n", ns).get("status") or {})
        .get("summary", {}).get("state") == "Succeeded",
        240, "the chart's sweep",
    )  # fmt: skip
    stored = cluster.kubectl.get("servingsweep", "chart-sweep", "-n", ns)
    if "bestConfig" not in stored["status"]["summary"]:  # the trial did not measure: say why, the dashboards can't
        trials = cluster.kubectl.get("sx", "-n", ns, "-l", "servinglab.dev/sweep=chart-sweep")["items"]
        outcomes = [(trial["metadata"]["name"], trial.get("status", {}).get("conditions")) for trial in trials]
        pytest.fail(f"the sweep measured nothing: {stored['status']}\ntrials: {outcomes}\n{operator_log(installed)}")
    return body


@pytest.fixture(scope="module")
def finished_litserve(cluster: Cluster, installed: Installed, finished: dict[str, Any]) -> dict[str, Any]:
    """The LitServe experiment `finished` applied beside the TorchServe one."""
    body = wait_finished(cluster, installed.namespace, "chart-litserve", lambda: operator_log(installed))
    assert condition(body, "Succeeded")["status"] == "True", (body["status"], operator_log(installed))
    return body


def test_experiment_succeeds_as_the_charts_service_account(
    cluster: Cluster, installed: Installed, finished: dict[str, Any]
) -> None:
    """The chart's RBAC is enough, and the operator's server Deployment and load Job (and the sweep's)
    pass the chart's pod policy, which was in force all along."""
    policy = f"{OPERATOR}-{installed.namespace}-pods"
    assert cluster.kubectl.get("validatingadmissionpolicybinding", policy)["spec"]["policyName"] == policy
    status = finished["status"]
    assert [level["concurrency"] for level in status["results"]] == [1, 4]
    assert all(level["throughputRps"] > 0 and level["errors"] == 0 for level in status["results"])
    # the chart's prometheusUrl reached the operator: GPU figures without one in the experiment
    assert condition(finished, "GPUMetricsAvailable")["status"] == "True"
    assert all("gpu" in level for level in status["results"])


def test_experiments_without_a_cost_are_priced_by_the_charts_pricing_for_their_node(
    cluster: Cluster, installed: Installed, finished: dict[str, Any], finished_litserve: dict[str, Any]
) -> None:
    """The T4 server by its GPU product (per GPU x 1), LitServe on the CPU node by the node's name, and the
    sweep's trial like any experiment: each level's cost per million at that price, saying where it came from."""
    trials = cluster.kubectl.get("sx", "-n", installed.namespace, "-l", "servinglab.dev/sweep=chart-sweep")["items"]
    assert len(trials) == 1
    # the sweep optimised cost with no price of its own: its winner is ranked by the chart's price
    swept = cluster.kubectl.get("servingsweep", "chart-sweep", "-n", installed.namespace)
    assert "cost" not in swept["spec"]["template"] and swept["spec"]["objective"]["optimize"] == "cost"
    assert swept["status"]["best"]["trial"] == trials[0]["metadata"]["name"], swept["status"]
    for body, price, source in (
        (finished, 0.35, "gpu product Tesla-T4"),
        (trials[0], 0.35, "gpu product Tesla-T4"),
        (finished_litserve, 0.12, "node cpu-0"),
    ):
        status = body["status"]
        assert "cost" not in body["spec"]
        assert status.get("price") == {"pricePerHour": price, "currency": "USD", "source": source}, status.get("price")
        for level in status["results"]:
            cost = level["cost"]
            assert (cost["pricePerHour"], cost["priceSource"]) == (price, source), cost
            assert cost["costPerMillion"] == pytest.approx(price / (level["throughputRps"] * 3600) * 1e6, rel=1e-4)
            assert "reason" not in cost


# -- the pod policy: what the operator's ServiceAccount may create ------------------------------------

POLICY_DENIAL = "servinglab operator pods:"
OBJECTS_DENIAL = "servinglab operator objects:"
LOAD_ACCOUNTS_DENIAL = "servinglab load accounts:"
PROBE = "policy-probe"  # the experiment (never created) whose children the policy tests offer


def operator_pods(namespace: str, name: str = PROBE, **server: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The server Deployment and the load Job the operator builds (the server's pod plan through
    servinglab.k8s.builders) for the chart test's experiment `name`; `server` overrides spec.server fields."""
    spec = parse_experiment(experiment(name, **server)).spec
    owner = builders.Owner(name, namespace, str(uuid.uuid4()))
    image = "servinglab/servinglab:0.1.0"
    inputs = PodInputs(config_map=f"{name}-config", servinglab_image=image, experiment_file=builders.EXPERIMENT_FILE)
    plan = servers.get(spec.server.kind).pod(spec, inputs)
    return builders.deployment(owner, spec, plan), loadbuilders.load_job(owner, spec, plan, image)


def create_as(cluster: Cluster, identity: str | None, manifest: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """Create `manifest` as `identity` (None: the cluster admin) in a server-side dry run: admitted or
    refused by every admission step, never stored. A refusal that passes on its own (the API server's
    discovery cache not knowing the owner's kind yet: PASSING_REFUSALS) is asked again, for up to a minute,
    as the operator does."""
    who = ["--as", identity] if identity else []
    deadline = time.monotonic() + 60
    while True:
        result = cluster.kubectl.run(
            "create", "--dry-run=server", *who, "-f", "-", stdin=json.dumps(manifest), check=False
        )  # fmt: skip
        passing = any(refusal in result.stderr for refusal in PASSING_REFUSALS)
        if not passing or time.monotonic() > deadline:
            return result
        time.sleep(1)


def altered(manifest: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """A copy of the manifest with `change` applied to its pod spec."""
    copy = json.loads(json.dumps(manifest))
    change(copy["spec"]["template"]["spec"])
    return copy


def policy_in_force(cluster: Cluster, identity: str, refused: dict[str, Any]) -> None:
    """Wait until the API server refuses `refused` from `identity`: it loads a new policy and binding
    asynchronously, within a second or so of their creation."""
    deadline = time.monotonic() + 30
    while create_as(cluster, identity, refused).returncode == 0:
        assert time.monotonic() < deadline, "the pod policy was not in force 30 s after it was installed"
        time.sleep(0.5)


def refusal(cluster: Cluster, identity: str, manifest: dict[str, Any], denial: str = POLICY_DENIAL) -> str:
    result = create_as(cluster, identity, manifest)
    assert result.returncode != 0, f"admitted: {json.dumps(manifest.get('spec', manifest))[:2000]}"
    assert "ValidatingAdmissionPolicy" in result.stderr and denial in result.stderr, result.stderr
    return " ".join(result.stderr.split())


def test_pod_policy_admits_the_operators_own_pods_and_refuses_any_other(cluster: Cluster, installed: Installed) -> None:
    ns = installed.namespace
    operator = f"system:serviceaccount:{ns}:{OPERATOR}"
    server, load = operator_pods(ns)
    torchserve, model = "torchserve", "model"  # the server pod's container and init container

    def privileged(pod: dict[str, Any]) -> None:  # (privileged implies privilege escalation: the API insists)
        pod["containers"][0]["securityContext"] |= {"privileged": True, "allowPrivilegeEscalation": True}

    policy_in_force(cluster, operator, altered(server, privileged))
    for manifest in (server, load):  # exactly what the operator creates (the experiment above ran them)
        admitted = create_as(cluster, operator, manifest)
        assert admitted.returncode == 0, admitted.stderr
    assert f"no container may be privileged: {torchserve}" in refusal(cluster, operator, altered(server, privileged))

    def foreign_account(pod: dict[str, Any]) -> None:
        pod["serviceAccountName"] = "ci-admin"
        pod["automountServiceAccountToken"] = True

    refused = refusal(cluster, operator, altered(server, foreign_account))
    assert "names ServiceAccount ci-admin with automountServiceAccountToken true" in refused
    refused = refusal(cluster, operator, altered(load, lambda pod: pod.update(serviceAccountName="ci-admin")))
    assert "Job policy-probe-load names ServiceAccount ci-admin" in refused
    renamed = altered(load, lambda pod: pod.update(serviceAccountName="ci-admin"))
    renamed["metadata"]["name"] = "ci-admin"  # a Job named after the ServiceAccount it wants to borrow
    assert "Job ci-admin names ServiceAccount ci-admin" in refusal(cluster, operator, renamed)

    def root(pod: dict[str, Any]) -> None:
        pod["initContainers"][0]["securityContext"] |= {"runAsNonRoot": False, "runAsUser": 0}

    assert f"runs as non-root (runAsNonRoot true, runAsUser not 0): not {model}" in refusal(
        cluster, operator, altered(server, root)
    )
    changes: list[tuple[Callable[[dict[str, Any]], None], str]] = [
        (lambda pod: pod["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True),
         f"sets allowPrivilegeEscalation false: not {torchserve}"),
        (lambda pod: pod["containers"][0]["securityContext"].update(capabilities={"add": ["NET_ADMIN"]}),
         f"drops all capabilities and adds none: not {torchserve}"),
        (lambda pod: pod["containers"][0]["securityContext"].update(seccompProfile={"type": "Unconfined"}),
         f"RuntimeDefault seccomp profile: not {torchserve}"),
        (lambda pod: pod.update(hostNetwork=True), "no host namespace (hostNetwork, hostPID, hostIPC)"),
        (lambda pod: pod.update(hostPID=True), "no host namespace (hostNetwork, hostPID, hostIPC)"),
        (lambda pod: pod["containers"][0]["ports"].append({"containerPort": 22, "hostPort": 22}), "and no hostPort"),
        (lambda pod: pod["volumes"].append({"name": "node-root", "hostPath": {"path": "/"}}),
         "no hostPath volume: node-root"),
    ]  # fmt: skip
    for change, message in changes:
        assert message in refusal(cluster, operator, altered(server, change))
    # Anyone else's Deployments are not this policy's to judge (RBAC and Pod Security Admission are)
    assert create_as(cluster, None, altered(server, privileged)).returncode == 0


def test_pod_policy_allow_lists_limit_images_node_selectors_and_sent_secrets(cluster: Cluster, namespace: str) -> None:
    release = "serving-lists"
    sendable = [
        {"secret": "registry", "key": "token", "hosts": ["models.example.com"]},
        {"secret": "mirror", "key": "token", "hosts": ["mirror.example.com"], "namespaces": ["elsewhere"]},
    ]
    cluster.helm(
        "install", release, str(CHART), "-n", namespace, "--set", "crds.install=false",
        "--set", "dashboards.enabled=false",
        "--set-json", 'podPolicy.allowedImages=["servinglab/", "pytorch/torchserve:"]',
        "--set-json", 'podPolicy.allowedNodeSelectors={"nvidia.com/gpu.product": ["Tesla-T4", "NVIDIA-A10G"]}',
        "--set-json", f"modelCredentials={json.dumps(sendable)}",
    )  # fmt: skip
    try:
        operator = f"system:serviceaccount:{namespace}:{release}-operator"
        server, load = operator_pods(namespace)
        elsewhere, _ = operator_pods(namespace, image="registry.example.com/torchserve:0.12.0")
        policy_in_force(cluster, operator, elsewhere)
        for manifest in (server, load):  # T4 selected; the load Job selects no node at all
            admitted = create_as(cluster, operator, manifest)
            assert admitted.returncode == 0, admitted.stderr
        refused = refusal(cluster, operator, elsewhere)
        assert "images come from podPolicy.allowedImages (servinglab/, pytorch/torchserve:)" in refused
        assert "not torchserve (registry.example.com/torchserve:0.12.0)" in refused
        v100, _ = operator_pods(namespace, nodeSelector={"nvidia.com/gpu.product": "Tesla-V100"})
        assert "this one selects nvidia.com/gpu.product=Tesla-V100" in refusal(cluster, operator, v100)
        pinned = altered(server, lambda pod: pod.update(nodeName="control-plane"))
        assert "nodeName control-plane" in refusal(cluster, operator, pinned)

        # a server's model init container may send a Secret key that modelCredentials lists for this namespace
        def sends(secret: str) -> dict[str, Any]:
            credentials = secret_key(secret, "token", AUTHORIZATION_ENV)
            return altered(server, lambda pod: pod["initContainers"][0].setdefault("env", []).append(credentials))

        admitted = create_as(cluster, operator, sends("registry"))
        assert admitted.returncode == 0, admitted.stderr
        assert f"Deployment {PROBE}-server refers to model: mirror/token" in refusal(cluster, operator, sends("mirror"))
    finally:
        cluster.helm("uninstall", release, "-n", namespace, "--wait")


def secret_key(name: str, key: str, env: str = "TOKEN") -> dict[str, Any]:
    return {"name": env, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}


def test_pod_policy_lets_pods_see_only_the_operators_own_secrets(cluster: Cluster, installed: Installed) -> None:
    """A leaked operator token cannot hand a pod a Secret it may not read (a ServiceAccount token it
    minted, someone's credentials): no secret or projected volume, no envFrom, no pull Secrets, and env
    keys only from the experiment's own generator key (a load Job) or modelCredentials (a server)."""
    ns = installed.namespace
    operator = f"system:serviceaccount:{ns}:{OPERATOR}"
    server, load = operator_pods(ns)
    token_volume = {"name": "token", "secret": {"secretName": "ci-admin-token"}}
    mounted = altered(server, lambda pod: pod["volumes"].append(token_volume))
    policy_in_force(cluster, operator, mounted)
    # the load pods' generator key, as loadbuilders.load_job refers to it (key_secret: a generated name)
    generator_key = secret_key(f"{PROBE}-load-key-x7k2p", loadbuilders.GENERATOR_KEY_FIELD, wire.KEY_ENV)
    keyed = altered(load, lambda pod: pod["containers"][0]["env"].append(generator_key))
    admitted = create_as(cluster, operator, keyed)
    assert admitted.returncode == 0, admitted.stderr
    # a server's model init container: its model's whole URL, the namespace's model cache key (modelsecrets)
    model_url = secret_key(f"{PROBE}-server-model-url-q8z4t", MODEL_URL_KEY, MODEL_URL_ENV)
    cache_key = secret_key(modelsecrets.MODEL_CACHE_KEY_SECRET, MODEL_CACHE_KEY_FIELD, CACHE_KEY_ENV)
    fetching = altered(
        server, lambda pod: pod["initContainers"][0].setdefault("env", []).extend([model_url, cache_key])
    )
    admitted = create_as(cluster, operator, fetching)
    assert admitted.returncode == 0, admitted.stderr
    # ... and in no other container: the server's runs the user's model
    serving = altered(server, lambda pod: pod["containers"][0].setdefault("env", []).extend([model_url, cache_key]))
    refused = refusal(cluster, operator, serving)
    assert f"torchserve: {PROBE}-server-model-url-q8z4t/{MODEL_URL_KEY}" in refused, refused
    assert f"{modelsecrets.MODEL_CACHE_KEY_SECRET}/{MODEL_CACHE_KEY_FIELD}" in refused, refused
    volumes = "volumes are configMap, emptyDir or persistentVolumeClaim only (no secret, projected or other volume)"
    assert f"{volumes}: not token" in refusal(cluster, operator, mounted)
    projected = {"name": "sa", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
    assert f"{volumes}: not sa" in refusal(
        cluster, operator, altered(server, lambda pod: pod["volumes"].append(projected))
    )
    foreign = secret_key("ci-admin-token", "token")
    refused = refusal(cluster, operator, altered(load, lambda pod: pod["containers"][0]["env"].append(foreign)))
    assert f"Job {PROBE}-load refers to loadgen: ci-admin-token/token" in refused
    another_key = secret_key(f"{PROBE}-load-key-x7k2p", "token")  # its own Secret, but no other key than `key`
    refused = refusal(cluster, operator, altered(load, lambda pod: pod["containers"][0]["env"].append(another_key)))
    assert f"loadgen: {PROBE}-load-key-x7k2p/token" in refused
    # no modelCredentials in this install: a server's model init container may send no Secret at all
    model_credentials = secret_key("registry", "token", AUTHORIZATION_ENV)
    sends = altered(server, lambda pod: pod["initContainers"][0].setdefault("env", []).append(model_credentials))
    assert f"Deployment {PROBE}-server refers to model: registry/token" in refusal(cluster, operator, sends)
    whole = altered(server, lambda pod: pod["containers"][0].update(envFrom=[{"secretRef": {"name": "ci-admin"}}]))
    assert "torchserve: envFrom ci-admin" in refusal(cluster, operator, whole)
    pulls = altered(server, lambda pod: pod.update(imagePullSecrets=[{"name": "ci-registry"}]))
    assert "imagePullSecrets ci-registry" in refusal(cluster, operator, pulls)


def probe_objects(namespace: str, uid: str) -> dict[str, dict[str, Any]]:
    """What the operator makes for a load Job besides the Job (servinglab.k8s.builders), by kind."""
    owner = builders.Owner(PROBE, namespace, uid)
    return {
        "Secret": loadbuilders.generator_key_secret(owner, wire.new_key()),
        "ServiceAccount": loadbuilders.load_service_account(owner),
        "Role": loadbuilders.load_role(owner),
        "RoleBinding": loadbuilders.load_role_binding(owner),
    }


def changed(manifest: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A copy of `manifest` with top-level `fields` replaced (and `metadata` fields merged)."""
    copy: dict[str, Any] = json.loads(json.dumps(manifest))
    copy["metadata"] |= fields.pop("metadata", {})
    return copy | fields


def test_objects_policy_admits_the_operators_secret_and_load_account_only(
    cluster: Cluster, installed: Installed
) -> None:
    """RBAC lets the operator create Secrets, ServiceAccounts, Roles and RoleBindings; the objects policy
    refuses a leaked token anything but what an experiment's load Job needs: no ServiceAccount token
    Secret, no account but `<experiment>-load`, no Role beyond its results ConfigMaps, no binding of any
    other role (a ClusterRole with the operator's own rights among them) or to any other subject."""
    ns = installed.namespace
    operator = f"system:serviceaccount:{ns}:{OPERATOR}"
    own = probe_objects(ns, str(uuid.uuid4()))
    owned = {"ownerReferences": own["ServiceAccount"]["metadata"]["ownerReferences"]}
    sa_token = {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "ci-admin-token", "namespace": ns, **owned,
                     "annotations": {"kubernetes.io/service-account.name": "ci-admin"}},
    }  # fmt: skip
    policy_in_force(cluster, operator, sa_token)
    for request in ("secrets", "serviceaccounts", "roles.rbac.authorization.k8s.io",
                    "rolebindings.rbac.authorization.k8s.io"):  # fmt: skip
        assert can_i(cluster, operator, "create", request, "-n", ns), request  # the policy, not RBAC, refuses
    model_url = modelsecrets.model_url_secret(builders.Owner(PROBE, ns, str(uuid.uuid4())), "https://h/m?sig=s")
    for manifest in (own["Secret"], own["ServiceAccount"], own["Role"], model_url,
                     modelsecrets.model_cache_key_secret(ns)):  # fmt: skip
        admitted = create_as(cluster, operator, manifest)
        assert admitted.returncode == 0, (manifest["kind"], admitted.stderr)
    # a binding's Role must exist (RBAC checks that the binder holds what it grants): the cluster admin's
    cluster.kubectl.apply(changed(own["Role"], metadata={"ownerReferences": []}))
    # ... and a ClusterRole granting only what the operator holds in the namespace, so RBAC would let it bind
    deployer = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": f"{ns}-deployer"},
        "rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]}],
    }  # fmt: skip
    cluster.kubectl.apply(deployer)
    try:
        admitted = create_as(cluster, operator, own["RoleBinding"])
        assert admitted.returncode == 0, admitted.stderr
        refused = partial(refusal, cluster, operator, denial=OBJECTS_DENIAL)
        assert "a Secret the operator creates is Opaque; this one is of type kubernetes.io/service-account-token" in (
            refused(sa_token)
        )
        named = changed(own["Secret"], metadata={"name": "ci-admin-creds", "generateName": None})
        refused_named = refused(named)
        assert f"one of {PROBE}-load-key-... (only the key key)" in refused_named.replace(
            f"{PROBE}-server-model-url-... (only the key url), ", ""
        )  # (either order)
        assert "this one is ci-admin-creds with key" in refused_named
        assert "is owned by its ServingExperiment" in refused(changed(own["Secret"], metadata={"ownerReferences": []}))
        account = changed(own["ServiceAccount"], metadata={"name": "ci-admin"})
        assert f"load account {PROBE}-load; this one is ci-admin" in refused(account)
        pulls = changed(own["ServiceAccount"], imagePullSecrets=[{"name": "ci-registry"}])
        assert "lists no secrets and no imagePullSecrets" in refused(pulls)
        deploys = changed(own["Role"], rules=deployer["rules"])
        assert f"Role {PROBE}-load grants create deployments" in refused(deploys)
        every_configmap = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"]}]
        assert "grants get/patch configmaps" in refused(changed(own["Role"], rules=every_configmap))
        cluster_role = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{ns}-deployer"}
        bound = changed(own["RoleBinding"], roleRef=cluster_role)
        assert f"binds ClusterRole {ns}-deployer to ServiceAccount {ns}/{PROBE}-load" in refused(bound)
        someone = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"}
        widened = changed(own["RoleBinding"], subjects=[*own["RoleBinding"]["subjects"], someone])
        assert "User /mallory" in refused(widened)
    finally:
        cluster.kubectl.run("delete", "clusterrole", f"{ns}-deployer", check=False)


def test_load_accounts_write_nothing_but_configmaps(cluster: Cluster, installed: Installed) -> None:
    """Whatever a load account comes to hold (here: a ClusterRole the cluster admin binds to it, as a
    binding made with a leaked operator token would), it creates no pod, Deployment, Job or Secret: its
    pods cannot escape the pod policy, which judges the operator's own requests."""
    ns = installed.namespace
    account = f"system:serviceaccount:{ns}:{PROBE}-load"
    powers = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": f"{ns}-powers"},
        "rules": [{"apiGroups": ["", "apps", "batch"], "resources": ["pods", "deployments", "jobs", "secrets",
                                                                     "configmaps"], "verbs": ["create"]}],
    }  # fmt: skip
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": f"{PROBE}-powers", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{ns}-powers"},
        "subjects": [{"kind": "ServiceAccount", "name": f"{PROBE}-load", "namespace": ns}],
    }  # fmt: skip
    cluster.kubectl.apply(powers)
    cluster.kubectl.apply(binding)
    try:
        server, load = operator_pods(ns)
        # the server's own pod spec (Pod Security's restricted level, enforced here, would refuse a worse one)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "escape", "namespace": ns},
               "spec": altered(server, lambda _: None)["spec"]["template"]["spec"]}  # fmt: skip
        assert eventually(lambda: can_i(cluster, account, "create", "pods", "-n", ns), SETTLE_SECONDS)
        policy_in_force(cluster, account, pod)
        refused = partial(refusal, cluster, account, denial=LOAD_ACCOUNTS_DENIAL)
        assert f"writes only ConfigMaps; {account} may not CREATE pods" in refused(pod)
        unowned = {"ownerReferences": []}  # (an owner would need update on its finalizers: not granted here)
        assert "may not CREATE deployments.apps" in refused(changed(server, metadata=unowned))
        assert "may not CREATE jobs.batch" in refused(changed(load, metadata=unowned))
        assert "may not CREATE secrets" in refused(changed(probe_objects(ns, "")["Secret"], metadata=unowned))
        parts = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{PROBE}-results-part-1", "namespace": ns},
        }
        admitted = create_as(cluster, account, parts)  # what a load pod writes: results in ConfigMaps
        assert admitted.returncode == 0, admitted.stderr
    finally:
        cluster.kubectl.run("delete", "rolebinding", f"{PROBE}-powers", "-n", ns, check=False)
        cluster.kubectl.run("delete", "clusterrole", f"{ns}-powers", check=False)


def test_a_load_job_runs_only_as_an_account_its_own_experiment_controls(cluster: Cluster, installed: Installed) -> None:
    """A Job with a forged owner reference (an experiment `ci` that does not exist) cannot borrow someone's
    ServiceAccount named like a load account: the account must be controlled by the Job's experiment."""
    ns = installed.namespace
    operator = f"system:serviceaccount:{ns}:{OPERATOR}"
    someones = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ci-load", "namespace": ns}}
    cluster.kubectl.apply(someones)
    try:
        _, forged = operator_pods(ns, name="ci")
        policy_in_force(cluster, operator, forged)
        refused = refusal(cluster, operator, forged)
        assert "a load Job runs as the ServiceAccount its own ServingExperiment controls" in refused
        assert "ServiceAccount ci-load is not controlled by the experiment of Job ci-load" in refused
        # (a Job whose account does not exist yet is admitted, and runs no pod until the account exists: the
        # experiments above ran their Jobs as accounts their experiment controls, through this policy)
    finally:
        cluster.kubectl.run("delete", "serviceaccount", "ci-load", "-n", ns, check=False)


# -- dashboards --------------------------------------------------------------------------------------

# The Triton dashboard's queries are evaluated against a Triton run in test_triton_on_cluster.py.
DASHBOARDS = sorted(path for path in (CHART / "dashboards").glob("*.json") if path.stem != "triton")


def finite_values(result: list[dict[str, Any]]) -> list[float]:
    return [float(sample["value"][1]) for sample in result if math.isfinite(float(sample["value"][1]))]


@pytest.mark.parametrize("path", DASHBOARDS, ids=[path.stem for path in DASHBOARDS])
def test_every_dashboard_query_returns_data_from_a_real_run(
    cluster: Cluster, installed: Installed, finished: dict[str, Any], finished_litserve: dict[str, Any], path: Path
) -> None:
    dashboard = json.loads(path.read_text())
    prometheus = installed.prometheus
    run = finished_litserve if path.stem == "litserve" else finished  # each server's dashboard, its own run
    results = cluster.kubectl.get("configmap", run["status"]["resultsRef"]["name"], "-n", installed.namespace)
    levels = json.loads(results["data"]["results.json"])["results"]
    # Live panels (TorchServe, GPU) are read as of the end of the load; results panels once written.
    at = float(levels[-1]["windowEnd"]) if path.stem != "experiments" else None

    def has_label(metric: str, label: str) -> bool:
        return any(label in labels for labels in prometheus.series(grafana_expression(metric)))

    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        metric, label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"]["query"]).groups()
        assert eventually(partial(has_label, metric, label), SETTLE_SECONDS), (variable["name"], metric, label)

    def returns_data(query: str) -> bool:
        return bool(finite_values(prometheus.query(query, at)))

    def measured_bound(bound: str) -> bool:
        experiments = cluster.kubectl.get("sx", "-n", installed.namespace)["items"]
        return any(
            (((level.get("latencyMs") or {}).get("intervals") or {}).get("p99") or {}).get(bound) is not None
            for body in experiments
            for level in (body.get("status") or {}).get("results") or []
        )

    queries = [(title, grafana_expression(expression)) for title, expression in panel_queries(dashboard)]
    # a level too short for a p99 bound has none (the upper needs 299 samples): a short run on a slow host
    # leaves that series empty, rightly; when any experiment here measured one, it must reach the panel
    unbounded = [f"servinglab_experiment_latency_p99_{b}_ms" for b in ("lower", "upper") if not measured_bound(b)]
    queries = [(title, query) for title, query in queries if not any(metric in query for metric in unbounded)]
    shows = [(title, query, eventually(partial(returns_data, query), SETTLE_SECONDS)) for title, query in queries]
    missing = [f"{title}: {query}" for title, query, shown in shows if not shown]
    if missing:  # what the operator exports now, and what the sweep's status holds, to tell why
        exported = prometheus.series('{__name__=~"servinglab_.+"}')
        sweep = cluster.kubectl.get("servingsweep", "chart-sweep", "-n", installed.namespace).get("status") or {}
        held = {key: sweep.get(key) for key in ("best", "front", "counts", "conditions")}
        pytest.fail(f"no data:\n{chr(10).join(missing)}\nseries: {exported}\nsweep: {held}\n{operator_log(installed)}")


# -- upgrade and uninstall (last: they change the release) ------------------------------------------


def upgraded_chart(directory: Path) -> Path:
    """The chart as a later release might ship it: its CRD defaults a field this operator does not know."""
    chart = directory / "serving"
    shutil.copytree(CHART, chart)
    crd_file = chart / "files" / "crd-servingexperiments.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["server"]["properties"]["upgradeKnob"] = {"type": "integer", "default": 3}
    crd_file.write_text(yaml.safe_dump(crd))
    return chart


def release_version(cluster: Cluster, namespace: str) -> int:
    return int(json.loads(cluster.helm("status", RELEASE, "-n", namespace, "-o", "json").stdout)["version"])


def test_an_upgrade_mid_run_leaves_the_running_experiment_and_its_server_alone(
    cluster: Cluster, installed: Installed, tmp_path: Path
) -> None:
    ns = installed.namespace
    body = experiment("mid-upgrade")
    body["spec"]["load"]["durationSeconds"] = 12  # two levels: the load outlasts the upgrade
    body["spec"]["cleanup"] = {"deleteServer": False}  # the server stays, to be compared afterwards
    cluster.kubectl.apply(body, namespace=ns)

    def status() -> dict[str, Any]:
        return dict(cluster.kubectl.get("sx", "mid-upgrade", "-n", ns).get("status") or {})

    started_or_ended = lambda: "Running" in str(status().get("conditions")) or "finishedAt" in status()  # noqa: E731
    cluster.kubectl.wait_for(started_or_ended, 180, "the load to start")
    assert "finishedAt" not in status(), (status(), operator_log(installed))
    server = "app.kubernetes.io/instance=mid-upgrade,app.kubernetes.io/component=server"
    pods = [p["metadata"]["uid"] for p in cluster.kubectl.get("pods", "-n", ns, "-l", server)["items"]]
    generation = cluster.kubectl.get("deployment", "mid-upgrade-server", "-n", ns)["metadata"]["generation"]
    operators = {p["metadata"]["uid"] for p in cluster.kubectl.get("pods", "-n", ns, "-l", OPERATOR_PODS)["items"]}
    try:
        # a new operator image, another image for experiments' pods, a CRD that defaults a new field
        cluster.helm(
            "upgrade", RELEASE, str(upgraded_chart(tmp_path)), "-n", ns, "--reuse-values",
            "--set", "image.tag=0.1.1", "--set", "experimentImage=servinglab/servinglab:0.1.1",
            "--wait", "--timeout", "180s",
        )  # fmt: skip
        assert "finishedAt" not in status(), status()  # the new operator took over mid-run...
        assert cluster.kubectl.get("sx", "mid-upgrade", "-n", ns)["spec"]["server"]["upgradeKnob"] == 3
        new = {p["metadata"]["uid"] for p in cluster.kubectl.get("pods", "-n", ns, "-l", OPERATOR_PODS)["items"]}
        assert new and not new & operators
        done = wait_finished(cluster, ns, "mid-upgrade", lambda: operator_log(installed))
        outcome = condition(done, "Succeeded")
        assert outcome["status"] == "True", (outcome["reason"], outcome["message"], operator_log(installed))
        assert len(done["status"]["results"]) == 2
        # ...and left the server alone: not re-applied, the same pod, no second one started beside it
        assert cluster.kubectl.get("deployment", "mid-upgrade-server", "-n", ns)["metadata"]["generation"] == generation
        assert [p["metadata"]["uid"] for p in cluster.kubectl.get("pods", "-n", ns, "-l", server)["items"]] == pods
    finally:
        cluster.kubectl.run("delete", "sx", "mid-upgrade", "-n", ns, "--wait=false", check=False)  # frees its GPU


def test_upgrade_rolls_the_operator_and_uninstall_keeps_the_crd_and_results(
    cluster: Cluster, installed: Installed, finished: dict[str, Any]
) -> None:
    ns = installed.namespace
    before = release_version(cluster, ns)
    cluster.helm("upgrade", RELEASE, str(CHART), "-n", ns, "--reuse-values", "--set", "pollSeconds=5",
                 "--wait", "--timeout", "180s")  # fmt: skip
    status = json.loads(cluster.helm("status", RELEASE, "-n", ns, "-o", "json").stdout)
    assert (status["version"], status["info"]["status"]) == (before + 1, "deployed")
    deployment = cluster.kubectl.get("deployment", OPERATOR, "-n", ns)
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SERVINGLAB_POLL_SECONDS"] == "5"
    assert deployment["status"].get("readyReplicas") == 1
    # the upgraded operator leaves the finished experiment as it was
    time.sleep(3)
    again = cluster.kubectl.get("sx", "chart-e2e", "-n", ns)
    assert again["status"]["results"] == finished["status"]["results"]

    cluster.helm("uninstall", RELEASE, "-n", ns, "--wait")
    for kind in ("deployments", "serviceaccounts", "roles", "rolebindings", "services", "configmaps"):
        assert not cluster.kubectl.get(kind, "-n", ns, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"], kind
    # helm.sh/resource-policy: keep — the CRD and every experiment with its results survive
    assert cluster.kubectl.get("sx", "chart-e2e", "-n", ns)["status"]["summary"]["state"] == "Succeeded"
