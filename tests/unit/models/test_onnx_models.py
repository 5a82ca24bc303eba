"""A user's ONNX model: recognised by its content, laid out for every server beside its declared input, refused
with a reason naming the field before any server starts when servinglab's handler cannot run it (external
data, a custom operator domain, an input it cannot feed, a fixed batch dimension, a precision ONNX Runtime
does not switch to), counted from its graph as PyTorch counts the same module, and run by the handler's own
ONNX Runtime session. Real ONNX files, exported from a small torch module or built with onnx.helper."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from servinglab import servers
from servinglab.api import ModelFormat, ModelRef, ModelSource, Precision
from servinglab.api.ceiling import DeclaredInput
from servinglab.models import counting, onnxcount
from servinglab.models import probe as modelprobe
from servinglab.models.probe import ModelCounts
from servinglab.servers import usermodel
from servinglab.servers.base import ModelError
from servinglab.servers.usermodel import Fetched, ModelSourceError
from servinglab_imaging import OnnxModel, onnx_refusal
from usermodels import OnnxRefusals, TinyCnn, export_onnx, make_onnx_refusals

CNN_PARAMETERS = 3 * 8 * 9 + 8 + 8 * 10 + 10
CNN_FLOPS = 2 * (8 * 16 * 16 * 27 + 80)  # the conv at 16x16 out, then the head (as PyTorch's counter has it)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    return export_onnx(TinyCnn().eval(), tmp_path_factory.mktemp("onnx") / "classifier.onnx")


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory) -> OnnxRefusals:
    return make_onnx_refusals(tmp_path_factory.mktemp("onnx-refused"))


def model_ref(path: Path, model_input: dict[str, object] | None = None, fmt: str = "auto") -> ModelRef:
    return ModelRef.model_validate({"name": "mine", "source": {"path": str(path), "format": fmt},
                                    "input": model_input or {"kind": "image", "size": 32}})  # fmt: skip


def prepare(model: ModelRef, into: Path, precision: Precision = Precision.FP32, batch_size: int = 4,
            kind: str = "litserve") -> object:  # fmt: skip
    return servers.get(kind).prepare_user_model(model, precision, into, None, None, False, batch_size)


def test_an_onnx_file_is_recognised_by_its_content_and_a_false_one_by_name(classifier: Path, tmp_path: Path) -> None:
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(classifier.read_bytes())
    source = ModelSource(path=str(renamed))
    assert usermodel.recognise(source, Fetched(renamed, None, 1)) is ModelFormat.ONNX
    impostor = tmp_path / "impostor.onnx"
    impostor.write_text("not a model\n")
    with pytest.raises(ModelSourceError) as refused:
        usermodel.recognise(ModelSource(path=str(impostor)), Fetched(impostor, None, 1))
    assert refused.value.reason == "ModelNotRecognized"
    assert "named .onnx, but not an ONNX ModelProto" in str(refused.value)
    with pytest.raises(ModelSourceError) as contradicted:
        usermodel.recognise(ModelSource(path=str(renamed), format="torchscript"), Fetched(renamed, None, 1))
    assert "format is torchscript, but the file is onnx" in str(contradicted.value)


@pytest.mark.parametrize("kind", ["torchserve", "litserve", "triton"])
def test_every_server_lays_an_onnx_model_out_beside_its_declared_input(
    kind: str, classifier: Path, tmp_path: Path
) -> None:
    into = tmp_path / "store" / "mine"
    described = prepare(model_ref(classifier), into, kind=kind)
    assert getattr(described, "format") == "onnx"  # noqa: B009 (the Protocol's return type is the description)
    packed = next(into.rglob("model.onnx"))
    assert packed.read_bytes() == classifier.read_bytes()
    declared = json.loads((packed.parent / "servinglab-input.json").read_text())
    assert declared["format"] == "onnx" and declared["size"] == 32


def test_external_data_is_refused_naming_the_file(refusals: OnnxRefusals, tmp_path: Path) -> None:
    with pytest.raises(ModelError) as refused:
        prepare(model_ref(refusals.external_data), tmp_path / "store" / "mine")
    message = str(refused.value)
    assert refused.value.reason == "ModelNotSupported"
    assert str(refusals.external_data) in message and "external data (weights.bin)" in message
    assert not (tmp_path / "store" / "mine").exists(), "nothing is laid out"


def test_an_operator_domain_onnx_runtime_cannot_load_is_refused_by_name(refusals: OnnxRefusals, tmp_path: Path) -> None:
    with pytest.raises(ModelError) as refused:
        prepare(model_ref(refusals.custom_domain, {"kind": "tensor", "shape": [16]}), tmp_path / "mine")
    assert refused.value.reason == "ModelNotSupported"
    assert "domain(s) com.example.custom" in str(refused.value) and str(refusals.custom_domain) in str(refused.value)


@pytest.mark.parametrize(
    ("declared", "said"),
    [
        ({"kind": "image", "size": 64}, "size 32 in dimension 2, where model.input (image 3x64x64, float32) has 64"),
        ({"kind": "tensor", "shape": [3, 32, 32], "dtype": "int64"}, "is FLOAT, and model.input"),
        ({"kind": "tensor", "shape": [3, 1024]}, "has rank 4; model.input (tensor 3x1024, float32) is fed as a batch "
         "of rank 3"),
    ],
)  # fmt: skip
def test_an_input_the_handler_cannot_feed_is_refused_naming_model_input(
    declared: dict[str, object], said: str, classifier: Path, tmp_path: Path
) -> None:
    with pytest.raises(ModelError) as refused:
        prepare(model_ref(classifier, declared), tmp_path / "mine")
    assert refused.value.reason == "ModelNotSupported" and said in str(refused.value)


def test_two_inputs_are_refused(refusals: OnnxRefusals, tmp_path: Path) -> None:
    with pytest.raises(ModelError) as refused:
        prepare(model_ref(refusals.two_inputs, {"kind": "tensor", "shape": [16]}), tmp_path / "mine")
    assert "takes 2 inputs (x, second)" in str(refused.value)


def test_a_fixed_batch_dimension_is_refused_when_the_server_batches(refusals: OnnxRefusals, tmp_path: Path) -> None:
    with pytest.raises(ModelError) as refused:
        prepare(model_ref(refusals.fixed_batch), tmp_path / "mine", batch_size=4)
    message = str(refused.value)
    assert refused.value.reason == "ModelNotSupported"
    assert "fixed batch dimension of 1, and server.batchSize is 4" in message and "dynamic batch axis" in message
    assert prepare(model_ref(refusals.fixed_batch), tmp_path / "one", batch_size=1) is not None, "batch 1 is served"


@pytest.mark.parametrize("precision", [Precision.FP16, Precision.BF16])
def test_half_precisions_are_refused_naming_the_field(precision: Precision, classifier: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError) as refused:
        prepare(model_ref(classifier), tmp_path / "mine", precision=precision)
    assert refused.value.reason == "PrecisionNotSupported" and f"server.precision {precision}" in str(refused.value)
    assert prepare(model_ref(classifier), tmp_path / "tf32", precision=Precision.TF32) is not None


def test_the_graph_counts_as_pytorch_counts_the_same_module(classifier: Path) -> None:
    counts = onnxcount.count(onnx.load_model(str(classifier)), DeclaredInput(kind="image", size=32))
    torch.manual_seed(0)
    module = TinyCnn().eval()
    sample = torch.zeros(1, 3, 32, 32)
    weights, activations = counting.bytes_moved(module, sample)
    assert counts == ModelCounts(parameters=CNN_PARAMETERS, flops_per_inference=counting.flops_of(module, sample),
                                 weight_bytes=weights, activation_bytes=activations, count_note=None)  # fmt: skip
    assert counts.flops_per_inference == CNN_FLOPS


def test_work_this_count_cannot_see_is_unknown_not_guessed() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])
    weight = helper.make_tensor("w", TensorProto.FLOAT, [16, 16], [0.0] * 256)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Einsum", ["h"], ["y"], equation="bi->bi")]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=[weight])
    counts = onnxcount.count(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                             DeclaredInput(kind="tensor", shape=[16], dtype="float32"))  # fmt: skip
    assert counts.flops_per_inference is None and counts.weight_bytes is None
    assert counts.parameters == 256 and "Einsum" in (counts.count_note or "")


def test_the_probe_runs_it_once_and_counts_it(classifier: Path, tmp_path: Path) -> None:
    into = tmp_path / "mine"
    prepare(model_ref(classifier), into)
    counts = modelprobe.count(into)
    assert counts["parameters"] == CNN_PARAMETERS and counts["flopsPerInference"] == CNN_FLOPS, counts


def test_the_handler_runs_it_in_onnx_runtime_as_torch_runs_the_module(classifier: Path, refusals: OnnxRefusals) -> None:
    torch.manual_seed(0)
    module = TinyCnn().eval()
    model = OnnxModel(str(classifier), torch.device("cpu"))
    batch = torch.from_numpy(np.random.default_rng(1).standard_normal((3, 3, 32, 32)).astype(np.float32))
    with torch.inference_mode():
        assert torch.allclose(model(batch), module(batch), atol=1e-5)
    assert model.provider == "CPUExecutionProvider" and f"{torch.get_num_threads()} threads" in model.note
    # its threads sleep between runs: spinning, they took the cores from the server's decoding and HTTP (a small
    # model served at 0.6x its TorchScript form on 2 cores; docs/benchmarks.md section 17)
    options = model.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert "server.precision" in str(onnx_refusal(model, torch.float16, "none", 4))
    assert "server.dataPath.compile default" in str(onnx_refusal(model, torch.float32, "default", 4))
    assert onnx_refusal(model, torch.float32, "none", 64) is None
    fixed = OnnxModel(str(refusals.fixed_batch), torch.device("cpu"))
    assert "server.batchSize 4" in str(onnx_refusal(fixed, torch.float32, "none", 4))
    assert onnx_refusal(fixed, torch.float32, "none", 1) is None


def _external(name: str) -> TensorProto:
    """A 16-float tensor whose data is said to live in weights.bin beside the model."""
    tensor = helper.make_tensor(name, TensorProto.FLOAT, [16], [0.0] * 16)
    del tensor.float_data[:]
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="weights.bin")
    return tensor


def _with_functions(path: Path, nodes: list[onnx.NodeProto], functions: list[onnx.FunctionProto]) -> Path:
    """A model of `nodes` (x -> y, batch x 16) with these functions, importing the opset (and com.example.fns,
    the functions' domain, where it has any)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid("com.example.fns", 1)] * bool(functions)
    model = helper.make_model(helper.make_graph(nodes, "fns", [x], [y]), opset_imports=opsets, functions=functions)
    onnx.save_model(model, str(path))
    return path


def _function(name: str, body: list[onnx.NodeProto], *domains: str) -> onnx.FunctionProto:
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(domain, 1) for domain in domains)]
    return helper.make_function("com.example.fns", name, ["a"], ["b"], body, opsets)


_DOUBLE = _function("Double", [helper.make_node("Add", ["a", "a"], ["b"])])


def _refused(path: Path, into: Path) -> str:
    with pytest.raises(ModelError) as refused:
        prepare(model_ref(path, {"kind": "tensor", "shape": [16]}), into / "mine")
    assert refused.value.reason == "ModelNotSupported"
    assert str(path) in str(refused.value)
    return str(refused.value)


def test_a_function_makes_loadable_only_the_operator_it_defines_not_its_domain(tmp_path: Path) -> None:
    nodes = [helper.make_node("Double", ["x"], ["d"], domain="com.example.fns"),
             helper.make_node("Scramble", ["d"], ["y"], domain="com.example.fns")]  # fmt: skip
    message = _refused(_with_functions(tmp_path / "fns.onnx", nodes, [_DOUBLE]), tmp_path)
    assert "domain(s) com.example.fns (Scramble)" in message
    served = _with_functions(tmp_path / "served.onnx", [*nodes[:1], helper.make_node("Identity", ["d"], ["y"])],
                             [_DOUBLE])  # fmt: skip
    prepare(model_ref(served, {"kind": "tensor", "shape": [16]}), tmp_path / "served")  # its own function: served


def test_a_custom_domain_inside_a_function_body_is_refused(tmp_path: Path) -> None:
    body = [helper.make_node("Scramble", ["a"], ["b"], domain="com.example.custom")]
    wrap = _function("Wrap", body, "com.example.custom")  # imported by the function only, not the model
    nodes = [helper.make_node("Wrap", ["x"], ["y"], domain="com.example.fns")]
    message = _refused(_with_functions(tmp_path / "wrapped.onnx", nodes, [wrap]), tmp_path)
    assert "domain(s) com.example.custom (Scramble)" in message


def test_external_data_in_a_function_constant_is_refused(tmp_path: Path) -> None:
    body = [helper.make_node("Constant", [], ["w"], value=_external("w")), helper.make_node("Add", ["a", "w"], ["b"])]
    nodes = [helper.make_node("Weighted", ["x"], ["y"], domain="com.example.fns")]
    message = _refused(_with_functions(tmp_path / "weighted.onnx", nodes, [_function("Weighted", body)]), tmp_path)
    assert "external data (weights.bin)" in message


def test_external_data_in_a_sparse_tensor_attribute_is_refused(tmp_path: Path) -> None:
    indices = helper.make_tensor("i", TensorProto.INT64, [1], [0])
    sparse = helper.make_sparse_tensor(_external("s"), indices, [16])
    nodes = [helper.make_node("Constant", [], ["s"], sparse_value=sparse), helper.make_node("Identity", ["x"], ["y"])]
    message = _refused(_with_functions(tmp_path / "sparse.onnx", nodes, []), tmp_path)
    assert "external data (weights.bin)" in message
