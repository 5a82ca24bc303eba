"""Triton's native backends for a model's form: which backend serves it, and its repository entry (pure).

Where a form is a Triton backend's own format (ONNX: `onnxruntime`, TorchScript: `pytorch`, a TensorRT
plan: `tensorrt`) Triton can run it without servinglab's Python model. :func:`choose_backend` says which
backend serves: the native one only when the tritonserver at hand has it (:func:`present_backends`: the
names in its `backends/` folder), the requests carry the model's input tensor, and the precision is fp32 (a
native backend runs the file as exported, at fp32; servinglab's model converts it when it loads it);
else the Python backend, with the reason. The requests servinglab sends Triton today are encoded bodies (one
BYTES element: a PNG/JPEG, or a user's JSON) that servinglab's Python model decodes; a native backend takes
tensors and decodes nothing, so no request encoding chooses it yet (:data:`TENSOR_ENCODINGS` is empty) and
the Python backend serves every form. :func:`render_native_config` and :func:`write_native_entry` are the
entry the native path needs (config.pbtxt and `1/model.onnx` / `1/model.pt` / `1/model.plan`).

What served is read back from Triton (its model configuration's `backend`) into the results'
`server.effective.backend` (:mod:`.config`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from servinglab.api import Precision, RequestEncoding, ServerSpec
from servinglab.api.forms import ModelForm
from servinglab.api.servers import capabilities
from servinglab.servers.handler import powers_of_two_up_to
from servinglab.servers.triton.config import VERSION, instance_groups

#: Triton's backend for servinglab's own model (every form, whatever the tritonserver has).
PYTHON = "python"
#: The request encodings that carry the model's input tensor (a native backend decodes nothing): none yet.
TENSOR_ENCODINGS: frozenset[RequestEncoding] = frozenset()
#: The backends of servinglab's Triton image (the PyTriton wheel's tritonserver: Python only), and of the
#: official Triton images (nvcr.io/nvidia/tritonserver), which a spec's `server.image` is taken to be.
SERVINGLAB_IMAGE_BACKENDS = frozenset({PYTHON})
OFFICIAL_IMAGE_BACKENDS = frozenset({PYTHON, "onnxruntime", "pytorch", "tensorrt"})


@dataclass(frozen=True)
class NativeBackend:
    """A Triton backend that runs a form's file as it is: its name, its platform, and the file's name."""

    backend: str
    platform: str
    file: str


#: Each native backend's platform and file name.
_BACKENDS = {
    "onnxruntime": NativeBackend("onnxruntime", "onnxruntime_onnx", "model.onnx"),
    "pytorch": NativeBackend("pytorch", "pytorch_libtorch", "model.pt"),
    "tensorrt": NativeBackend("tensorrt", "tensorrt_plan", "model.plan"),
}
#: The forms a native backend serves, as Triton declares them (`capabilities.native_backends`).
NATIVE = {form: _BACKENDS[backend] for form, backend in capabilities("triton").native_backends.items()}
#: ONNX's element types (TensorProto.DataType) as Triton's data types.
ONNX_TYPES = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 5: "TYPE_INT16", 6: "TYPE_INT32", 7: "TYPE_INT64",
              9: "TYPE_BOOL", 10: "TYPE_FP16", 11: "TYPE_FP64", 16: "TYPE_BF16"}  # fmt: skip


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a native model: its name, Triton data type and dims (without the batch axis;
    -1 where a dim varies)."""

    name: str
    data_type: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class BackendChoice:
    """The backend that serves, and why not a native one (None when it is native)."""

    backend: str
    reason: str | None = None


def present_backends(backends_dir: Path) -> frozenset[str]:
    """The backends a tritonserver has: the folders in its `backends/` (e.g. `<install>/backends/onnxruntime`)."""
    if not backends_dir.is_dir():
        return frozenset()
    return frozenset(path.name for path in backends_dir.iterdir() if path.is_dir())


def image_backends(image: str | None) -> frozenset[str]:
    """The backends a server pod's tritonserver has, as declared per image (a pod's config.pbtxt is written
    before its image runs): servinglab's Triton image (`server.image` unset) has Python only."""
    return OFFICIAL_IMAGE_BACKENDS if image else SERVINGLAB_IMAGE_BACKENDS


def choose_backend(
    form: ModelForm | None, precision: Precision, present: frozenset[str], encoding: RequestEncoding
) -> BackendChoice:
    """The form's native backend where it can serve, else the Python backend with the reason."""
    native = NATIVE.get(form) if form is not None else None
    if native is None:
        return BackendChoice(PYTHON, f"the {form or 'model as it comes'} runs in servinglab's Python model")
    if native.backend not in present:
        return BackendChoice(PYTHON, f"this tritonserver has no {native.backend} backend")
    if encoding not in TENSOR_ENCODINGS:
        return BackendChoice(
            PYTHON,
            f"the requests are {encoding} bodies that servinglab's model decodes; {native.backend} takes tensors",
        )
    if precision != Precision.FP32:
        return BackendChoice(
            PYTHON, f"{native.backend} runs the file at fp32; {precision} is converted in servinglab's model"
        )
    return BackendChoice(native.backend)


def onnx_io(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The ONNX file's graph inputs (less its initializers) and outputs, as Triton's tensors: their names,
    data types and dims less the batch axis (a symbolic or unknown dim is -1)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    initialized = {initializer.name for initializer in graph.initializer}

    def tensor(value: onnx.ValueInfoProto) -> TensorSpec:
        kind = value.type.tensor_type
        dims = tuple(dim.dim_value if dim.HasField("dim_value") else -1 for dim in kind.shape.dim)
        if kind.elem_type not in ONNX_TYPES:
            raise ValueError(f"{path.name}: {value.name} has ONNX element type {kind.elem_type}, which Triton lacks")
        return TensorSpec(value.name, ONNX_TYPES[kind.elem_type], dims[1:])

    inputs = [tensor(value) for value in graph.input if value.name not in initialized]
    return inputs, [tensor(value) for value in graph.output]


def torchscript_io(
    input_dims: list[int], output_dims: list[int] | None = None
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """A traced model's one input and one output as Triton's pytorch backend names them (INPUT__0,
    OUTPUT__0: by position), fp32, their dims less the batch axis (`output_dims` unknown: one varying dim)."""
    return (
        [TensorSpec("INPUT__0", "TYPE_FP32", tuple(input_dims))],
        [TensorSpec("OUTPUT__0", "TYPE_FP32", tuple(output_dims or [-1]))],
    )


def _tensors(tensors: list[TensorSpec]) -> list[str]:
    rendered = [f'  {{ name: "{t.name}", data_type: {t.data_type}, dims: [{", ".join(map(str, t.dims))}] }}'
                for t in tensors]  # fmt: skip
    return [line + ("," if index < len(rendered) - 1 else "") for index, line in enumerate(rendered)]


def render_native_config(
    model_name: str, form: ModelForm, server: ServerSpec, gpus: int, inputs: list[TensorSpec],
    outputs: list[TensorSpec],
) -> str:  # fmt: skip
    """config.pbtxt of `model_name` served by the form's native backend: the platform and backend, the batch
    size, the tensors, dynamic batching (the batch delay, the powers of two up to the batch size preferred)
    and `workers` instances on the CPU or spread over `gpus` GPUs."""
    native = NATIVE[form]
    preferred = ", ".join(map(str, powers_of_two_up_to(server.batch_size)))
    lines = [
        f'name: "{model_name}"',
        f'platform: "{native.platform}"',
        f'backend: "{native.backend}"',
        f"max_batch_size: {server.batch_size}",
        "input [", *_tensors(inputs), "]",
        "output [", *_tensors(outputs), "]",
        f"dynamic_batching {{ preferred_batch_size: [{preferred}], "
        f"max_queue_delay_microseconds: {server.max_batch_delay_ms * 1000} }}",
        f"instance_group [{', '.join(instance_groups(server.workers, gpus))}]",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def write_native_entry(entry: Path, model_name: str, form: ModelForm, server: ServerSpec, gpus: int,
                       built: Path, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> Path:  # fmt: skip
    """The repository entry at `entry` for the native backend: config.pbtxt and the form's file `built`
    copied to `1/model.onnx` (`model.pt`, `model.plan`). Returns the file's path."""
    version = entry / VERSION
    version.mkdir(parents=True, exist_ok=True)
    placed = version / NATIVE[form].file
    shutil.copyfile(built, placed)
    (entry / "config.pbtxt").write_text(render_native_config(model_name, form, server, gpus, inputs, outputs))
    return placed
