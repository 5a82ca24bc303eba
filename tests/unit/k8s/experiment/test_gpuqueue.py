"""The GPU queue's decision on a table of clusters: pools, several GPUs per node, several namespaces,
namespace defaults, other workloads' GPU pods, servers still being placed.

Each row is a cluster (nodes, pods bound to them, experiments) and what the queue must decide for each
queued experiment: `admit`, `wait N` (its place in line), or `never`. The digests come from API-shaped
objects through the same functions the operator's caches use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from servinglab.api import EXPERIMENT_UID_LABEL
from servinglab.api.kube import resource_problem
from servinglab.k8s.experiment.gpuqueue import Decision, capacity, plan
from servinglab.k8s.experiment.placement import (
    Claim,
    NamespaceRules,
    claim_of,
    gpu_pod_of,
    node_of,
    quota_of,
    rules_of,
)

GPU = "nvidia.com/gpu"
TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
TOLERATE = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
T4 = {"nvidia.com/gpu.product": "Tesla-T4"}
A100 = {"nvidia.com/gpu.product": "A100"}


def node(name: str, gpus: int, labels: dict[str, str], resource: str = GPU, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {"taints": [TAINT], **spec},
            "status": {"allocatable": {resource: str(gpus), "cpu": "8"}}}  # fmt: skip


def pod(on: str, gpus: int, experiment: str = "", resource: str = GPU, **meta: Any) -> dict[str, Any]:
    labels = {EXPERIMENT_UID_LABEL: experiment} if experiment else {}
    return {"metadata": {"name": f"p-{on}", "labels": labels, **meta},
            "spec": {"nodeName": on, "containers": [{"resources": {"limits": {resource: str(gpus)}}}]},
            "status": {"phase": "Running"}}  # fmt: skip


def exp(
    name: str, gpus: int = 1, selector: dict[str, str] | None = None, tolerations: list[dict[str, Any]] | None = None,
    namespace: str = "a", started: bool = False, second: int = 0,
) -> dict[str, Any]:  # fmt: skip
    server = {"gpus": gpus, "nodeSelector": T4 if selector is None else selector,
              "tolerations": TOLERATE if tolerations is None else tolerations}  # fmt: skip
    created = f"2025-01-01T00:00:{second:02d}Z"
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": name, "creationTimestamp": created},
        "spec": {"server": server},
        "status": {"startedAt": "2025-01-01T00:01:00Z"} if started else {},
    }  # fmt: skip


@dataclass
class Cluster:
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]] = field(default_factory=list)
    experiments: list[dict[str, Any]] = field(default_factory=list)
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> annotations
    resource: str = GPU
    quotas: list[dict[str, Any]] = field(default_factory=list)

    def decide(self) -> dict[str, Decision]:
        nodes = [n for raw in self.nodes if (n := node_of(raw, self.resource)) is not None]
        pods = [p for raw in self.pods if (p := gpu_pod_of(raw, self.resource)) is not None]
        claims = [c for raw in self.experiments if (c := claim_of(raw)) is not None]
        rules = {ns: rules_of({"metadata": {"name": ns, "annotations": a}}) for ns, a in self.namespaces.items()}
        quotas = [q for raw in self.quotas if (q := quota_of(raw, self.resource)) is not None]
        return plan(nodes, pods, claims, rules, self.resource, quotas)


def quota(namespace: str, hard: int, used: int, key: str = f"requests.{GPU}", **spec: Any) -> dict[str, Any]:
    """A ResourceQuota as the API returns it once the quota controller has counted it."""
    return {"metadata": {"name": f"q-{namespace}-{hard}", "namespace": namespace},
            "spec": {"hard": {key: str(hard), "requests.cpu": "8"}, **spec},
            "status": {"hard": {key: str(hard)}, "used": {key: str(used)}}}  # fmt: skip


def outcome(decision: Decision) -> str:
    return "admit" if decision.admit else "never" if decision.never else f"wait {decision.position}"


TWO_T4_ONE_A100X4 = [node("t4-0", 1, T4), node("t4-1", 1, T4), node("a100-0", 4, A100)]
TABLE = {
    # ResourceQuotas on GPUs: an experiment waits for its namespace's quota instead of being refused its pods
    "at its namespace's quota, an experiment waits though a node is free; another namespace's goes ahead": (
        Cluster(
            TWO_T4_ONE_A100X4,
            [pod("t4-0", 1, "a1")],
            [exp("a1", started=True), exp("a2", second=1), exp("b1", namespace="b", second=2)],
            quotas=[quota("a", 1, 1)],
        ),
        {"a2": "wait 1", "b1": "admit"},
    ),
    "an admitted server not yet bound counts against its quota (the quota may not count it yet)": (
        Cluster(TWO_T4_ONE_A100X4, [], [exp("a1", started=True), exp("a2", second=1)], quotas=[quota("a", 1, 0)]),
        {"a2": "wait 1"},
    ),
    "the tightest of two quotas bounds; an earlier one admitted in the same plan takes its share": (
        Cluster(
            TWO_T4_ONE_A100X4,
            experiments=[exp("a1", 1, A100), exp("a2", 1, A100, second=1), exp("a3", 1, A100, second=2)],
            quotas=[quota("a", 4, 1), quota("a", 3, 1)],
        ),
        {"a1": "admit", "a2": "admit", "a3": "wait 1"},  # 3 - 1 left: two of the three
    ),
    "more than a quota's hard can never run; a scoped quota, or one on other resources, is not the queue's": (
        Cluster(
            TWO_T4_ONE_A100X4,
            experiments=[exp("big", 2, A100), exp("b1", namespace="b", second=1), exp("c1", namespace="c", second=2)],
            quotas=[quota("a", 1, 0), quota("b", 0, 0, scopes=["BestEffort"]), quota("c", 0, 0, key="requests.cpu")],
        ),
        {"big": "never", "b1": "admit", "c1": "admit"},
    ),
    # the findings, each now decided per node
    "T4 experiments are admitted while A100 experiments hold four GPUs": (
        Cluster(
            TWO_T4_ONE_A100X4,
            [pod("a100-0", 4, "held")],
            [exp("held", 4, A100, started=True), exp("t4-a", second=1), exp("t4-b", second=2)],
        ),
        {"t4-a": "admit", "t4-b": "admit"},
    ),
    "a queued A100 experiment at the head blocks no T4 experiment": (
        Cluster(
            TWO_T4_ONE_A100X4,
            [pod("a100-0", 4, "held")],
            [exp("held", 4, A100, started=True), exp("a100", 1, A100, second=1), exp("t4", second=2)],
        ),
        {"a100": "wait 1", "t4": "admit"},
    ),
    "a 2-GPU request is not admitted onto two nodes with one GPU free each": (
        Cluster([node("n0", 2, {}), node("n1", 2, {})], [pod("n0", 1), pod("n1", 1)], [exp("two", 2, {})]),
        {"two": "wait 1"},
    ),
    "a 2-GPU request is admitted where one node has two free": (
        Cluster([node("n0", 2, {}), node("n1", 4, {})], [pod("n0", 1), pod("n1", 2)], [exp("two", 2, {})]),
        {"two": "admit"},
    ),
    "two namespaces share one queue: the GPUs one holds are not the other's": (
        Cluster(
            TWO_T4_ONE_A100X4,
            [pod("t4-0", 1, "a1"), pod("t4-1", 1, "a2")],
            [exp("a1", started=True), exp("a2", started=True), exp("b1", namespace="b", second=1), exp("a3", second=2)],
        ),
        {"b1": "wait 1", "a3": "wait 2"},
    ),
    "first come first served across namespaces": (
        Cluster(
            TWO_T4_ONE_A100X4,
            [pod("t4-0", 1, "a1")],
            [exp("a1", started=True), exp("b1", namespace="b", second=1), exp("a2", second=2)],
        ),
        {"b1": "admit", "a2": "wait 1"},
    ),
    "namespace default tolerations let a spec without tolerations onto tainted nodes": (
        Cluster(
            TWO_T4_ONE_A100X4,
            experiments=[exp("bare", tolerations=[])],
            namespaces={
                "a": {
                    "scheduler.alpha.kubernetes.io/defaultTolerations": '[{"key": "nvidia.com/gpu", '
                    '"operator": "Exists"}]'
                }
            },
        ),
        {"bare": "admit"},
    ),
    "without them, no node could ever hold it": (
        Cluster(TWO_T4_ONE_A100X4, experiments=[exp("bare", tolerations=[])]),
        {"bare": "never"},
    ),
    "a namespace node selector keeps a spec without one to its pool": (
        Cluster(
            TWO_T4_ONE_A100X4,
            [pod("t4-0", 1), pod("t4-1", 1)],
            [exp("any", selector={})],
            namespaces={"a": {"scheduler.alpha.kubernetes.io/node-selector": "nvidia.com/gpu.product=Tesla-T4"}},
        ),
        {"any": "wait 1"},  # the A100 is free, but the namespace keeps its pods on T4s
    ),
    "a spec contradicting its namespace's node selector never runs": (
        Cluster(
            TWO_T4_ONE_A100X4,
            experiments=[exp("a100", 1, A100)],
            namespaces={"a": {"scheduler.alpha.kubernetes.io/node-selector": "nvidia.com/gpu.product=Tesla-T4"}},
        ),
        {"a100": "never"},
    ),
    "other workloads' GPU pods are counted": (
        Cluster(TWO_T4_ONE_A100X4, [pod("t4-0", 1), pod("t4-1", 1)], [exp("t4")]),
        {"t4": "wait 1"},
    ),
    # and what keeps admitted servers from waiting Pending
    "an admitted server not yet bound keeps its nodes for itself": (
        Cluster(
            [node("n0", 1, {}), node("n1", 2, {})], [], [exp("two", 2, {}, started=True), exp("one", 1, {}, second=1)]
        ),
        {"one": "wait 1"},  # the scheduler could put `one` on n1 and leave `two` Pending
    ),
    "one-GPU servers on the same nodes are admitted together while GPUs remain for each": (
        Cluster(
            [node("n0", 1, {}), node("n1", 2, {})],
            [pod("n1", 1)],
            [exp("x", 1, {}, started=True), exp("c1", 1, {}, second=1), exp("c2", 1, {}, second=2)],
        ),
        {"c1": "admit", "c2": "wait 1"},  # 2 free: one for x (not yet placed), one for c1
    ),
    "once it is bound, the rest is free": (
        Cluster(
            [node("n0", 1, {}), node("n1", 2, {})],
            [pod("n1", 2, "two")],
            [exp("two", 2, {}, started=True), exp("one", 1, {}, second=1)],
        ),
        {"one": "admit"},
    ),
    "a terminating pod still holds its GPU": (
        Cluster([node("n0", 1, {})], [pod("n0", 1, deletionTimestamp="2025-01-01T00:00:00Z")], [exp("one", 1, {})]),
        {"one": "wait 1"},
    ),
    "finished pods and unbound pods hold nothing": (
        Cluster(
            [node("n0", 1, {})],
            [{**pod("n0", 1), "status": {"phase": "Succeeded"}}, {**pod("n0", 1), "spec": {"containers": []}}],
            [exp("one", 1, {})],
        ),
        {"one": "admit"},
    ),
    "a node without the resource holds nothing": (
        Cluster([node("cpu", 0, {})], experiments=[exp("one", 1, {})]),
        {"one": "never"},
    ),
    "a cordoned or not ready node is waited for, not given up on": (
        Cluster(
            [
                node("n0", 1, {}, unschedulable=True),
                node("n1", 1, {}, taints=[TAINT, {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]),
            ],
            experiments=[exp("one", 1, {})],
        ),
        {"one": "wait 1"},
    ),
    "a MIG profile is its own resource": (
        Cluster(
            [node("mig", 7, {}, resource="nvidia.com/mig-1g.5gb"), node("full", 1, {})],
            [pod("mig", 6, resource="nvidia.com/mig-1g.5gb"), pod("full", 1)],
            [exp("one", 1, {}), exp("two", 2, {}, second=1), exp("eight", 8, {}, second=2)],
            resource="nvidia.com/mig-1g.5gb",
        ),
        {"one": "admit", "two": "wait 1", "eight": "never"},  # slices are counted; a whole GPU is no slice
    ),
}


@pytest.mark.parametrize("cluster, expected", TABLE.values(), ids=TABLE.keys())
def test_the_queue_decides_per_node_per_pool_across_namespaces(cluster: Cluster, expected: dict[str, str]) -> None:
    decisions = cluster.decide()
    assert {uid: outcome(d) for uid, d in decisions.items()} == expected


def test_messages_say_what_is_in_use_where_and_who_is_ahead() -> None:
    cluster = Cluster([node("n0", 1, T4), node("n1", 1, T4)], [pod("n0", 1, "x"), pod("n1", 1, "y")],
                      [exp("x", started=True), exp("y", started=True), exp("c", second=1)])  # fmt: skip
    waiting = cluster.decide()["c"].waiting
    assert waiting == (
        "waiting for 1 nvidia.com/gpu on one of the 2 nodes that can hold it (the most free on one: 0): "
        "2 of 2 in use; position 1 in the queue (0 ahead)"
    )
    never = Cluster([node("n0", 1, T4), node("n1", 1, T4)], experiments=[exp("greedy", 4)]).decide()["greedy"].never
    assert never == (
        "no node matching the server's nodeSelector and tolerations offers 4 nvidia.com/gpu "
        "(the largest offers 1, 2 nodes match)"
    )
    placing = Cluster([node("n0", 3, {})], experiments=[exp("x", 2, {}, started=True), exp("c", 1, {}, second=1)])
    assert "1 admitted server(s) still being placed on these nodes" in (placing.decide()["c"].waiting or "")
    cordoned = Cluster([node("n0", 1, {}, unschedulable=True)], experiments=[exp("c", 1, {})]).decide()["c"]
    assert "1 of the nodes take no pods now (cordoned, not ready or tainted)" in (cordoned.waiting or "")


def test_a_namespace_annotation_the_api_server_would_refuse_is_named() -> None:
    bad = rules_of({"metadata": {"name": "ns", "annotations": {"scheduler.alpha.kubernetes.io/node-selector": "a"}}})
    assert bad.problem == (
        "namespace ns's scheduler.alpha.kubernetes.io/node-selector annotation 'a' is not key=value[,key=value]"
    )
    json_bad = rules_of({"metadata": {"name": "ns", "annotations": {
        "scheduler.alpha.kubernetes.io/defaultTolerations": "{not json"}}})  # fmt: skip
    assert json_bad.problem is not None and "not a JSON list of tolerations" in json_bad.problem
    decided = Cluster([node("n0", 1, {})], experiments=[exp("e", 1, {})],
                      namespaces={"a": {"scheduler.alpha.kubernetes.io/node-selector": "a"}}).decide()  # fmt: skip
    assert decided["e"].never == bad.problem.replace("namespace ns's", "namespace a's")


def held(containers: list[int], inits: list[int], sidecars: tuple[int, ...] = ()) -> int:
    """What a bound pod with these containers' GPU requests holds (0: it is not kept)."""

    def c(n: int, **extra: Any) -> dict[str, Any]:
        return {"resources": {"requests": {GPU: str(n)}, "limits": {GPU: str(n)}}, **extra}

    initial = [c(n) for n in inits] + [c(n, restartPolicy="Always") for n in sidecars]
    spec = {"nodeName": "n0", "containers": [c(n) for n in containers], "initContainers": initial}
    body = {"metadata": {"name": "p"}, "status": {"phase": "Pending"}, "spec": spec}
    digest = gpu_pod_of(body, GPU)
    return digest.gpus if digest is not None else 0


def test_a_pod_holds_its_containers_gpus_or_its_largest_init_containers() -> None:
    assert held([1, 1], [1]) == 2
    assert held([1], [3]) == 3
    assert held([1], [], sidecars=(1,)) == 2  # a sidecar runs beside the containers
    assert held([0], [0]) == 0


def test_claims_are_unfinished_experiments_that_want_gpus() -> None:
    finished = {**exp("f"), "status": {"conditions": [{"type": "Failed", "status": "True"}]}}
    assert claim_of(finished) is None
    assert claim_of(exp("cpu", gpus=0)) is None
    deleting = exp("d", started=True)
    deleting["metadata"]["deletionTimestamp"] = "2025-01-01T00:02:00Z"
    assert claim_of(deleting) is None  # its pod, while there, holds the GPUs; the claim no longer does
    claim = claim_of(exp("e", second=5))
    assert isinstance(claim, Claim) and claim.order == ("2025-01-01T00:00:05Z", "a", "e") and not claim.admitted


def test_the_gpu_resource_must_be_an_extended_resource_name() -> None:
    for good in ("nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "amd.com/gpu", "gpu.intel.com/i915"):
        assert resource_problem(good) is None, good
    for bad in ("gpu", "nvidia.com/", "kubernetes.io/gpu", "NVIDIA.com/gpu", "nvidia.com/gpu x"):
        assert resource_problem(bad) is not None, bad


def test_a_sweep_runs_no_more_trials_than_its_pool_could_hold_at_once() -> None:
    nodes = [n for raw in TWO_T4_ONE_A100X4 if (n := node_of(raw, GPU)) is not None]
    one_a100 = claim_of(exp("x", 1, A100))
    two_a100 = claim_of(exp("y", 2, A100))
    assert one_a100 is not None and two_a100 is not None
    assert capacity(one_a100, nodes, NamespaceRules()) == 4
    assert capacity(two_a100, nodes, NamespaceRules()) == 2


def replicated(name: str, replicas: int, gpus: int = 1, **options: Any) -> dict[str, Any]:
    found = exp(name, gpus, **options)
    found["spec"]["server"]["replicas"] = replicas
    return found


def test_a_server_of_several_replicas_waits_until_every_replica_has_its_gpus() -> None:
    nodes = [node("t4-a", 2, T4), node("t4-b", 1, T4)]
    # 3 one-GPU replicas: 3 free GPUs across two nodes hold them; with one taken, it waits
    assert outcome(Cluster(nodes, experiments=[replicated("three", 3)]).decide()["three"]) == "admit"
    busy = Cluster(nodes, pods=[pod("t4-b", 1)], experiments=[replicated("three", 3)])
    assert outcome(busy.decide()["three"]) == "wait 1"
    assert "1 x 3 replicas = 3" in (busy.decide()["three"].waiting or "")
    # 2 replicas of 2 GPUs: only t4-a holds one of them, so never
    never = Cluster(nodes, experiments=[replicated("big", 2, gpus=2)]).decide()["big"]
    assert never.never is not None and "spec.server.replicas is 2" in never.never, never
    # an admitted 2-replica server with one pod placed still takes a GPU from the one behind it
    placing = Cluster([node("t4-a", 2, T4)], pods=[pod("t4-a", 1, experiment="two")],
                      experiments=[replicated("two", 2, started=True), exp("next", second=1)])  # fmt: skip
    assert outcome(placing.decide()["next"]) == "wait 1"


def test_a_quota_counts_every_replicas_gpus() -> None:
    nodes = [node("t4-a", 4, T4)]
    over = Cluster(nodes, experiments=[replicated("three", 3)], quotas=[quota("a", 2, 0)]).decide()["three"]
    assert over.never is not None and "asks for 1 x 3 replicas = 3" in over.never, over
    fits = Cluster(nodes, experiments=[replicated("two", 2)], quotas=[quota("a", 2, 0)]).decide()["two"]
    assert outcome(fits) == "admit"
