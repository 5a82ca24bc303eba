"""The operator end to end on the real control plane.

The operator runs as `servinglab operator` (kopf's runner) in its own process. KWOK schedules and
runs the pods on simulated T4 nodes; the local kubelet starts the real TorchServe and the real load
generator from the specs the operator wrote; a real Prometheus scrapes that TorchServe and a
DCGM-format exporter. Each test follows one experiment to its outcome.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.kubelet import LocalKubelet
from clusterenv.monitoring import FB_USED_MIB, POWER_WATTS, UTIL_HIGH, UTIL_LOW, DcgmExporter, Prometheus
from clusterenv.operatorproc import Operator

pytestmark = [pytest.mark.k8s, pytest.mark.torchserve]

SERVINGLAB = str(Path(sys.executable).with_name("servinglab"))


def test_experiment_runs_to_succeeded_with_results_in_status(
    tmp_path: Path,
    cluster: Cluster,
    namespace: str,
    operator: Operator,
    kubelet_factory: Callable[..., LocalKubelet],
    monitoring: tuple[DcgmExporter, Prometheus],
) -> None:
    _, prometheus = monitoring
    kubelet = kubelet_factory()
    experiment_file = tmp_path / "tiny-e2e.yaml"
    experiment_file.write_text(json.dumps(experiment("tiny-e2e", prometheus.url)))
    applied_at = time.monotonic()
    # applied and followed by the CLI, as a user would: `servinglab run FILE --cluster`
    client = subprocess.Popen(
        [SERVINGLAB, "run", str(experiment_file), "--cluster", "-n", namespace, "--timeout", "240"],
        env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    body = wait_finished(cluster, namespace, "tiny-e2e", operator.log)
    elapsed = time.monotonic() - applied_at
    followed, _ = client.communicate(timeout=60)
    assert client.returncode == 0, followed
    assert "Succeeded=True" in followed and "p99 ms" in followed
    status = body["status"]
    assert condition(body, "Succeeded")["status"] == "True", (status, operator.log(), kubelet.errors)
    assert condition(body, "ServerReady")["status"] == "True"
    assert condition(body, "LoadTestComplete")["status"] == "True"

    # The server pod really ran on a simulated T4 node, started from the operator's Deployment.
    server_pod = status["serverPod"]
    assert server_pod.startswith("tiny-e2e-server-")
    assert status["coldStartSeconds"] > 0

    # Status numbers are the load generator's own, as written to the referenced ConfigMap.
    stored = cluster.kubectl.get("configmap", status["resultsRef"]["name"], "-n", namespace)
    full = json.loads(stored["data"]["results.json"])["results"]
    assert [level["concurrency"] for level in status["results"]] == [1, 4]
    for compact, raw in zip(status["results"], full, strict=True):
        assert compact["throughputRps"] == raw["throughputRps"] > 0
        assert compact["latencyMs"]["p99"] == raw["latencyMs"]["p99"]
        latency = compact["latencyMs"]
        assert latency["p50"] <= latency["p90"] <= latency["p95"] <= latency["p99"] <= latency["max"]
        assert compact["errors"] == 0
        assert compact["server"]["meanBatchSize"] > 0  # counters sampled mid-batch: one user can show 0.99
        gpu = compact["gpu"]
        assert UTIL_LOW <= gpu["utilizationAvgPercent"] <= UTIL_HIGH
        assert gpu["utilizationMaxPercent"] == UTIL_HIGH
        assert gpu["memoryUsedMaxMiB"] == FB_USED_MIB
        assert gpu["powerAvgWatts"] == POWER_WATTS
        # 60 W over the window, within Prometheus' extrapolation at 1 s resolution
        assert gpu["energyJoules"] == pytest.approx(POWER_WATTS * raw["windowSeconds"], rel=0.35)
    assert condition(body, "GPUMetricsAvailable")["status"] == "True"
    # the ceiling for the T4 the server is pinned to: FLOPs counted once where the model was built (the init
    # container says so in status.model) and handed to the Job, which then needs no torch; fp32 peak 8.1 TFLOPS
    ceiling, model = status["ceiling"], status["model"]
    assert (ceiling["accelerator"], ceiling["peakTflops"], ceiling["flopsPerInference"], model["flopsPerInference"],
            model["source"]) == ("T4", 8.1, 3_244_672, 3_244_672, "built-in:tiny")  # fmt: skip
    assert ceiling["theoreticalRps"] == pytest.approx(8.1e12 / 3_244_672, abs=1e-2)
    best_served = max(level["throughputRps"] for level in status["results"])
    assert ceiling["servedOverTheoretical"] == pytest.approx(best_served / ceiling["theoreticalRps"], rel=1e-3)
    # the Job has no GPU: local runs measure the raw figure (a null drops out of the merge-patched status)
    assert ceiling.get("rawAtFormedBatchRps") is None and "measured by local runs" in ceiling["note"]
    summary = status["summary"]
    assert summary["state"] == "Succeeded"
    assert summary["bestThroughputRps"] == max(level["throughputRps"] for level in status["results"])

    # Prometheus scraped the same TorchServe: it counted at least the measured requests (its last
    # scraped value; the server itself is gone by now).
    served = prometheus.query(f'sum(max_over_time(ts_inference_requests_total{{namespace="{namespace}"}}[10m]))')
    assert float(served[0]["value"][1]) >= sum(level["requests"] for level in full)

    # The server is cleaned up after the run; the results stay.
    cluster.kubectl.wait_for(
        lambda: not cluster.kubectl.get("deployments", "-n", namespace)["items"], 30, "the server Deployment deleted"
    )
    table = cluster.kubectl.run("get", "sx", "-n", namespace).stdout
    assert "Succeeded" in table
    assert_reported_everywhere(cluster, namespace, status, operator)
    print(f"apply -> Succeeded: {elapsed:.1f} s for {2 * (1 + 3)} s of configured load\n{table}")


def assert_verdicts(status: dict[str, Any]) -> None:
    """Every level's verdict, compact (its figures are rebuilt from the level), the best level's in the summary."""
    verdicts = [level["verdict"] for level in status["results"]]
    assert all(v["bottleneck"] and v["because"] and v["next"] and "timeMs" not in v for v in verdicts), verdicts
    best_level = max(status["results"], key=lambda level: level["throughputRps"])
    assert status["summary"]["verdict"] == best_level["verdict"]["bottleneck"]


def results_table(cluster: Cluster, namespace: str, name: str) -> str:
    """What `servinglab results NAME` prints."""
    command = [SERVINGLAB, "results", name, "-n", namespace]
    return subprocess.run(command, env=cluster.env, capture_output=True, text=True, check=True).stdout


def assert_reported_everywhere(cluster: Cluster, namespace: str, status: dict[str, Any], operator: Operator) -> None:
    """The finished result shows in `servinglab results`, as events, and in the operator's metrics; each level
    has its verdict."""
    assert_verdicts(status)
    summary = status["summary"]
    shown = results_table(cluster, namespace, "tiny-e2e")
    assert f"{status['results'][0]['throughputRps']:.1f}" in shown
    assert f"verdict at 4: {status['results'][1]['verdict']['bottleneck']}" in " ".join(shown.split())

    # Each transition was recorded as an event on the experiment.
    events = cluster.kubectl.get("events", "-n", namespace, "--field-selector", "involvedObject.name=tiny-e2e")
    reasons = [event["reason"] for event in sorted(events["items"], key=lambda e: e["metadata"]["creationTimestamp"])]
    assert {"Deploying", "ServerReady", "LoadTestStarted", "Succeeded"} <= set(reasons), reasons

    # The operator exports the finished experiment's figures for dashboards.
    exported = operator.exported()
    best = summary["bestThroughputRps"]
    assert any(
        line.startswith("servinglab_experiment_best_throughput_rps{")
        and 'experiment="tiny-e2e"' in line
        and float(line.rsplit(" ", 1)[1]) == pytest.approx(best)
        for line in exported.splitlines()
    ), exported[-2000:]
    assert 'servinglab_experiments_finished_total{state="Succeeded"} 1.0' in exported
    verdict = status["results"][1]["verdict"]["bottleneck"]
    labels = ('experiment="tiny-e2e"', f'verdict="{verdict}"', 'concurrency="4"')
    assert any(line.startswith("servinglab_experiment_verdict{") and all(label in line for label in labels)
               for line in exported.splitlines())  # fmt: skip


def test_invalid_spec_fails_without_children(cluster: Cluster, namespace: str, operator: Operator) -> None:
    bad = experiment("no-such-model")
    bad["spec"]["model"]["name"] = "bert"  # passes the CRD schema, fails the operator's model check
    cluster.kubectl.apply(bad, namespace=namespace)
    body = wait_finished(cluster, namespace, "no-such-model", operator.log, timeout=60)
    failed = condition(body, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec"
    assert "spec.model: 'bert' is not a built-in model" in failed["message"]
    for kind in ("deployments", "jobs", "configmaps", "services"):
        items = cluster.kubectl.get(kind, "-n", namespace)["items"]
        assert not [i for i in items if i["metadata"]["name"].startswith("no-such-model")], kind


def test_a_gpu_request_no_node_could_ever_hold_fails_at_once(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    cluster.kubectl.apply(experiment("greedy", gpus=4), namespace=namespace)
    body = wait_finished(cluster, namespace, "greedy", operator.log, timeout=90)
    failed = condition(body, "Failed")
    assert failed["reason"] == "Unschedulable"
    assert "offers 4 nvidia.com/gpu (the largest offers 1, 2 nodes match)" in failed["message"]
    assert not cluster.kubectl.get("deployments", "-n", namespace)["items"]  # nothing was deployed


def test_failed_load_job_fails_the_experiment_with_its_message(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet_factory(job_outcome=(137, "OOMKilled: load generator ran out of memory"))
    cluster.kubectl.apply(experiment("job-dies"), namespace=namespace)
    body = wait_finished(cluster, namespace, "job-dies", operator.log)
    failed = condition(body, "Failed")
    assert failed["reason"] == "LoadJobFailed"
    assert "exit code 137" in failed["message"] and "OOMKilled" in failed["message"]


def test_server_crash_during_the_run_fails_the_experiment(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet = kubelet_factory()
    long = experiment("crashes")
    long["spec"]["load"]["durationSeconds"] = 60
    cluster.kubectl.apply(long, namespace=namespace)
    cluster.kubectl.wait_for(
        lambda: bool(cluster.kubectl.get("jobs", "-n", namespace)["items"]), 120, "the load Job to start"
    )
    kubelet.kill_server()
    body = wait_finished(cluster, namespace, "crashes", operator.log, timeout=60)
    failed = condition(body, "Failed")
    assert failed["reason"] == "ServerCrashed", failed
    assert "exit code 137" in failed["message"]
    # a failed run must not keep holding the GPU (spec.cleanup.deleteServer defaults to true)
    cluster.kubectl.wait_for(
        lambda: not cluster.kubectl.get("deployments", "-n", namespace)["items"], 30, "the server removed"
    )


def test_operator_restart_mid_run_resumes_without_a_second_job(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet_factory()
    cluster.kubectl.apply(experiment("restarts"), namespace=namespace)
    cluster.kubectl.wait_for(
        lambda: bool(cluster.kubectl.get("jobs", "-n", namespace)["items"]), 120, "the load Job to start"
    )
    job_uid = cluster.kubectl.get("job", "restarts-load", "-n", namespace)["metadata"]["uid"]
    operator.stop()
    operator.start()
    body = wait_finished(cluster, namespace, "restarts", operator.log)
    assert condition(body, "Succeeded")["status"] == "True", body["status"]
    jobs = cluster.kubectl.get("jobs", "-n", namespace)["items"]
    assert [job["metadata"]["uid"] for job in jobs] == [job_uid]


def test_deleting_the_experiment_removes_its_children(cluster: Cluster, namespace: str, operator: Operator) -> None:
    cluster.kubectl.apply(experiment("deleted"), namespace=namespace)
    cluster.kubectl.wait_for(
        lambda: bool(cluster.kubectl.get("deployments", "-n", namespace)["items"]), 60, "the server Deployment"
    )
    cluster.kubectl.run("delete", "sx", "deleted", "-n", namespace, "--wait=true", "--timeout=60s")

    def children_gone() -> bool:
        left = [
            item["metadata"]["name"]
            for kind in ("deployments", "services", "configmaps", "roles", "serviceaccounts")
            for item in cluster.kubectl.get(kind, "-n", namespace)["items"]
            if item["metadata"]["name"].startswith("deleted-")
        ]
        return not left

    cluster.kubectl.wait_for(children_gone, 60, "the garbage collector to remove every child")


def test_spec_is_immutable_once_applied(cluster: Cluster, namespace: str, crd: None) -> None:
    cluster.kubectl.apply(experiment("frozen"), namespace=namespace)
    edit = cluster.kubectl.run(
        "patch", "sx", "frozen", "-n", namespace, "--type=merge", "-p", '{"spec":{"server":{"batchSize":8}}}',
        check=False,
    )  # fmt: skip
    assert edit.returncode != 0
    assert "spec is immutable" in edit.stderr


def test_server_that_never_gets_ready_fails_after_its_startup_timeout(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    # no local kubelet: the pod runs (KWOK) but its readiness probe never passes
    cluster.kubectl.apply(experiment("never-ready", startupTimeoutSeconds=5), namespace=namespace)
    body = wait_finished(cluster, namespace, "never-ready", operator.log, timeout=90)
    failed = condition(body, "Failed")
    assert failed["reason"] == "ServerNotReady"
    assert "not ready within 5 s (server.startupTimeoutSeconds)" in failed["message"]


def test_results_are_written_without_prometheus_and_the_condition_says_why(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet_factory()
    cluster.kubectl.apply(experiment("no-prometheus"), namespace=namespace)
    body = wait_finished(cluster, namespace, "no-prometheus", operator.log)
    assert condition(body, "Succeeded")["status"] == "True", body["status"]
    gpu = condition(body, "GPUMetricsAvailable")
    assert (gpu["status"], gpu["reason"]) == ("False", "NotConfigured")
    assert all("gpu" not in level and level["throughputRps"] > 0 for level in body["status"]["results"])


def test_open_loop_experiment_reports_rates_and_trust_flags_in_status(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet_factory()
    open_loop = experiment("open-e2e")
    open_loop["spec"]["load"] = {
        "mode": "open", "arrival": "poisson", "rates": [20, 40], "warmupSeconds": 1, "durationSeconds": 4,
        "stability": {"windowSeconds": 1, "windows": 2, "tolerance": 1.0},
    }  # fmt: skip
    cluster.kubectl.apply(open_loop, namespace=namespace)
    body = wait_finished(cluster, namespace, "open-e2e", operator.log)
    status = body["status"]
    assert condition(body, "Succeeded")["status"] == "True", (status, operator.log())
    assert [level["rateRps"] for level in status["results"]] == [20, 40]
    for level in status["results"]:
        assert "concurrency" not in level and level["throughputRps"] > 0
        assert level["openLoop"]["sentRps"] == pytest.approx(level["rateRps"], rel=0.4)  # 4 s of Poisson arrivals
        assert level["openLoop"]["droppedSends"] == 0
        # the trust verdicts, typed as a local run's: stability judged (windows kept in the ConfigMap only)
        assert level["stability"]["stable"] in (True, False) and not level["stability"].get("windows")
        assert isinstance(level["generator"]["saturated"], bool) and level["generator"]["cpuPercent"] >= 0
    assert status["summary"]["bestRateRps"] in (20, 40) and "bestConcurrency" not in status["summary"]
    # the same table a local run prints, keyed by rate
    shown = results_table(cluster, namespace, "open-e2e")
    assert "20 rps" in shown and "40 rps" in shown


def test_two_load_pods_drive_one_level_and_their_requests_merge_into_one_result(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet],
    monitoring: tuple[DcgmExporter, Prometheus],
) -> None:  # fmt: skip
    _, prometheus = monitoring
    kubelet = kubelet_factory()
    document = experiment("two-pods", prometheus.url)
    document["spec"]["load"].update(concurrency=[6], durationSeconds=3, generators=2)
    cluster.kubectl.apply(document, namespace=namespace)
    body = wait_finished(cluster, namespace, "two-pods", operator.log)
    status = body["status"]
    assert condition(body, "Succeeded")["status"] == "True", (status["conditions"], kubelet.errors)
    job = cluster.kubectl.get("job", "two-pods-load", "-n", namespace)
    assert job["spec"]["completionMode"] == "Indexed" and job["status"]["succeeded"] == 2
    stored = cluster.kubectl.get("configmap", status["resultsRef"]["name"], "-n", namespace)
    (level,) = json.loads(stored["data"]["results.json"])["results"]
    generator = level["generator"]
    assert generator["generators"] == 2 and all(g["cpuPercent"] > 0 for g in generator["perGenerator"]), generator
    assert level["errors"] == 0 and level["concurrency"] == 6
    # one count for both pods, and TorchServe's own counter over the same window agrees with it (up to
    # the requests in flight at the window's edges and those answered while its metrics were read)
    served = level["server"]["serverRequests"]
    assert abs(served - level["requests"]) <= 2 * 6 + 0.25 * level["throughputRps"], (served, level["requests"])
