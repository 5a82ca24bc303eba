"""An ONNX model's size and work, counted from its graph (no torch): what the ceiling and the roofline use.

At one sample (the batch dimension set to 1, symbolic sizes to `model.input`'s), after ONNX shape
inference, with the same conventions as PyTorch's counter for the other formats (:mod:`.counting`), so a
module exported to ONNX counts as it does in TorchScript:

- FLOPs: matrix products and convolutions only, 2 per multiply-add (Conv, ConvTranspose, Gemm, MatMul;
  bias additions and elementwise operators are not counted, as PyTorch's counter does not count them);
- parameters: the elements of every floating-point initializer; weight bytes: every initializer's bytes,
  read once per batch;
- activation bytes: every node's outputs written once and read once by the next, except operators that only
  relabel a tensor (Reshape, Flatten, Squeeze, Unsqueeze, Identity) and those that make constants or shapes.

A figure that cannot be counted is None with the reason, never guessed: a node whose work is not counted
here (recurrent cells, Einsum, attention, quantised products, a subgraph's loop or branch), or a shape
shape inference leaves unknown.
"""

from __future__ import annotations

import math
from typing import Any

from servinglab.api.ceiling import DeclaredInput
from servinglab.models.probe import ModelCounts

#: Nodes with matrix work this count does not see: their presence leaves the FLOPs unknown.
UNCOUNTED = ("LSTM", "GRU", "RNN", "Einsum", "If", "Loop", "Scan", "Attention", "MultiHeadAttention",
             "QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "FusedMatMul", "DeformConv")  # fmt: skip
#: Nodes that move no bytes of their own (views in PyTorch, constants, shapes).
MOVES_NOTHING = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Constant", "ConstantOfShape", "Shape",
                 "Size")  # fmt: skip


class Uncounted(ValueError):
    """A figure this count cannot give; the message says why."""


def _at_one_sample(model: Any, declared: DeclaredInput) -> Any:
    """The model with its input's batch dimension 1 and its symbolic sizes the declared ones, shapes inferred."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    initializers = {tensor.name for tensor in copy.graph.initializer}
    (entry,) = [item for item in copy.graph.input if item.name not in initializers]
    if declared.kind == "image" and declared.size is None:
        raise Uncounted("the declared image input has no size")
    sizes = [3, declared.size or 0, declared.size or 0] if declared.kind == "image" else list(declared.shape or [])
    for dim, size in zip(entry.type.tensor_type.shape.dim, [1, *sizes], strict=False):
        if not dim.HasField("dim_value"):
            dim.dim_value = int(size)
    return onnx.shape_inference.infer_shapes(copy, strict_mode=False, data_prop=True)


def _shapes(model: Any) -> dict[str, tuple[list[int] | None, int]]:
    """Every value's (dims, or None where any is unknown; element type)."""
    found: dict[str, tuple[list[int] | None, int]] = {}
    graph = model.graph
    for info in (*graph.input, *graph.value_info, *graph.output):
        tensor_type = info.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        known = tensor_type.HasField("shape") and all(d is not None for d in dims)
        found[info.name] = ([int(d) for d in dims if d is not None] if known else None, tensor_type.elem_type)
    for tensor in graph.initializer:
        found[tensor.name] = (list(tensor.dims), tensor.data_type)
    return found


def _dims(shapes: dict[str, tuple[list[int] | None, int]], name: str, node: Any) -> list[int]:
    dims = shapes.get(name, (None, 0))[0]
    if dims is None:
        raise Uncounted(f"the shape of {name!r} ({node.op_type} {node.name or ''}) is unknown after shape inference")
    return dims


def _node_flops(node: Any, shapes: dict[str, tuple[list[int] | None, int]]) -> int:
    """2 x the multiply-adds of one node (0 for a node that is not a matrix product or a convolution)."""
    op = node.op_type
    if op == "Conv":  # each output element: input channels per group x kernel elements
        return 2 * math.prod(_dims(shapes, node.output[0], node)) * math.prod(_dims(shapes, node.input[1], node)[1:])
    if op == "ConvTranspose":  # each input element spreads over output channels per group x kernel elements
        return 2 * math.prod(_dims(shapes, node.input[0], node)) * math.prod(_dims(shapes, node.input[1], node)[1:])
    if op == "Gemm":
        a = _dims(shapes, node.input[0], node)
        trans_a = any(attribute.name == "transA" and attribute.i for attribute in node.attribute)
        inner = a[0] if trans_a else a[-1]
        return 2 * math.prod(_dims(shapes, node.output[0], node)) * inner
    if op == "MatMul":
        return 2 * math.prod(_dims(shapes, node.output[0], node)) * _dims(shapes, node.input[0], node)[-1]
    return 0


def _element_bytes(elem_type: int) -> int:
    import onnx

    return int(onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize)


def count(model: Any, declared: DeclaredInput) -> ModelCounts:
    """The parameters, FLOPs per inference and bytes moved (with a note for what is not counted) of a ModelProto
    (one that :mod:`.onnxcheck` passed: weights inside the file, one input) at one sample of `declared`."""
    import onnx

    floating = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
    initializers = list(model.graph.initializer)
    parameters = sum(math.prod(t.dims) for t in initializers if t.data_type in floating)
    weights = sum(math.prod(t.dims) * _element_bytes(t.data_type) for t in initializers)
    flops: int | None = None
    activations: int | None = None
    note: str | None = None
    try:
        inferred = _at_one_sample(model, declared)
        shapes = _shapes(inferred)
        nodes = list(inferred.graph.node)
        if blind := sorted({node.op_type for node in nodes if node.op_type in UNCOUNTED}):
            raise Uncounted(f"the graph holds {', '.join(blind)}, whose work is not counted here")
        flops = sum(_node_flops(node, shapes) for node in nodes)
        if flops == 0:
            flops, note = None, "FLOPs not counted: the graph holds no matrix product or convolution"
    except (Uncounted, onnx.shape_inference.InferenceError, ValueError) as exc:
        note = f"FLOPs not counted: {exc}"
    if flops is not None:
        try:
            written = sum(
                math.prod(_dims(shapes, name, node)) * _element_bytes(shapes[name][1])
                for node in nodes if node.op_type not in MOVES_NOTHING for name in node.output if name
            )  # fmt: skip
            activations = 2 * written
        except Uncounted as exc:
            weights, note = None, f"bytes moved not counted: {exc}"  # both figures or neither, as for torch
    return ModelCounts(parameters=int(parameters), flops_per_inference=flops,
                       weight_bytes=weights if activations is not None else None, activation_bytes=activations,
                       count_note=note)  # fmt: skip
