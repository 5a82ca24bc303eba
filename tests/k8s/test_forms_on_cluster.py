"""The model's form (`server.form`) on the cluster: the server pod's model init container builds the tiny
model's ONNX form with the local path's code (`servinglab prepare-form`), keeps it in the model cache claim
(keyed by content, signed with the namespace's cache key), gates it against eager fp32 and puts it beside
the model, where LitServe's handler serves it; what ran reaches the experiment's status and its results
document. A second experiment with the same model, form, precision and batches builds nothing; a cached
form that no longer agrees with eager fp32 ends the experiment as FormDisagrees with both errors."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy
import onnx
import pytest
from onnx import numpy_helper

from clusterenv import manifests
from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.kubelet import LocalKubelet
from clusterenv.monitoring import DcgmExporter, Prometheus
from clusterenv.operatorproc import Operator
from servinglab.k8s.follow import experiment_of
from servinglab.models import digests

pytestmark = [pytest.mark.k8s]


def onnx_experiment(name: str, prometheus_url: str) -> dict[str, Any]:
    document = experiment(name, prometheus_url, kind="litserve", form="onnxruntime")
    document["spec"]["load"] = {"concurrency": [2], "warmupSeconds": 1, "durationSeconds": 2}
    return document


def test_an_onnx_form_is_built_once_in_the_pod_served_reported_and_a_changed_one_disagrees(
    cluster: Cluster, namespace: str, crd: None, tmp_path: Path, kubelet_factory: Callable[..., LocalKubelet],
    monitoring: tuple[DcgmExporter, Prometheus],
) -> None:  # fmt: skip
    _, prometheus = monitoring
    kubelet = kubelet_factory()
    cluster.kubectl.apply(*manifests.bound_claim(namespace, "model-cache"))
    operator = Operator(cluster, namespace, tmp_path / "operator", {"SERVINGLAB_MODEL_CACHE_CLAIM": "model-cache"})
    operator.start()
    bodies, seconds = {}, {}
    try:
        for name in ("onnx", "onnx-again"):
            begun = time.monotonic()
            cluster.kubectl.apply(onnx_experiment(name, prometheus.url), namespace=namespace)
            bodies[name] = wait_finished(cluster, namespace, name, operator.log, timeout=420)
            seconds[name] = time.monotonic() - begun
            status = bodies[name]["status"]
            assert condition(bodies[name], "Succeeded")["status"] == "True", (status, kubelet.errors)
        forms = kubelet.claims_root / "model-cache" / "forms"
        (entry,) = [path for path in forms.iterdir() if path.is_dir() and not path.name.startswith(".")]
        # the cached form changed (and signed again, as only a holder of the cache's key could): it no
        # longer agrees with eager fp32, and the gate that runs on every use says so before LitServe starts
        built = entry / "servinglab-form.onnx"
        graph = onnx.load(str(built))
        for initializer in graph.graph.initializer:
            values = numpy_helper.to_array(initializer)
            if values.dtype == numpy.float32:
                initializer.CopyFrom(numpy_helper.from_array(values * 1.5 + 0.25, initializer.name))
        onnx.save(graph, str(built))
        secret = cluster.kubectl.get("secret", "servinglab-model-cache-key", "-n", namespace)
        key = base64.b64decode(secret["data"]["key"])
        digests.write_manifest(entry, entry.with_name(f"{entry.name}.manifest.json"), key, cacheKey=entry.name)
        cluster.kubectl.apply(onnx_experiment("onnx-changed", prometheus.url), namespace=namespace)
        changed = wait_finished(cluster, namespace, "onnx-changed", operator.log, timeout=300)
    finally:
        operator.stop()
    for body in bodies.values():
        (level,) = body["status"]["results"]
        assert level["errors"] == 0 and level["requests"] > 0
    first, again = (bodies[name]["status"]["form"] for name in ("onnx", "onnx-again"))
    assert (first["form"], first["backend"], first["provider"]) == ("onnxruntime", "onnxruntime",
                                                                    "CPUExecutionProvider")  # fmt: skip
    assert first["batchSizes"] == [1, 2, 4] and first["gate"]["passed"] and first["gate"]["maxRelError"] <= 1e-3
    assert first["cached"] is False and first["buildSeconds"] > 0
    assert again["cached"] is True and again["buildSeconds"] == 0 and again["cacheKey"] == first["cacheKey"]
    assert first["cacheKey"] == entry.name
    # the results document (`servinglab results`) says what ran
    results = experiment_of(bodies["onnx"]).results
    assert results.runtime is not None and results.runtime.form is not None
    assert (results.runtime.mode, results.runtime.form.backend) == ("cluster", "onnxruntime")
    failed = condition(changed, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "FormDisagrees", failed
    assert "largest absolute error" in failed["message"] and "largest relative error" in failed["message"]
    assert not changed["status"].get("results")
    print(f"apply -> Succeeded with the ONNX form: built {seconds['onnx']:.1f} s, cached {seconds['onnx-again']:.1f} s")
