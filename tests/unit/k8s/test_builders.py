"""The operator's pure parts: child manifests, conditions, failure reasons, status summary, PromQL."""

from __future__ import annotations

import json
from typing import Any

import yaml

from servinglab import servers
from servinglab.api import conditions as cond
from servinglab.api import load_experiment
from servinglab.api.results import LevelResult
from servinglab.k8s import builders as resources
from servinglab.k8s import loadbuilders
from servinglab.k8s.client import Ref
from servinglab.k8s.experiment.diagnose import crash_reason, replaced_server, unschedulable_reason
from servinglab.k8s.experiment.status import summary_of
from servinglab.k8s.leader import lease_manifest
from servinglab.k8s.promql import query_text
from servinglab.servers.base import PodInputs, PodPlan
from servinglab.servers.torchserve import pod as torchserve_pod
from support.manifests import experiment
from support.paths import EXAMPLES

HALFP = load_experiment(EXAMPLES / "experiment-halfp.yaml").spec
OWNER = resources.Owner("resnet50-halfp", "bench", "uid-1")


def plan(image: str = "servinglab/servinglab:0.1.0") -> PodPlan:
    """The server pod the experiment's kind lays out, as the reconciler asks for it."""
    return servers.get(HALFP.server.kind).pod(HALFP, PodInputs(resources.Names(OWNER.name).config, image))


def test_children_are_owned_and_named_deterministically() -> None:
    manifests = [
        resources.config_map(OWNER, plan(), {}),
        resources.deployment(OWNER, HALFP, plan()),
        resources.service(OWNER, plan()),
        loadbuilders.load_job(OWNER, HALFP, plan(), "servinglab/servinglab:0.1.0"),
        resources.results_config_map(OWNER),
    ]
    names = [m["metadata"]["name"] for m in manifests]
    assert names == [
        "resnet50-halfp-config",
        "resnet50-halfp-server",
        "resnet50-halfp-server",
        "resnet50-halfp-load",
        "resnet50-halfp-results",
    ]
    for manifest in manifests:
        (owner,) = manifest["metadata"]["ownerReferences"]
        assert owner["uid"] == "uid-1" and owner["controller"] is True
        assert manifest["metadata"]["labels"]["app.kubernetes.io/instance"] == "resnet50-halfp"


def test_server_pod_asks_for_the_gpu_on_a_t4_and_runs_restricted() -> None:
    deployment = resources.deployment(OWNER, HALFP, plan())
    pod = deployment["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    assert server["image"] == "pytorch/torchserve:0.12.0-gpu"
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "Tesla-T4"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert server["securityContext"]["allowPrivilegeEscalation"] is False
    assert server["readinessProbe"]["exec"]["command"] == ["test", "-f", torchserve_pod.SERVER_READY_FILE]
    assert server["command"][:2] == ["sh", "-c"] and server["args"][:2] == ["torchserve", "--foreground"]
    assert pod["automountServiceAccountToken"] is False


def test_management_api_is_bound_to_localhost_in_the_pod() -> None:
    properties = resources.config_map(OWNER, plan(), {})["data"]["config.properties"]
    assert "management_address=http://127.0.0.1:8081" in properties
    assert "inference_address=http://0.0.0.0:8080" in properties
    exposed = {p["port"] for p in resources.service(OWNER, plan())["spec"]["ports"]}
    assert exposed == {8080, 8082}


def test_load_job_may_only_patch_its_results_and_their_parts() -> None:
    patch, create = loadbuilders.load_role(OWNER)["rules"]
    assert patch["resourceNames"][0] == "resnet50-halfp-results"
    assert patch["resourceNames"][1:] == [f"resnet50-halfp-results-part-{i}" for i in range(1, 32)]
    assert (patch["resources"], patch["verbs"]) == (["configmaps"], ["get", "patch"])
    assert create == {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}
    job = loadbuilders.load_job(OWNER, HALFP, plan(), "servinglab/servinglab:0.1.0")
    assert job["spec"]["backoffLimit"] == 0
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--target") + 1] == "http://resnet50-halfp-server:8080"


def test_condition_transition_time_changes_only_with_status() -> None:
    first = cond.set_condition([], cond.SERVER_READY, None, "Deploying", "")
    first = [first[0].model_copy(update={"last_transition_time": "2000-01-01T00:00:00Z"})]
    same = cond.set_condition(first, cond.SERVER_READY, None, "StillDeploying", "")
    assert same[0].last_transition_time == "2000-01-01T00:00:00Z"
    changed = cond.set_condition(same, cond.SERVER_READY, True, "Available", "")
    assert changed[0].last_transition_time != "2000-01-01T00:00:00Z"
    assert not cond.finished(changed)
    assert cond.finished(cond.set_condition(changed, cond.FAILED, True, "X", ""))


def pod(status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "status": status}


def test_failure_reasons_quote_the_cluster() -> None:
    scheduler = "0/3 nodes are available: 2 Insufficient nvidia.com/gpu."
    pending = pod({"conditions": [{"type": "PodScheduled", "reason": "Unschedulable", "message": scheduler}]})
    assert unschedulable_reason([pending]) == scheduler
    restarted = pod(
        {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "torchserve",
                    "restartCount": 2,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                }
            ],
        }
    )
    reason = crash_reason([restarted])
    assert reason is not None and "OOMKilled" in reason and "137" in reason
    assert crash_reason([pod({"phase": "Running", "containerStatuses": []})]) is None


def test_status_levels_are_compact_and_the_summary_picks_the_best_level_within_the_slo() -> None:
    levels = [
        LevelResult.model_validate(
            {"concurrency": c, "throughputRps": rps, "latencyMs": {"p50": p99 / 2, "p99": p99, "max": p99 + 1},
             "requests": 100, "errors": 0, "errorsByKind": {}, "server": {"meanBatchSize": 2.0, "batches": 5},
             "latencyCdfMs": [[0.0, 1.0], [100.0, p99 + 1]], "meetsSlo": p99 <= 100.0,
             "stability": {"windows": [{"start": 1.0, "throughputRps": rps, "p99Ms": p99}], "stable": True},
             "generator": {"cpuPercent": 5.0, "sendGapMs": {"p99": 0.1}, "saturated": False, "generators": 2,
                           "perGenerator": [{"cpuPercent": 5.0, "sendGapMs": {"p99": 0.1}, "saturated": False}] * 2}}
        )
        for c, rps, p99 in ((1, 10.0, 20.0), (8, 50.0, 90.0), (32, 70.0, 300.0))
    ]  # fmt: skip
    compact = [level.compact() for level in levels]
    # the status keeps what the table and the report show, not every request's CDF, every window or generator
    assert compact[0].latency_cdf_ms is None and compact[0].stability is not None
    assert compact[0].stability.windows == [] and compact[0].stability.stable is True
    assert compact[0].generator is not None and compact[0].generator.per_generator is None
    assert compact[0].server == levels[0].server and compact[0].latency_ms == levels[0].latency_ms
    assert [c.meets_slo for c in compact] == [True, True, False]
    result = summary_of(compact, 100.0, "Succeeded")
    assert (result.best_concurrency, result.best_throughput_rps) == (8, 50.0)


def test_gpu_query_matches_both_dcgm_label_styles() -> None:
    query = query_text("avg_over_time", "DCGM_FI_DEV_GPU_UTIL", "bench", "srv-1", 12.3)
    assert 'namespace="bench",pod="srv-1"' in query
    assert 'exported_namespace="bench",exported_pod="srv-1"' in query
    assert "[13s]" in query and " or " in query


def test_experiment_document_in_the_config_map_round_trips() -> None:
    document = experiment("x", **HALFP.model_dump(by_alias=True, mode="json"))
    stored = resources.config_map(OWNER, plan(), document)["data"]["experiment.yaml"]
    assert yaml.safe_load(stored)["spec"]["server"]["batchSize"] == 64


def test_pods_and_children_are_recognised_by_the_owner_uid_not_the_name() -> None:
    deployment = resources.deployment(OWNER, HALFP, plan())
    assert resources.owned_by(deployment, "uid-1") and not resources.owned_by(deployment, "uid-0")
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = dict(term.split("=") for term in resources.pod_selector(OWNER, "server").split(","))
    assert selector.items() <= template_labels.items() and selector[resources.UID_LABEL] == "uid-1"
    job_labels = loadbuilders.load_job(OWNER, HALFP, plan("x"), "x")["spec"]["template"]["metadata"]["labels"]
    assert job_labels[resources.UID_LABEL] == "uid-1"


def test_the_load_job_ties_its_results_to_the_experiment_uid() -> None:
    container = loadbuilders.load_job(OWNER, HALFP, plan("x"), "x")["spec"]["template"]["spec"]["containers"][0]
    owner = next(json.loads(env["value"]) for env in container["env"] if env["name"] == "SERVINGLAB_RESULTS_OWNER")
    # parts of a large document are garbage-collected with the experiment, without needing finalizer rights
    assert owner == {"apiVersion": "servinglab.dev/v1alpha1", "kind": "ServingExperiment", "name": "resnet50-halfp",
                     "uid": "uid-1", "controller": False, "blockOwnerDeletion": False}  # fmt: skip


def named_pod(name: str, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


def test_a_server_pod_replaced_during_the_load_is_named() -> None:
    assert replaced_server([named_pod("s-1")], "s-1") is None
    assert replaced_server([named_pod("s-1", deleting=True), named_pod("s-2")], "s-1") == (
        "server pod s-1 was deleted during the load test; now s-2: its measurements are discarded"
    )
    assert "deleted during the load test: its" in str(replaced_server([], "s-1"))


def test_a_lease_names_its_holder_and_counts_transitions() -> None:
    ref = Ref("coordination.k8s.io/v1", "Lease", "ns", "servinglab-operator")
    first = lease_manifest(ref, "a", 15, None)
    assert first["spec"]["holderIdentity"] == "a" and first["spec"]["leaseTransitions"] == 0
    assert "resourceVersion" not in first["metadata"]
    held = {**first, "metadata": {**first["metadata"], "resourceVersion": "7"}}
    renewed = lease_manifest(ref, "a", 15, held)
    assert renewed["spec"]["acquireTime"] == first["spec"]["acquireTime"]  # a renewal is not a transition
    assert renewed["spec"]["leaseTransitions"] == 0 and renewed["metadata"]["resourceVersion"] == "7"
    taken = lease_manifest(ref, "b", 15, held)
    assert taken["spec"]["holderIdentity"] == "b" and taken["spec"]["leaseTransitions"] == 1
