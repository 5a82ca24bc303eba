"""The handler's data path, server-neutral: request bodies -> a batch on the device -> the model's output.

What `server.dataPath` asks for, realised inside whichever server runs the model (TorchServe's handler
today; a LitServe LitAPI or a Triton Python backend call the same three steps): once per worker
:func:`plan_data_path` (checks what the machine can do and fails with a message naming the setting) and
:class:`BatchMaker`; per batch :meth:`BatchMaker.make` (decode, transfer, convert) and
:meth:`BatchMaker.forward` (pads a compiled model's batch to a compiled size). :meth:`DataPathPlan.report`
is what really ran, for the results.

The options: PIL decode on a pool of threads (PIL releases the GIL while it decodes); torchvision's
batched `decode_jpeg` on CUDA; uint8 pixels converted and normalised on the device as one batch, or each
image converted on the CPU; pinned host memory with non-blocking copies on a side stream, chunk by chunk,
so one chunk's copy overlaps the next chunk's decode and the previous chunk's conversion; `torch.compile`
(batches padded to powers of two, so the measured run never recompiles); channels-last.

Shipped next to `servinglab_imaging.py` (imported by basename); nothing here imports a server's package.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from servinglab_imaging import MEAN, STD, BadInput, decode_image, decode_tensor, to_batch

_JPEG_MAGIC = b"\xff\xd8\xff"
#: Chunks a pinned batch is copied in: enough to overlap, few enough that each copy is worth a launch.
COPY_CHUNKS = 4
CUDA_ONLY = {"decode": "device", "pinnedCopies": True, "compile": "reduce-overhead"}


class DataPathError(RuntimeError):
    """A data path this worker cannot run; the message names the setting and what is missing."""


@dataclass(frozen=True)
class DataPathPlan:
    """The data path one worker runs, settled before the first request."""

    decode: str = "cpu"
    decode_threads: int = 1
    transfer: str = "uint8"
    pinned_copies: bool = False
    compile: str = "none"
    channels_last: bool = False
    device: str = "cpu"
    #: The batch sizes a compiled model runs at; a formed batch is padded up to the next one.
    padded_sizes: tuple[int, ...] = field(default=())

    def report(self, input_kind: str = "image") -> dict[str, Any]:
        """What ran, camelCase like the results (`runtime.dataPath`), with a sentence for people."""
        return {
            "decode": self.decode, "decodeThreads": self.decode_threads, "transfer": self.transfer,
            "pinnedCopies": self.pinned_copies, "compile": self.compile, "channelsLast": self.channels_last,
            "paddedBatchSizes": list(self.padded_sizes) or None, "device": self.device,
            "note": self._note(input_kind),
        }  # fmt: skip

    def _note(self, input_kind: str) -> str:
        on = self.device
        if input_kind == "tensor":
            parts = [f"tensor bodies parsed on {self.decode_threads} CPU thread(s)"]
        elif self.decode == "device":
            parts = [f"JPEG decoded on {on} by torchvision's batched decode_jpeg (PNG/.npy bodies on the CPU)"]
        else:
            parts = [f"PIL decode on {self.decode_threads} thread(s) per worker"]
            parts.append(
                f"uint8 pixels converted and normalised on {on} as one batch"
                if self.transfer == "uint8"
                else "each image converted and normalised on the CPU, float pixels sent"
            )
        if self.pinned_copies:
            parts.append(f"pinned host memory, non-blocking copies on a side stream in {COPY_CHUNKS} chunks")
        if self.compile != "none":
            sizes = ", ".join(str(s) for s in self.padded_sizes)
            parts.append(f"torch.compile mode {self.compile}, batches padded to {sizes}")
        else:
            parts.append("eager PyTorch")
        parts.append("channels-last" if self.channels_last else "contiguous (NCHW)")
        return "; ".join(parts)


def _torchvision_problem() -> str | None:
    """Why torchvision's decode_jpeg cannot run here, or None."""
    if importlib.util.find_spec("torchvision") is None:
        return f"torchvision is not installed (install the release built for torch {torch.__version__})"
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except (ImportError, RuntimeError) as exc:  # a torchvision built for another torch fails here
        return f"torchvision does not load with torch {torch.__version__}: {exc}"
    return None


def plan_data_path(
    settings: Mapping[str, Any] | None, device: torch.device, input_kind: str, batch_size: int
) -> DataPathPlan:
    """The plan for `settings` (the spec's `dataPath`, camelCase) on `device`; raises DataPathError when
    the machine cannot run it (a CUDA path without CUDA, device decode without torchvision, the CPU's
    compiler missing for torch.compile)."""
    wanted = dict(settings or {})
    cuda = device.type == "cuda"
    for key, value in CUDA_ONLY.items():
        if wanted.get(key) == value and not cuda:
            why = "no GPU is visible to this worker" if not torch.cuda.is_available() else "the worker runs on the CPU"
            raise DataPathError(f"dataPath.{key}: {value} needs CUDA, and {why}")
    decode = str(wanted.get("decode", "cpu"))
    if decode == "device":
        if input_kind != "image":
            raise DataPathError("dataPath.decode: device decodes JPEG images; this model takes tensors")
        if (problem := _torchvision_problem()) is not None:
            raise DataPathError(f"dataPath.decode: device needs torchvision's decode_jpeg: {problem}")
    mode = str(wanted.get("compile", "none"))
    # inductor builds C++ kernels on the CPU; on a GPU, Triton builds its kernels' launcher with a C compiler
    compiler = os.environ.get("CXX", "g++") if not cuda else os.environ.get("CC", "gcc")
    if mode != "none" and shutil.which(compiler) is None:
        kind = "C++ compiler (g++ or $CXX)" if not cuda else "C compiler for Triton (gcc or $CC)"
        raise DataPathError(f"dataPath.compile: {mode} needs a {kind} on PATH, and there is none")
    channels_last = wanted.get("channelsLast")
    return DataPathPlan(
        decode=decode,
        decode_threads=int(wanted.get("decodeThreads", 1)),
        transfer=str(wanted.get("transfer", "uint8")) if input_kind == "image" else "as declared",
        pinned_copies=bool(wanted.get("pinnedCopies", False)),
        compile=mode,
        # a memory format of 4-D image batches; on by default where cuDNN gains from it
        channels_last=input_kind == "image" and (cuda if channels_last is None else bool(channels_last)),
        device=str(device),
        padded_sizes=tuple(powers_of_two_up_to(batch_size)) if mode != "none" else (),
    )


def powers_of_two_up_to(largest: int) -> list[int]:
    """1, 2, 4, ... below `largest`, and `largest` itself."""
    return sorted({min(2**i, largest) for i in range(max(largest, 1).bit_length() + 1)})


def padded_size(plan: DataPathPlan, rows: int) -> int:
    """The batch size a batch of `rows` runs at: the next compiled size, or `rows` itself (not compiled)."""
    return next((size for size in plan.padded_sizes if size >= rows), rows)


def sizes_to_compile(plan: DataPathPlan, largest: int) -> list[int]:
    """The padded sizes a batch of at most `largest` rows runs at (each compiles its graph on its first pass),
    up to the one `largest` itself is padded to; none for a model that is not compiled."""
    return [size for size in plan.padded_sizes if size <= padded_size(plan, largest)]


def compile_model(model: torch.nn.Module, plan: DataPathPlan) -> Any:
    """The model as the plan runs it: torch.compile'd at fixed shapes (one graph per padded size), or as is."""
    if plan.compile == "none":
        return model
    import torch._dynamo

    # one compiled graph per padded batch size must fit in dynamo's cache, or it falls back to eager
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, len(plan.padded_sizes) + 2)
    return torch.compile(model, mode=None if plan.compile == "default" else plan.compile, dynamic=False)


def run_model(model: Callable[[torch.Tensor], Any], batch: torch.Tensor, plan: DataPathPlan) -> Any:
    """The model's output for `batch`; a compiled model's batch is padded to the next compiled size (with
    copies of its last row) and the padding cut from the output. The raw probe runs the model this way too."""
    rows = batch.shape[0]
    size = padded_size(plan, rows)
    if plan.compile != "none":
        batch = _compiled_input(batch, size, plan)
    # compiled graphs (CUDA graphs above all) are traced under no_grad; eager runs in inference mode
    with torch.no_grad() if plan.compile != "none" else torch.inference_mode():
        output = model(batch)
    if size == rows:
        return output
    if isinstance(output, tuple | list):
        return type(output)(o[:rows] if isinstance(o, torch.Tensor) else o for o in output)
    return output[:rows]


def _compiled_input(batch: torch.Tensor, size: int, plan: DataPathPlan) -> torch.Tensor:
    """`batch` as a compiled model takes it: `size` rows (copies of its last row after its own) in the plan's
    memory layout. A compiled graph is guarded on its input's strides, so every batch, the warm-up's too, is
    given the one layout the plan names: padded with torch.cat, a channels-last batch came out contiguous and
    missed the graph its warm-up compiled, compiling another inside the measured window."""
    layout = torch.channels_last if plan.channels_last and batch.dim() == 4 else torch.contiguous_format
    rows = batch.shape[0]
    if size == rows:
        return batch.contiguous(memory_format=layout)  # as it is when it already has that layout
    padded = torch.empty((size, *batch.shape[1:]), dtype=batch.dtype, device=batch.device, memory_format=layout)
    padded[:rows] = batch
    padded[rows:] = batch[-1:]
    return padded


def warm_up_passes(plan: DataPathPlan) -> int:
    """Passes per padded size before serving: CUDA graphs (reduce-overhead) run their first call as a warm-up
    and record the graph on the second, which would otherwise be the first served batch of that size."""
    return 2 if plan.compile == "reduce-overhead" else 1


def normalise_on(batch: torch.Tensor, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    """NCHW pixels in 0..255 (uint8 or float, on any device) -> the normalised batch in `dtype`."""
    device = batch.device
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    out = batch.float().div_(255.0).sub_(mean).div_(std).to(dtype)
    return out.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def normalised_image(image: np.ndarray) -> np.ndarray:
    """One HxWx3 uint8 image -> 3xHxW float32, normalised (the `float` transfer, on a CPU thread)."""
    chw = image.transpose(2, 0, 1).astype(np.float32) / 255.0
    return (chw - np.asarray(MEAN, np.float32)[:, None, None]) / np.asarray(STD, np.float32)[:, None, None]


@dataclass
class Made:
    """A batch made from request bodies: the tensor (None when every body was bad), which bodies it holds
    (their positions, in order), and why the others were refused."""

    batch: torch.Tensor | None
    valid: list[int]
    errors: dict[int, str]


class BatchMaker:
    """One worker's data path: its decode pool, side stream and pinned staging buffer live across batches."""

    def __init__(
        self, plan: DataPathPlan, device: torch.device, dtype: torch.dtype, declared: Mapping[str, Any]
    ) -> None:
        self.plan, self.device, self.dtype = plan, device, dtype
        self.input = dict(declared)  # the model's input: {"kind": "image", "size"} or a tensor's shape and dtype
        self.size = int(self.input.get("size", 224))
        self.pool = ThreadPoolExecutor(plan.decode_threads, "servinglab-decode") if plan.decode_threads > 1 else None
        self.side = torch.cuda.Stream(device) if plan.pinned_copies else None
        self.staging: torch.Tensor | None = None

    # -- per batch ---------------------------------------------------------------------------------

    def make(self, bodies: Sequence[bytes]) -> Made:
        if self.plan.decode == "device":
            return self._on_device(bodies)
        results = self._decoded(bodies)
        if self.side is not None:
            return self._pinned(results, len(bodies))
        arrays, valid, errors = _split(results)
        if not arrays:
            return Made(None, valid, errors)
        if self.input.get("kind") == "tensor" or self.plan.transfer == "float":
            stacked = torch.from_numpy(np.stack(arrays)).to(self.device, non_blocking=True)
            batch = stacked.to(self.dtype) if stacked.is_floating_point() else stacked
            if self.plan.channels_last:
                batch = batch.contiguous(memory_format=torch.channels_last)
            return Made(batch, valid, errors)
        return Made(to_batch(arrays, self.device, self.dtype, self.plan.channels_last), valid, errors)

    def forward(self, model: Callable[[torch.Tensor], Any], batch: torch.Tensor) -> Any:
        return run_model(model, batch, self.plan)

    # -- decoding ------------------------------------------------------------------------------------

    def _decode_one(self, body: bytes) -> np.ndarray | BadInput:
        try:
            if self.input.get("kind") == "tensor":
                return decode_tensor(body, self.input["shape"], self.input["dtype"])
            image = decode_image(body, self.size)
            return normalised_image(image) if self.plan.transfer == "float" else image
        except BadInput as exc:
            return exc

    def _decoded(self, bodies: Sequence[bytes]) -> Iterator[np.ndarray | BadInput]:
        """Each body decoded, in order, as soon as it is (the pool decodes `decodeThreads` at a time)."""
        if self.pool is None:
            return (self._decode_one(body) for body in bodies)
        return self.pool.map(self._decode_one, bodies)

    def _pinned(self, results: Iterator[np.ndarray | BadInput], count: int) -> Made:
        """Decoded rows staged in pinned memory and copied chunk by chunk on the side stream; the default
        stream converts each chunk as soon as its copy is done."""
        assert self.side is not None
        self.side.synchronize()  # the staging buffer's last copies are done before it is written again
        chunk = max(1, math.ceil(count / COPY_CHUNKS))
        pending: list[np.ndarray] = []
        valid: list[int] = []
        errors: dict[int, str] = {}
        parts: list[torch.Tensor] = []
        for index, result in enumerate(results):
            if isinstance(result, BadInput):
                errors[index] = str(result)
            else:
                valid.append(index)
                pending.append(result)
            if pending and (len(pending) == chunk or index == count - 1):
                parts.append(self._copy_chunk(pending, len(valid) - len(pending), count))
                pending = []
        if not parts:
            return Made(None, valid, errors)
        batch = torch.cat(parts)
        return Made(batch.contiguous(memory_format=torch.channels_last) if self.plan.channels_last else batch,
                    valid, errors)  # fmt: skip

    def _copy_chunk(self, arrays: list[np.ndarray], offset: int, count: int) -> torch.Tensor:
        assert self.side is not None
        host = torch.from_numpy(np.stack(arrays))
        if self.staging is None or self.staging.shape[1:] != host.shape[1:] or self.staging.shape[0] < count:
            self.staging = torch.empty((count, *host.shape[1:]), dtype=host.dtype, pin_memory=True)
        staged = self.staging[offset : offset + len(arrays)]
        staged.copy_(host)
        with torch.cuda.stream(self.side):
            on_device = staged.to(self.device, non_blocking=True)
        torch.cuda.current_stream(self.device).wait_stream(self.side)
        on_device.record_stream(torch.cuda.current_stream(self.device))
        if self.input.get("kind") == "tensor" or self.plan.transfer == "float":
            return on_device.to(self.dtype) if on_device.is_floating_point() else on_device
        return normalise_on(on_device.permute(0, 3, 1, 2), self.dtype, channels_last=False)

    def _on_device(self, bodies: Sequence[bytes]) -> Made:
        """JPEG bodies decoded together by torchvision on the GPU and resized there; others on the CPU."""
        from torchvision.io import ImageReadMode, decode_jpeg

        errors: dict[int, str] = {}
        pixels: dict[int, torch.Tensor] = {}
        jpegs = [i for i, body in enumerate(bodies) if body.startswith(_JPEG_MAGIC)]
        data = [torch.frombuffer(bytearray(bodies[i]), dtype=torch.uint8) for i in jpegs]
        try:
            decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device) if data else []
        except RuntimeError:  # one bad JPEG fails the whole call: find it, decode the rest one by one
            decoded = []
            for i, one in zip(jpegs, data, strict=True):
                try:
                    pixels[i] = decode_jpeg(one, mode=ImageReadMode.RGB, device=self.device)
                except RuntimeError as exc:
                    errors[i] = f"cannot decode image: {exc}"
        pixels.update(zip(jpegs, decoded, strict=False))
        for i, body in enumerate(bodies):
            if i in pixels or i in errors:
                continue
            try:
                # PIL's pixels are read-only: torch warns on (and may not write to) a tensor over them
                decoded_pixels = np.array(decode_image(body, self.size))
                pixels[i] = torch.from_numpy(decoded_pixels).permute(2, 0, 1).to(self.device)
            except BadInput as exc:
                errors[i] = str(exc)
        valid = sorted(pixels)
        if not valid:
            return Made(None, valid, errors)
        resized = [self._resized(pixels[i]) for i in valid]
        return Made(normalise_on(torch.stack(resized), self.dtype, self.plan.channels_last), valid, errors)

    def _resized(self, image: torch.Tensor) -> torch.Tensor:
        if tuple(image.shape[1:]) == (self.size, self.size):
            return image.float()
        return torch.nn.functional.interpolate(
            image[None].float(), size=(self.size, self.size), mode="bilinear", antialias=True, align_corners=False
        )[0].clamp_(0, 255)


def _split(results: Iterator[np.ndarray | BadInput]) -> tuple[list[np.ndarray], list[int], dict[int, str]]:
    arrays, valid, errors = [], [], {}
    for index, result in enumerate(results):
        if isinstance(result, BadInput):
            errors[index] = str(result)
        else:
            arrays.append(result)
            valid.append(index)
    return arrays, valid, errors
