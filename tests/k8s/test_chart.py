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
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.kubelet import LocalKubelet
from clusterenv.monitoring import DcgmExporter, Prometheus
from servinglab.api.crd import crd_manifest, sweep_crd_manifest
from servinglab.k8s import credentials

pytestmark = [pytest.mark.k8s]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "serving"
RELEASE = "serving"
OPERATOR = f"{RELEASE}-operator"  # the chart's name for the operator's Deployment, SA, Role, Service


def helm(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(cluster.binaries.helm), *args], env=cluster.env, capture_output=True, text=True, timeout=300, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def render(cluster: Cluster, namespace: str, *values: str) -> list[dict[str, Any]]:
    rendered = helm(cluster, "template", RELEASE, str(CHART), "-n", namespace, *values).stdout
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
    lint = helm(cluster, "lint", "--strict", str(CHART), "-n", namespace, *values)
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
    if variant == "default":
        assert kinds == sorted(
            ["CustomResourceDefinition", "CustomResourceDefinition", "ServiceAccount", "Role", "RoleBinding",
             "ClusterRole", "ClusterRoleBinding", "Deployment", "Service", "ConfigMap", "ConfigMap", "ConfigMap", "Pod",
             "NetworkPolicy"]
        )  # fmt: skip
        assert rbac["Role"]["metadata"]["namespace"] == namespace
        # the one cluster-scoped grant of a namespaced install: listing nodes (the GPU queue)
        assert rbac["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
    elif variant.startswith("all"):
        assert {"ClusterRole", "ClusterRoleBinding", "ServiceMonitor", "PodMonitor"} <= set(kinds)
        assert "Role" not in kinds and kinds.count("ClusterRole") == 2
        assert "NetworkPolicy" not in kinds  # the namespaces are not known: the README says what to apply
        podmonitor = next(d for d in documents if d["kind"] == "PodMonitor")
        assert podmonitor["spec"]["namespaceSelector"] == {"any": True}
    else:
        roles = [d["metadata"]["namespace"] for d in documents if d["kind"] == "Role"]
        assert roles == [namespace, "default"]
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


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"image": {"tag": "latest"}}, "/image/tag"),
        ({"pollSeconds": "fast"}, "/pollSeconds"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "/watchNamespaces/0"),
        ({"prometheusUrl": "prometheus:9090"}, "/prometheusUrl"),
        ({"replicaCount": 2}, "replicaCount"),
        ({"modelCredentials": [{"secret": "registry", "key": "token"}]}, "/modelCredentials/0"),
        (
            {"modelCredentials": [{"secret": "registry", "key": "token", "hosts": ["https://h/"]}]},
            "/modelCredentials/0/hosts/0",
        ),
    ],
)
def test_values_violating_the_schema_are_refused_naming_the_key(
    cluster: Cluster, tmp_path: Path, values: dict[str, Any], named: str
) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    for command in ("lint", "template"):
        result = helm(cluster, command, str(CHART), "-f", str(values_file), check=False)
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

    def server_started(pod: str, metrics_port: int) -> None:
        exporter.pods.append((namespace, pod))
        prometheus.scrape(f"127.0.0.1:{metrics_port}", {"namespace": namespace, "pod": pod})

    def operator_started(pod: str, metrics_port: int) -> None:
        prometheus.scrape(f"127.0.0.1:{metrics_port}", {"operator_pod": pod})

    api = cluster.api_server(workdir / "ca.crt")
    pods = Path(tempfile.mkdtemp(prefix="pods-"))  # short paths: unix sockets live under it
    kubelet = LocalKubelet(
        cluster.kubectl, namespace, pods, api, workdir / "ca.crt", server_started, on_operator_started=operator_started
    ).start()
    try:
        helm(
            cluster, "install", RELEASE, str(CHART), "-n", namespace, "--take-ownership",
            "--wait", "--timeout", "180s", "--set", "pollSeconds=1", "--set", "unschedulableGraceSeconds=3",
            "--set", f"prometheusUrl={prometheus.url}",
        )  # fmt: skip
        yield Installed(namespace, kubelet, prometheus)
    finally:
        helm(cluster, "uninstall", RELEASE, "-n", namespace, "--wait", check=False)
        kubelet.stop()
        cluster.kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)


def operator_log(installed: Installed) -> str:
    logs = sorted(installed.kubelet.workdir.glob("kl-*/operator.log"))
    return "\n".join(path.read_text(errors="replace")[-3000:] for path in logs) + f"\n{installed.kubelet.errors}"


def test_install_creates_the_operator_and_serves_the_crd(cluster: Cluster, installed: Installed) -> None:
    ns = installed.namespace
    status = json.loads(helm(cluster, "status", RELEASE, "-n", ns, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    selector = f"app.kubernetes.io/instance={RELEASE}"
    created = {
        (item["kind"], item["metadata"]["name"])
        for kind in ("deployments", "serviceaccounts", "roles", "rolebindings", "services", "configmaps")
        for item in cluster.kubectl.get(kind, "-n", ns, "-l", selector)["items"]
    }
    assert created == {
        ("Deployment", OPERATOR), ("ServiceAccount", OPERATOR), ("Role", OPERATOR), ("RoleBinding", OPERATOR),
        ("Service", OPERATOR), ("ConfigMap", f"{RELEASE}-dashboard-torchserve"),
        ("ConfigMap", f"{RELEASE}-dashboard-gpu"), ("ConfigMap", f"{RELEASE}-dashboard-experiments"),
    }  # fmt: skip
    deployment = cluster.kubectl.get("deployment", OPERATOR, "-n", ns)
    assert deployment["status"].get("readyReplicas") == 1, deployment["status"]
    crd = cluster.kubectl.get("crd", "servingexperiments.servinglab.dev")
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True"
    assert cluster.kubectl.run("get", "servingexperiments", "-n", ns).returncode == 0


# What the operator does, written out independently of the chart: the RBAC must be exactly this.
OPERATOR_NEEDS = {
    "servingexperiments.servinglab.dev": {"get", "list", "watch", "create", "patch"},
    "servingexperiments.servinglab.dev/status": {"patch"},
    "servingsweeps.servinglab.dev": {"get", "list", "watch", "patch"},
    "servingsweeps.servinglab.dev/status": {"patch"},
    "servingexperiments.servinglab.dev/finalizers": {"update"},  # OwnerReferencesPermissionEnforcement
    "servingsweeps.servinglab.dev/finalizers": {"update"},
    "leases.coordination.k8s.io": {"get", "create", "update"},  # leader election
    "nodes": {"list"},  # cluster-scoped: the GPU queue's capacity
    "configmaps": {"get", "create", "patch"},
    "serviceaccounts": {"get", "create", "patch"},
    "services": {"get", "create", "patch", "delete"},
    "deployments.apps": {"get", "create", "patch", "delete"},
    "jobs.batch": {"get", "create", "patch", "delete"},
    "pods": {"list"},
    "roles.rbac.authorization.k8s.io": {"get", "create", "patch"},
    "rolebindings.rbac.authorization.k8s.io": {"get", "create", "patch"},
    "events": {"create"},
    "secrets": {"create"},  # the load pods' generator key; never read back
    "networkpolicies.networking.k8s.io": {"get", "create", "patch"},
}
# Granted to every authenticated identity by Kubernetes itself (system:basic-user and friends).
EVERYONE_MAY = {
    "selfsubjectreviews.authentication.k8s.io",
    "selfsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectrulesreviews.authorization.k8s.io",
}


def can_i_list(cluster: Cluster, namespace: str, identity: str) -> dict[str, set[str]]:
    listing = cluster.kubectl.run("auth", "can-i", "--list", "-n", namespace, "--as", identity).stdout
    rules: dict[str, set[str]] = {}
    for line in listing.splitlines()[1:]:
        if not line.strip() or line.startswith(" "):  # non-resource URLs
            continue
        resource = line.split()[0]
        verbs = re.findall(r"\[([^\]]*)\]\s*$", line)[0].split()
        rules.setdefault(resource, set()).update(verbs)
    return {resource: verbs for resource, verbs in rules.items() if resource not in EVERYONE_MAY}


def can_i(cluster: Cluster, identity: str, *request: str) -> bool:
    result = cluster.kubectl.run("auth", "can-i", *request, "--as", identity, check=False)
    return result.stdout.strip() == "yes"


def test_operator_service_account_can_do_exactly_what_it_needs(cluster: Cluster, installed: Installed) -> None:
    ns = installed.namespace
    identity = f"system:serviceaccount:{ns}:{OPERATOR}"
    assert can_i_list(cluster, ns, identity) == OPERATOR_NEEDS
    for resource, verbs in OPERATOR_NEEDS.items():
        name, _, subresource = resource.partition("/")
        extra = [f"--subresource={subresource}"] if subresource else []
        for verb in verbs:
            assert can_i(cluster, identity, verb, name, "-n", ns, *extra), (verb, resource)
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
    ):
        assert not can_i(cluster, identity, *request), request


def test_all_namespaces_option_grants_the_same_rules_cluster_wide(cluster: Cluster, namespace: str) -> None:
    release = "serving-all"
    helm(
        cluster, "install", release, str(CHART), "-n", namespace, "--set", "watchAllNamespaces=true",
        "--set", "crds.install=false", "--set", "dashboards.enabled=false",
    )  # fmt: skip
    try:
        identity = f"system:serviceaccount:{namespace}:{release}-operator"
        elsewhere = f"other-{uuid.uuid4().hex[:6]}"
        assert can_i_list(cluster, elsewhere, identity) == {
            **OPERATOR_NEEDS,
            "customresourcedefinitions.apiextensions.k8s.io": {"list", "watch"},
        }
        assert can_i(cluster, identity, "list", "servingexperiments.servinglab.dev", "--all-namespaces")
        assert not can_i(cluster, identity, "get", "secrets", "-n", elsewhere)
        deployment = cluster.kubectl.get("deployment", f"{release}-operator", "-n", namespace)
        assert "--all-namespaces" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    finally:
        helm(cluster, "uninstall", release, "-n", namespace, "--wait")
    assert not cluster.kubectl.get("clusterroles", "-l", f"app.kubernetes.io/instance={release}")["items"]


def test_helm_test_checks_the_operators_health(cluster: Cluster, installed: Installed) -> None:
    result = helm(cluster, "test", RELEASE, "-n", installed.namespace, "--timeout", "120s", check=False)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{operator_log(installed)}"
    assert re.search(rf"TEST SUITE:\s+{OPERATOR}-test\n(?:.*\n)*?Phase:\s+Succeeded", result.stdout), result.stdout


@pytest.fixture(scope="module")
def finished(cluster: Cluster, installed: Installed) -> dict[str, Any]:
    """A tiny experiment run by the chart's operator; GPU metrics from the chart's prometheusUrl. Beside
    it, a one-trial sweep (the other T4), so the dashboards' sweep panels have a real sweep to show."""
    ns = installed.namespace
    template = experiment("template")["spec"]
    one_trial = {
        "apiVersion": "servinglab.dev/v1alpha1", "kind": "ServingSweep", "metadata": {"name": "chart-sweep"},
        "spec": {"template": template, "strategy": "list",
                 "configurations": [{"batchSize": 4, "maxBatchDelayMs": 5, "workers": 1, "precision": "fp32"}]},
    }  # fmt: skip
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
    sweep = cluster.kubectl.get("servingsweep", "chart-sweep", "-n", ns)
    if "bestConfig" not in sweep["status"]["summary"]:  # the trial did not measure: say why, the dashboards can't
        trials = cluster.kubectl.get("sx", "-n", ns, "-l", "servinglab.dev/sweep=chart-sweep")["items"]
        outcomes = [(trial["metadata"]["name"], trial.get("status", {}).get("conditions")) for trial in trials]
        pytest.fail(f"the sweep measured nothing: {sweep['status']}\ntrials: {outcomes}\n{operator_log(installed)}")
    return body


@pytest.fixture(scope="module")
def finished_litserve(cluster: Cluster, installed: Installed, finished: dict[str, Any]) -> dict[str, Any]:
    """The LitServe experiment `finished` applied beside the TorchServe one."""
    body = wait_finished(cluster, installed.namespace, "chart-litserve", lambda: operator_log(installed))
    assert condition(body, "Succeeded")["status"] == "True", (body["status"], operator_log(installed))
    return body


def test_experiment_succeeds_as_the_charts_service_account(finished: dict[str, Any]) -> None:
    status = finished["status"]
    assert [level["concurrency"] for level in status["results"]] == [1, 4]
    assert all(level["throughputRps"] > 0 and level["errors"] == 0 for level in status["results"])
    # the chart's prometheusUrl reached the operator: GPU figures without one in the experiment
    assert condition(finished, "GPUMetricsAvailable")["status"] == "True"
    assert all("gpu" in level for level in status["results"])


# -- dashboards --------------------------------------------------------------------------------------

DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
# Grafana's built-in variables, as a 1 s scrape interval and a short run make them.
GRAFANA_BUILTINS = {"$__rate_interval": "15s", "$__interval": "5s", "$__range": "60s"}


def grafana_expression(expression: str) -> str:
    """The query Grafana sends with every template variable set to All (its allValue `.*`)."""
    for builtin, value in GRAFANA_BUILTINS.items():
        expression = expression.replace(builtin, value)
    return re.sub(r"\$\{?(\w+)\}?", ".*", expression)


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


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
        assert eventually(partial(has_label, metric, label)), (variable["name"], metric, label)

    def returns_data(query: str) -> bool:
        return bool(finite_values(prometheus.query(query, at)))

    queries = [(title, grafana_expression(expression)) for title, expression in panel_queries(dashboard)]
    missing = [f"{title}: {query}" for title, query in queries if not eventually(partial(returns_data, query))]
    assert not missing, "no data:\n" + "\n".join(missing)


def eventually(check: Callable[[], bool], seconds: float = 20) -> bool:
    """Whether `check` holds within `seconds`: the operator's figures appear with its next scrape,
    which on a busy machine can come some seconds after the experiment's status says Succeeded."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
    return True


# -- upgrade and uninstall (last: they change the release) ------------------------------------------


def test_upgrade_rolls_the_operator_and_uninstall_keeps_the_crd_and_results(
    cluster: Cluster, installed: Installed, finished: dict[str, Any]
) -> None:
    ns = installed.namespace
    helm(cluster, "upgrade", RELEASE, str(CHART), "-n", ns, "--reuse-values", "--set", "pollSeconds=5",
         "--wait", "--timeout", "180s")  # fmt: skip
    status = json.loads(helm(cluster, "status", RELEASE, "-n", ns, "-o", "json").stdout)
    assert (status["version"], status["info"]["status"]) == (2, "deployed")
    deployment = cluster.kubectl.get("deployment", OPERATOR, "-n", ns)
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SERVINGLAB_POLL_SECONDS"] == "5"
    assert deployment["status"].get("readyReplicas") == 1
    # the upgraded operator leaves the finished experiment as it was
    time.sleep(3)
    again = cluster.kubectl.get("sx", "chart-e2e", "-n", ns)
    assert again["status"]["results"] == finished["status"]["results"]

    helm(cluster, "uninstall", RELEASE, "-n", ns, "--wait")
    for kind in ("deployments", "serviceaccounts", "roles", "rolebindings", "services", "configmaps"):
        assert not cluster.kubectl.get(kind, "-n", ns, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"], kind
    # helm.sh/resource-policy: keep — the CRD and every experiment with its results survive
    assert cluster.kubectl.get("sx", "chart-e2e", "-n", ns)["status"]["summary"]["state"] == "Succeeded"
