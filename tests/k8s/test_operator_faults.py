"""The operator under the faults clusters really have, each produced for real on the local control plane.

A process is killed with SIGKILL, a pod or an experiment is deleted, the API server is stopped, a
request is refused by a ValidatingAdmissionPolicy (the API server's own admission, with CEL), a
Prometheus accepts connections and never answers. Each test then asserts what the user cares about:
one Job, one result, the right reason, no GPU left held, no delete left hanging, nothing lost.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

import clusterenv
from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.kubelet import LocalKubelet
from clusterenv.operatorproc import Operator
from clusterenv.policies import refusing
from servinglab.api.results import to_json
from servinglab.k8s.client import PASSING_REFUSALS, Kube, KubeError
from servinglab.k8s.sink import decode_results

pytestmark = [pytest.mark.k8s, pytest.mark.torchserve]

RESULTS_WRITER = Path(clusterenv.__file__).with_name("results_writer.py")


def longer(name: str, seconds: float = 8, prometheus_url: str | None = None) -> dict[str, Any]:
    """Two levels of `seconds` each: time enough to strike during the measured window."""
    body = experiment(name, prometheus_url)
    body["spec"]["load"]["durationSeconds"] = seconds
    return body


def get(cluster: Cluster, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    found = cluster.kubectl.run("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def items(cluster: Cluster, namespace: str, kind: str) -> list[dict[str, Any]]:
    return list(cluster.kubectl.get(kind, "-n", namespace)["items"])


def wait_for_job(cluster: Cluster, namespace: str, timeout: float = 120) -> dict[str, Any]:
    cluster.kubectl.wait_for(lambda: bool(items(cluster, namespace, "jobs")), timeout, "the load Job to start")
    return items(cluster, namespace, "jobs")[0]


def running_pod(kubelet: LocalKubelet, component: str, timeout: float = 120) -> str:
    """The name of the pod of `component` whose process the local kubelet runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, pod in list(kubelet.pods.items()):
            if pod.labels.get("app.kubernetes.io/component") == component and pod.processes and not pod.done:
                return name
        time.sleep(0.5)
    pytest.fail(f"no {component} pod ran within {timeout} s: {kubelet.errors}")


def pod_log(kubelet: LocalKubelet, component: str) -> str:
    logs = [p.log for p in kubelet.pods.values() if p.labels.get("app.kubernetes.io/component") == component]
    return "".join(log.read_text(errors="replace") for log in logs if log is not None and log.exists())


def reasons(cluster: Cluster, namespace: str, name: str) -> list[str]:
    events = cluster.kubectl.get("events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")
    return [event["reason"] for event in events["items"]]


@contextmanager
def refused(
    cluster: Cluster, namespace: str, rules: list[dict[str, Any]], allow_when: str = "false"
) -> Iterator[Callable[[], None]]:
    """Requests matching `rules` in `namespace` are refused by the API server unless the CEL expression
    `allow_when` holds; yields `lift()`, which ends the refusal (also done on exit)."""
    with refusing(cluster, namespace, rules, allow_when, "refused by the fault test") as lift:
        yield lift


def finalizers(cluster: Cluster, namespace: str, name: str) -> list[str]:
    body = get(cluster, namespace, "sx", name) or {}
    return list(body.get("metadata", {}).get("finalizers") or [])


# -- 1. deletes that hang ----------------------------------------------------------------------------


def test_a_finished_experiment_has_no_finalizer_and_its_namespace_goes_without_an_operator(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet_factory()
    cluster.kubectl.apply(experiment("ends"), namespace=namespace)
    cluster.kubectl.wait_for(lambda: bool(finalizers(cluster, namespace, "ends")), 60, "the running one's finalizer")
    body = wait_finished(cluster, namespace, "ends", operator.log)
    assert condition(body, "Succeeded")["status"] == "True", body["status"]
    cluster.kubectl.wait_for(lambda: not finalizers(cluster, namespace, "ends"), 30, "no finalizer once finished")
    operator.stop()  # as after `helm uninstall`: nobody would remove a finalizer now
    cluster.kubectl.run("delete", "namespace", namespace, "--wait=false")
    gone = lambda: cluster.kubectl.run("get", "namespace", namespace, check=False).returncode != 0  # noqa: E731
    cluster.kubectl.wait_for(gone, 60, f"namespace {namespace} deleted with no operator running")


# -- 2. a GPU held after the end ---------------------------------------------------------------------


def test_the_server_is_removed_after_a_refused_delete_and_an_operator_killed_after_succeeded(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet_factory()
    deletes = [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["DELETE"], "resources": ["deployments"]}]
    with refused(cluster, namespace, deletes) as lift:
        cluster.kubectl.apply(experiment("frees"), namespace=namespace)
        body = wait_finished(cluster, namespace, "frees", operator.log)
        assert condition(body, "Succeeded")["status"] == "True", body["status"]
        time.sleep(4)  # several passes, each refused
        assert get(cluster, namespace, "deployment", "frees-server") is not None  # still holding its GPU
        assert "delete Deployment" in operator.log() and "refused by the fault test" in operator.log()
        assert "cleanedUpAt" not in get(cluster, namespace, "sx", "frees")["status"]  # type: ignore[index]
        operator.kill()  # the worst moment: finished, not yet cleaned up
        lift()
    operator.start()
    cluster.kubectl.wait_for(
        lambda: get(cluster, namespace, "deployment", "frees-server") is None, 60, "the server removed after restart"
    )
    cluster.kubectl.wait_for(lambda: not finalizers(cluster, namespace, "frees"), 30, "the finalizer removed")
    status = get(cluster, namespace, "sx", "frees")["status"]  # type: ignore[index]
    assert status["cleanedUpAt"] >= status["finishedAt"]
    assert condition({"status": status}, "Succeeded")["status"] == "True"  # the result was not touched


# -- 3. results lost -----------------------------------------------------------------------------------


def test_a_results_document_of_several_mib_survives_writes_refused_for_a_while(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    # Several MiB of windows take a legal spec (windows of 50 ms at least) half an hour of measuring: the
    # load Job writes a document of that size through the real sink instead, as its ServiceAccount.
    kubelet = kubelet_factory(job_command=[sys.executable, str(RESULTS_WRITER), "large"])
    big = experiment("big")
    load_account = f"system:serviceaccount:{namespace}:big-load"
    writes = [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]}
    ]
    with refused(cluster, namespace, writes, allow_when=f"request.userInfo.username != '{load_account}'") as lift:
        cluster.kubectl.apply(big, namespace=namespace)
        running_pod(kubelet, "load")
        cluster.kubectl.wait_for(lambda: "retrying in" in pod_log(kubelet, "load"), 120, "a refused results write")
        time.sleep(3)  # refused again, then allowed
        lift()
    body = wait_finished(cluster, namespace, "big", operator.log)
    assert condition(body, "Succeeded")["status"] == "True", (body["status"], pod_log(kubelet, "load")[-2000:])
    assert "kept failing" not in pod_log(kubelet, "load")

    head = get(cluster, namespace, "configmap", "big-results")
    document = to_json(decode_results(head, lambda name: get(cluster, namespace, "configmap", name)))
    assert len(json.dumps(document)) > 2 * 2**20  # several MiB, beyond one object's 1 MiB
    assert document["experimentUid"] == body["metadata"]["uid"]
    levels = document["results"]
    assert len(levels[0]["stability"]["windows"]) > 20_000
    compact = body["status"]["results"]
    assert [level["throughputRps"] for level in compact] == [level["throughputRps"] for level in levels]
    assert len(json.dumps(body["status"])) < 20_000  # the status stays compact


# -- 4. kills at the worst moment ------------------------------------------------------------------------


def test_two_operators_one_acts_and_a_leader_killed_mid_measurement_is_replaced(
    tmp_path: Path,
    cluster: Cluster,
    namespace: str,
    operator: Operator,
    kubelet_factory: Callable[..., LocalKubelet],
) -> None:
    kubelet_factory()
    second = Operator(cluster, namespace, tmp_path / "second").start()
    operators = [operator, second]
    full_log = lambda op: (op.workdir / "operator.log").read_text(errors="replace")  # noqa: E731
    try:
        cluster.kubectl.wait_for(
            lambda: (
                sum("leading as" in full_log(op) for op in operators) == 1
                and any("standing by" in full_log(op) for op in operators)
            ),
            60,
            "one operator leading, one standing by",
        )
        leader = next(op for op in operators if "leading as" in full_log(op))
        standby = second if leader is operator else operator
        with urllib.request.urlopen(standby.health_url, timeout=5) as response:  # a standby replica stays live
            assert response.status == 200
        cluster.kubectl.apply(longer("leads"), namespace=namespace)
        job_uid = wait_for_job(cluster, namespace)["metadata"]["uid"]
        time.sleep(4)  # inside the first measured window
        assert condition(get(cluster, namespace, "sx", "leads"), "LoadTestComplete")["status"] != "True"
        leader.kill()
        body = wait_finished(cluster, namespace, "leads", standby.log)
        assert condition(body, "Succeeded")["status"] == "True", (body["status"], standby.log())
        assert "leading as" in full_log(standby)
        assert [job["metadata"]["uid"] for job in items(cluster, namespace, "jobs")] == [job_uid]
        assert len(body["status"]["results"]) == 2
        events = reasons(cluster, namespace, "leads")
        assert events.count("LoadTestStarted") == 1 and events.count("Succeeded") == 1, events
    finally:
        second.stop()


def test_an_operator_killed_while_its_results_write_is_refused_loses_nothing(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet_factory()
    status_writes = [{"apiGroups": ["servinglab.dev"], "apiVersions": ["v1alpha1"], "operations": ["UPDATE"],
                      "resources": ["servingexperiments/status"]}]  # fmt: skip
    with refused(cluster, namespace, status_writes, allow_when="!has(object.status.results)") as lift:
        cluster.kubectl.apply(experiment("writes"), namespace=namespace)
        job_uid = wait_for_job(cluster, namespace)["metadata"]["uid"]
        cluster.kubectl.wait_for(
            lambda: "patch status of ServingExperiment" in operator.log() and "refused" in operator.log(),
            120,
            "the final status write refused",
        )
        operator.kill()
        lift()
    operator.start()
    body = wait_finished(cluster, namespace, "writes", operator.log)
    assert condition(body, "Succeeded")["status"] == "True", body["status"]
    assert len(body["status"]["results"]) == 2 and all(
        level["throughputRps"] > 0 for level in body["status"]["results"]
    )
    assert [job["metadata"]["uid"] for job in items(cluster, namespace, "jobs")] == [job_uid]
    assert reasons(cluster, namespace, "writes").count("Succeeded") == 1


def delete_mid_load(
    cluster: Cluster, namespace: str, kubelet: LocalKubelet, name: str, component: str, seconds: float
) -> tuple[str, dict[str, Any]]:
    """Delete the `component` pod a few seconds into the load; the pod's name and the finished experiment."""
    cluster.kubectl.apply(longer(name, seconds), namespace=namespace)
    wait_for_job(cluster, namespace)
    pod = running_pod(kubelet, component)
    time.sleep(4)
    cluster.kubectl.run("delete", "pod", pod, "-n", namespace, "--wait=false")
    return pod, wait_finished(cluster, namespace, name, lambda: "", timeout=120)


def test_a_load_pod_killed_mid_level_fails_the_experiment_without_a_partial_result(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    _, body = delete_mid_load(cluster, namespace, kubelet_factory(), "loadgone", "load", 8)
    failed = condition(body, "Failed")
    assert failed["reason"] == "LoadJobFailed", (failed, operator.log())
    assert "results" not in body["status"]  # never a result made of a partial level
    assert len(items(cluster, namespace, "jobs")) == 1  # the one Job, kept for its log


def test_a_server_pod_deleted_mid_load_fails_with_server_restarted(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    server_pod, body = delete_mid_load(cluster, namespace, kubelet_factory(), "replaced", "server", 15)
    failed = condition(body, "Failed")
    assert failed["reason"] == "ServerRestarted", (failed, operator.log())
    assert f"server pod {server_pod} was deleted during the load test" in failed["message"]
    assert "results" not in body["status"]
    assert len(items(cluster, namespace, "jobs")) <= 1
    cluster.kubectl.wait_for(
        lambda: not items(cluster, namespace, "deployments"), 30, "the replacement server removed too"
    )


# -- 5. stale objects --------------------------------------------------------------------------------------


def test_a_reapplied_experiment_never_reads_its_predecessors_job_or_results(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet_factory()
    cluster.kubectl.apply(experiment("again"), namespace=namespace)
    first = wait_finished(cluster, namespace, "again", operator.log)
    assert condition(first, "Succeeded")["status"] == "True", first["status"]
    old_job = get(cluster, namespace, "job", "again-load")["metadata"]["uid"]  # type: ignore[index]
    # another controller's finalizer keeps the old Job and results around after the experiment is gone
    hold = json.dumps({"metadata": {"finalizers": ["example.com/hold"]}})
    for kind, name in (("job", "again-load"), ("configmap", "again-results")):
        cluster.kubectl.run("patch", kind, name, "-n", namespace, "--type=merge", "-p", hold)
    cluster.kubectl.run("delete", "sx", "again", "-n", namespace, "--wait=true", "--timeout=60s")
    cluster.kubectl.apply(experiment("again"), namespace=namespace)

    def waiting() -> bool:
        body = get(cluster, namespace, "sx", "again") or {}
        conditions = {c["type"]: c for c in body.get("status", {}).get("conditions", [])}
        return conditions.get("ServerReady", {}).get("reason") == "WaitingForPredecessor"

    cluster.kubectl.wait_for(waiting, 60, "the new experiment waiting for its predecessor's children")
    time.sleep(3)
    assert get(cluster, namespace, "deployment", "again-server") is None  # nothing deployed over them
    release = json.dumps({"metadata": {"finalizers": None}})
    for kind, name in (("job", "again-load"), ("configmap", "again-results")):
        cluster.kubectl.run("patch", kind, name, "-n", namespace, "--type=merge", "-p", release)
    second = wait_finished(cluster, namespace, "again", operator.log)
    assert condition(second, "Succeeded")["status"] == "True", second["status"]
    new_uid = second["metadata"]["uid"]
    assert new_uid != first["metadata"]["uid"]
    job = get(cluster, namespace, "job", "again-load")
    assert job is not None and job["metadata"]["uid"] != old_job
    head = get(cluster, namespace, "configmap", "again-results")
    assert decode_results(head, lambda name: None).experiment_uid == new_uid


# -- 6. refusals that pass -----------------------------------------------------------------------------------


def test_server_pods_refused_for_a_moment_start_once_the_refusal_passes(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    # as in a namespace created a moment before its experiment, whose default ServiceAccount is not made
    # yet: the ReplicaSet retries its pods, and the experiment waits for it within startGraceSeconds
    kubelet_factory()
    creates = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
    with refused(cluster, namespace, creates) as lift:
        cluster.kubectl.apply(experiment("late"), namespace=namespace)

        def pods_refused() -> bool:
            deployment = get(cluster, namespace, "deployment", "late-server") or {}
            conditions = deployment.get("status", {}).get("conditions", [])
            return any(c["type"] == "ReplicaFailure" and c["status"] == "True" for c in conditions)

        cluster.kubectl.wait_for(pods_refused, 60, "the server's pods refused")
        time.sleep(3)  # several passes see the refusal
        lift()
    body = wait_finished(cluster, namespace, "late", operator.log)
    assert condition(body, "Succeeded")["status"] == "True", (body["status"], operator.log()[-3000:])


def test_a_child_of_a_kind_the_api_server_has_not_mapped_yet_is_refused_for_a_moment_not_for_good(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """For up to 30 s after a CRD is installed, the API server refuses a child owned (with
    blockOwnerDeletion) by an object of that CRD, unless its client may finalize anything: its admission
    looks the owner's kind up in a discovery cache it renews every 30 s. CI met it as the chart's first
    experiment ending Rejected. The operator's client, as the chart's ServiceAccount is, must take that
    refusal as one that passes, and the same apply must succeed once the cache is renewed."""
    kubectl = cluster.kubectl
    kubectl.run("create", "serviceaccount", "creator", "-n", namespace)
    kubectl.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                   "metadata": {"name": "creator", "namespace": namespace},
                   "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]},
                             {"apiGroups": ["*"], "resources": ["probes/finalizers", "deployments/finalizers"],
                              "verbs": ["update"]}]})  # fmt: skip
    kubectl.run("create", "rolebinding", "creator", "-n", namespace, "--role=creator",
                f"--serviceaccount={namespace}:creator")  # fmt: skip
    configuration = client.Configuration(host=cluster.api_server(tmp_path / "ca.crt"))
    configuration.ssl_ca_cert = str(tmp_path / "ca.crt")
    configuration.api_key = {"BearerToken": kubectl.run("create", "token", "creator", "-n", namespace).stdout.strip()}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}

    def owned_by(name: str, api_version: str, kind: str) -> dict[str, Any]:
        owner = {"apiVersion": api_version, "kind": kind, "name": "owner", "uid": str(uuid.uuid4()),
                 "controller": True, "blockOwnerDeletion": True}  # fmt: skip
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace, "ownerReferences": [owner]}}  # fmt: skip

    async def refusals_until_admitted(group: str) -> list[KubeError]:
        """Fill the API server's cache (a child of a Deployment), install a CRD of `group`, then apply a
        child of one of its objects until it is admitted; the errors met on the way."""
        kube = Kube(client.ApiClient(configuration))
        met: list[KubeError] = []
        try:
            # names of this try's own: an earlier try's child is not collected until its owner's kind is known
            # everywhere, and changing its owner would need delete on ConfigMaps
            tag = group.split(".", 1)[0]
            await kube.apply(owned_by(f"primer-{tag}", "apps/v1", "Deployment"))
            kubectl.apply(probe_crd(group))
            kubectl.wait_established(f"probes.{group}")
            deadline = time.monotonic() + 75
            while True:
                try:
                    await kube.apply(owned_by(f"child-{tag}", f"{group}/v1", "Probe"))
                    return met
                except KubeError as exc:
                    met.append(exc)
                    assert time.monotonic() < deadline, f"still refused after 75 s: {exc}"
                    await asyncio.sleep(1)
        finally:
            await kube.close()

    groups = [f"g{uuid.uuid4().hex[:8]}.test.servinglab.dev" for _ in range(3)]
    try:
        # the cache may be renewed between the first apply and the CRD (a chance of about 1 in 30 each try)
        for group in groups:
            if met := asyncio.run(refusals_until_admitted(group)):
                break
        assert met, "a child of a just-installed kind was never refused: the API server no longer does this"
        for error in met:
            assert error.status == 403 and PASSING_REFUSALS[0] in str(error), error
            assert not error.refusal, error  # so the operator retries it, and ends nothing as Rejected
    finally:
        for group in groups:
            kubectl.run("delete", "crd", f"probes.{group}", "--wait=false", check=False)


def probe_crd(group: str) -> dict[str, Any]:
    """A namespaced kind `Probe` of `group` that keeps whatever it is given."""
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"probes.{group}"},
        "spec": {"group": group, "names": {"kind": "Probe", "plural": "probes"}, "scope": "Namespaced",
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema}]},
    }  # fmt: skip


# -- 7. calls that never return ------------------------------------------------------------------------------


@contextmanager
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (a hung Prometheus, a half-open proxy)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.5)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        for connection in held:
            connection.close()
        listener.close()


def test_a_stopped_api_server_and_a_silent_prometheus_do_not_hang_the_run(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    if cluster.control_plane is None:
        pytest.skip("stopping the API server needs --cluster=local (what CI runs)")
    kubelet = kubelet_factory()
    with silent_server() as port:
        cluster.kubectl.apply(longer("outage", 8, f"http://127.0.0.1:{port}"), namespace=namespace)
        job_uid = wait_for_job(cluster, namespace)["metadata"]["uid"]
        running_pod(kubelet, "load")
        time.sleep(2)  # into the first level
        cluster.control_plane.stop_api_server()
        time.sleep(10)  # the operator's calls fail meanwhile; the load keeps running
        cluster.control_plane.start_api_server()
        body = wait_finished(cluster, namespace, "outage", operator.log, timeout=240)
    # If it could not renew its Lease meanwhile, it stopped acting and exited (a standby might have taken over),
    # and the harness started it again, as its Deployment would; it exits for no other reason.
    whole_log = (operator.workdir / "operator.log").read_text(errors="replace")
    assert operator.restarts == 0 or "lost lease" in whole_log, operator.log()
    assert condition(body, "Succeeded")["status"] == "True", (body["status"], operator.log())
    gpu = condition(body, "GPUMetricsAvailable")
    assert (gpu["status"], gpu["reason"]) == ("False", "PrometheusUnreachable")
    assert f"http://127.0.0.1:{port}: no answer within" in gpu["message"]
    assert [job["metadata"]["uid"] for job in items(cluster, namespace, "jobs")] == [job_uid]
