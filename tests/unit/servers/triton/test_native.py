"""Triton's native backends for a model's form (servinglab.servers.triton.native): the repository entry written
for onnxruntime (from a real ONNX export's graph) and pytorch (TorchScript's INPUT__0/OUTPUT__0), checked
field by field; which backend serves: the native one only where the tritonserver has it, the requests carry
tensors and the precision is fp32, else Python with the reason; what Triton says served is read back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from servinglab.api import Precision, RequestEncoding, ServerSpec
from servinglab.api.forms import ModelForm
from servinglab.models.formbuild import export_onnx
from servinglab.servers.triton import config, native
from servinglab.servers.triton.native import BackendChoice, TensorSpec


def fields(text: str) -> list[str]:
    return text.strip().splitlines()


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    network = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10)).eval()
    path = tmp_path_factory.mktemp("onnx") / "servinglab-form.onnx"
    export_onnx(network, torch.zeros(1, 3, 8, 8), path)
    return path


def test_the_onnxruntime_entry_is_written_from_the_graph_field_by_field(onnx_file: Path, tmp_path: Path) -> None:
    inputs, outputs = native.onnx_io(onnx_file)
    # the graph's own names and types, the batch axis (dynamic) left out
    assert inputs == [TensorSpec("input", "TYPE_FP32", (3, 8, 8))]
    assert outputs == [TensorSpec("output", "TYPE_FP32", (10,))]
    server = ServerSpec(batch_size=8, max_batch_delay_ms=5, workers=3, gpus=0)
    placed = native.write_native_entry(tmp_path / "tiny", "tiny", ModelForm.ONNXRUNTIME, server, 0, onnx_file,
                                       inputs, outputs)  # fmt: skip
    assert placed == tmp_path / "tiny" / "1" / "model.onnx" and placed.read_bytes() == onnx_file.read_bytes()
    assert fields((tmp_path / "tiny" / "config.pbtxt").read_text()) == [
        'name: "tiny"',
        'platform: "onnxruntime_onnx"',
        'backend: "onnxruntime"',
        "max_batch_size: 8",
        "input [",
        '  { name: "input", data_type: TYPE_FP32, dims: [3, 8, 8] }',
        "]",
        "output [",
        '  { name: "output", data_type: TYPE_FP32, dims: [10] }',
        "]",
        "dynamic_batching { preferred_batch_size: [1, 2, 4, 8], max_queue_delay_microseconds: 5000 }",
        "instance_group [{ count: 3, kind: KIND_CPU }]",
    ]


def test_the_pytorch_entry_names_tensors_by_position_and_spreads_instances_over_the_gpus(tmp_path: Path) -> None:
    inputs, outputs = native.torchscript_io([3, 224, 224], [1000])
    server = ServerSpec(batch_size=6, max_batch_delay_ms=20, workers=3, gpus=2)
    built = tmp_path / "servinglab-form.pt"
    built.write_bytes(b"traced")
    placed = native.write_native_entry(tmp_path / "resnet", "resnet", ModelForm.TORCHSCRIPT, server, 2, built,
                                       inputs, outputs)  # fmt: skip
    assert placed.relative_to(tmp_path) == Path("resnet/1/model.pt")
    assert fields((tmp_path / "resnet" / "config.pbtxt").read_text()) == [
        'name: "resnet"',
        'platform: "pytorch_libtorch"',
        'backend: "pytorch"',
        "max_batch_size: 6",
        "input [",
        '  { name: "INPUT__0", data_type: TYPE_FP32, dims: [3, 224, 224] }',
        "]",
        "output [",
        '  { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [1000] }',
        "]",
        "dynamic_batching { preferred_batch_size: [1, 2, 4, 6], max_queue_delay_microseconds: 20000 }",
        "instance_group [{ count: 2, kind: KIND_GPU, gpus: [0] }, { count: 1, kind: KIND_GPU, gpus: [1] }]",
    ]
    # an output whose shape is not known: one varying dim; a TensorRT plan is model.plan
    assert native.torchscript_io([16])[1] == [TensorSpec("OUTPUT__0", "TYPE_FP32", (-1,))]
    assert native.NATIVE[ModelForm.TENSORRT] == native.NativeBackend("tensorrt", "tensorrt_plan", "model.plan")


def test_the_backends_a_tritonserver_has_are_the_folders_in_its_backends(tmp_path: Path) -> None:
    (tmp_path / "python").mkdir()
    (tmp_path / "onnxruntime").mkdir()
    (tmp_path / "README").write_text("not a backend")
    assert native.present_backends(tmp_path) == {"python", "onnxruntime"}
    assert native.present_backends(tmp_path / "missing") == frozenset()
    assert native.image_backends(None) == {"python"}  # servinglab's Triton image: PyTriton's tritonserver
    assert native.image_backends("nvcr.io/nvidia/tritonserver:24.10-py3") >= {"onnxruntime", "pytorch", "tensorrt"}


def test_a_native_backend_serves_only_where_present_with_tensor_requests_at_fp32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    binary, fp32 = RequestEncoding.KSERVE_V2_BINARY, Precision.FP32
    everything = native.OFFICIAL_IMAGE_BACKENDS
    assert native.choose_backend(ModelForm.ONNXRUNTIME, fp32, frozenset({"python"}), binary) == BackendChoice(
        "python", "this tritonserver has no onnxruntime backend"
    )
    # the bodies servinglab sends Triton are encoded images (BYTES) its Python model decodes: Python serves
    choice = native.choose_backend(ModelForm.TORCHSCRIPT, fp32, everything, binary)
    assert choice.backend == "python" and choice.reason is not None and "pytorch takes tensors" in choice.reason
    assert native.choose_backend(ModelForm.COMPILE, fp32, everything, binary).backend == "python"
    assert native.choose_backend(None, fp32, everything, binary).backend == "python"
    # were there an encoding that carries the input tensor, the native backend would serve, at fp32 only
    monkeypatch.setattr(native, "TENSOR_ENCODINGS", frozenset({binary}))
    assert native.choose_backend(ModelForm.ONNXRUNTIME, fp32, everything, binary) == BackendChoice("onnxruntime")
    assert native.choose_backend(ModelForm.TORCHSCRIPT, fp32, everything, binary) == BackendChoice("pytorch")
    assert native.choose_backend(ModelForm.ONNXRUNTIME, Precision.FP16, everything, binary).backend == "python"


def test_the_backend_triton_says_served_is_read_back() -> None:
    groups = [{"count": 1, "kind": "KIND_CPU"}]
    applied = config.read_applied(
        {
            "name": "tiny",
            "backend": "onnxruntime",
            "platform": "onnxruntime_onnx",
            "max_batch_size": 4,
            "instance_group": groups,
        }
    )
    assert applied.backend == "onnxruntime" and applied.effective(1).backend == "onnxruntime"
    assert config.expected(ServerSpec(gpus=0), 0).backend == "python"
