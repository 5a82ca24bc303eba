"""A user's own model laid out for each server from one declaration (each server's `capabilities`): a
TorchScript file or exported program goes beside its declared input with servinglab's handler files, where
that server's entry point loads it with the handler's own `load()`; a format a server does not serve (an
archive with its own handler, outside TorchServe) is refused with its reason before anything is laid out.
Fake zips stand in for the models: recognising one reads its member names, and nothing here loads it."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from servinglab import servers
from servinglab.api import ExperimentSpec, ModelFormat, ModelRef, Precision
from servinglab.servers.base import ModelError, PodInputs


def torchscript_like(path: Path) -> Path:
    """A zip with the members that make a file TorchScript by content."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("classifier/code/__torch__.py", "")
        archive.writestr("classifier/constants.pkl", b"")
    return path


def mar_like(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"handler": "mine.py"}}))
    return path


def model_ref(path: Path, model_input: dict[str, object] | None = None) -> ModelRef:
    return ModelRef.model_validate({"name": "mine", "source": {"path": str(path)},
                                    "input": model_input or {"kind": "image", "size": 32}})  # fmt: skip


def test_every_server_declares_the_user_model_formats_it_serves() -> None:
    packed = {ModelFormat.TORCHSCRIPT, ModelFormat.EXPORTED, ModelFormat.ONNX}
    assert set(servers.get("litserve").capabilities.user_model_formats) == packed
    assert set(servers.get("triton").capabilities.user_model_formats) == packed
    assert set(servers.get("torchserve").capabilities.user_model_formats) == {
        *packed, ModelFormat.MAR, ModelFormat.DIRECTORY,
    }  # fmt: skip


def test_litserve_lays_a_torchscript_file_out_for_its_litapi(tmp_path: Path) -> None:
    model = model_ref(torchscript_like(tmp_path / "classifier.pt"))
    into = tmp_path / "store" / "mine"
    described = servers.get("litserve").prepare_user_model(model, Precision.BF16, into, None, None, False)
    assert described.format == "torchscript" and described.source == str(tmp_path / "classifier.pt")
    assert json.loads((into / "servinglab-serve.json").read_text()) == {"serializedFile": "model.pt"}
    assert json.loads((into / "servinglab-input.json").read_text()) == {
        "format": "torchscript", "kind": "image", "size": 32, "shape": [], "dtype": "float32",
    }  # fmt: skip
    names = {path.name for path in into.iterdir()}
    assert {"model.pt", "servinglab_litserve_api.py", "servinglab_image_handler.py", "servinglab_imaging.py",
            "servinglab-model.json"} <= names  # fmt: skip
    assert not list((tmp_path / "store").glob(".scratch-*")), "the work folder is gone"


def test_triton_lays_a_torchscript_file_out_as_a_repository_entry_answering_json(tmp_path: Path) -> None:
    model = model_ref(torchscript_like(tmp_path / "regressor.pt"), {"kind": "tensor", "shape": [16]})
    into = tmp_path / "repository" / "mine"
    described = servers.get("triton").prepare_user_model(model, Precision.FP32, into, None, None, False)
    assert described.format == "torchscript"
    assert (into / "1" / "model.py").read_text().startswith('"""Triton\'s Python backend entry point')
    assert {"servinglab_image_handler.py", "servinglab_imaging.py", "servinglab_datapath.py"} <= {
        path.name for path in (into / "1").iterdir()
    }
    build = into / "1" / "build"
    assert (build / "model.pt").is_file() and json.loads((build / "servinglab-model.json").read_text())[
        "name"
    ] == "mine"
    assert json.loads((build / "servinglab-input.json").read_text())["shape"] == [16]
    spec = ExperimentSpec.model_validate({"model": model.model_dump(by_alias=True, exclude_none=True),
                                          "server": {"kind": "triton", "gpus": 0}})  # fmt: skip
    inputs = PodInputs(config_map="cm", servinglab_image="servinglab/servinglab:0.1.0")
    pbtxt = servers.get("triton").pod(spec, inputs).config_files["config.pbtxt"]
    assert 'name: "ANSWER", data_type: TYPE_STRING' in pbtxt and "CLASSES" not in pbtxt
    (probe,) = [c for c in servers.get("triton").pod(spec, inputs).init_containers if c["name"] == "probe"]
    assert probe["command"][-1] == "/models/mine/1/build", "the probe counts the model where it lies"


@pytest.mark.parametrize("kind", ["litserve", "triton"])
def test_an_archive_with_its_own_handler_is_refused_outside_torchserve(kind: str, tmp_path: Path) -> None:
    source = mar_like(tmp_path / "mine.mar")
    spec = ExperimentSpec.model_validate(
        {"model": {"name": "mine", "source": {"path": str(source)}}, "server": {"kind": kind}}
    )
    work = tmp_path / "work"
    with pytest.raises(ModelError) as raised:
        servers.get(kind).prepare_model(spec, work)
    message = str(raised.value)
    assert raised.value.reason == "ModelNotSupported"
    assert str(source) in message and "not serve a mar model" in message and "torchscript or exported" in message
    assert not [path for path in work.rglob("*") if path.is_file()], "nothing is left laid out"
