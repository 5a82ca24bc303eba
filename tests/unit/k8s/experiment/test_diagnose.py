"""Pods that never start and servers that go away, read from pod, node and Deployment status as a kubelet
and the controllers write it: each gives the reason the experiment ends with, at once or after the grace a
registry or a late Secret deserves; and an out-of-memory end prunes a sweep's larger configurations.
(tests/k8s/test_operator_endings.py drives the same states through a cluster.)"""

from __future__ import annotations

from typing import Any

import pytest

from servinglab.api import TrialConfig, parse_experiment
from servinglab.k8s.experiment import diagnose
from servinglab.servers import get
from servinglab.servers.base import OUT_OF_MEMORY
from servinglab.sweep import rollup, search
from support.manifests import experiment

NOW = 1_700_000_100.0
CREATED = "2023-11-14T22:13:20Z"  # NOW - 100 s


def pod(
    name: str = "x-server-1", phase: str = "Pending", node: str | None = "gpu-t4-0", **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": CREATED},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, **status},
    }


def waiting(reason: str, message: str = "", init: bool = False, image: str = "registry.invalid/ts:1") -> dict[str, Any]:
    container = {"name": "model" if init else "torchserve", "image": image, "state": {"waiting": {"reason": reason,
                 "message": message}}}  # fmt: skip
    return pod(**{"initContainerStatuses" if init else "containerStatuses": [container]})


@pytest.mark.parametrize(
    ("reason", "grace", "expected"),
    [
        ("InvalidImageName", 1000, "ImagePullFailed"),  # never pullable: at once
        ("ErrImagePull", 1000, None),  # a registry may recover: within the grace, a wait
        ("ErrImagePull", 30, "ImagePullFailed"),
        ("ImagePullBackOff", 30, "ImagePullFailed"),
        ("CreateContainerConfigError", 1000, None),  # the Secret may be created in a moment
        ("CreateContainerConfigError", 30, "ConfigMissing"),
        ("ContainerCreating", 30, None),
        ("PodInitializing", 30, None),
    ],
)
def test_containers_that_cannot_start(reason: str, grace: float, expected: str | None) -> None:
    found = diagnose.start_failure([waiting(reason, "said by the kubelet")], "server", grace, NOW)
    assert (found[0] if found else None) == expected
    if found is not None:
        assert "server pod x-server-1, container torchserve" in found[1] and "said by the kubelet" in found[1]


def test_a_missing_secret_of_the_model_init_container_is_config_missing() -> None:
    found = diagnose.start_failure([waiting("CreateContainerConfigError", 'secret "token" not found', init=True)],
                                   "server", 30, NOW)  # fmt: skip
    assert found == ("ConfigMissing", 'server pod x-server-1, container model cannot start: secret "token" not found')


def test_an_unpullable_image_is_named() -> None:
    found = diagnose.start_failure([waiting("ImagePullBackOff", 'Back-off pulling image "registry.invalid/ts:1"')],
                                   "load", 30, NOW)  # fmt: skip
    assert found is not None and found[0] == "ImagePullFailed"
    assert found[1].startswith("load pod x-server-1, container torchserve: image registry.invalid/ts:1 cannot be")


def test_an_evicted_server_and_one_killed_for_memory() -> None:
    gone = pod(phase="Failed", reason="Evicted", message="The node was low on resource: memory.")
    assert diagnose.evicted([gone]) == (
        "ServerEvicted",
        "server pod x-server-1 was evicted by its node: The node was low on resource: memory.",
    )
    assert diagnose.evicted([pod(phase="Failed", reason="Error")]) is None  # a crash is not an eviction
    killed = {"name": "torchserve", "restartCount": 1, "state": {"running": {}},
              "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}  # fmt: skip
    found = diagnose.out_of_memory([pod(phase="Running", containerStatuses=[killed])])
    assert found is not None and found[0] == OUT_OF_MEMORY and "OOMKilled" in found[1]
    crashed = {**killed, "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}
    assert diagnose.out_of_memory([pod(phase="Running", containerStatuses=[crashed])]) is None


def node(ready: str, reason: str = "KubeletReady", since: str | None = CREATED) -> dict[str, Any]:
    said: dict[str, Any] = {"type": "Ready", "status": ready, "reason": reason}
    if since is not None:
        said["lastTransitionTime"] = since
    conditions = [{"type": "MemoryPressure", "status": "False"}, said]
    return {"metadata": {"name": "gpu-t4-0"}, "status": {"conditions": conditions}}


def test_a_server_whose_node_is_gone_or_not_ready_past_the_grace_is_lost() -> None:
    running = pod(phase="Running")
    assert diagnose.nodes_of([running, pod(node=None)]) == ["gpu-t4-0"]
    assert diagnose.lost_node([running], {"gpu-t4-0": node("True")}, 30, NOW) is None
    assert diagnose.lost_node([running], {"gpu-t4-0": None}, 30, NOW) == (
        "ServerLost",
        "node gpu-t4-0 of server pod x-server-1 was deleted",
    )
    # NotReady for 100 s: past a grace of 30 s, within one of 120 s (a kubelet restart, a missed heartbeat)
    unknown = node("Unknown", "NodeStatusUnknown")
    found = diagnose.lost_node([running], {"gpu-t4-0": unknown}, 30, NOW)
    assert found == (
        "ServerLost", "node gpu-t4-0 of server pod x-server-1 is not Ready (Unknown, NodeStatusUnknown) for 100 s"
    )  # fmt: skip
    assert diagnose.lost_node([running], {"gpu-t4-0": unknown}, 120, NOW) is None
    # no transition time: how long it has lasted cannot be told, so it is not waited for
    found = diagnose.lost_node([running], {"gpu-t4-0": node("False", "KubeletNotReady", since=None)}, 120, NOW)
    assert found == ("ServerLost", "node gpu-t4-0 of server pod x-server-1 is not Ready (False, KubeletNotReady)")
    deleting = {**running, "metadata": {**running["metadata"], "deletionTimestamp": CREATED}}
    assert diagnose.lost_node([deleting], {"gpu-t4-0": None}, 30, NOW) is None  # going anyway: replaced_server's case


def test_pods_the_api_refuses_to_create_and_a_missing_payload_claim() -> None:
    refused = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "lastTransitionTime": CREATED,
               "message": 'pods "x-server-1" is forbidden: exceeded quota: q'}  # fmt: skip
    deployment = {"status": {"conditions": [refused]}}
    assert diagnose.refused_pods(deployment, 30, NOW) == 'the server\'s pods are refused: pods "x-server-1" is ' \
        "forbidden: exceeded quota: q"  # fmt: skip
    # a refusal younger than the grace may pass on its own (the ServiceAccount of a namespace made a moment ago)
    assert diagnose.refused_pods(deployment, 120, NOW) is None
    available = {"status": {"conditions": [{"type": "Available", "status": "False"}]}}
    assert diagnose.refused_pods(available, 30, NOW) is None
    payload = {"files": ["a.jpg"], "pvc": {"claimName": "bodies", "path": "in"}}
    spec = parse_experiment(experiment("x", load={"payload": payload})).spec
    said = '0/3 nodes are available: persistentvolumeclaim "bodies" not found.'
    scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": said}
    unplaced = pod("x-load-0", node=None, conditions=[scheduled])
    assert diagnose.payload_missing([unplaced], spec) == (
        'load pod x-load-0 cannot be placed: 0/3 nodes are available: persistentvolumeclaim "bodies" not found.'
    )
    assert diagnose.stuck([unplaced], 30, NOW) == "x-load-0" and diagnose.stuck([unplaced], 1000, NOW) is None


def test_a_model_that_does_not_fit_the_gpu_ends_as_out_of_memory_through_the_seam() -> None:
    torchserve = get("torchserve")
    oom = "ModelLoadFailed: TorchServe's workers could not load m (2 attempts): torch.OutOfMemoryError: CUDA out of"
    assert torchserve.start_failure(oom + " memory. Tried to allocate 2.00 GiB")[0] == OUT_OF_MEMORY  # type: ignore[index]
    other = "ModelLoadFailed: TorchServe's workers could not load m (2 attempts): KeyError: 'fc'"
    assert torchserve.start_failure(other) == ("ModelLoadFailed", other.partition(": ")[2])
    ended = pod(phase="Running", containerStatuses=[{"name": "torchserve", "state": {"terminated": {
        "exitCode": 3, "message": oom + " memory."}}}])  # fmt: skip
    found = diagnose.server_start_failure([ended], torchserve)
    assert found is not None and found[0] == OUT_OF_MEMORY


def test_a_trial_that_ended_out_of_memory_on_a_cluster_prunes_larger_configurations() -> None:
    assert search.OUT_OF_MEMORY == OUT_OF_MEMORY  # the reason the operator ends with is the one the search prunes on
    small = TrialConfig(batch_size=8, max_batch_delay_ms=5, workers=1, precision="fp16")
    large = TrialConfig(batch_size=32, max_batch_delay_ms=5, workers=2, precision="fp16")
    # as the sweep reconciler records a Failed trial: "<reason>: <message>"
    for failure in (
        "OutOfMemory: server pod t-1: container torchserve was killed for exceeding its memory",
        "OutOfMemory: server pod t-1: TorchServe's workers could not load m: CUDA out of memory",
    ):
        assert rollup.classify_failure(failure) == OUT_OF_MEMORY
        history = [search.Outcome(small, None, feasible=False, reason=rollup.classify_failure(failure))]
        assert search.pruned_by(history, large) == "implied by OutOfMemory at b8-d5-w1-fp16"


def test_a_replica_counts_as_serving_only_once_its_ready_condition_is_true() -> None:
    def pod(phase: str, ready: str | None) -> dict[str, object]:
        conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
        return {"metadata": {"name": "p"}, "status": {"phase": phase, "conditions": conditions}}

    assert diagnose.pod_ready(pod("Running", "True"))
    # a replacement that runs but does not pass its readiness probe yet, and one that has not started
    assert not diagnose.pod_ready(pod("Running", "False"))
    assert not diagnose.pod_ready(pod("Running", None))
    assert not diagnose.pod_ready(pod("Pending", "True"))
