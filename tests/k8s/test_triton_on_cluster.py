"""A Triton experiment on the test cluster: the operator deploys Triton's pod through the seam (its init
container lays out the repository entry, the server container runs the Triton environment's launcher), the
stand-in kubelet runs it as local processes, readiness is Triton's own word, and the load Job speaks the
KServe v2 protocol and reads Triton's metrics through the Service."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.kubelet import LocalKubelet
from clusterenv.operatorproc import Operator
from servinglab.servers.triton.env import TritonEnv

pytestmark = [pytest.mark.k8s, pytest.mark.triton]


def test_a_triton_experiment_succeeds_with_triton_s_breakdown(
    cluster: Cluster,
    namespace: str,
    operator: Operator,
    kubelet_factory: Callable[..., LocalKubelet],
    triton_env: TritonEnv,
) -> None:
    kubelet = kubelet_factory()
    document = experiment("tiny-triton", kind="triton", batchSize=4, maxBatchDelayMs=20, workers=2)
    cluster.kubectl.apply(document, namespace=namespace)
    body = wait_finished(cluster, namespace, "tiny-triton", operator.log)
    status = body["status"]
    assert condition(body, "Succeeded")["status"] == "True", (status, operator.log(), kubelet.errors)
    assert condition(body, "ServerReady")["status"] == "True"

    assert status["coldStartSeconds"] > 0
    stored = cluster.kubectl.get("configmap", status["resultsRef"]["name"], "-n", namespace)
    levels = json.loads(stored["data"]["results.json"])["results"]
    assert [level["concurrency"] for level in levels] == [1, 4]
    for level in levels:
        assert level["errors"] == 0 and level["requests"] > 0
        assert level["server"]["serverRequests"] >= level["requests"]  # Triton's own count, through the Service
        assert level["server"]["meanBatchSize"] >= 1
