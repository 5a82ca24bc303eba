"""Every experiment ends, fast, with a reason a user can act on, and frees its GPU: refusals of the API server
(an admission policy, a quota), specs the API would refuse, bad Prometheus answers, passes that keep failing,
pods that never start (an image, a Secret, a payload), a server whose node goes away, evicted or killed for
memory; and the load Job's deadline outlasts the load it plans.

Each case is produced for real on the local control plane: the API server's own admission policies (CEL)
stand in for a policy engine, a ResourceQuota refuses, the stand-in kubelet reports what a kubelet reports
(tests/clusterenv/kubelet.py), a node stops being Ready. Where a queued sibling is involved it waits for the
very GPU the failing experiment holds: both are pinned to one node of one GPU.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import clusterenv
from clusterenv import manifests
from clusterenv.controlplane import Cluster, register_nodes
from clusterenv.experiments import condition, experiment, sweep, wait_finished
from clusterenv.kubelet import LocalKubelet
from clusterenv.operatorproc import Operator
from clusterenv.policies import mutating, refusing
from servinglab.api.conditions import epoch

pytestmark = [pytest.mark.k8s, pytest.mark.torchserve]

RESULTS_WRITER = Path(clusterenv.__file__).with_name("results_writer.py")
#: How long a failing start may take before it is a failure here (the operator's default is 30 s).
GRACE = 3
#: How long passes may keep failing before the experiment ends here (the operator's default is 300 s).
FAILING = 10
#: "Ends fast": the issue's bar, from the moment the cause is there to the experiment's end.
A_MINUTE = 60
#: How long a server's node may stay NotReady here (the operator's default is 60 s), and a blip shorter than it.
NODE_GRACE = 40
BLIP = 20
JOBS = [{"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["jobs"]}]
# what Kyverno's require-requests-limits and its kin ask of every container
REQUESTS_AND_LIMITS = (
    "object.spec.template.spec.containers.all(c, has(c.resources) && has(c.resources.requests)"
    " && has(c.resources.limits) && 'cpu' in c.resources.limits && 'memory' in c.resources.limits)"
)
NEEDS_LIMITS = "every container needs CPU and memory requests and limits"


@pytest.fixture()
def operator(cluster: Cluster, crd: None, namespace: str, tmp_path: Path) -> Iterator[Operator]:
    allowed = [{"secret": "model-token", "key": "token", "hosts": ["models.example.com"]}]
    env = {
        "SERVINGLAB_START_GRACE_SECONDS": str(GRACE),
        "SERVINGLAB_FAILING_SECONDS": str(FAILING),
        "SERVINGLAB_NODE_GRACE_SECONDS": str(NODE_GRACE),
        "SERVINGLAB_MODEL_CREDENTIALS": json.dumps(allowed),
    }
    running = Operator(cluster, namespace, tmp_path, env).start()
    yield running
    running.stop()


def get(cluster: Cluster, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    found = cluster.kubectl.run("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict((get(cluster, namespace, "sx", name) or {}).get("status") or {})


def pinned(name: str, node: str, **server: Any) -> dict[str, Any]:
    """The tiny model on one T4 node by name: a sibling pinned to the same node waits for the same GPU."""
    return experiment(name, nodeSelector={"nvidia.com/gpu.product": "Tesla-T4", "kubernetes.io/hostname": node},
                      **server)  # fmt: skip


def short(body: dict[str, Any]) -> dict[str, Any]:
    body["spec"]["load"] = {"concurrency": [1], "warmupSeconds": 1, "durationSeconds": 2}
    return body


def held(body: dict[str, Any]) -> dict[str, Any]:
    """A load far longer than the test: the fault lands mid-run however slowly this host starts the server."""
    body["spec"]["load"] = {"concurrency": [1], "warmupSeconds": 1, "durationSeconds": 600}
    return body


def wait_admitted(cluster: Cluster, namespace: str, name: str, timeout: float = A_MINUTE) -> None:
    admitted = lambda: bool(status(cluster, namespace, name).get("startedAt"))  # noqa: E731
    cluster.kubectl.wait_for(admitted, timeout, f"{name} admitted (its server deployed)")


def wait_queued(cluster: Cluster, namespace: str, name: str) -> None:
    def queued() -> bool:
        conditions = status(cluster, namespace, name).get("conditions") or []
        return any(c["type"] == "Queued" and c["status"] == "True" for c in conditions)

    cluster.kubectl.wait_for(queued, 30, f"{name} queued for the GPU its sibling holds")


def ended(cluster: Cluster, namespace: str, operator: Operator, name: str, reason: str, since: str | float) -> str:
    """Wait until `name` has failed with `reason`, within a minute of `since` (a status field naming when the
    cause arose, "created", or the time a fault was played, in epoch seconds); its server removed. The Failed
    message."""
    body = wait_finished(cluster, namespace, name, operator.log, timeout=180)
    failed = condition(body, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", reason), (failed, operator.log())
    if isinstance(since, float):
        began = since
    else:
        began = epoch(body["metadata"]["creationTimestamp"] if since == "created" else body["status"][since])
    took = epoch(body["status"]["finishedAt"]) - began
    assert took <= A_MINUTE, (name, reason, took)
    gone = lambda: get(cluster, namespace, "deployment", f"{name}-server") is None  # noqa: E731
    cluster.kubectl.wait_for(gone, 30, f"the server of {name} removed")
    return str(failed["message"])


# -- refusals of the API server --------------------------------------------------------------------------


def test_a_policy_refusing_the_load_job_ends_it_rejected_and_the_queued_sibling_is_admitted(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet_factory()
    with refusing(cluster, namespace, JOBS, REQUESTS_AND_LIMITS, NEEDS_LIMITS):
        first = pinned("refused", "gpu-t4-0")
        first["spec"]["load"]["resources"] = {"requests": {"cpu": "100m", "memory": "128Mi"}}  # no limits
        cluster.kubectl.apply(first, namespace=namespace)
        wait_admitted(cluster, namespace, "refused")
        cluster.kubectl.apply(pinned("sibling", "gpu-t4-0"), namespace=namespace)
        wait_queued(cluster, namespace, "sibling")
        message = ended(cluster, namespace, operator, "refused", "Rejected", "serverReadyAt")
        wait_admitted(cluster, namespace, "sibling")
    assert "apply Job" in message and NEEDS_LIMITS in message, message
    assert get(cluster, namespace, "job", "refused-load") is None


def quota(cluster: Cluster, namespace: str, hard: dict[str, str]) -> None:
    """A ResourceQuota, once the quota controller has accounted for it (admission enforces it from then)."""
    cluster.kubectl.run("delete", "resourcequota", "--all", "-n", namespace)
    body = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "limits"}, "spec": {"hard": hard}}
    cluster.kubectl.apply(body, namespace=namespace)
    counted = lambda: bool((get(cluster, namespace, "resourcequota", "limits") or {}).get("status", {}).get("hard"))  # noqa: E731
    cluster.kubectl.wait_for(counted, 30, "the quota accounted for")


def test_validation_refuses_an_empty_key_toleration_and_quotas_it_cannot_foresee_end_rejected(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet = kubelet_factory()
    cluster.kubectl.apply(experiment("anykey", tolerations=[{"effect": "NoSchedule"}]), namespace=namespace)
    message = ended(cluster, namespace, operator, "anykey", "InvalidSpec", "created")
    assert "spec.server.tolerations[0]: an empty key matches every taint and needs operator: Exists" in message
    assert get(cluster, namespace, "configmap", "anykey-config") is None  # nothing was created

    # no Service may be created here: refused before the Deployment exists, so no server pod ever ran
    quota(cluster, namespace, {"services": "0"})
    cluster.kubectl.apply(pinned("noservice", "gpu-t4-0"), namespace=namespace)
    message = ended(cluster, namespace, operator, "noservice", "Rejected", "startedAt")
    assert "apply Service" in message and "exceeded quota" in message, message
    assert not [pod for pod in kubelet.pods.values() if pod.labels.get("app.kubernetes.io/instance") == "noservice"]

    # every pod must ask for CPU: the server's pods are refused (the Deployment says why), the queue moves on
    quota(cluster, namespace, {"requests.cpu": "8", "limits.cpu": "8"})
    cluster.kubectl.apply(pinned("nocpu", "gpu-t4-0"), namespace=namespace)
    wait_admitted(cluster, namespace, "nocpu")
    cluster.kubectl.apply(pinned("behind", "gpu-t4-0"), namespace=namespace)
    wait_queued(cluster, namespace, "behind")
    message = ended(cluster, namespace, operator, "nocpu", "Rejected", "startedAt")
    assert "the server's pods are refused" in message and "must specify" in message, message
    wait_admitted(cluster, namespace, "behind")


# -- bad Prometheus answers ------------------------------------------------------------------------------


@contextmanager
def prometheus(series: list[dict[str, Any]]) -> Iterator[str]:
    """An HTTP server on loopback answering every instant query as Prometheus does, with `series`."""
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": series}}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_bad_prometheus_answers_end_as_unavailable_gpu_metrics_and_the_queue_moves_on(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet_factory()
    with prometheus([{"metric": {}}]) as empty, prometheus([{"metric": {}, "value": [0, "+Inf"]}]) as infinite:
        for name, url in (("emptyseries", empty), ("infinite", infinite)):
            cluster.kubectl.apply(short(experiment(name, url)), namespace=namespace)
            wait_admitted(cluster, namespace, name)
        cluster.kubectl.apply(short(experiment("third")), namespace=namespace)
        wait_queued(cluster, namespace, "third")  # both T4s are held
        for name, url in (("emptyseries", empty), ("infinite", infinite)):
            body = wait_finished(cluster, namespace, name, operator.log, timeout=180)
            assert condition(body, "Succeeded")["status"] == "True", (body["status"], operator.log())
            gpu = condition(body, "GPUMetricsAvailable")
            said = "not a Prometheus sample" if name == "emptyseries" else "a sample that is not finite"
            assert (gpu["status"], gpu["reason"], gpu["message"]) == ("False", "PrometheusQueryFailed",
                                                                      f"{url}: HTTP 200, {said}")  # fmt: skip
            assert body["status"]["results"][0]["throughputRps"] > 0
            took = epoch(body["status"]["finishedAt"]) - epoch(body["status"]["serverReadyAt"])
            assert took <= A_MINUTE, (name, took)
            gone = lambda name=name: get(cluster, namespace, "deployment", f"{name}-server") is None  # noqa: E731
            cluster.kubectl.wait_for(gone, 30, f"the server of {name} removed")
        wait_admitted(cluster, namespace, "third")


# -- passes that keep failing ----------------------------------------------------------------------------


def test_passes_that_keep_failing_end_the_experiment_after_the_bound_and_remove_its_server(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    # A webhook that refuses one status write (here: the server's readiness) for good, as a buggy policy or a
    # schema the operator does not match would: no retry helps, nothing else fails.
    kubelet_factory()
    statuses = [{"apiGroups": ["servinglab.dev"], "apiVersions": ["v1alpha1"], "operations": ["UPDATE"],
                 "resources": ["servingexperiments/status"]}]  # fmt: skip
    allow = (
        "!has(object.status) || !has(object.status.conditions) || "
        "!object.status.conditions.exists(c, c.type == 'ServerReady' && c.status == 'True') || "
        "object.status.conditions.exists(c, c.type == 'Failed' && c.status == 'True')"
    )
    with refusing(cluster, namespace, statuses, allow, "readiness may not be recorded here"):
        cluster.kubectl.apply(experiment("stuck"), namespace=namespace)
        message = ended(cluster, namespace, operator, "stuck", "ReconcileFailed", "startedAt")
    assert "readiness may not be recorded here" in message, message
    failing = float(re.search(r"kept failing for (\d+) s", message).group(1))  # type: ignore[union-attr]
    assert FAILING <= failing <= FAILING + 15, message
    ready = condition({"status": status(cluster, namespace, "stuck")}, "ServerReady")
    assert ready["status"] != "True"  # the refused write never landed; the failure did


def test_sweep_passes_that_keep_failing_end_the_sweep_after_the_bound(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    """A sweep's status writes refused for good (all but the one that records its failure): its passes keep
    failing, and after failingSeconds it ends as ReconcileFailed instead of retrying for ever."""
    statuses = [{"apiGroups": ["servinglab.dev"], "apiVersions": ["v1alpha1"], "operations": ["UPDATE"],
                 "resources": ["servingsweeps/status"]}]  # fmt: skip
    allow = (
        "has(object.status) && has(object.status.conditions) && "
        "object.status.conditions.exists(c, c.type == 'Failed' && c.status == 'True')"
    )
    template = short(experiment("template"))["spec"]
    one = {"batchSize": 1, "maxBatchDelayMs": 5, "workers": 1, "precision": "fp32"}
    body = sweep("stuck-sweep", template, strategy="list", configurations=[one])
    with refusing(cluster, namespace, statuses, allow, "sweep progress may not be recorded here"):
        cluster.kubectl.apply(body, namespace=namespace)
        stored = lambda: get(cluster, namespace, "servingsweep", "stuck-sweep") or {}  # noqa: E731
        cluster.kubectl.wait_for(lambda: "finishedAt" in stored().get("status", {}), A_MINUTE + FAILING, "its end")
    failed = condition(stored(), "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "ReconcileFailed"), (failed, operator.log())
    assert "sweep progress may not be recorded here" in failed["message"], failed
    failing = float(re.search(r"kept failing for (\d+) s", failed["message"]).group(1))  # type: ignore[union-attr]
    assert FAILING <= failing <= FAILING + 15, failed


# -- the load Job's deadline -----------------------------------------------------------------------------


def test_the_load_jobs_deadline_outlasts_a_burst_longer_than_300_s(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    """The Job controller counts a Job's age from its status.startTime: a mutating policy sets it back by the
    whole planned load (warm-up and 600 s of burst) the moment the controller first writes it, so the Job is
    judged as at the end of its load; the load pod then writes results (the real sink) and exits. Under the
    old deadline (300 s for any shaped run) the controller killed it at once. The policy engine that asks
    every container for requests and limits admits the Job as the operator makes it."""
    kubelet = kubelet_factory(job_command=[sys.executable, str(RESULTS_WRITER), "small"])
    body = experiment("burst")
    burst = {"baseRps": 5, "burstRps": 10, "burstSeconds": 5, "periodSeconds": 60, "durationSeconds": 600}
    body["spec"]["load"] = {"mode": "open", "warmupSeconds": 1, "shape": {"burst": burst}}
    planned = 1 + 600
    first_start = "has(object.status.startTime) && (!has(oldObject.status) || !has(oldObject.status.startTime))"
    back = (f'[JSONPatch{{op: "replace", path: "/status/startTime", '
            f'value: string(timestamp(object.metadata.creationTimestamp) - duration("{planned}s"))}}]')  # fmt: skip
    job_statuses = [{"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["UPDATE"],
                     "resources": ["jobs/status"]}]  # fmt: skip
    with (
        refusing(cluster, namespace, JOBS, REQUESTS_AND_LIMITS, NEEDS_LIMITS),
        mutating(cluster, namespace, job_statuses, first_start, back),
    ):
        cluster.kubectl.apply(body, namespace=namespace)
        finished = wait_finished(cluster, namespace, "burst", operator.log, timeout=180)
        # the control: a Job with the old deadline, judged the same way, is killed at once
        cluster.kubectl.apply(control_job(300), namespace=namespace)

        def killed() -> bool:
            return "DeadlineExceeded" in json.dumps((get(cluster, namespace, "job", "control") or {}).get("status"))

        cluster.kubectl.wait_for(killed, 30, "the control Job killed by its 300 s deadline")
    load_log = "".join(p.log.read_text(errors="replace") for p in kubelet.pods.values() if p.log is not None)
    assert condition(finished, "Succeeded")["status"] == "True", (finished["status"], load_log[-2000:])
    job = get(cluster, namespace, "job", "burst-load")
    assert job is not None
    states = {c["type"]: c["status"] for c in job["status"]["conditions"]}
    assert states.get("Complete") == "True" and states.get("Failed") != "True", job["status"]
    ran = epoch(job["status"]["completionTime"]) - epoch(job["status"]["startTime"])
    assert ran >= planned > 300  # as the Job controller counts: past its planned load, and past the old deadline
    assert job["spec"]["activeDeadlineSeconds"] > ran


def control_job(deadline: int) -> dict[str, Any]:
    """A Job that nothing runs (KWOK keeps its pod Running), allowed by the namespace's policies."""
    limits = {"cpu": "100m", "memory": "64Mi"}
    container = {
        "name": "idle", "image": "servinglab/servinglab:0.1.0", "command": ["sleep", "3600"],
        "resources": {"requests": limits, "limits": limits},
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 65532,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
    }  # fmt: skip
    pod = {"restartPolicy": "Never", "containers": [container]}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "control"},
            "spec": {"activeDeadlineSeconds": deadline, "backoffLimit": 0, "template": {"spec": pod}}}  # fmt: skip


# -- pods that never start -------------------------------------------------------------------------------


def test_images_that_cannot_be_pulled_and_a_missing_secret_end_fast(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet_factory()
    cluster.kubectl.apply(pinned("nohost", "gpu-t4-0", image="registry.invalid/torchserve:0.12.0-gpu"),
                          namespace=namespace)  # fmt: skip
    cluster.kubectl.apply(pinned("badname", "gpu-t4-1", image="Registry.Example/TorchServe:0.12.0"),
                          namespace=namespace)  # fmt: skip
    secretless = experiment("secretless")
    token = {"name": "model-token", "key": "token"}
    source = {"url": "https://models.example.com/m.pt", "authorizationSecret": token}
    secretless["spec"]["model"] = {"name": "mine", "source": source}
    cluster.kubectl.apply(secretless, namespace=namespace)  # queued until one of the two T4s is free
    message = ended(cluster, namespace, operator, "nohost", "ImagePullFailed", "startedAt")
    assert "image registry.invalid/torchserve:0.12.0-gpu cannot be pulled (ErrImagePull)" in message, message
    # a reference the runtime would refuse (InvalidImageName) is refused before anything is created
    message = ended(cluster, namespace, operator, "badname", "InvalidSpec", "created")
    assert "spec.server.image: 'Registry.Example/TorchServe:0.12.0'" in message and "not lowercase" in message, message
    assert get(cluster, namespace, "configmap", "badname-config") is None
    message = ended(cluster, namespace, operator, "secretless", "ConfigMissing", "startedAt")
    assert 'container model cannot start: secret "model-token" not found' in message, message


def test_a_missing_payload_ends_fast(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet_factory()
    nomap = short(experiment("nomap"))
    nomap["spec"]["load"]["payload"] = {"files": ["a.jpg"], "configMap": "bodies"}
    cluster.kubectl.apply(nomap, namespace=namespace)
    message = ended(cluster, namespace, operator, "nomap", "PayloadMissing", "created")
    assert message == f"the payload ConfigMap bodies does not exist in namespace {namespace}"
    assert "startedAt" not in status(cluster, namespace, "nomap")  # refused before any GPU was taken

    noclaim = short(experiment("noclaim"))
    noclaim["spec"]["load"]["payload"] = {"files": ["a.jpg"], "pvc": {"claimName": "bodies", "path": "in"}}
    cluster.kubectl.apply(noclaim, namespace=namespace)
    message = ended(cluster, namespace, operator, "noclaim", "PayloadMissing", "serverReadyAt")
    assert 'persistentvolumeclaim "bodies" not found' in message, message


# -- servers that go away --------------------------------------------------------------------------------


def server_pod(cluster: Cluster, namespace: str, kubelet: LocalKubelet, name: str) -> str:
    """The server pod of experiment `name` once the kubelet runs it."""

    def running() -> str | None:
        for pod_name, pod in list(kubelet.pods.items()):
            if pod.labels.get("app.kubernetes.io/instance") == name and pod.processes and not pod.done:
                return pod_name
        return None

    cluster.kubectl.wait_for(lambda: running() is not None, 120, f"the server of {name} running")
    return str(running())


def loading(cluster: Cluster, namespace: str, name: str) -> bool:
    conditions = status(cluster, namespace, name).get("conditions") or []
    return any(c["type"] == "LoadTestComplete" and c.get("reason") == "Running" for c in conditions)


def server_under_load(cluster: Cluster, namespace: str, kubelet: LocalKubelet, name: str) -> str:
    """The server pod of experiment `name` once its load runs: a fault played before that could race the pod's
    own way to Ready (KWOK's ready stage, matched before the fault, can write its status over the fault's)."""
    pod = server_pod(cluster, namespace, kubelet, name)
    cluster.kubectl.wait_for(lambda: loading(cluster, namespace, name), 180, f"the load of {name} running")
    return pod


@contextmanager
def node_not_ready(cluster: Cluster, node: str) -> Iterator[None]:
    """The node stops reporting (KWOK lets go of it) and says NotReady; given back to KWOK, Ready, on exit."""
    kubectl, now = cluster.kubectl, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    kubectl.run("annotate", "node", node, f"{manifests.KWOK_NODE_ANNOTATION}-")
    ready = {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "container runtime is down",
             "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
    kubectl.run("patch", "node", node, "--subresource=status", "-p", json.dumps({"status": {"conditions": [ready]}}))
    try:
        yield
    finally:
        # Ready at once (a restarted kubelet's first report), then KWOK's again
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        back = {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
                "lastTransitionTime": now}  # fmt: skip
        kubectl.run("patch", "node", node, "--subresource=status", "-p", json.dumps({"status": {"conditions": [back]}}))
        kubectl.run("annotate", "node", node, f"{manifests.KWOK_NODE_ANNOTATION}=fake", "--overwrite")
        wait_schedulable(cluster, node)


def wait_schedulable(cluster: Cluster, node: str) -> None:
    """Ready again, and the node controller's not-ready taints gone (other tests place pods on it)."""

    def back() -> bool:
        shown = cluster.kubectl.run("get", "node", node, "-o", "json", check=False)
        found = json.loads(shown.stdout) if shown.returncode == 0 else {}
        conditions = found.get("status", {}).get("conditions", [])
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        taints = {t["key"] for t in found.get("spec", {}).get("taints") or []}
        return ready and taints == {"nvidia.com/gpu"}

    cluster.kubectl.wait_for(back, 90, f"node {node} Ready and schedulable again")


def test_a_node_not_ready_for_a_moment_is_waited_out_and_one_not_ready_past_the_grace_ends_it_lost(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    """A kubelet restart or a missed heartbeat: the node says NotReady for BLIP s mid-load while the server keeps
    serving, and the experiment goes on. Then the node stays NotReady: ServerLost once NODE_GRACE s have passed."""
    kubelet = kubelet_factory()
    cluster.kubectl.apply(held(pinned("lost", "gpu-t4-0")), namespace=namespace)
    server_under_load(cluster, namespace, kubelet, "lost")
    with node_not_ready(cluster, "gpu-t4-0"):
        time.sleep(BLIP)
    assert "finishedAt" not in status(cluster, namespace, "lost"), (status(cluster, namespace, "lost"), operator.log())
    assert loading(cluster, namespace, "lost")

    began = time.time()
    with node_not_ready(cluster, "gpu-t4-0"):
        body = wait_finished(cluster, namespace, "lost", operator.log, timeout=180)
    failed = condition(body, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "ServerLost"), (failed, operator.log())
    message = str(failed["message"])
    assert "node gpu-t4-0 of server pod lost-server-" in message and "is not Ready (" in message, message
    assert epoch(body["status"]["finishedAt"]) - began >= NODE_GRACE - 1, (message, began)  # whole seconds
    lasted = float(re.search(r"\) for (\d+) s$", message).group(1))  # type: ignore[union-attr]
    assert lasted >= NODE_GRACE, message
    gone = lambda: get(cluster, namespace, "deployment", "lost-server") is None  # noqa: E731
    cluster.kubectl.wait_for(gone, 30, "the server of lost removed")


def test_an_eviction_an_oom_kill_and_a_deleted_node_end_fast(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet = kubelet_factory()
    cluster.kubectl.apply(held(pinned("evicted", "gpu-t4-1")), namespace=namespace)
    pod = server_under_load(cluster, namespace, kubelet, "evicted")
    faulted = time.time()
    kubelet.evict_server(pod)
    message = ended(cluster, namespace, operator, "evicted", "ServerEvicted", faulted)
    assert message.endswith("was evicted by its node: The node was low on resource: memory."), message

    cluster.kubectl.apply(held(pinned("oom", "gpu-t4-1")), namespace=namespace)
    pod = server_under_load(cluster, namespace, kubelet, "oom")
    faulted = time.time()
    kubelet.oom_kill_server(pod)
    message = ended(cluster, namespace, operator, "oom", "OutOfMemory", faulted)
    assert "killed for exceeding its memory (OOMKilled)" in message, message

    cluster.kubectl.apply(held(pinned("deleted", "gpu-t4-0")), namespace=namespace)
    server_under_load(cluster, namespace, kubelet, "deleted")
    faulted = time.time()
    cluster.kubectl.run("delete", "node", "gpu-t4-0", "--wait=false")
    try:
        message = ended(cluster, namespace, operator, "deleted", "ServerLost", faulted)
    finally:
        register_nodes(cluster.kubectl, [manifests.node("gpu-t4-0", gpus=1)])
        wait_schedulable(cluster, "gpu-t4-0")
    assert "node gpu-t4-0 of server pod deleted-server-" in message and message.endswith("was deleted"), message
