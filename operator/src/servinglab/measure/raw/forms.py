"""The model alone in each of its forms, in a child process: built (or found built), checked against eager
fp32, then timed at one batch size.

    python -m servinglab.measure.raw.forms '{"model": "resnet50", "precision": "fp16", "device": "cuda:0",
        "forms": ["eager", "torchscript", "compile", "onnxruntime"], "batchSize": 64, "seconds": 5,
        "cacheDir": "/tmp/forms"}'

A form is how the model runs: eager PyTorch, TorchScript (traced and frozen), ``torch.compile`` (default
mode, or ``reduce-overhead``: CUDA graphs, GPU only), ONNX Runtime (with the execution provider the
device has) and TensorRT (Torch-TensorRT, GPU only). Started by `benchmarks/gpu_check.py`; it imports torch,
so it is never imported by a process that generates load or reconciles.

Each form is
- refused with its reason when the device or the installed libraries cannot run it;
- built once: TorchScript and ONNX files are kept under `cacheDir`, keyed by the model, the form, the
  precision, the batch size and the library versions, so a second use builds nothing (``cached: true``);
- gated: its output on a fixed probe batch is compared with eager fp32 on the same device, and a form
  whose largest error relative to the reference's range exceeds the precision's tolerance is
  ``failed-gate`` with both errors and never timed;
- timed like the raw probe (:mod:`servinglab.measure.raw.child`): inputs already on the device, every
  pass synchronised, the best of five segments.

One JSON object per line on stdout: ``{"event": "ready", "device", "versions"}``, then one
``{"event": "form", "form", "status", ...}`` per form, and ``{"event": "done"}``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from servinglab.measure.raw.child import best_segment_rps, emit, keep_stdout_for_events
from servinglab.measure.raw.protocol import FormsRequest
from servinglab.models.formbuild import PROBE_ROWS, TOLERANCE, export_onnx, export_torchscript, versions

__all__ = ["FORMS", "PROBE_ROWS", "TOLERANCE", "refusal", "versions"]

FORMS = ("eager", "torchscript", "compile", "compile-cudagraphs", "onnxruntime", "tensorrt")


def refusal(form: str, device: Any) -> str | None:
    """Why `form` cannot run on `device` with the libraries installed here, or None."""
    if form not in FORMS:
        return f"unknown form {form!r}; one of {', '.join(FORMS)}"
    gpu_only = {"compile-cudagraphs": "CUDA graphs", "tensorrt": "TensorRT"}
    if form in gpu_only and device.type != "cuda":
        return f"{gpu_only[form]} needs a GPU; this device is {device.type}"
    needs = {"onnxruntime": ("onnx", "onnxruntime"), "tensorrt": ("torch_tensorrt",)}.get(form, ())
    missing = [name for name in needs if importlib.util.find_spec(name) is None]
    if missing:
        return f"the {form} form needs the Python package(s) {', '.join(missing)}, not installed here"
    if form == "onnxruntime" and device.type == "cuda":
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            return "ONNX Runtime here has no CUDAExecutionProvider (onnxruntime-gpu is not installed)"
    return None


def cache_key(model: str, form: str, precision: str, batch_size: int, device: Any, found: dict[str, str]) -> str:
    text = json.dumps([model, form, precision, batch_size, device.type, found], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class _Row(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class Ran(_Row):
    """What ran a form: the backend, and its mode, execution provider or library where it has one."""

    backend: str
    mode: str | None = None
    provider: str | None = None
    library: str | None = None


class Gate(_Row):
    """The form's output on the probe batch against eager fp32's."""

    max_abs_error: float
    max_rel_error: float
    tolerance: float
    passed: bool


class Timing(_Row):
    throughput_rps: float
    pass_seconds: float
    passes: int


class NotBuilt(_Row):
    """A form refused (the device or the libraries cannot run it) or whose build failed."""

    form: str
    status: str
    reason: str


class Built(_Row):
    """A form built and gated: measured, or failed-gate with the reason (fields in the order they are printed)."""

    form: str
    precision: str
    batch_size: int
    backend: str
    mode: str | None = None
    provider: str | None = None
    library: str | None = None
    build_seconds: float
    cached: bool
    gate: Gate
    status: str
    reason: str | None = None
    throughput_rps: float | None = None
    pass_seconds: float | None = None
    passes: int | None = None


class Forms:
    """The model on its device at one precision, and what each form is built from."""

    def __init__(self, request: FormsRequest) -> None:
        import torch

        from servinglab.models import counting

        self.torch = torch
        self.model_name = request.model
        self.device = torch.device(request.device)
        self.batch_size = request.batch_size
        self.seconds = request.seconds
        self.cache = Path(request.cache_dir or "/tmp/servinglab-forms")
        self.imaging = counting.handler_imaging()
        self.plan = self.imaging.plan_precision(request.precision, self.device)
        network, self.size = counting.network(self.model_name, weights=True)
        self.channels_last = self.device.type == "cuda"
        generator = torch.Generator().manual_seed(0)
        self.probe32 = torch.randn(PROBE_ROWS, 3, self.size, self.size, generator=generator).to(self.device)
        self.timed32 = torch.randn(self.batch_size, 3, self.size, self.size, generator=generator).to(self.device)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # the reference is fp32
        with torch.inference_mode():
            self.reference = network.to(self.device).float()(self.probe32).float()
        self.network = self.imaging.apply_precision(network.to(self.device), self.plan, self.channels_last)
        self.versions = versions()

    def cast(self, batch: Any) -> Any:
        batch = batch.to(dtype=self.plan.dtype)
        return batch.contiguous(memory_format=self.torch.channels_last) if self.channels_last else batch

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    # --- building: each returns (a callable taking a batch on the device, what ran, cached) ---

    def build(self, form: str) -> tuple[Callable[[Any], Any], Ran, bool]:
        torch = self.torch
        key = cache_key(self.model_name, form, self.plan.precision, self.batch_size, self.device, self.versions)
        if form == "eager":
            return self.network, Ran(backend="pytorch", mode="eager"), False
        if form == "torchscript":
            path = self.cache / f"{key}.ts"
            cached = path.exists()
            if not cached:
                self.cache.mkdir(parents=True, exist_ok=True)
                export_torchscript(self.network, self.cast(self.timed32), path, freeze=True)
            return torch.jit.load(str(path), map_location=self.device), Ran(backend="torchscript"), cached
        if form in ("compile", "compile-cudagraphs"):
            mode = "reduce-overhead" if form == "compile-cudagraphs" else None
            compiled = torch.compile(self.network, mode=mode, dynamic=False)
            return compiled, Ran(backend="inductor", mode=mode or "default"), False
        if form == "onnxruntime":
            return self.onnxruntime(key)
        if form == "tensorrt":
            import torch_tensorrt

            engine = torch_tensorrt.compile(
                self.network, inputs=[self.cast(self.timed32)], enabled_precisions={self.plan.dtype}
            )
            return engine, Ran(backend="tensorrt", library="torch_tensorrt"), False
        raise ValueError(form)

    def onnxruntime(self, key: str) -> tuple[Callable[[Any], Any], Ran, bool]:
        import numpy
        import onnxruntime

        torch = self.torch
        path = self.cache / f"{key}.onnx"
        cached = path.exists()
        if not cached:
            self.cache.mkdir(parents=True, exist_ok=True)
            export_onnx(self.network, self.cast(self.timed32[:1]).contiguous(), path)
        provider = "CUDAExecutionProvider" if self.device.type == "cuda" else "CPUExecutionProvider"
        options = onnxruntime.SessionOptions()  # as many intra-op threads as torch: the same cores as every form
        options.intra_op_num_threads, options.inter_op_num_threads = torch.get_num_threads(), 1
        session = onnxruntime.InferenceSession(str(path), options, providers=[provider])

        def run(batch: Any) -> Any:
            if self.device.type != "cuda":
                return torch.from_numpy(session.run(None, {"input": batch.contiguous().numpy()})[0])
            # inputs and outputs stay on the GPU: the same footing as the other forms
            batch = batch.contiguous()
            output = torch.empty((batch.shape[0], *self.reference.shape[1:]), dtype=batch.dtype, device=self.device)
            binding = session.io_binding()
            element = numpy.float16 if batch.dtype == torch.float16 else numpy.float32
            binding.bind_input("input", "cuda", 0, element, list(batch.shape), batch.data_ptr())
            binding.bind_output("output", "cuda", 0, element, list(output.shape), output.data_ptr())
            session.run_with_iobinding(binding)
            return output

        return run, Ran(backend="onnxruntime", provider=provider), cached

    # --- checking and timing ---

    def gate(self, run: Callable[[Any], Any]) -> Gate:
        with self.torch.inference_mode():
            output = run(self.cast(self.probe32)).float()
        scale = float(self.reference.abs().max()) or 1.0
        largest = float((output - self.reference).abs().max())
        tolerance = TOLERANCE[self.plan.precision]
        return Gate(
            max_abs_error=largest, max_rel_error=largest / scale, tolerance=tolerance,
            passed=bool(largest / scale <= tolerance),
        )  # fmt: skip

    def time(self, run: Callable[[Any], Any]) -> Timing:
        batch = self.cast(self.timed32)
        passes: list[float] = []
        with self.torch.inference_mode():
            for _ in range(3):  # warm: kernel choice, CUDA graph capture, allocator growth
                run(batch)
            self.sync()
            deadline = time.monotonic() + self.seconds
            while time.monotonic() < deadline or len(passes) < 5:
                begun = time.perf_counter()
                run(batch)
                self.sync()
                passes.append(time.perf_counter() - begun)
        return Timing(
            throughput_rps=round(best_segment_rps(self.batch_size, passes), 2),
            pass_seconds=round(min(passes), 6),
            passes=len(passes),
        )

    def measure(self, form: str) -> NotBuilt | Built:
        reason = refusal(form, self.device)
        if reason is not None:
            return NotBuilt(form=form, status="refused", reason=reason)
        begun = time.monotonic()
        try:
            run, ran, cached = self.build(form)
            gate = self.gate(run)  # a compiled form compiles on its first call: counted as its build
        except Exception as error:  # a form that cannot be built is a named failure, not the end of the probe
            return NotBuilt(form=form, status="build-failed", reason=f"{type(error).__name__}: {error}"[:600])
        row = Built(
            form=form, precision=self.plan.precision, batch_size=self.batch_size, **ran.model_dump(),
            build_seconds=round(time.monotonic() - begun, 3), cached=cached, gate=gate, status="measured",
        )  # fmt: skip
        if not gate.passed:
            reason = (f"largest error {gate.max_abs_error:.3g} ({gate.max_rel_error:.3g} of the output's range) "
                      f"exceeds {gate.tolerance:g} for {self.plan.precision}")  # fmt: skip
            return row.model_copy(update={"status": "failed-gate", "reason": reason})
        return row.model_copy(update=self.time(run).model_dump())


def main(request: FormsRequest) -> None:
    keep_stdout_for_events()
    started = time.monotonic()
    forms = Forms(request)
    label = forms.torch.cuda.get_device_name(forms.device) if forms.device.type == "cuda" else "cpu"
    emit("ready", device=label, versions=forms.versions)
    for form in request.forms:
        emit("form", **forms.measure(form).model_dump(by_alias=True, exclude_none=True))
    emit("done", seconds=round(time.monotonic() - started, 3))


if __name__ == "__main__":
    main(FormsRequest.model_validate_json(sys.argv[1]))
