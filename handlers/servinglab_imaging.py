"""Plain, TorchServe-free functions behind the image-classification handler.

Shipped inside the model archive next to `servinglab_image_handler.py` (TorchServe puts the archive
directory on sys.path, so this imports by basename) and unit-tested directly. Nothing here imports
`ts`, so the TorchServe-specific surface stays in the handler class alone.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

# ImageNet channel statistics, the usual normalisation for classifiers of this shape.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_NPY_MAGIC = b"\x93NUMPY"

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


class BadInput(ValueError):
    """A request body that cannot be turned into an image; reported per request, not per batch."""


@dataclass(frozen=True)
class BatchRun:
    """One batch's answers (JSON, one per row), the rows rejected (index -> why: answered 400 alone), and
    the perf_counter instants at its start, after preprocess, after inference and at its end. (Here, not
    in the handler's file: TorchServe wants exactly one class there.)"""

    responses: list[str]
    rejected: dict[int, str]
    timings: tuple[float, float, float, float]


def request_body(row: dict[str, Any]) -> bytes:
    """The payload of one TorchServe request row: raw body, or the first multipart file field."""
    for key in ("body", "data", "file", "image"):
        value = row.get(key)
        if isinstance(value, bytes | bytearray):
            return bytes(value)
        if isinstance(value, str):
            return value.encode()
        if isinstance(value, list | dict):  # TorchServe parses application/json bodies itself
            return json.dumps(value).encode()
    raise BadInput("request has no body; POST the image bytes (JPEG, PNG or .npy uint8) or the tensor (.npy or JSON)")


def decode_image(payload: bytes, size: int) -> np.ndarray:
    """Bytes -> HxWx3 uint8 array of `size`x`size`.

    Accepts JPEG, PNG (any mode, converted to RGB) and raw uint8 tensors in .npy format, shaped
    HxWx3 or 3xHxW. Images of another size are resized (bilinear); raw tensors must already match.
    """
    if payload.startswith(_NPY_MAGIC):
        try:
            array = np.load(io.BytesIO(payload), allow_pickle=False)
        except ValueError as exc:
            raise BadInput(f"unreadable .npy payload: {exc}") from None
        if array.dtype != np.uint8:
            raise BadInput(f"raw tensor must be uint8, got {array.dtype}")
        if array.ndim == 3 and array.shape[0] == 3 and array.shape[2] != 3:
            array = array.transpose(1, 2, 0)
        if array.shape != (size, size, 3):
            raise BadInput(f"raw tensor must be {size}x{size}x3 (or 3x{size}x{size}), got {array.shape}")
        return np.ascontiguousarray(array)
    if not (payload.startswith(_JPEG_MAGIC) or payload.startswith(_PNG_MAGIC)):
        raise BadInput("payload is neither JPEG, PNG nor a .npy uint8 tensor")
    try:
        with Image.open(io.BytesIO(payload)) as image:
            rgb = image.convert("RGB")
    except (OSError, Image.DecompressionBombError) as exc:
        raise BadInput(f"cannot decode image: {exc}") from None
    if rgb.size != (size, size):
        rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8)


_TENSOR_DTYPES = {
    "float32": np.float32, "float16": np.float16, "bfloat16": np.float32, "int64": np.int64, "int32": np.int32,
    "uint8": np.uint8,
}  # fmt: skip


def decode_tensor(payload: bytes, shape: Sequence[int], dtype: str) -> np.ndarray:
    """One sample of a declared tensor input: a .npy array, or a JSON list (or {"inputs": list}).

    The shape must match exactly (no batch dimension); the values are cast to `dtype` (bfloat16
    travels as float32 and is cast on the device)."""
    if payload.startswith(_NPY_MAGIC):
        try:
            array = np.load(io.BytesIO(payload), allow_pickle=False)
        except ValueError as exc:
            raise BadInput(f"unreadable .npy payload: {exc}") from None
    else:
        try:
            value = json.loads(payload)
        except (UnicodeDecodeError, ValueError):
            raise BadInput("payload is neither a .npy array nor JSON") from None
        if isinstance(value, dict):
            value = value.get("inputs", value.get("data"))
        try:
            array = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise BadInput('JSON payload is not a numeric list (nor {"inputs": list})') from None
    if tuple(array.shape) != tuple(shape):
        raise BadInput(f"tensor must have shape {list(shape)}, got {list(array.shape)}")
    return np.ascontiguousarray(array.astype(_TENSOR_DTYPES[dtype], copy=False))


def zeros_sample(shape: Sequence[int], dtype: str) -> np.ndarray:
    """A sample of the declared input, all zeros: what the warm-up runs."""
    return np.zeros(tuple(shape), dtype=_TENSOR_DTYPES[dtype])


def tensors_to_batch(samples: Sequence[np.ndarray], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Stack decoded tensor samples; floating inputs take the precision's dtype, integers stay."""
    batch = torch.from_numpy(np.stack(samples)).to(device, non_blocking=True)
    return batch.to(dtype) if batch.is_floating_point() else batch


def tensor_outputs(output: Any, limit: int = 64) -> list[dict[str, Any]]:
    """Per sample of a model's output (a tensor, or the first of a tuple): its shape and first values."""
    if isinstance(output, tuple | list):
        output = output[0]
    rows = output.detach().float().cpu()
    return [{"shape": list(row.shape), "values": [round(float(v), 6) for v in row.flatten()[:limit].tolist()]}
            for row in rows]  # fmt: skip


def onnx_refusal(model: OnnxModel, dtype: torch.dtype, compile_mode: str, batch_size: int) -> str | None:
    """Why the handler cannot serve this ONNX model with these settings (naming the setting), or None."""
    if dtype != torch.float32:
        return (f"server.precision: an ONNX model runs in ONNX Runtime as saved, at fp32 (tf32 on a GPU), not "
                f"{str(dtype).removeprefix('torch.')}")  # fmt: skip
    if compile_mode != "none":
        return f"server.dataPath.compile {compile_mode}: torch.compile cannot compile an ONNX Runtime session"
    batch = model.input_shape[0] if model.input_shape else None
    if isinstance(batch, int) and (batch != 1 or batch_size > 1):
        return (f"server.batchSize {batch_size}: the ONNX model's input {model.input_name!r} has a fixed batch "
                f"dimension of {batch}; export it with a dynamic batch axis")  # fmt: skip
    return None


class OnnxModel(torch.nn.Module):
    """An ONNX model run by ONNX Runtime behind a module's call, so the handler's data path, warm-up and answers
    are the same as a torch model's: a batch tensor in (the one input), the first output back as a tensor on
    the batch's device. The CUDA execution provider where the device is a GPU and this onnxruntime has it,
    else the CPU's, with as many intra-op threads as torch uses (the handler leaves torch's default)."""

    def __init__(self, path: str, device: torch.device, allow_tf32: bool = False) -> None:
        super().__init__()
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.inter_op_num_threads = 1
        # ORT's intra-op threads spin after each run by default, taking the cores from the server's decoding
        # and HTTP threads in between batches (a small model served slower than its TorchScript form)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers: list[Any] = ["CPUExecutionProvider"]
        if device.type == "cuda" and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            cuda = {"device_id": device.index or 0, "use_tf32": int(allow_tf32)}
            providers.insert(0, ("CUDAExecutionProvider", cuda))
        self.session = onnxruntime.InferenceSession(path, options, providers=providers)
        first = self.session.get_inputs()[0]
        self.input_name, self.input_shape = first.name, list(first.shape)
        self.provider = self.session.get_providers()[0]
        self.note = f"ONNX Runtime {onnxruntime.__version__}, {self.provider}, {options.intra_op_num_threads} threads"
        if device.type == "cuda" and self.provider != "CUDAExecutionProvider":
            self.note += " (this onnxruntime has no CUDAExecutionProvider: the model runs on the CPU)"

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        fed = batch.detach().to("cpu").contiguous().numpy()
        output = self.session.run(None, {self.input_name: fed})[0]
        return torch.from_numpy(np.ascontiguousarray(output)).to(batch.device)


def load_serialized(path: Any, device: torch.device, allow_tf32: bool = False) -> torch.nn.Module:
    """A TorchScript file (torch.jit.save), an exported program (.pt2, torch.export.save), in eval mode, or an
    ONNX model (.onnx) in an ONNX Runtime session (TF32 on the GPU with `allow_tf32`)."""
    if str(path).endswith(".onnx"):
        return OnnxModel(str(path), device, allow_tf32)
    if str(path).endswith(".pt2"):
        module: torch.nn.Module = torch.export.load(str(path)).module()
        return module.to(device)
    scripted: torch.nn.Module = torch.jit.load(str(path), map_location=device)
    return scripted.eval()


def to_batch(
    images: Sequence[np.ndarray],
    device: torch.device,
    dtype: torch.dtype,
    channels_last: bool,
) -> torch.Tensor:
    """Stack HxWx3 uint8 images into one normalised NCHW batch on `device` in `dtype`.

    The uint8 batch crosses to the device first (a quarter of the bytes of fp32), then conversion and
    normalisation run there as a few whole-batch operations rather than per image.
    """
    stacked = torch.from_numpy(np.stack(images)).to(device, non_blocking=True)
    batch = stacked.permute(0, 3, 1, 2).float().div_(255.0)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    batch = batch.sub_(mean).div_(std).to(dtype)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    return batch.contiguous(memory_format=memory_format)


def top_k(logits: torch.Tensor, k: int) -> list[list[dict[str, float | int]]]:
    """Per row of logits, the k most likely classes with softmax probabilities (computed in fp32)."""
    probabilities = torch.softmax(logits.float(), dim=1)
    k = min(k, probabilities.shape[1])
    values, indices = probabilities.topk(k, dim=1)
    return [
        [{"class": int(i), "probability": round(float(p), 6)} for p, i in zip(row_p, row_i, strict=True)]
        for row_p, row_i in zip(values.tolist(), indices.tolist(), strict=True)
    ]


@dataclass(frozen=True)
class PrecisionPlan:
    """How a requested precision is realised on a device, and whether it is native there."""

    precision: str
    dtype: torch.dtype
    allow_tf32: bool
    native: bool
    note: str


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def plan_precision(precision: str, device: torch.device) -> PrecisionPlan:
    """Choose dtype and TF32 policy for `precision` on `device`, and say if the hardware emulates it.

    fp16/bf16 convert the model and inputs (`.half()` style) instead of autocast: for inference the
    whole network runs in the reduced type, which is what a serving benchmark should measure.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        native = {
            "fp32": True,
            "tf32": major >= 8,
            "fp16": (major, minor) >= (5, 3),
            "bf16": major >= 8,
        }[precision]
    else:
        flags = _cpu_flags()
        name = "CPU"
        native = {
            "fp32": True,
            "tf32": False,
            "fp16": bool(flags & {"avx512_fp16", "amx_fp16"}),
            "bf16": bool(flags & {"avx512_bf16", "amx_bf16"}),
        }[precision]
    note = (
        f"{precision} runs natively on {name}"
        if native
        else f"{precision} is emulated on {name} (no native {precision} arithmetic); "
        "expect it to be slower than fp32 here"
    )
    if precision == "tf32" and not native:
        note = f"tf32 is not available on {name}; it runs as fp32"
    return PrecisionPlan(precision, dtype, precision == "tf32", native, note)


def apply_precision(model: torch.nn.Module, plan: PrecisionPlan, channels_last: bool) -> torch.nn.Module:
    """Convert an eval-mode model to the plan's dtype and memory format; set the TF32 switches.

    The TF32 switches are process-global in PyTorch; each TorchServe worker is its own process
    serving one model, so setting them here is the per-model choice the spec asked for.
    """
    torch.backends.cuda.matmul.allow_tf32 = plan.allow_tf32
    torch.backends.cudnn.allow_tf32 = plan.allow_tf32
    torch.set_float32_matmul_precision("high" if plan.allow_tf32 else "highest")
    model = model.to(dtype=plan.dtype)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    try:
        return model.eval()
    except NotImplementedError:  # an exported program's module has no train/eval switch: it is traced as is
        return model


def json_response(predictions: list[dict[str, float | int]]) -> str:
    """Serialise one request's prediction list (TorchServe sends strings as-is)."""
    return json.dumps({"predictions": predictions}, separators=(",", ":"))


def error_response(message: str) -> str:
    """Serialise a per-request error so one bad image does not fail the whole batch."""
    return json.dumps({"error": message}, separators=(",", ":"))


def warm_up(
    forward: Callable[[int], None],
    sizes: Sequence[int],
    budget_seconds: float,
    clock: Callable[[], float] = time.perf_counter,
    required: Sequence[int] = (),
    required_passes: int = 1,
) -> dict[str, Any]:
    """Run `forward` once per batch size, smallest first, while the time budget lasts (by `clock`).

    A size is skipped when the time per sample of the last one predicts it would end past the budget
    (per-sample time falls with batch size, so the estimate errs long). The `required` sizes run whatever
    the budget: a compiled model compiles a graph per padded size on its first pass there (seconds to
    minutes each), and a size left out would compile inside the measured window; their time predicts
    nothing. Each runs `required_passes` times (CUDA graphs record on the second). Returns what ran, for the
    log: ``{"seconds", "batchSizes", "skipped", "budgetSeconds"}``, and ``"required"`` when some were.
    """
    started = clock()
    done: list[int] = []
    skipped: list[int] = []
    per_sample: float | None = None
    for size in sorted({*sizes, *required}):
        must = size in required
        elapsed = clock() - started
        if not must and (
            budget_seconds <= 0 or (per_sample is not None and elapsed + per_sample * size > budget_seconds)
        ):
            skipped.append(size)
            continue
        begun = clock()
        for _ in range(required_passes if must else 1):
            forward(size)
        if not must:
            per_sample = (clock() - begun) / size
        done.append(size)
    return {
        "seconds": round(clock() - started, 3),
        "batchSizes": done,
        "skipped": skipped,
        **({"required": sorted(required)} if required else {}),
        "budgetSeconds": budget_seconds,
    }
