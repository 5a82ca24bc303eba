"""TorchServe entry point: one batched handler for every model servinglab packs, and the model runner
LitServe's entry point (`servinglab_litserve_api.py`) drives.

It serves the built-in image classifiers (a `model.py` with `build_model()` and a state dict) and the
user's own TorchScript files and exported programs (`model.pt` / `model.pt2`, with the input declared
in `servinglab-input.json`: an image of a size, or a tensor of a shape and dtype).

TorchServe imports this file by basename and requires exactly one class in it, so the plain
functions live in `servinglab_imaging.py` (shipped alongside). The handler deliberately does not
subclass `ts.torch_handler.base_handler.BaseHandler`: that module switches TF32 on globally at import
and hides model loading; here the model comes from the archive's `build_model()` and a state dict,
and the precision is applied exactly as the experiment's model-config.yaml asks
(`handler: {precision, channelsLast, warmupBatchSizes, warmupSeconds, topK}`).

`load()` and `run()` are the server-neutral halves (a model folder and settings in; rows of request
bodies in, answers, rejections and stage timings out); `initialize()` and `handle()` adapt them to
TorchServe's context. Per batch, under TorchServe, it records timings as TorchServe metrics (declared in
the metrics.yaml the runner renders): counters of milliseconds spent in preprocess / inference /
postprocess, batches and batched requests (so the server-side breakdown and the mean batch size are
exact over any window), and a gauge with the last batch size.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from servinglab_imaging import (
    BadInput,
    BatchRun,
    apply_precision,
    decode_image,
    decode_tensor,
    error_response,
    json_response,
    load_serialized,
    plan_precision,
    request_body,
    tensor_outputs,
    tensors_to_batch,
    to_batch,
    top_k,
    warm_up,
    zeros_sample,
)

#: Written by servinglab next to a packed TorchScript/.pt2 model: what one request decodes to.
INPUT_FILE = "servinglab-input.json"

logger = logging.getLogger(__name__)


class ServinglabImageHandler:
    """initialize() once per worker; handle() once per batch."""

    def __init__(self) -> None:
        self.initialized = False
        self.model: torch.nn.Module | None = None
        self.device = torch.device("cpu")
        self.input_size = 224
        self.input: dict[str, Any] = {"kind": "image"}
        self.top_k = 5
        self.channels_last = False
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
        # channels_last pays off with cuDNN/oneDNN convolutions on GPUs; default on there only.
        self.channels_last = bool(settings.get("channelsLast", self.device.type == "cuda"))
        self.plan = plan_precision(str(settings.get("precision", "fp32")), self.device)
        logger.info("servinglab precision: %s", self.plan.note)

        serialized = model_dir / serialized_file
        if model_file:  # a built-in: its definition and seeded weights
            module = _import_file(model_dir / model_file, "servinglab_model_definition")
            self.input_size = int(getattr(module, "INPUT_SIZE", 224))
            model = module.build_model()
            model.load_state_dict(torch.load(serialized, map_location="cpu", weights_only=True))
            model = model.to(self.device).eval()
        else:  # the user's TorchScript or exported program, with its declared input
            self.input = json.loads((model_dir / INPUT_FILE).read_text())
            self.input_size = int(self.input.get("size", 224))
            model = load_serialized(serialized, self.device)
            if self.input["kind"] != "image":
                self.channels_last = False  # a memory format for 4-D image batches only
        self.model = apply_precision(model, self.plan, self.channels_last)
        sizes = settings.get("warmupBatchSizes")
        if sizes is None:  # an archive rendered without the list: every power of two up to batch_size
            sizes = sorted({min(2**i, batch_size) for i in range(batch_size.bit_length() + 1)})
        report = warm_up(self._forward_zeros, [int(s) for s in sizes], float(settings.get("warmupSeconds", 60.0)))
        self.warmup_report = report
        logger.info("servinglab warm-up: %s", json.dumps(report))
        self.initialized = True

    def _forward_zeros(self, size: int) -> None:
        """One forward pass at batch `size`, so the first requests are not measured while
        cuDNN/oneDNN pick kernels and allocators grow."""
        assert self.model is not None
        with torch.inference_mode():
            self.model(self._zeros(size))
        self._synchronize()

    def _zeros(self, size: int) -> torch.Tensor:
        if self.input["kind"] == "tensor":
            sample = zeros_sample(self.input["shape"], self.input["dtype"])
            return tensors_to_batch([sample] * size, self.device, self.plan.dtype)
        dummy = torch.zeros((size, 3, self.input_size, self.input_size), device=self.device, dtype=self.plan.dtype)
        return dummy.contiguous(memory_format=torch.channels_last) if self.channels_last else dummy

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
        started = time.perf_counter()
        samples: list[Any] = []
        valid: list[int] = []
        responses: list[str] = [""] * len(data)
        rejected: dict[int, str] = {}
        tensor_input = self.input["kind"] == "tensor"
        for index, row in enumerate(data):
            try:
                body = request_body(row)
                if tensor_input:
                    samples.append(decode_tensor(body, self.input["shape"], self.input["dtype"]))
                else:
                    samples.append(decode_image(body, self.input_size))
                valid.append(index)
            except BadInput as exc:
                responses[index] = error_response(str(exc))
                rejected[index] = str(exc)
        batch = None
        if samples:
            batch = (
                tensors_to_batch(samples, self.device, self.plan.dtype)
                if tensor_input
                else to_batch(samples, self.device, self.plan.dtype, self.channels_last)
            )
        preprocessed = time.perf_counter()

        logits = None
        if batch is not None:
            assert self.model is not None
            with torch.inference_mode():
                logits = self.model(batch)
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
