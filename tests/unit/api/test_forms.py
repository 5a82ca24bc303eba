"""`server.form` in specs: GPU-only forms refused with `gpus: 0` and contradictory settings refused when the
spec is read, naming the fields; the refusals of this machine (no GPU, a library not installed, a user's
model that cannot take the form); what every server's handler is told."""

from __future__ import annotations

from typing import Any

import pytest

from servinglab.api import ServerSpec, SpecError, parse_experiment
from servinglab.models import forms
from servinglab.servers.handler import handler_settings
from servinglab.servers.triton.config import render_config
from support import manifests


def experiment(server: dict[str, Any]) -> dict[str, Any]:
    return manifests.experiment("forms", server=server)


def refused(server: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as caught:
        parse_experiment(experiment(server))
    return str(caught.value)


def test_tensorrt_without_a_gpu_is_refused_naming_the_field() -> None:
    assert "spec.server.form: tensorrt needs a GPU (TensorRT runs on NVIDIA GPUs only), and gpus is 0" in refused(
        {"gpus": 0, "form": "tensorrt"}
    )
    assert parse_experiment(experiment({"gpus": 1, "form": "tensorrt"})).spec.server.form == "tensorrt"


@pytest.mark.parametrize("form", ["eager", "torchscript", "onnxruntime"])
def test_a_form_and_dataPath_compile_that_contradict_are_refused_naming_both(form: str) -> None:
    message = refused({"gpus": 0, "form": form, "dataPath": {"compile": "default"}})
    assert f"spec.server.form: {form} and spec.server.dataPath.compile: default contradict" in message


def test_compile_takes_dataPath_compiles_mode_and_default_when_unset() -> None:
    assert ServerSpec(gpus=0, form="compile").compile_mode() == "default"
    mode = {"compile": "max-autotune-no-cudagraphs"}
    assert ServerSpec.model_validate({"gpus": 0, "form": "compile", "dataPath": mode}).compile_mode() == mode["compile"]
    # CUDA graphs are the GPU's: refused with gpus 0 whichever field asks for them
    assert "dataPath.compile: reduce-overhead (CUDA graphs) needs a GPU" in refused(
        {"gpus": 0, "form": "compile", "dataPath": {"compile": "reduce-overhead"}}
    )


def test_onnxruntime_at_half_precision_is_refused_naming_both_fields() -> None:
    message = refused({"gpus": 0, "form": "onnxruntime", "precision": "fp16"})
    assert "spec.server.form: onnxruntime runs the exported model at fp32" in message
    assert "spec.server.precision: fp16" in message


def test_this_machines_refusals_name_the_field() -> None:
    tensorrt = ServerSpec(gpus=1, form="tensorrt")
    assert forms.refusal(tensorrt, gpus_visible=0) == (
        "spec.server.form: tensorrt needs a GPU, and none is visible on this machine"
    )
    missing = forms.refusal(tensorrt, gpus_visible=1)  # torch_tensorrt is not installed here
    assert missing is not None and "spec.server.form: tensorrt needs the Python package torch_tensorrt" in missing
    onnx_only = forms.refusal(ServerSpec(gpus=0, form="torchscript"), 0, packed_format="onnx")
    assert onnx_only == "spec.server.form: torchscript cannot be built from a onnx model (it can take: onnxruntime)"
    assert forms.refusal(ServerSpec(gpus=0, form="onnxruntime"), 0, packed_format="onnx") is None
    for form in ("eager", "torchscript", "compile", "onnxruntime"):
        assert forms.refusal(ServerSpec(gpus=0, form=form), 0) is None, form


def test_every_server_tells_its_handler_the_form_and_the_compile_mode() -> None:
    settings = handler_settings(ServerSpec(gpus=0, form="compile"))
    assert settings["form"] == "compile"
    assert settings["dataPath"] == {**handler_settings(ServerSpec(gpus=0))["dataPath"], "compile": "default"}  # type: ignore[dict-item]
    assert "form" not in handler_settings(ServerSpec(gpus=0)), "unset: the model as it comes, as before"
    config = render_config("tiny", ServerSpec(kind="triton", gpus=0, form="onnxruntime"), 0)
    assert 'key: "form", value: { string_value: "onnxruntime" }' in config
