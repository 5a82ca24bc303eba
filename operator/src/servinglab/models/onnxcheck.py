"""An ONNX model (`.onnx`) recognised and checked before any server starts, without running it.

The file is parsed with `onnx` (a protobuf: nothing of the user's runs, no external data is read) after it
was fetched within `maxBytes`; protobuf itself reads no message over 2 GiB, which is why larger ONNX
models keep their weights in external data files, refused here. What servinglab's handler cannot run is
refused with the reason the experiment ends with and a message naming `model.source`:

- tensors whose data lives in external files (`data_location: EXTERNAL`): the model is one file, checked
  by its digest and bounded by maxBytes; a file it names beside it would be neither (ModelNotSupported);
- operators of a domain ONNX Runtime does not load: the default (`""`, `ai.onnx`), `ai.onnx.ml` and ONNX
  Runtime's own `com.microsoft` are loadable, as are the operators the model's own functions define (each by
  its domain and name; the functions' bodies are checked as the graph is); any other needs a custom-op library
  servinglab does not load (ModelNotSupported, the domain and operator named);
- inputs the handler cannot feed: exactly one graph input, of the rank, element type and sizes of
  `model.input` with a batch dimension first, which must be dynamic when `server.batchSize` > 1
  (ModelNotSupported, the field named);
- a precision other than fp32/tf32 (PrecisionNotSupported): ONNX Runtime runs the graph as it was saved.

Running it once on a probe batch (its outputs, its counts) is the model probe's, in a child process
(:mod:`.probe_child`, :mod:`.onnxcount`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servinglab.api import ModelInput, ModelSource, Precision
from servinglab.api.reasons import Reason
from servinglab.models.fetch import ModelSourceError

#: Operator domains ONNX Runtime's standard build loads (besides the model's own functions).
LOADABLE_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")
#: The element type (TensorProto.DataType name) the handler feeds for each declared dtype at fp32: floating
#: inputs are sent as float32 (they follow the precision), integers as declared.
FED_TYPES = {"float32": "FLOAT", "float16": "FLOAT", "bfloat16": "FLOAT", "int64": "INT64", "int32": "INT32",
             "uint8": "UINT8"}  # fmt: skip
PRECISIONS = (Precision.FP32, Precision.TF32)
_NOT_SUPPORTED = Reason.MODEL_NOT_SUPPORTED


def parse(path: Path) -> Any | None:
    """The file's ModelProto (external data not loaded), or None when it is not an ONNX model."""
    import onnx

    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except Exception:  # protobuf's DecodeError and onnx's own errors, on bytes that are not a model
        return None
    # protobuf reads many byte strings as some message: an ONNX model names its IR version and has a graph
    if model.ir_version < 1 or not model.HasField("graph") or not model.graph.node:
        return None
    return model


def _graphs(graph: Any) -> Iterator[Any]:
    """The graph and every subgraph in its nodes' attributes (If, Loop, Scan bodies)."""
    yield graph
    yield from _subgraphs(graph.node)


def _subgraphs(nodes: Any) -> Iterator[Any]:
    """Every graph in these nodes' attributes, and the subgraphs in those, at any depth."""
    for node in nodes:
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from _graphs(attribute.g)
            for sub in attribute.graphs:
                yield from _graphs(sub)


def _node_lists(model: Any) -> Iterator[Any]:
    """Every list of nodes the model holds: its graph's and subgraphs', and its functions' bodies (a function's
    node runs as much as the graph's: ONNX Runtime inlines it) with their subgraphs."""
    for graph in _graphs(model.graph):
        yield graph.node
    for function in model.functions:
        yield function.node
        for graph in _subgraphs(function.node):
            yield graph.node


def _tensors(model: Any) -> Iterator[tuple[str, Any]]:
    """(where, tensor) for every tensor the model holds: initializers, sparse ones, node attributes (in the
    graph, its subgraphs and the model's functions)."""
    for graph in _graphs(model.graph):
        for tensor in graph.initializer:
            yield f"initializer {tensor.name!r}", tensor
        for sparse in graph.sparse_initializer:
            yield f"sparse initializer {sparse.values.name!r}", sparse.values
            yield f"sparse initializer {sparse.values.name!r}", sparse.indices
    for nodes in _node_lists(model):
        for node in nodes:
            for attribute in node.attribute:
                where = f"node {node.name or node.op_type!r} attribute {attribute.name!r}"
                if attribute.HasField("t"):
                    yield where, attribute.t
                for tensor in attribute.tensors:
                    yield where, tensor
                sparses = [attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []
                for sparse in [*sparses, *attribute.sparse_tensors]:
                    yield where, sparse.values
                    yield where, sparse.indices


def _refuse_external_data(source: ModelSource, model: Any) -> None:
    import onnx

    for where, tensor in _tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            files = sorted({entry.value for entry in tensor.external_data if entry.key == "location"})
            raise ModelSourceError(
                _NOT_SUPPORTED,
                f"{source.describe()}: the ONNX model keeps its {where} in external data ({', '.join(files) or '?'}); "
                "servinglab serves one file, checked by its sha256 and bounded by maxBytes: save it with "
                "onnx.save_model(model, path, save_as_external_data=False) (models under 2 GiB fit in one file)",
            )


def _refuse_domains(source: ModelSource, model: Any) -> None:
    # a model's function makes loadable the one operator it defines (domain, name), not its whole domain
    own = {(function.domain, function.name) for function in model.functions}
    loadable = set(LOADABLE_DOMAINS)
    imported = {entry.domain for entry in model.opset_import}
    for function in model.functions:
        imported |= {entry.domain for entry in function.opset_import}
    # a domain imported only for the model's functions names no operator ONNX Runtime must find elsewhere
    custom_ops: dict[str, set[str]] = {domain: set() for domain in imported - loadable - {d for d, _ in own}}
    for nodes in _node_lists(model):
        for node in nodes:
            if node.domain not in loadable and (node.domain, node.op_type) not in own:
                custom_ops.setdefault(node.domain, set()).add(node.op_type)
    if custom_ops:
        named = ", ".join(f"{domain} ({', '.join(sorted(ops))})" if ops else domain
                          for domain, ops in sorted(custom_ops.items()))  # fmt: skip
        raise ModelSourceError(
            _NOT_SUPPORTED,
            f"{source.describe()}: the ONNX model uses operators of the domain(s) {named}, which ONNX Runtime "
            "loads only from a custom-op library servinglab does not load (the model's own functions define "
            f"none of these); it serves the domains {', '.join(repr(d) for d in LOADABLE_DOMAINS)}",
        )


def _dims(value_info: Any) -> list[int | str | None]:
    """Each dimension: its size, its symbolic name, or None when unknown."""
    return [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)
            for dim in value_info.type.tensor_type.shape.dim]  # fmt: skip


def _refuse_inputs(source: ModelSource, model: Any, declared: ModelInput, batch_size: int) -> str:
    """The one input the handler feeds; refused when it cannot feed it (count, rank, type, sizes, batch)."""
    import onnx

    what = source.describe()
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = [entry for entry in model.graph.input if entry.name not in initializers]
    if len(inputs) != 1:
        names = ", ".join(entry.name for entry in inputs) or "none"
        raise ModelSourceError(_NOT_SUPPORTED, f"{what}: the ONNX model takes {len(inputs)} inputs ({names}); "
                               "servinglab's handler feeds one tensor, the batch of model.input")  # fmt: skip
    entry = inputs[0]
    if not entry.type.HasField("tensor_type"):
        raise ModelSourceError(_NOT_SUPPORTED, f"{what}: the ONNX model's input {entry.name!r} is not a tensor")
    wanted = [3, declared.size, declared.size] if declared.kind == "image" else list(declared.shape)
    dtype = "float32" if declared.kind == "image" else declared.dtype
    shown = f"model.input ({declared.kind} {'x'.join(str(d) for d in wanted)}, {dtype})"
    elem_type = onnx.TensorProto.DataType.Name(entry.type.tensor_type.elem_type)
    if elem_type != FED_TYPES[dtype]:
        raise ModelSourceError(_NOT_SUPPORTED, f"{what}: the ONNX model's input {entry.name!r} is {elem_type}, and "
                               f"{shown} is fed as {FED_TYPES[dtype]}")  # fmt: skip
    if not entry.type.tensor_type.HasField("shape"):
        return str(entry.name)  # any shape: ONNX Runtime checks nothing, the probe's run shows what it does
    dims = _dims(entry)
    if len(dims) != len(wanted) + 1:
        raise ModelSourceError(_NOT_SUPPORTED, f"{what}: the ONNX model's input {entry.name!r} has rank {len(dims)}; "
                               f"{shown} is fed as a batch of rank {len(wanted) + 1} (batch first)")  # fmt: skip
    for position, (dim, size) in enumerate(zip(dims[1:], wanted, strict=True), start=1):
        if isinstance(dim, int) and dim != size:
            raise ModelSourceError(_NOT_SUPPORTED, f"{what}: the ONNX model's input {entry.name!r} has size {dim} "
                                   f"in dimension {position}, where {shown} has {size}")  # fmt: skip
    batch = dims[0]
    if isinstance(batch, int) and (batch != 1 or batch_size > 1):
        raise ModelSourceError(
            _NOT_SUPPORTED,
            f"{what}: the ONNX model's input {entry.name!r} has a fixed batch dimension of {batch}, and "
            f"server.batchSize is {batch_size}: the handler forms batches of 1 to {batch_size}; export it with a "
            "dynamic batch axis (torch.onnx.export(..., dynamic_axes={name: {0: 'batch'}}))"
            + (" or serve it with server.batchSize 1" if batch == 1 else ""),
        )
    return str(entry.name)


def check(source: ModelSource, path: Path, declared: ModelInput | None, precision: Precision | None,
          batch_size: int) -> str:  # fmt: skip
    """Refuse (:class:`ModelSourceError`) what the handler cannot serve; the name of the input it feeds."""
    if precision is not None and precision not in PRECISIONS:
        raise ModelSourceError(
            Reason.PRECISION_NOT_SUPPORTED,
            f"{source.describe()}: server.precision {precision}: an ONNX model runs in ONNX Runtime as it was "
            "saved, at fp32 (tf32 on a GPU that has it); serve it at fp32, or give the TorchScript/.pt2 file",
        )
    model = parse(path)
    if model is None:
        raise ModelSourceError(Reason.MODEL_NOT_RECOGNIZED, f"{source.describe()}: not an ONNX model (no ModelProto)")
    _refuse_external_data(source, model)
    _refuse_domains(source, model)
    return _refuse_inputs(source, model, declared or ModelInput(), batch_size)
