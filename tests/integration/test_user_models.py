"""Users' own models and request bodies, end to end with a real TorchServe: `servinglab run` with a
TorchScript file, an exported program, an ONNX model and a .mar of its own, fetched over HTTP (with credentials: over
HTTPS, from a CA made for the test) or read from a path; the user's files and JSON-lines records as
bodies; and every kind of bad source failing with its own reason before a server is left running."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from servinglab.api import PayloadFormat
from servinglab.loadgen.payloads import make_payloads
from support import manifests
from usermodels import OnnxRefusals, UserModels, file_server, make_local_ca, make_onnx_refusals, make_user_models

pytestmark = pytest.mark.torchserve


@pytest.fixture(scope="module")
def user_models(tmp_path_factory: pytest.TempPathFactory) -> UserModels:
    return make_user_models(tmp_path_factory.mktemp("user-models"))


@pytest.fixture(scope="module")
def onnx_refusals(tmp_path_factory: pytest.TempPathFactory) -> OnnxRefusals:
    return make_onnx_refusals(tmp_path_factory.mktemp("onnx-refused"))


@pytest.fixture()
def model_cache(tmp_path: Path) -> Iterator[Path]:
    """A private model cache, so every test starts cold and can look inside."""
    cache = tmp_path / "model-cache"
    before = os.environ.get("SERVINGLAB_MODEL_CACHE")
    os.environ["SERVINGLAB_MODEL_CACHE"] = str(cache)
    yield cache
    if before is None:
        os.environ.pop("SERVINGLAB_MODEL_CACHE")
    else:
        os.environ["SERVINGLAB_MODEL_CACHE"] = before


#: The experiments' start-up timeout: a bad model is told before it runs out (its reason says so too).
STARTUP_TIMEOUT_SECONDS = 120


def experiment(name: str, model: dict[str, Any], precision: str = "fp32", payload: dict[str, Any] | None = None,
               levels: tuple[int, ...] = (2,), ceiling: bool = False) -> dict[str, Any]:  # fmt: skip
    return manifests.experiment(
        name,
        model=model,
        server={"gpus": 0, "batchSize": 4, "maxBatchDelayMs": 5, "precision": precision, "warmupSeconds": 5,
                "startupTimeoutSeconds": STARTUP_TIMEOUT_SECONDS},
        load={"concurrency": list(levels), "warmupSeconds": 1, "durationSeconds": 2,
              "payload": payload or {"format": "png"}},
        ceiling={"enabled": ceiling, "rawSeconds": 1},
    )  # fmt: skip


Outcome = tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]


def run(servinglab_cmd: list[str], document: dict[str, Any], folder: Path) -> Outcome:
    spec_file, output = folder / f"{document['metadata']['name']}.yaml", folder / "results.json"
    output.unlink(missing_ok=True)
    spec_file.write_text(yaml.safe_dump(document))
    completed = subprocess.run([*servinglab_cmd, "run", str(spec_file), "--output", str(output)], cwd=folder,
                               capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    return completed, (json.loads(output.read_text()) if output.exists() else None)


def test_torchscript_from_a_url_at_bf16_with_the_users_image_files(
    servinglab_cmd: list[str], user_models: UserModels, model_cache: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    model_file = user_models.torchscript_classifier
    for index, body in enumerate(make_payloads(PayloadFormat.PNG, 48, 3, seed=4)):
        (tmp_path / f"photo-{index}.png").write_bytes(body)  # 48 px: the handler resizes to the declared 32
    digest = user_models.sha256(model_file)
    with file_server(user_models.folder) as files:
        model = {"name": "classifier", "source": {"url": f"{files.url}/{model_file.name}", "sha256": digest},
                 "input": {"kind": "image", "size": 32}}  # fmt: skip
        payload = {"files": [f"photo-{i}.png" for i in range(3)], "check": {"json": True}}
        completed, results = run(servinglab_cmd, experiment("ts", model, "bf16", payload, ceiling=True), tmp_path)
        assert completed.returncode == 0, completed.stderr[-3000:]
        again, second = run(servinglab_cmd, experiment("ts", model, "bf16", payload), tmp_path)
        assert again.returncode == 0, again.stderr[-3000:]
    assert results is not None and second is not None
    info = results["modelInfo"]
    assert info["source"] == f"{files.url}/{model_file.name}" and info["format"] == "torchscript"
    assert info["sha256"] == digest and info["sizeBytes"] == model_file.stat().st_size
    assert info["parameters"] == 3 * 8 * 9 + 8 + 8 * 10 + 10  # conv weights + bias, linear weights + bias
    assert info["flopsPerInference"] == 2 * (8 * 16 * 16 * 27 + 80)  # conv at 16x16 out, then the head
    assert info["weightBytes"] == 4 * info["parameters"] and info["activationBytes"] >= 2 * 4 * 8 * 16 * 16  # roofline
    assert info["downloaded"] is True and second["modelInfo"]["downloaded"] is False
    assert files.requests == [f"/{model_file.name}"], "the second run must come from the cache by digest"
    assert "bf16" in results["runtime"]["precisionNote"]
    level = results["results"][0]
    assert level["requests"] > 0 and level["errors"] == 0
    # the model alone, loaded and converted as served: the ceiling works for the user's model too
    ceiling = results["ceiling"]
    assert ceiling["flopsPerInference"] == info["flopsPerInference"]
    assert ceiling["rawAtFormedBatchRps"] > 0 and ceiling["servedOverRaw"] > 0


def test_exported_program_with_json_lines_records_and_a_response_check(
    servinglab_cmd: list[str], user_models: UserModels, model_cache: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    (tmp_path / "sample.json").write_text(json.dumps({"inputs": [0.25] * 16}))
    records = [{"body": [i / 16] * 16} for i in range(5)]
    records.append({"bodyFile": "sample.json", "contentType": "application/json"})
    (tmp_path / "requests.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    model = {"name": "regressor", "source": {"path": str(user_models.exported_regressor)},
             "input": {"kind": "tensor", "shape": [16]}}  # fmt: skip
    payload = {"records": "requests.jsonl", "check": {"json": True}}
    completed, results = run(servinglab_cmd, experiment("pt2", model, "fp16", payload, ceiling=True), tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert results is not None
    assert results["modelInfo"]["format"] == "exported"
    assert results["modelInfo"]["parameters"] == 16 * 32 + 32 + 32 * 4 + 4
    assert "fp16" in results["runtime"]["precisionNote"]
    level = results["results"][0]
    assert level["requests"] > 0 and level["errors"] == 0
    assert results["ceiling"]["rawAtFormedBatchRps"] > 0, "a tensor input is measured alone as well"


def test_an_onnx_model_served_in_onnx_runtime_through_the_handler(
    servinglab_cmd: list[str], user_models: UserModels, model_cache: Path, tmp_path: Path, no_leftover_servers: float
) -> None:
    model = {"name": "classifier", "source": {"path": str(user_models.onnx_classifier)},
             "input": {"kind": "image", "size": 32}}  # fmt: skip
    payload = {"format": "png", "check": {"json": True}}
    completed, results = run(servinglab_cmd, experiment("onnx", model, "fp32", payload, ceiling=True), tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert results is not None
    info = results["modelInfo"]
    assert info["format"] == "onnx" and info["source"] == str(user_models.onnx_classifier)
    # counted from the graph as PyTorch counts the TorchScript file of the same module
    assert info["parameters"] == 3 * 8 * 9 + 8 + 8 * 10 + 10
    assert info["flopsPerInference"] == 2 * (8 * 16 * 16 * 27 + 80)
    assert info["weightBytes"] == 4 * info["parameters"] and info["activationBytes"] > 0
    assert "ONNX Runtime" in results["runtime"]["precisionNote"]
    level = results["results"][0]
    assert level["requests"] > 0 and level["errors"] == 0
    assert results["ceiling"]["rawAtFormedBatchRps"] > 0, "the ONNX model is measured alone too"


def test_an_archive_with_its_own_handler_behind_credentials(
    servinglab_cmd: list[str], user_models: UserModels, model_cache: Path, tmp_path: Path, no_leftover_servers: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    (tmp_path / "good.json").write_text('{"text": "hello"}')
    (tmp_path / "bad.txt").write_text("plain words, answered with something that is not JSON")
    payload = {"files": ["good.json", "bad.txt"], "check": {"json": True}}
    ca = make_local_ca(tmp_path / "ca")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.ca_cert))  # `servinglab run` trusts the test's CA
    # the archive calls its model "echo" (its manifest); the experiment calls it "greeter", and TorchServe must
    # serve it under that name, the one the runner waits for and sends to
    with file_server(user_models.folder, authorization="Bearer s3cret", tls=ca) as files:
        url = f"{files.url}/{user_models.echo_mar.name}"
        monkeypatch.setenv("SERVINGLAB_MODEL_AUTHORIZATION", "Bearer s3cret")
        completed, results = run(servinglab_cmd, experiment("mar", {"name": "greeter", "source": {"url": url}},
                                                             payload=payload), tmp_path)  # fmt: skip
        refused, _ = run(servinglab_cmd, experiment("mar16", {"name": "greeter", "source": {"url": url}}, "fp16",
                                                    payload), tmp_path)  # fmt: skip
        monkeypatch.delenv("SERVINGLAB_MODEL_AUTHORIZATION")
        unauthorised, _ = run(servinglab_cmd, experiment("mar", {"name": "greeter", "source": {"url": url}},
                                                          payload=payload), tmp_path)  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert results is not None and results["modelInfo"]["handler"] == "echo_handler.py"
    level = results["results"][0]
    kinds = level["errorsByKind"]
    assert set(kinds) == {"malformed_json"} and 0 < kinds["malformed_json"] < level["requests"]
    assert refused.returncode == 2 and "PrecisionNotSupported" in refused.stderr
    assert "echo_handler.py" in refused.stderr, "the refusal names the archive's own handler"
    assert unauthorised.returncode == 2 and "ModelDownloadFailed" in unauthorised.stderr
    assert "401" in unauthorised.stderr


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("missing", "ModelDownloadFailed"),
        ("checksum", "ModelChecksumMismatch"),
        ("text", "ModelNotRecognized"),
        ("state-dict", "ModelNotRecognized"),
        ("broken-handler", "ModelLoadFailed"),
        ("onnx-external-data", "ModelNotSupported"),
        ("onnx-custom-domain", "ModelNotSupported"),
    ],
)
def test_a_bad_source_fails_with_its_reason_and_leaves_nothing_running(
    case: str, reason: str, servinglab_cmd: list[str], user_models: UserModels, onnx_refusals: OnnxRefusals,
    model_cache: Path, tmp_path: Path, no_leftover_servers: float,
) -> None:  # fmt: skip
    with file_server(user_models.folder) as files:
        source = {
            "missing": {"url": f"{files.url}/no-such-model.pt"},
            "checksum": {"url": f"{files.url}/{user_models.torchscript_classifier.name}", "sha256": "0" * 64},
            "text": {"path": str(user_models.not_a_model)},
            "state-dict": {"path": str(user_models.state_dict)},
            "broken-handler": {"url": f"{files.url}/{user_models.broken_mar.name}"},
            "onnx-external-data": {"path": str(onnx_refusals.external_data)},
            "onnx-custom-domain": {"path": str(onnx_refusals.custom_domain)},
        }[case]
        started = time.monotonic()
        completed, results = run(servinglab_cmd, experiment("bad", {"name": "bad", "source": source}), tmp_path)
    assert completed.returncode == 2 and results is None
    message = " ".join(completed.stderr.split())
    assert reason in message, message[-2000:]
    named = source.get("url") or source.get("path")
    assert reason == "ModelLoadFailed" or named in message, "the message names the source"
    assert time.monotonic() - started < STARTUP_TIMEOUT_SECONDS, "a bad model must not wait out the start-up timeout"
    assert not list((model_cache / "files").glob("*/*")) or case not in ("checksum", "missing")
