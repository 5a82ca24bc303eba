"""Users' own models on LitServe and Triton, as on TorchServe: `servinglab run` with a TorchScript image
classifier, an exported (.pt2) tensor regressor and an ONNX image classifier (run in ONNX Runtime), each
served with servinglab's handler (the same load, precision conversion and inference code), its results'
modelInfo counted; and each server's answers
equal to the model run in-process on the same input."""

from __future__ import annotations

import io
import json
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_user_models import experiment, run  # the TorchServe tests' experiment and `servinglab run`

from servinglab import servers
from servinglab.api import ExperimentSpec
from support.serving import ready_server
from usermodels import UserModels, make_user_models

KINDS = ["litserve", pytest.param("triton", marks=pytest.mark.triton)]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def user_models(tmp_path_factory: pytest.TempPathFactory) -> UserModels:
    return make_user_models(tmp_path_factory.mktemp("user-models"))


def on(kind: str, document: dict[str, Any]) -> dict[str, Any]:
    document["spec"]["server"]["kind"] = kind
    return document


def answer_of(kind: str, status: int, answer: Any) -> Any:
    """The handler's JSON answer: the body itself, or (Triton) the element of its ANSWER output."""
    assert status == 200, answer
    if kind != "triton":
        return answer
    (output,) = answer["outputs"]
    assert output["name"] == "ANSWER" and output["datatype"] == "BYTES"
    return json.loads(output["data"][0])


@pytest.mark.parametrize("kind", KINDS)
def test_a_users_torchscript_and_exported_models_run_end_to_end(
    kind: str, request: pytest.FixtureRequest, servinglab_cmd: list[str], user_models: UserModels, tmp_path: Path,
    no_leftover_servers: float,
) -> None:  # fmt: skip
    if kind == "triton":
        request.getfixturevalue("triton_env")
    script = user_models.torchscript_classifier
    image = {"name": "classifier", "source": {"path": str(script), "sha256": user_models.sha256(script)},
             "input": {"kind": "image", "size": 32}}  # fmt: skip
    payload = {"format": "png", "check": {"json": True}}
    ran, results = run(servinglab_cmd, on(kind, experiment("ts", image, "bf16", payload, ceiling=True)), tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert results is not None
    info = results["modelInfo"]
    assert (
        info["source"] == str(script)
        and info["format"] == "torchscript"
        and info["sha256"] == user_models.sha256(script)
    )
    assert info["parameters"] == 3 * 8 * 9 + 8 + 8 * 10 + 10 and info["flopsPerInference"] == 2 * (
        8 * 16 * 16 * 27 + 80
    )
    assert "bf16" in results["runtime"]["precisionNote"]
    level = results["results"][0]
    assert level["requests"] > 0 and level["errors"] == 0
    # the model alone, found where this server keeps it (Triton: the repository entry's 1/build/)
    assert results["ceiling"]["rawAtFormedBatchRps"] > 0 and results["ceiling"]["servedOverRaw"] > 0

    (tmp_path / "requests.jsonl").write_text("\n".join(json.dumps({"body": [i / 16] * 16}) for i in range(5)) + "\n")
    tensor = {"name": "regressor", "source": {"path": str(user_models.exported_regressor)},
              "input": {"kind": "tensor", "shape": [16]}}  # fmt: skip
    payload = {"records": "requests.jsonl", "check": {"json": True}}
    ran, results = run(servinglab_cmd, on(kind, experiment("pt2", tensor, "fp16", payload)), tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert results is not None
    assert results["modelInfo"]["format"] == "exported"
    assert results["modelInfo"]["parameters"] == 16 * 32 + 32 + 32 * 4 + 4
    assert "fp16" in results["runtime"]["precisionNote"]
    level = results["results"][0]
    assert level["requests"] > 0 and level["errors"] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_users_onnx_model_runs_end_to_end(
    kind: str, request: pytest.FixtureRequest, servinglab_cmd: list[str], user_models: UserModels, tmp_path: Path,
    no_leftover_servers: float,
) -> None:  # fmt: skip
    if kind == "triton":
        request.getfixturevalue("triton_env")
    image = {"name": "classifier", "source": {"path": str(user_models.onnx_classifier)},
             "input": {"kind": "image", "size": 32}}  # fmt: skip
    payload = {"format": "png", "check": {"json": True}}
    ran, results = run(servinglab_cmd, on(kind, experiment("onnx", image, "fp32", payload, ceiling=True)), tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert results is not None
    info = results["modelInfo"]
    assert info["format"] == "onnx" and info["flopsPerInference"] == 2 * (8 * 16 * 16 * 27 + 80)
    assert "ONNX Runtime" in results["runtime"]["precisionNote"]
    level = results["results"][0]
    assert level["requests"] > 0 and level["errors"] == 0
    assert results["ceiling"]["rawAtFormedBatchRps"] > 0, "measured alone where this server keeps it"


@pytest.mark.parametrize("kind", KINDS)
def test_a_users_models_answer_as_they_do_in_process(
    kind: str, request: pytest.FixtureRequest, user_models: UserModels, tmp_path: Path, no_leftover_servers: float
) -> None:
    if kind == "triton":
        request.getfixturevalue("triton_env")
    pixels = np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    npy = io.BytesIO()
    np.save(npy, pixels)
    sample = [round(0.1 * i - 0.5, 3) for i in range(16)]
    cases = [
        ("classifier", user_models.torchscript_classifier, {"kind": "image", "size": 32}, npy.getvalue(),
         "application/octet-stream"),
        ("regressor", user_models.exported_regressor, {"kind": "tensor", "shape": [16]}, json.dumps(sample).encode(),
         "application/json"),
    ]  # fmt: skip
    answers: dict[str, Any] = {}
    for name, path, declared, body, content_type in cases:
        spec = ExperimentSpec.model_validate({
            "model": {"name": name, "source": {"path": str(path)}, "input": declared},
            "server": {"kind": kind, "gpus": 0, "warmupSeconds": 1, "startupTimeoutSeconds": 120},
        })  # fmt: skip
        server = servers.get(kind)
        work = tmp_path / name
        served = server.prepare_model(spec, work)
        make = partial(server.local, name, served.directory, spec, work, False)
        with ready_server(make, 180) as (local, _):
            answers[name] = answer_of(kind, *local.predict(body, content_type, 60.0))

    classifier = torch.jit.load(str(user_models.torchscript_classifier)).eval()
    batch = torch.from_numpy(pixels).permute(2, 0, 1).float().div(255.0).unsqueeze(0)
    batch = (batch - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    with torch.inference_mode():
        probabilities = torch.softmax(classifier(batch), dim=1)[0]
        with warnings.catch_warnings():  # torch.export.load's own FutureWarning about torch.load
            warnings.simplefilter("ignore", FutureWarning)
            regressor = torch.export.load(str(user_models.exported_regressor)).module()
        expected = regressor(torch.tensor([sample]))[0]
    top = torch.topk(probabilities, 5)
    predictions = answers["classifier"]["predictions"]
    assert [p["class"] for p in predictions] == top.indices.tolist()
    assert [p["probability"] for p in predictions] == pytest.approx(top.values.tolist(), abs=1e-4)
    row = answers["regressor"]
    assert row["shape"] == [4] and row["values"] == pytest.approx(expected.tolist(), abs=1e-4)
