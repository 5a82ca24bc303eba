"""The GPU queue on the real control plane with two pools and two namespaces: T4 nodes (the session's
two single-T4 nodes) and an A100 node with two GPUs added here, one operator watching two namespaces,
and a GPU pod that is not the operator's.

No stand-in kubelet: KWOK runs the server pods, which never get ready, so every admitted experiment
holds its GPUs (a real bound pod) until it is deleted. The real scheduler places the pods; a pod left
Pending for lack of a GPU shows as a FailedScheduling event, which must never appear.

Then a namespace's ResourceQuota on GPUs, with the stand-in kubelet serving for real: two experiments
against a quota of one GPU, while both T4 nodes are free, run one after the other.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterenv import manifests
from clusterenv.controlplane import Cluster, register_nodes
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.kubelet import LocalKubelet
from clusterenv.operatorproc import Operator
from servinglab.api.conditions import epoch

pytestmark = [pytest.mark.k8s]

A100 = {"nvidia.com/gpu.product": "A100-SXM4-40GB"}
TOLERATE = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


@pytest.fixture()
def a100_node(cluster: Cluster) -> Iterator[str]:
    name = f"gpu-a100-{uuid.uuid4().hex[:4]}"
    register_nodes(cluster.kubectl, [manifests.node(name, gpus=2, product=A100["nvidia.com/gpu.product"])])
    yield name
    cluster.kubectl.run("delete", "node", name, "--wait=false", check=False)


@pytest.fixture()
def second_namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace whose pods get the GPU taint's toleration by default (PodTolerationRestriction)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    defaults = '[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]'
    cluster.kubectl.apply(
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": name, "annotations": {"scheduler.alpha.kubernetes.io/defaultTolerations": defaults},
                      "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )  # fmt: skip
    yield name
    cluster.kubectl.run("delete", "namespace", name, "--wait=false", check=False)


def holder(name: str, gpus: int, **server: Any) -> dict[str, Any]:
    """An experiment whose server keeps its GPUs: it never gets ready, and its startup timeout is long."""
    return experiment(name, gpus=gpus, startupTimeoutSeconds=900, **server)


def foreign_gpu_pod(name: str, node: str) -> dict[str, Any]:
    """Someone else's workload holding one GPU on the A100 node."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "tolerations": TOLERATE,
                 "containers": [{"name": "train", "image": "trainer:1",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }  # fmt: skip


def state(cluster: Cluster, namespace: str, name: str) -> tuple[bool, str]:
    """(admitted, the Queued condition's message while it waits)."""
    status = cluster.kubectl.get("sx", name, "-n", namespace).get("status") or {}
    queued = next((c for c in status.get("conditions", []) if c["type"] == "Queued"), {})
    return bool(status.get("startedAt")), str(queued.get("message", "")) if queued.get("status") == "True" else ""


def wait_state(cluster: Cluster, namespace: str, name: str, admitted: bool, text: str, log: Any) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now, message = state(cluster, namespace, name)
        if now == admitted and (admitted or text in message):
            return message
        time.sleep(0.5)
    pytest.fail(f"{namespace}/{name}: wanted admitted={admitted} {text!r}, is {state(cluster, namespace, name)}\n"
                f"{log()}")  # fmt: skip


def test_two_pools_and_two_namespaces_share_one_queue_without_blocking_or_overcommit(
    cluster: Cluster, crd: None, namespace: str, second_namespace: str, a100_node: str, tmp_path: Path
) -> None:
    ns1, ns2 = namespace, second_namespace
    trainer = f"trainer-{uuid.uuid4().hex[:6]}"
    cluster.kubectl.apply(foreign_gpu_pod(trainer, a100_node))
    operator = Operator(cluster, ns1, tmp_path, also_watch=(ns2,)).start()
    try:
        # head of the line: 2 A100 GPUs, while someone else's pod holds one of the two
        cluster.kubectl.apply(holder("a100-two", 2, nodeSelector=A100), namespace=ns1)
        time.sleep(1.1)  # creation order (whole seconds) is queue order
        cluster.kubectl.apply(holder("t4-a", 1), namespace=ns1)
        # ns2: no tolerations in the spec; the namespace's default toleration lets it onto the tainted T4s
        cluster.kubectl.apply(holder("t4-b", 1, tolerations=[]), namespace=ns2)
        wait_state(cluster, ns1, "a100-two", False, "1 of 2 in use; position 1 in the queue", operator.log)
        wait_state(cluster, ns1, "t4-a", True, "", operator.log)  # not behind the A100 experiment
        wait_state(cluster, ns2, "t4-b", True, "", operator.log)
        time.sleep(1.1)
        cluster.kubectl.apply(holder("t4-c", 1, tolerations=[]), namespace=ns2)
        time.sleep(1.1)
        cluster.kubectl.apply(holder("t4-d", 1), namespace=ns1)
        # both T4s are held across the two namespaces: one queue, in creation order
        wait_state(cluster, ns2, "t4-c", False, "2 of 2 in use; position 1 in the queue", operator.log)
        wait_state(cluster, ns1, "t4-d", False, "2 of 2 in use; position 2 in the queue", operator.log)

        cluster.kubectl.run("delete", "pod", trainer, "-n", "default", "--wait=false")
        wait_state(cluster, ns1, "a100-two", True, "", operator.log)
        cluster.kubectl.run("delete", "sx", "t4-a", "-n", ns1, "--wait=false")
        wait_state(cluster, ns2, "t4-c", True, "", operator.log)  # first in line, though in the other namespace
        assert state(cluster, ns1, "t4-d")[0] is False

        def placed() -> bool:  # every admitted server bound to a node of its pool
            pods = [p for ns in (ns1, ns2) for p in cluster.kubectl.get(
                "pods", "-n", ns, "-l", "app.kubernetes.io/component=server")["items"]
                if not p["metadata"].get("deletionTimestamp")]  # fmt: skip
            return len(pods) == 3 and all(p["spec"].get("nodeName") for p in pods)

        cluster.kubectl.wait_for(placed, 60, "three servers bound")
        nodes = {
            p["metadata"]["labels"]["servinglab.dev/experiment"]: p["spec"]["nodeName"]
            for ns in (ns1, ns2)
            for p in cluster.kubectl.get("pods", "-n", ns, "-l", "app.kubernetes.io/component=server")["items"]
            if not p["metadata"].get("deletionTimestamp")
        }
        assert (
            nodes["a100-two"] == a100_node
            and nodes["t4-b"].startswith("gpu-t4-")
            and nodes["t4-c"].startswith("gpu-t4-")
        )
        # no pod was ever left Pending for want of a GPU (the scheduler would have said so)
        for ns in (ns1, ns2):
            events = cluster.kubectl.get("events", "-n", ns, "--field-selector", "reason=FailedScheduling")["items"]
            assert not events, [e["message"] for e in events]
    finally:
        operator.stop()
        cluster.kubectl.run("delete", "pod", trainer, "-n", "default", "--wait=false", check=False)


@pytest.mark.torchserve
def test_two_experiments_against_a_quota_of_one_gpu_run_one_after_the_other_and_both_succeed(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    """Both T4 nodes are free, but the namespace may request one GPU in all: the second waits for the quota
    (its server's pods would be refused, and it would end Rejected), and runs once the first has let go."""
    kubelet_factory()
    hard = {"requests.nvidia.com/gpu": "1"}
    cluster.kubectl.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus"},
                           "spec": {"hard": hard}}, namespace=namespace)  # fmt: skip

    def counted() -> bool:
        return bool(cluster.kubectl.get("resourcequota", "gpus", "-n", namespace).get("status", {}).get("hard"))

    cluster.kubectl.wait_for(counted, 30, "the quota accounted for")
    cluster.kubectl.apply(experiment("first"), namespace=namespace)
    wait_state(cluster, namespace, "first", True, "", operator.log)
    cluster.kubectl.apply(experiment("second"), namespace=namespace)
    said = f"within the ResourceQuota gpus of namespace {namespace}: 1 of 1 in use, 0 left for new servers"
    wait_state(cluster, namespace, "second", False, said, operator.log)
    first = wait_finished(cluster, namespace, "first", operator.log, timeout=300)
    second = wait_finished(cluster, namespace, "second", operator.log, timeout=300)
    for body in (first, second):
        assert condition(body, "Succeeded")["status"] == "True", (body["status"], operator.log())
    assert epoch(second["status"]["startedAt"]) >= epoch(first["status"]["finishedAt"])
    assert second["status"]["queuedSeconds"] > 0
