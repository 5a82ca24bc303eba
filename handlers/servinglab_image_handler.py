"""TorchServe entry point: one batched handler for every model servinglab packs, and the model runner
LitServe's entry point (`servinglab_litserve_api.py`) drives.

It serves the built-in image classifiers (a `model.py` with `build_model()` and a state dict) and the
user's own TorchScript files, exported programs and ONNX models (`model.pt` / `model.pt2` / `model.onnx`,
with the input declared in `servinglab-input.json`: an image of a size, or a tensor of a shape and dtype).
An ONNX model runs in an ONNX Runtime session behind a module's call (`OnnxModel`), so decoding, batching,
warm-up and answers are the same; it runs at fp32 (tf32 on a GPU), without torch.compile.

TorchServe imports this file by basename and requires exactly one class in it, so the plain
functions live in `servinglab_imaging.py` and the data path (decode, transfer, copies, compile) in
`servinglab_datapath.py`, both shipped alongside and free of TorchServe. The handler deliberately does not
subclass `ts.torch_handler.base_handler.BaseHandler`: that module switches TF32 on globally at import
and hides model loading; here the model comes from the archive's `build_model()` and a state dict,
and the precision is applied exactly as the experiment's model-config.yaml asks
(`handler: {precision, dataPath, warmupBatchSizes, warmupSeconds, topK}`); it logs how the precision
and the data path were realised ("servinglab precision: ...", "servinglab data path: {json}").

`load()` and `run()` are the server-neutral halves (a model folder and settings in; rows of request
bodies in, answers, rejections and stage timings out); `initialize()` and `handle()` adapt them to
TorchServe's context. Per batch, under TorchServe, it records timings as TorchServe metrics (declared in
the metrics.yaml the runner renders): counters of milliseconds spent in preprocess / inference /
postprocess, batches and batched requests (so the server-side breakdown and the mean batch size are
exact over any window), and a gauge with the last batch size.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from servinglab_datapath import (
    BatchMaker,
    compile_model,
    plan_data_path,
    powers_of_two_up_to,
    sizes_to_compile,
    warm_up_passes,
)
from servinglab_imaging import (
    BadInput,
    BatchRun,
    OnnxModel,
    apply_precision,
    error_response,
    json_response,
    load_serialized,
    onnx_refusal,
    plan_precision,
    request_body,
    tensor_outputs,
    tensors_to_batch,
    top_k,
    warm_up,
    zeros_sample,
)

#: Written by servinglab next to a packed TorchScript/.pt2 model: what one request decodes to.
INPUT_FILE = "servinglab-input.json"
#: The model's form (`server.form`) as servinglab built and checked it beside the model, by form.
FORM_FILES = {"torchscript": "servinglab-form.pt", "onnxruntime": "servinglab-form.onnx"}

logger = logging.getLogger(__name__)


class ServinglabImageHandler:
    """initialize() once per worker; handle() once per batch."""

    def __init__(self) -> None:
        self.initialized = False
        self.model: Any = None
        self.device = torch.device("cpu")
        self.input_size = 224
        self.input: dict[str, Any] = {"kind": "image"}
        self.top_k = 5
        self.batches: BatchMaker | None = None
        self.warmup_report: dict[str, Any] = {}

    # -- lifecycle -------------------------------------------------------------------------------

    def initialize(self, context: Any) -> None:
        """TorchServe's: the model folder, GPU and batch size from its context, the settings from the
        experiment's model-config.yaml."""
        properties = context.system_properties
        settings = (getattr(context, "model_yaml_config", None) or {}).get("handler", {}) or {}
        manifest_model = context.manifest["model"]
        self.load(
            Path(properties["model_dir"]), manifest_model["serializedFile"], manifest_model.get("modelFile"),
            settings, properties.get("gpu_id"), int(properties.get("batch_size") or 1),
        )  # fmt: skip

    def load(
        self, model_dir: Path, serialized_file: str, model_file: str | None, settings: dict[str, Any],
        gpu_id: int | None, batch_size: int,
    ) -> None:  # fmt: skip
        """Any server's: load the model (a built-in's `model_file` and state dict, or the user's serialized
        model with its declared input), apply the precision and warm up, on GPU `gpu_id` if CUDA is there."""
        if torch.cuda.is_available() and gpu_id is not None:
            self.device = torch.device(f"cuda:{int(gpu_id)}")
            torch.cuda.set_device(self.device)
        self.top_k = int(settings.get("topK", 5))
        self.plan = plan_precision(str(settings.get("precision", "fp32")), self.device)

        serialized = model_dir / serialized_file
        form = str(settings.get("form") or "")
        built = model_dir / FORM_FILES[form] if form in FORM_FILES else None  # the form servinglab built and gated
        if built is not None and not built.is_file():
            if model_file:
                raise ValueError(f"server.form: {form}: {built.name} was not built beside the model")
            built = None  # a user's model already in that form, served as it comes
        if model_file:  # a built-in: its definition and seeded weights
            module = _import_file(model_dir / model_file, "servinglab_model_definition")
            self.input_size = int(getattr(module, "INPUT_SIZE", 224))
            if built is not None:
                model = load_serialized(built, self.device, self.plan.allow_tf32)
            else:
                model = module.build_model()
                model.load_state_dict(torch.load(serialized, map_location="cpu", weights_only=True))
                model = model.to(self.device).eval()
        else:  # the user's TorchScript or exported program, with its declared input
            self.input = json.loads((model_dir / INPUT_FILE).read_text())
            self.input_size = int(self.input.get("size", 224))
            model = load_serialized(built or serialized, self.device, self.plan.allow_tf32)
        self.input["size"] = self.input_size
        path = plan_data_path(settings.get("dataPath"), self.device, self.input["kind"], batch_size)
        if isinstance(model, OnnxModel):  # what ONNX Runtime cannot do is refused, naming the setting
            if (refusal := onnx_refusal(model, self.plan.dtype, path.compile, batch_size)) is not None:
                raise ValueError(refusal)
            self.plan = dataclasses.replace(self.plan, note=f"{self.plan.note}; {model.note}")
        logger.info("servinglab precision: %s", self.plan.note)
        self.batches = BatchMaker(path, self.device, self.plan.dtype, self.input)
        self.model = compile_model(apply_precision(model, self.plan, path.channels_last), path)
        logger.info("servinglab data path: %s", json.dumps(path.report(self.input["kind"])))
        sizes = settings.get("warmupBatchSizes")
        if sizes is None:  # an archive rendered without the list: every power of two up to batch_size
            sizes = powers_of_two_up_to(batch_size)
        sizes = [int(s) for s in sizes]
        # a compiled model compiles each padded size it can be asked for before it serves, whatever the budget
        required = sizes_to_compile(path, max(sizes, default=batch_size))
        report = warm_up(self._forward_zeros, sizes, float(settings.get("warmupSeconds", 60.0)), required=required,
                         required_passes=warm_up_passes(path))  # fmt: skip
        self.warmup_report = report
        logger.info("servinglab warm-up: %s", json.dumps(report))
        self.initialized = True

    def _forward_zeros(self, size: int) -> None:
        """One forward pass at batch `size`, so the first requests are not measured while
        cuDNN/oneDNN pick kernels and allocators grow."""
        assert self.model is not None and self.batches is not None
        self.batches.forward(self.model, self._zeros(size))
        self._synchronize()

    def _zeros(self, size: int) -> torch.Tensor:
        if self.input["kind"] == "tensor":
            sample = zeros_sample(self.input["shape"], self.input["dtype"])
            return tensors_to_batch([sample] * size, self.device, self.plan.dtype)
        dummy = torch.zeros((size, 3, self.input_size, self.input_size), device=self.device, dtype=self.plan.dtype)
        assert self.batches is not None
        return dummy.contiguous(memory_format=torch.channels_last) if self.batches.plan.channels_last else dummy

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- per batch -------------------------------------------------------------------------------

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[str]:
        """TorchServe's: one batch, a rejected request answered 400 alone, the timings as its metrics."""
        ran = self.run(data)
        for index, message in ran.rejected.items():
            context.set_response_status(400, message, idx=index)
        self._record(context.metrics, len(data), *ran.timings)
        return ran.responses

    def run(self, data: list[dict[str, Any]]) -> BatchRun:
        """Any server's: one batch of request rows ({"body": ...}) -> one JSON answer per row."""
        assert self.model is not None and self.batches is not None
        started = time.perf_counter()
        responses: list[str] = [""] * len(data)
        rejected: dict[int, str] = {}
        tensor_input = self.input["kind"] == "tensor"
        rows: list[int] = []  # which request each body came from
        bodies: list[bytes] = []
        for index, row in enumerate(data):
            try:
                bodies.append(request_body(row))
                rows.append(index)
            except BadInput as exc:
                responses[index] = error_response(str(exc))
                rejected[index] = str(exc)
        made = self.batches.make(bodies)
        for position, message in made.errors.items():
            responses[rows[position]] = error_response(message)
            rejected[rows[position]] = message
        valid = [rows[position] for position in made.valid]
        self._synchronize()  # the copies and conversion count as preprocessing, not inference
        preprocessed = time.perf_counter()

        logits = None
        if made.batch is not None:
            logits = self.batches.forward(self.model, made.batch)
            self._synchronize()
        inferred = time.perf_counter()

        if logits is not None and tensor_input:
            for index, outputs in zip(valid, tensor_outputs(logits), strict=True):
                responses[index] = json.dumps(outputs, separators=(",", ":"))
        elif logits is not None:
            for index, predictions in zip(valid, top_k(logits, self.top_k), strict=True):
                responses[index] = json_response(predictions)
        finished = time.perf_counter()
        return BatchRun(responses, rejected, (started, preprocessed, inferred, finished))

    @staticmethod
    def _record(metrics: Any, size: int, t0: float, t1: float, t2: float, t3: float) -> None:
        """Counters (not last-value gauges) so any window's means are exact differences."""
        from ts.metrics.metric_type_enum import MetricTypes

        counter, gauge = MetricTypes.COUNTER, MetricTypes.GAUGE
        metrics.add_metric("ServinglabBatches", 1, unit="count", metric_type=counter)
        metrics.add_metric("ServinglabBatchedRequests", size, unit="count", metric_type=counter)
        metrics.add_metric("ServinglabPreprocessMs", (t1 - t0) * 1e3, unit="ms", metric_type=counter)
        metrics.add_metric("ServinglabInferenceMs", (t2 - t1) * 1e3, unit="ms", metric_type=counter)
        metrics.add_metric("ServinglabPostprocessMs", (t3 - t2) * 1e3, unit="ms", metric_type=counter)
        metrics.add_metric("ServinglabLastBatchSize", size, unit="count", metric_type=gauge)


def _import_file(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import model definition {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
