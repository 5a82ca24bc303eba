"""LitServe on the cluster: the same operator, reconcilers and load Job as for TorchServe, the pod from
LitServe's own plan (the seam). The local kubelet runs the pod's script from the experiment's ConfigMap
(on the CPU: the simulated T4 is not here) after the model init container laid the tiny model out for
LitServe; the load Job checks the workers' own report of their settings before it sends load."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.kubelet import LocalKubelet
from clusterenv.monitoring import DcgmExporter, Prometheus
from clusterenv.operatorproc import Operator

pytestmark = [pytest.mark.k8s]


def test_a_litserve_experiment_succeeds_with_the_settings_its_workers_report(
    tmp_path: Path,
    cluster: Cluster,
    namespace: str,
    operator: Operator,
    kubelet_factory: Callable[..., LocalKubelet],
    monitoring: tuple[DcgmExporter, Prometheus],
) -> None:
    _, prometheus = monitoring
    kubelet = kubelet_factory()
    applied = time.monotonic()
    cluster.kubectl.apply(
        experiment("tiny-litserve", prometheus.url, kind="litserve", batchSize=4, workers=2), namespace=namespace
    )
    body = wait_finished(cluster, namespace, "tiny-litserve", operator.log, timeout=300)
    status = body["status"]
    assert condition(body, "Succeeded")["status"] == "True", (status, operator.log()[-3000:], kubelet.errors)
    # the load Job read what LitServe's workers run with, and it is what the spec asked for
    assert status["effective"] == {"batchSize": 4, "maxBatchDelayMs": 5, "readyWorkers": 2}
    assert [level["concurrency"] for level in status["results"]] == [1, 4]
    for level in status["results"]:
        assert level["errors"] == 0 and level["throughputRps"] > 0
        # (a mean read from counters sampled mid-batch: one user can show 0.99)
        assert level["server"]["meanBatchSize"] > 0 and level["server"]["queueMsMean"] is not None
    assert status["model"]["source"] == "built-in:tiny" and status["coldStartSeconds"] > 0

    # the pod was LitServe's: its container, its readiness (every worker set up), in a restricted namespace
    server = next(p for p in kubelet.pods.values() if p.labels.get("app.kubernetes.io/component") == "server")
    assert server.container["name"] == "litserve"
    assert server.container["readinessProbe"]["httpGet"]["path"] == "/health"
    # Prometheus scraped the LitAPI's counters from the pod's metrics port, as the chart's PodMonitor would
    query = f'sum(max_over_time(servinglab_litserve_requests_total{{namespace="{namespace}"}}[10m]))'
    assert float(prometheus.query(query)[0]["value"][1]) >= sum(level["requests"] for level in status["results"])
    table = cluster.kubectl.run("get", "sx", "-n", namespace).stdout
    assert "litserve" in table and "Succeeded" in table
    print(f"apply -> Succeeded on LitServe: {time.monotonic() - applied:.1f} s\n{table}")
