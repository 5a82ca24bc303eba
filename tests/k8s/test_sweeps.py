"""Sweeps and the GPU queue on the real control plane: trials as child experiments on the two
simulated T4 nodes, at most as many servers as GPUs, restart resume, delete, invalid sweeps.

The operator runs as `servinglab operator`; KWOK schedules the pods on the simulated nodes and the
local kubelet runs the real TorchServe and load generator of each trial.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.experiments import sweep as sweep_of
from clusterenv.kubelet import LocalKubelet
from clusterenv.operatorproc import SERVINGLAB, Operator
from clusterenv.policies import refusing

pytestmark = [pytest.mark.k8s, pytest.mark.torchserve]


def sweep(name: str, price_per_hour: float | None = None, **spec: Any) -> dict[str, Any]:
    template = experiment("template")["spec"]
    template["load"] = {"concurrency": [4], "warmupSeconds": 0.5, "durationSeconds": 2}
    if price_per_hour is not None:
        template["cost"] = {"pricePerHour": price_per_hour}
    return sweep_of(name, template, **spec)


class ServerWatch:
    """Samples, every 0.3 s, how many server pods are bound to a node and not terminating."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ServerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            pods = self.cluster.kubectl.get(
                "pods", "-n", self.namespace, "-l", "app.kubernetes.io/component=server"
            )["items"]  # fmt: skip
            bound = [
                p for p in pods
                if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
                and p["status"].get("phase") in ("Pending", "Running")
            ]  # fmt: skip
            self.most = max(self.most, len(bound))
            self._stop.wait(0.3)


def get_sweep(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.kubectl.get("servingsweep", name, "-n", namespace)


def wait_sweep(
    cluster: Cluster, namespace: str, name: str, log: Callable[[], str], timeout: float = 400
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = get_sweep(cluster, namespace, name)
        state = (body.get("status") or {}).get("summary", {}).get("state")
        if state in ("Succeeded", "Failed"):
            return body
        time.sleep(1)
    pytest.fail(f"sweep {name} did not finish in {timeout} s; operator log:\n{log()}")


def test_a_third_one_gpu_experiment_waits_in_the_queue_then_succeeds(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet_factory()
    with ServerWatch(cluster, namespace) as watch:
        for name in ("queue-a", "queue-b", "queue-c"):
            cluster.kubectl.apply(experiment(name), namespace=namespace)
            time.sleep(0.5)  # creation order is queue order

        # two T4 nodes, one GPU each: the third is queued, first in line once the other two hold the GPUs
        def queued_message() -> str:
            body = cluster.kubectl.get("sx", "queue-c", "-n", namespace)
            queued = next((c for c in (body.get("status") or {}).get("conditions", []) if c["type"] == "Queued"), {})
            return str(queued.get("message", "")) if queued.get("status") == "True" else ""

        cluster.kubectl.wait_for(
            lambda: "2 of 2 in use; position 1 in the queue" in queued_message(), 90, "queue-c first in line"
        )
        assert condition(cluster.kubectl.get("sx", "queue-c", "-n", namespace), "Queued")["reason"] == "WaitingForGPU"
        assert cluster.kubectl.get("sx", "queue-c", "-n", namespace)["status"]["summary"]["state"] == "Queued"
        assert "queue-c-server" not in {
            d["metadata"]["name"] for d in cluster.kubectl.get("deployments", "-n", namespace)["items"]
        }
        bodies = {
            name: wait_finished(cluster, namespace, name, operator.log, 360)
            for name in ("queue-a", "queue-b", "queue-c")
        }
    for name, body in bodies.items():
        assert condition(body, "Succeeded")["status"] == "True", (name, body["status"].get("conditions"))
    third = bodies["queue-c"]["status"]
    assert condition(bodies["queue-c"], "Queued")["status"] == "False" and third["queuedSeconds"] > 0
    assert watch.most <= 2, f"{watch.most} servers were scheduled at once on two GPUs"


def assert_exported(cluster: Cluster, operator: Operator, name: str, status: dict[str, Any]) -> None:
    """The dashboards' sweep panels: the operator's metrics show the best and the front its status holds
    (the pass that finishes a sweep writes both: kopf once cancelled it between the two)."""

    def exported() -> dict[str, list[float]]:
        found: dict[str, list[float]] = {}
        for line in operator.exported().splitlines():
            if not line.startswith("#") and f'sweep="{name}"' in line:
                found.setdefault(line.split("{", 1)[0], []).append(float(line.rsplit(" ", 1)[1]))
        return found

    best = "servinglab_sweep_best_capacity_rps"
    cluster.kubectl.wait_for(lambda: best in exported(), 10, f"the best of {name} exported")
    assert exported()[best] == [pytest.approx(status["best"]["capacityRps"])]
    assert len(exported()["servinglab_sweep_front_throughput_rps"]) == len(status["front"])
    # the cost front: one series per point, none for an unpriced sweep
    assert len(exported().get("servinglab_sweep_cost_front_cost_per_million", [])) == len(status.get("costFront") or [])


def assert_cost_front(status: dict[str, Any]) -> None:
    """A priced sweep: its cost front (cost per million against p99's upper bound) reaches the status, with
    no reason for its absence."""
    assert status.get("costFront") and "costFrontReason" not in status, status.get("costFrontReason")
    assert {p["trial"] for p in status["costFront"]} <= {t["name"] for t in status["trials"]}
    assert all(p["costPerMillion"] > 0 for p in status["costFront"])


def test_a_sweep_runs_its_trials_two_at_a_time_and_rolls_them_up(
    cluster: Cluster,
    namespace: str,
    operator: Operator,
    kubelet_factory: Callable[..., LocalKubelet],
    tmp_path: Path,
) -> None:
    kubelet_factory()
    configs = [{"batchSize": b, "maxBatchDelayMs": 5, "workers": 1, "precision": "fp32"} for b in (1, 4, 8)]
    confirm = {"candidates": 2, "rounds": 2}  # the best two measured again, alternating, twice
    with ServerWatch(cluster, namespace) as watch:  # priced (a T4's hour), so the status has a cost front
        cluster.kubectl.apply(sweep("sweep-e2e", 0.35, strategy="list", configurations=configs, parallelism=3,
                                    confirm=confirm), namespace=namespace)  # fmt: skip
        # parallelism 3, but two GPUs: at most two trials at once
        cluster.kubectl.wait_for(
            lambda: len(cluster.kubectl.get("sx", "-n", namespace)["items"]) >= 2,
            60, "two trials",
        )  # fmt: skip
        time.sleep(3)
        assert len(cluster.kubectl.get("sx", "-n", namespace)["items"]) == 2
        body = wait_sweep(cluster, namespace, "sweep-e2e", operator.log)
    assert watch.most <= 2
    status = body["status"]
    assert status["summary"]["state"] == "Succeeded", (status, operator.log())
    assert status["counts"]["run"] == 3 and status["stopReason"] == "every configuration was tried"
    children = cluster.kubectl.get("sx", "-n", namespace, "-l", "servinglab.dev/sweep=sweep-e2e")["items"]
    reruns = [c for c in children if "servinglab.dev/confirms" in c["metadata"].get("annotations", {})]
    trials = [c for c in children if c not in reruns]
    assert sorted(t["metadata"]["name"] for t in trials) == [f"sweep-e2e-b{b}-d5-w1-fp32" for b in (1, 4, 8)]
    # the two best trials, each measured again in rounds 1 and 2 (child experiments <trial>-r<round>)
    confirmation = status["confirmation"]
    candidates = [c["trial"] for c in confirmation["candidates"]]
    assert sorted(c["metadata"]["name"] for c in reruns) == sorted(f"{t}-r{r}" for t in candidates for r in (1, 2))
    assert confirmation["state"] in ("Confirmed", "Tie") and all(
        len(c["runsRps"]) + len(c.get("missed", [])) == 2 for c in confirmation["candidates"]
    )
    assert status["best"]["trial"] == confirmation["winner"] and status["best"]["confidence"] == confirmation["state"]
    assert status["summary"]["winner"] == confirmation["state"]
    for trial in trials:
        assert trial["metadata"]["labels"]["servinglab.dev/batch-size"] == str(trial["spec"]["server"]["batchSize"])
        (owner,) = trial["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("ServingSweep", body["metadata"]["uid"])
    best = status["best"]
    assert best["lowRps"] <= best["capacityRps"] <= best["highRps"]
    assert status["summary"]["bestConfig"] == "b{batchSize}-d{maxBatchDelayMs}-w{workers}-{precision}".format(
        **best["config"]
    )
    assert status["front"] and {p["trial"] for p in status["front"]} <= {t["metadata"]["name"] for t in trials}
    assert_exported(cluster, operator, "sweep-e2e", status)
    assert_cost_front(status)

    printed = cluster.kubectl.run("get", "servingsweeps", "-n", namespace).stdout
    assert "sweep-e2e" in printed and "Succeeded" in printed and status["summary"]["bestConfig"] in printed
    # the same table and document as a local sweep, from the CLI
    exported = tmp_path / "best"
    results = subprocess.run([SERVINGLAB, "results", "--sweep", "sweep-e2e", "-n", namespace, "-o", "-",
                              "--export", str(exported)],
                             env=cluster.env, capture_output=True, text=True, check=False)  # fmt: skip
    assert results.returncode == 0, results.stderr
    document = json.loads(results.stdout[results.stdout.index("{") :])
    assert document["kind"] == "ServingSweepResults" and document["best"] == status["best"]
    assert len(document["points"]) == 3  # one level per trial, every point kept
    # the winner, ready to deploy
    best_experiment = yaml.safe_load((exported / "experiment.yaml").read_text())
    assert best_experiment["spec"]["server"]["batchSize"] == best["config"]["batchSize"]
    assert f"batchSize: {best['config']['batchSize']}" in (exported / "model-config.yaml").read_text()

    # finished sweeps and trials carry no finalizer: deleting them needs no operator
    def finalizers() -> list[str]:
        objects = [cluster.kubectl.get("servingsweep", "sweep-e2e", "-n", namespace), *trials]
        objects[1:] = [cluster.kubectl.get("sx", t["metadata"]["name"], "-n", namespace) for t in trials]
        return [f for o in objects for f in o["metadata"].get("finalizers") or []]

    cluster.kubectl.wait_for(lambda: not finalizers(), 30, "no finalizer on the finished sweep and trials")
    operator.stop()
    cluster.kubectl.run("delete", "servingsweep", "sweep-e2e", "-n", namespace, "--wait=true", "--timeout=60s")
    cluster.kubectl.wait_for(lambda: not cluster.kubectl.get("sx", "-n", namespace)["items"], 60, "trials deleted")


def test_an_operator_restart_resumes_a_sweep_without_running_a_trial_twice(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet_factory()
    configs = [{"batchSize": b, "maxBatchDelayMs": 5, "workers": 1, "precision": "fp32"} for b in (2, 4, 8)]
    cluster.kubectl.apply(sweep("resumed", strategy="list", configurations=configs, parallelism=1,
                                confirm={"rounds": 0}), namespace=namespace)  # fmt: skip

    def finished_trials() -> int:
        return int(
            (get_sweep(cluster, namespace, "resumed").get("status") or {}).get("summary", {}).get("trialsDone", 0)
        )

    cluster.kubectl.wait_for(lambda: finished_trials() >= 1, 240, "a first finished trial")
    operator.stop()
    uids = {t["metadata"]["name"]: t["metadata"]["uid"] for t in cluster.kubectl.get("sx", "-n", namespace)["items"]}
    operator.start()
    body = wait_sweep(cluster, namespace, "resumed", operator.log)
    assert body["status"]["summary"]["state"] == "Succeeded"
    trials = cluster.kubectl.get("sx", "-n", namespace)["items"]
    assert len(trials) == 3 and body["status"]["counts"]["run"] == 3
    for trial in trials:  # the trials that existed before the restart are the same objects
        if trial["metadata"]["name"] in uids:
            assert trial["metadata"]["uid"] == uids[trial["metadata"]["name"]]


def test_an_invalid_sweep_fails_naming_the_field_and_creates_nothing(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    bad = sweep("bad-sweep", strategy="list")  # no configurations
    cluster.kubectl.apply(bad, namespace=namespace)
    body = wait_sweep(cluster, namespace, "bad-sweep", operator.log, timeout=60)
    failed = condition(body, "Failed")
    assert failed["reason"] == "InvalidSpec" and "strategy list needs configurations" in failed["message"]
    assert not cluster.kubectl.get("sx", "-n", namespace)["items"]


def test_a_sweep_whose_trials_the_api_refuses_fails_rejected_and_does_not_retry_for_ever(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    """A policy (a quota on the count of experiments would do the same) refuses every trial: the sweep ends
    Failed as Rejected with the API's message, as an experiment whose child is refused does."""
    creates = [{"apiGroups": ["servinglab.dev"], "apiVersions": ["*"], "operations": ["CREATE"],
                "resources": ["servingexperiments"]}]  # fmt: skip
    with refusing(cluster, namespace, creates, "false", "no experiments here"):
        one = {"batchSize": 1, "maxBatchDelayMs": 5, "workers": 1, "precision": "fp32"}
        cluster.kubectl.apply(sweep("refused-sweep", strategy="list", configurations=[one]), namespace=namespace)
        body = wait_sweep(cluster, namespace, "refused-sweep", operator.log, timeout=60)
    failed = condition(body, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "Rejected", failed
    assert "refused a trial" in failed["message"] and "no experiments here" in failed["message"], failed
    assert body["status"]["summary"]["state"] == "Failed" and body["status"].get("finishedAt")
    assert not cluster.kubectl.get("sx", "-n", namespace)["items"]
