"""The test cluster is real: scheduling with GPU resources and taints, Job outcomes, garbage
collection and CRD validation are done by the real Kubernetes components, not by mocks."""

from __future__ import annotations

import base64
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterenv import manifests
from clusterenv.apiread import ApiReader
from clusterenv.controlplane import Cluster
from clusterenv.kubectl import ClusterError, Kubectl

pytestmark = pytest.mark.k8s

T4_SELECTOR = {"nvidia.com/gpu.product": "Tesla-T4"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


# Test namespaces enforce the restricted Pod Security Standard; these pods comply.
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def gpu_deployment(name: str, gpus: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": T4_SELECTOR,
                    "tolerations": [GPU_TOLERATION],
                    "securityContext": POD_SECURITY,
                    "containers": [
                        {
                            "name": "server",
                            "image": "pytorch/torchserve:0.12.0-gpu",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                            "securityContext": CONTAINER_SECURITY,
                        }
                    ],
                },
            },
        },
    }


def job(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations or {}},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": POD_SECURITY,
                    "containers": [
                        {"name": "load", "image": "servinglab/loadgen:0.1.0", "securityContext": CONTAINER_SECURITY}
                    ],
                },
            },
        },
    }


def pods_of(kubectl: Kubectl, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl.get("pods", "-n", namespace, "-l", selector)["items"]
    return items


def test_versions_are_the_pinned_ones(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl.run("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == version["clientVersion"]["gitVersion"]
    assert version["serverVersion"]["gitVersion"].startswith("v1.")
    assert version["serverVersion"]["gitVersion"] != "v0.0.0-master+$Format:%H$"


def test_simulated_gpu_nodes_look_like_t4_nodes(cluster: Cluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in cluster.kubectl.get("nodes")["items"]}
    gpu_nodes = [n for n in nodes.values() if n["metadata"]["labels"].get("nvidia.com/gpu.product") == "Tesla-T4"]
    assert len(gpu_nodes) >= 2
    for node in gpu_nodes:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert "nvidia.com/gpu" not in nodes["cpu-0"]["status"]["allocatable"]


def test_gpu_deployment_is_scheduled_on_a_t4_node_and_becomes_available(cluster: Cluster, namespace: str) -> None:
    kubectl = cluster.kubectl
    kubectl.apply(gpu_deployment("server", gpus=1), namespace=namespace)
    kubectl.run("wait", "-n", namespace, "deployment/server", "--for=condition=Available", "--timeout=90s")
    (pod,) = pods_of(kubectl, namespace, "app=server")
    node = kubectl.get("node", pod["spec"]["nodeName"])
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "Tesla-T4"
    assert pod["status"]["phase"] == "Running"


def test_deployment_wanting_more_gpus_than_any_node_stays_pending_with_the_reason(
    cluster: Cluster, namespace: str
) -> None:
    kubectl = cluster.kubectl
    kubectl.apply(gpu_deployment("greedy", gpus=4), namespace=namespace)

    def scheduler_said_why() -> bool:
        events = kubectl.get("events", "-n", namespace, "--field-selector", "reason=FailedScheduling")["items"]
        return any("Insufficient nvidia.com/gpu" in e.get("message", "") for e in events)

    kubectl.wait_for(scheduler_said_why, 60, "a FailedScheduling event naming nvidia.com/gpu")
    (pod,) = pods_of(kubectl, namespace, "app=greedy")
    assert pod["status"]["phase"] == "Pending"
    (condition,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert condition["status"] == "False" and condition["reason"] == "Unschedulable"


def test_job_completes(cluster: Cluster, namespace: str) -> None:
    kubectl = cluster.kubectl
    kubectl.apply(job("done", {manifests.EXIT_CODE_ANNOTATION: "0"}), namespace=namespace)
    kubectl.run("wait", "-n", namespace, "job/done", "--for=condition=Complete", "--timeout=90s")


def test_failing_job_records_exit_code_and_message_chosen_by_the_test(cluster: Cluster, namespace: str) -> None:
    kubectl = cluster.kubectl
    kubectl.apply(job("fails"), namespace=namespace)
    # Without the annotation the pod keeps running, like real work; the test decides when and how it ends.
    kubectl.wait_for(
        lambda: any(p["status"].get("phase") == "Running" for p in pods_of(kubectl, namespace, "job-name=fails")),
        60,
        "the Job's pod Running",
    )
    (pod,) = pods_of(kubectl, namespace, "job-name=fails")
    kubectl.run(
        "annotate", "-n", namespace, "pod", pod["metadata"]["name"],
        f"{manifests.EXIT_CODE_ANNOTATION}=3", f"{manifests.MESSAGE_ANNOTATION}=CUDA error: out of memory",
    )  # fmt: skip
    kubectl.run("wait", "-n", namespace, "job/fails", "--for=condition=Failed", "--timeout=90s")
    (pod,) = pods_of(kubectl, namespace, "job-name=fails")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert pod["status"]["phase"] == "Failed"
    assert terminated["exitCode"] == 3
    assert terminated["message"] == "CUDA error: out of memory"
    assert terminated["reason"] == "Error"


def test_deleting_an_owner_garbage_collects_its_children(cluster: Cluster, namespace: str) -> None:
    kubectl = cluster.kubectl
    kubectl.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}, namespace=namespace)
    owner = kubectl.get("configmap", "owner", "-n", namespace)
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    children = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"child-{i}", "ownerReferences": [reference]},
        }
        for i in range(2)
    ]
    kubectl.apply(*children, namespace=namespace)
    kubectl.run("delete", "configmap", "owner", "-n", namespace)

    def children_gone() -> bool:
        names = {i["metadata"]["name"] for i in kubectl.get("configmaps", "-n", namespace)["items"]}
        return not names & {"child-0", "child-1"}

    kubectl.wait_for(children_gone, 60, "the garbage collector to delete the children")


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.servinglab.dev"},
    "spec": {
        "group": "test.servinglab.dev",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"batchSize": {"type": "integer", "minimum": 1, "maximum": 1024}},
                            }
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_is_served_and_schema_violations_are_rejected_with_the_field(cluster: Cluster, namespace: str) -> None:
    kubectl = cluster.kubectl
    kubectl.apply(CRD)
    kubectl.wait_established("widgets.test.servinglab.dev")

    def widget(batch_size: int) -> dict[str, Any]:
        return {
            "apiVersion": "test.servinglab.dev/v1",
            "kind": "Widget",
            "metadata": {"name": f"w{batch_size}"},
            "spec": {"batchSize": batch_size},
        }

    kubectl.wait_for(
        lambda: kubectl.run("get", "widgets", "-n", namespace, check=False).returncode == 0,
        30,
        "widgets served",
    )
    kubectl.apply(widget(8), namespace=namespace)
    assert kubectl.get("widget", "w8", "-n", namespace)["spec"]["batchSize"] == 8
    rejected = kubectl.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(widget(0)), check=False)
    assert rejected.returncode != 0
    assert "spec.batchSize" in rejected.stderr
    assert "should be greater than or equal to 1" in rejected.stderr


def test_pods_with_a_readiness_probe_become_ready_only_when_probed(cluster: Cluster, namespace: str) -> None:
    """Like a kubelet: Running at once, Ready only after the (harness-run) probe passes."""
    kubectl = cluster.kubectl
    deployment = gpu_deployment("probed", gpus=1)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"] = {"httpGet": {"path": "/ping", "port": 8080}}
    kubectl.apply(deployment, namespace=namespace)

    def running() -> list[dict[str, Any]]:
        return [p for p in pods_of(kubectl, namespace, "app=probed") if p["status"].get("phase") == "Running"]

    kubectl.wait_for(lambda: bool(running()), 60, "the probed pod Running")
    (pod,) = running()
    ready = [c for c in pod["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "False"
    assert kubectl.get("deployment", "probed", "-n", namespace)["status"].get("availableReplicas") is None
    kubectl.run("annotate", "-n", namespace, "pod", pod["metadata"]["name"], f"{manifests.READY_ANNOTATION}=true")
    kubectl.run("wait", "-n", namespace, "deployment/probed", "--for=condition=Available", "--timeout=60s")


def test_test_namespaces_refuse_pods_that_break_the_restricted_standard(cluster: Cluster, namespace: str) -> None:
    """What makes "every pod the operator creates is compliant" a proof: the API server enforces it here."""
    loose = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "loose"},
             "spec": {"containers": [{"name": "c", "image": "servinglab/loadgen:0.1.0"}]}}  # fmt: skip
    refused = cluster.kubectl.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(loose), check=False)
    assert refused.returncode != 0 and 'violates PodSecurity "restricted:latest"' in refused.stderr, refused.stderr
    compliant = {**loose, "spec": {"securityContext": POD_SECURITY, "containers": [
        {"name": "c", "image": "servinglab/loadgen:0.1.0", "securityContext": CONTAINER_SECURITY}]}}  # fmt: skip
    cluster.kubectl.apply(compliant, namespace=namespace)


def test_reads_in_process_and_through_kubectl_see_the_same_objects(cluster: Cluster, namespace: str) -> None:
    """The polling loops read in-process (apiread.py); a kubeconfig it cannot use falls back to
    `kubectl get --raw`. Both see the same pod, and both say "none" for one that does not exist."""
    cluster.kubectl.apply(gpu_deployment("read-me", gpus=1), namespace=namespace)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    cluster.kubectl.wait_for(lambda: bool(cluster.kubectl.read(pods)["items"]), 60, "the deployment's pod")
    # as for a kubeconfig with an exec plugin, which the in-process reader cannot use
    through_kubectl = Kubectl(cluster.kubectl.binary, cluster.kubeconfig, in_process_reads=False)
    (pod,) = cluster.kubectl.read(pods)["items"]
    name = pod["metadata"]["name"]
    for kubectl in (cluster.kubectl, through_kubectl):
        assert kubectl.read(f"{pods}/{name}")["metadata"]["uid"] == pod["metadata"]["uid"]
        assert [item["metadata"]["name"] for item in kubectl.read(pods)["items"]] == [name]
        assert kubectl.read(f"{pods}/{name}-gone") is None
    assert not through_kubectl.reads_in_process


def test_the_in_process_reader_takes_named_or_embedded_credentials_and_keeps_no_copy(
    cluster: Cluster, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kind's and our kubeconfigs embed the CA and the client's certificate and key; others name files,
    relative to the kubeconfig's folder as for kubectl. The reader takes both. ssl loads only from files,
    so the embedded ones are written for a moment: no copy stays."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())  # a fresh copy: the same, with files named
    cluster_section, user_section = config["clusters"][0]["cluster"], config["users"][0]["user"]
    if "client-key-data" not in user_section:
        pytest.skip("this cluster's kubeconfig does not embed a client certificate (--cluster=existing)")
    for section, key in ((cluster_section, "certificate-authority"), (user_section, "client-certificate"),
                         (user_section, "client-key")):  # fmt: skip
        (tmp_path / f"{key}.pem").write_bytes(base64.b64decode(section.pop(f"{key}-data")))
        section[key] = f"{key}.pem"
    (tmp_path / "named.kubeconfig").write_text(json.dumps(config))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.chdir(scratch)  # not the kubeconfig's folder

    readers = [ApiReader(cluster.kubeconfig), ApiReader(tmp_path / "named.kubeconfig")]

    assert list(scratch.iterdir()) == []  # the embedded credentials' copies are gone
    for reader in readers:
        assert reader.get(f"/api/v1/namespaces/{namespace}")["metadata"]["name"] == namespace
        assert reader.get(f"/api/v1/namespaces/{namespace}-gone") is None
    assert cluster.kubectl.reads_in_process


def test_a_refused_read_is_an_error_and_an_unusable_kubeconfig_falls_back_to_kubectl(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Only a missing object reads as None: a refused read (a wrong token here) is a ClusterError, in-process
    and through kubectl alike. A kubeconfig the reader cannot use (an exec plugin) reads through kubectl."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["users"][0]["user"] = {"token": "not-a-token"}
    (tmp_path / "token.kubeconfig").write_text(json.dumps(config))
    wrong_token = Kubectl(cluster.kubectl.binary, tmp_path / "token.kubeconfig")
    config["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "false"}}
    (tmp_path / "exec.kubeconfig").write_text(json.dumps(config))

    assert wrong_token.reads_in_process
    for kubectl in (wrong_token, Kubectl(cluster.kubectl.binary, wrong_token.kubeconfig, in_process_reads=False)):
        with pytest.raises(ClusterError, match=r"401|Unauthorized"):
            kubectl.read("/api/v1/namespaces/default")
    assert not Kubectl(cluster.kubectl.binary, tmp_path / "exec.kubeconfig").reads_in_process
