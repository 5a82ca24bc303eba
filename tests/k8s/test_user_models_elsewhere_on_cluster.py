"""Users' own models on LitServe and Triton on the control plane, as on TorchServe
(tests/k8s/test_user_models_on_cluster.py): the server pod's `model` init container fetches the model (from
a URL, checked against its sha256, or from a claim) and lays it out for the server kind, the `probe` init
container counts it, the server serves it with servinglab's handler (ONNX models in ONNX Runtime) and the
load Job measures it. Every format on every server in two runs of concurrent pods: TorchScript and ONNX on
LitServe and Triton at once, then a sweep whose kind axis covers the three servers over an exported (.pt2)
model, each server's best named in `bestPerKind`. On the CPU node, tiny loads: the shared machine has 2 cores.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from clusterenv import manifests
from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, sweep, wait_finished
from clusterenv.kubelet import LocalKubelet
from clusterenv.operatorproc import Operator
from servinglab.servers.triton.env import TritonEnv
from usermodels import UserModels, file_server, make_user_models

pytestmark = [pytest.mark.k8s, pytest.mark.torchserve, pytest.mark.triton]

ON_CPU = {"gpus": 0, "nodeSelector": {}, "tolerations": [], "batchSize": 2, "maxBatchDelayMs": 5}
TINY_LOAD = {"concurrency": [2], "warmupSeconds": 0.5, "durationSeconds": 2}
#: The CNN both image classifiers hold (tests/usermodels.py): its parameters and FLOPs, as the probe counts them
CNN_PARAMETERS = 3 * 8 * 9 + 8 + 8 * 10 + 10
CNN_FLOPS = 2 * (8 * 16 * 16 * 27 + 80)


@pytest.fixture(scope="module")
def user_models(tmp_path_factory: pytest.TempPathFactory) -> UserModels:
    return make_user_models(tmp_path_factory.mktemp("user-models"))


def user_model_experiment(name: str, kind: str, model: dict[str, Any]) -> dict[str, Any]:
    document = experiment(name, kind=kind, **ON_CPU)
    document["spec"]["model"] = model
    document["spec"]["load"] = TINY_LOAD | {"payload": {"format": "png", "check": {"json": True}}}
    return document


def server_containers(kubelet: LocalKubelet) -> dict[str, str]:
    """Each server pod's experiment and the name of the container it ran (the server kind's own)."""
    return {
        pod.labels["servinglab.dev/experiment"]: pod.container["name"]
        for pod in kubelet.pods.values()
        if pod.labels.get("app.kubernetes.io/component") == "server"
    }


def test_torchscript_and_onnx_models_on_litserve_and_triton_from_a_claim_and_a_url(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet],
    user_models: UserModels, triton_env: TritonEnv,
) -> None:  # fmt: skip
    kubelet = kubelet_factory()
    cluster.kubectl.apply(*manifests.bound_claim(namespace, "models", "ReadOnlyMany"))
    models = kubelet.claims_root / "models" / "v1"
    models.mkdir(parents=True)
    (models / "classifier.pt").write_bytes(user_models.torchscript_classifier.read_bytes())
    onnx, script = user_models.onnx_classifier, user_models.torchscript_classifier
    image = {"kind": "image", "size": 32}
    with file_server(user_models.folder) as files:
        sources = {
            "torchscript": {"pvc": {"claimName": "models", "path": "v1/classifier.pt"},
                            "sha256": user_models.sha256(script)},
            "onnx": {"url": f"{files.url}/{onnx.name}", "sha256": user_models.sha256(onnx)},
        }  # fmt: skip
        runs = {f"{kind}-{form}": (kind, form) for kind in ("litserve", "triton") for form in sources}
        for name, (kind, form) in runs.items():  # all four at once: their pods start side by side
            model = {"name": "classifier", "input": image, "source": sources[form]}
            cluster.kubectl.apply(user_model_experiment(name, kind, model), namespace=namespace)
        bodies = {name: wait_finished(cluster, namespace, name, operator.log, timeout=600) for name in runs}
    for name, body in bodies.items():
        status = body["status"]
        assert condition(body, "Succeeded")["status"] == "True", (name, status["conditions"], kubelet.errors)
        kind, form = runs[name]
        described = status["model"]
        assert described["format"] == form, (name, described)
        assert described["sha256"] == sources[form]["sha256"]
        # counted by the probe init container in the folder the server kind serves it from
        assert (described["parameters"], described["flopsPerInference"]) == (CNN_PARAMETERS, CNN_FLOPS), name
        (level,) = status["results"]
        assert level["requests"] > 0 and level["errors"] == 0, (name, level)
    assert bodies["litserve-torchscript"]["status"]["model"]["source"] == "pvc://models/v1/classifier.pt"
    assert bodies["triton-onnx"]["status"]["model"]["source"] == f"{files.url}/{onnx.name}"
    assert server_containers(kubelet) == {name: kind for name, (kind, _) in runs.items()}
    assert sorted(files.requests) == [f"/{onnx.name}"] * 2, "each ONNX experiment's init container fetched it"


def test_a_sweep_over_the_three_servers_names_each_ones_best_for_a_users_exported_model(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet],
    user_models: UserModels, triton_env: TritonEnv,
) -> None:  # fmt: skip
    kubelet = kubelet_factory()
    records = [json.dumps({"body": {"inputs": [i / 10] * 16}}) for i in range(4)]
    cluster.kubectl.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bodies", "namespace": namespace},
         "data": {"requests.jsonl": "\n".join(records) + "\n"}}
    )  # fmt: skip
    regressor = user_models.exported_regressor
    with file_server(user_models.folder) as files:
        template = experiment("template", **ON_CPU)["spec"]
        source = {"url": f"{files.url}/{regressor.name}", "sha256": user_models.sha256(regressor)}
        template["model"] = {"name": "regressor", "input": {"kind": "tensor", "shape": [16]}, "source": source}
        payload = {"records": "requests.jsonl", "configMap": "bodies", "check": {"json": True}}
        template["load"] = TINY_LOAD | {"payload": payload}
        space = {"kind": {"values": ["torchserve", "litserve", "triton"]}, "batchSize": {"values": [2]}}
        document = sweep("own-model", template, strategy="grid", parallelism=3, confirm={"rounds": 0}, space=space)
        cluster.kubectl.apply(document, namespace=namespace)

        def finished() -> bool:
            assert operator.process is not None and operator.process.poll() is None, operator.log()[-3000:]
            body = cluster.kubectl.get("servingsweep", "own-model", "-n", namespace)
            return (body.get("status") or {}).get("summary", {}).get("state") in ("Succeeded", "Failed")

        cluster.kubectl.wait_for(finished, 600, "the sweep over the three servers")
    status = cluster.kubectl.get("servingsweep", "own-model", "-n", namespace)["status"]
    assert status["summary"]["state"] == "Succeeded", (status, kubelet.errors)
    trials = cluster.kubectl.get("sx", "-n", namespace, "-l", "servinglab.dev/sweep=own-model")["items"]
    kinds = {t["metadata"]["labels"]["servinglab.dev/server-kind"]: t for t in trials}
    assert sorted(kinds) == ["litserve", "torchserve", "triton"]
    for kind, trial in kinds.items():  # each trial served the user's model, not the template's built-in one
        assert condition(trial, "Succeeded")["status"] == "True", (kind, trial["status"]["conditions"])
        described = trial["status"]["model"]
        assert described["format"] == "exported" and described["sha256"] == user_models.sha256(regressor), kind
        assert described["parameters"] == 16 * 32 + 32 + 32 * 4 + 4, kind
        (level,) = trial["status"]["results"]
        assert level["requests"] > 0 and level["errors"] == 0, (kind, level)
    best = {entry["config"]["kind"]: entry["trial"] for entry in status["bestPerKind"]}
    assert best == {kind: trial["metadata"]["name"] for kind, trial in kinds.items()}
    assert status["best"]["trial"] in best.values()
    assert server_containers(kubelet) == {trial["metadata"]["name"]: kind for kind, trial in kinds.items()}
