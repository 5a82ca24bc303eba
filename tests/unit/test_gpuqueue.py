"""The GPU queue's arithmetic: which nodes can hold a server, when an experiment may deploy."""

from __future__ import annotations

from typing import Any

from servinglab.k8s.experiment.gpuqueue import decide, node_offer

T4 = {"nvidia.com/gpu.product": "Tesla-T4"}
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def node(gpus: str, labels: dict[str, str], taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"labels": labels},
        "spec": {"taints": taints or []},
        "status": {"allocatable": {"nvidia.com/gpu": gpus}},
    }


def test_a_node_offers_its_gpus_only_to_servers_its_labels_and_taints_allow() -> None:
    tainted = node("1", T4, [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    assert node_offer(tainted, T4, TOLERATE_GPU) == 1
    assert node_offer(tainted, T4, []) == 0  # the taint keeps it away
    assert node_offer(tainted, {"nvidia.com/gpu.product": "NVIDIA-A100"}, TOLERATE_GPU) == 0
    assert node_offer(node("4", {}), {}, []) == 4
    assert node_offer({"metadata": {}, "spec": {}, "status": {}}, {}, []) == 0  # a CPU node


def test_the_first_in_line_is_admitted_when_enough_gpus_are_free() -> None:
    assert decide(1, [1, 1], in_use=1, position=1).admit
    waiting = decide(1, [1, 1], in_use=2, position=1)
    assert (
        not waiting.admit
        and waiting.waiting == "waiting for 1 nvidia.com/gpu: 2 of 2 in use; position 1 in the queue (0 ahead)"
    )
    behind = decide(1, [1, 1], in_use=1, position=2)  # a GPU is free, but another was first
    assert not behind.admit and "position 2" in (behind.waiting or "")


def test_a_request_no_node_could_ever_hold_is_refused_naming_the_largest_offer() -> None:
    never = decide(4, [1, 1], in_use=0, position=1)
    assert not never.admit and never.never is not None and "the largest offers 1, 2 nodes match" in never.never
    assert decide(1, [], in_use=0, position=1).never is not None


def test_offers_lists_what_each_node_that_can_host_the_server_gives_it() -> None:
    from servinglab.api import ServerSpec
    from servinglab.k8s.experiment.gpuqueue import offers

    server = ServerSpec.model_validate({"gpus": 1, "nodeSelector": T4, "tolerations": TOLERATE_GPU})
    t4 = node("1", T4, [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    nodes = [t4, t4, node("8", {"nvidia.com/gpu.product": "NVIDIA-A100"}), {"metadata": {}, "spec": {}, "status": {}}]
    assert offers(nodes, server) == [1, 1]
