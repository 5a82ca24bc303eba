"""Triton's Python backend entry point: servinglab's built-in image classifiers and a user's own TorchScript
file, exported program or ONNX model served by Triton.

servinglab writes it into the model repository as `<model>/1/model.py`, beside `servinglab_imaging.py`
(the decoding, batching and precision code every server runs), `servinglab_image_handler.py` and the
model's build (`build/`: a built-in's `model.py` with `build_model()` and its seeded weights, or the user's
`model.pt`/`model.pt2` with its declared input, `servinglab-input.json`). The model configuration's
parameters say the precision, the warm-up and the top-k of the answer (servinglab's renderer writes them
from the spec).

One request carries one body (an encoded image, a .npy array or a JSON list for a tensor input) as the one
element of the BYTES input; Triton's dynamic batcher hands `execute` the requests of a batch. A request that
cannot be decoded gets its own error; the rest of the batch is served. A built-in answers with its top-k
classes and probabilities. A user's model is loaded, converted and run by the handler's own `load()` and
`run()` (the very code TorchServe and LitServe run) and answers with the handler's JSON (the ANSWER output).

The stub that runs this file ignores PYTHONPATH: the packages it needs (numpy 1 for the stub, then torch
and pillow) are named in SERVINGLAB_TRITON_SITE (:mod:`servinglab.servers.triton.env`) and added first.
"""

from __future__ import annotations

import os
import site
import sys

for _folder in reversed(os.environ.get("SERVINGLAB_TRITON_SITE", "").split(os.pathsep)):
    if _folder and _folder not in sys.path:
        site.addsitedir(_folder)
        sys.path.remove(_folder)
        sys.path.insert(0, _folder)  # ahead of the interpreter's own site-packages

import importlib.util  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from servinglab_datapath import (  # noqa: E402
    compile_model,
    plan_data_path,
    run_model,
    sizes_to_compile,
    warm_up_passes,
)
from servinglab_imaging import (  # noqa: E402
    BadInput,
    apply_precision,
    decode_image,
    load_serialized,
    plan_precision,
    to_batch,
    top_k,
    warm_up,
)

#: The model's build, beside this file.
BUILD_DIR = "build"
#: Beside a user's packed model: its declared input (written by servinglab; the handler reads it).
INPUT_FILE = "servinglab-input.json"
SERIALIZED_FILES = ("model.pt", "model.pt2", "model.onnx")
#: The model's form (`server.form`) as servinglab built and checked it beside the build, by form.
FORM_FILES = {"torchscript": "servinglab-form.pt", "onnxruntime": "servinglab-form.onnx"}


class TritonPythonModel:
    """initialize() once per instance; execute() once per batch of requests."""

    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        parameters = {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}
        self.device = torch.device("cpu")
        if args.get("model_instance_kind") == "GPU" and torch.cuda.is_available():
            self.device = torch.device(f"cuda:{int(args['model_instance_device_id'])}")
            torch.cuda.set_device(self.device)
        self.top_k = int(parameters.get("top_k", "5"))
        build = Path(__file__).resolve().parent / BUILD_DIR
        self.handler: Any = None
        if (build / INPUT_FILE).is_file():
            self._load_user_model(build, parameters, args, int(config.get("max_batch_size", 1)))
            return
        self.plan = plan_precision(parameters.get("precision", "fp32"), self.device)
        print(f"servinglab precision: {self.plan.note}", flush=True)

        definition = _import_file(build / "model.py", f"servinglab_model_{args['model_instance_name']}")
        self.input_size = int(getattr(definition, "INPUT_SIZE", 224))
        form = parameters.get("form", "")
        if form in FORM_FILES:  # the form servinglab built and checked beside the build
            model = load_serialized(build / FORM_FILES[form], self.device, self.plan.allow_tf32)
        else:
            model = definition.build_model()
            model.load_state_dict(torch.load(build / "weights.pt", map_location="cpu", weights_only=True))
        mode = parameters.get("compile", "none")
        largest = max(int(config.get("max_batch_size", 1)), 1)
        # form compile: fixed shapes, a batch padded to the next power of two (one graph each), as on every server;
        # channels-last on a GPU (the plan's default there: it pays off with cuDNN convolutions)
        self.path = plan_data_path({"compile": mode}, self.device, "image", largest)
        self.model = apply_precision(model.to(self.device).eval(), self.plan, self.path.channels_last)
        self.model = compile_model(self.model, self.path)
        print(f"servinglab form: {form or 'eager'}{f', compile {mode}' if mode != 'none' else ''}", flush=True)

        sizes = [int(size) for size in parameters.get("warmup_batch_sizes", "").split(",") if size]
        # each padded size compiles its graph before Triton serves, whatever the budget
        required = sizes_to_compile(self.path, max(sizes, default=largest))
        report = warm_up(self._forward_zeros, sizes, float(parameters.get("warmup_seconds", "60")), required=required,
                         required_passes=warm_up_passes(self.path))  # fmt: skip
        print(f"servinglab warm-up: {json.dumps(report)}", flush=True)

    def _load_user_model(self, build: Path, parameters: dict[str, str], args: dict[str, Any], batch: int) -> None:
        """A user's TorchScript/.pt2 model, loaded, converted and warmed up by the handler (as on every server)."""
        from servinglab_image_handler import ServinglabImageHandler

        settings = {
            "precision": parameters.get("precision", "fp32"),
            "topK": int(parameters.get("top_k", "5")),
            "warmupBatchSizes": [int(size) for size in parameters.get("warmup_batch_sizes", "").split(",") if size],
            "warmupSeconds": float(parameters.get("warmup_seconds", "60")),
            "form": parameters.get("form", ""),
            "dataPath": {"compile": parameters.get("compile", "none")},
        }
        serialized = next(name for name in SERIALIZED_FILES if (build / name).is_file())
        gpu_id = int(args["model_instance_device_id"]) if self.device.type == "cuda" else None
        self.handler = ServinglabImageHandler()
        self.handler.load(build, serialized, None, settings, gpu_id, max(batch, 1))
        print(f"servinglab precision: {self.handler.plan.note}", flush=True)
        print(f"servinglab warm-up: {json.dumps(self.handler.warmup_report)}", flush=True)

    def _forward_zeros(self, size: int) -> None:
        batch = torch.zeros((size, 3, self.input_size, self.input_size), device=self.device, dtype=self.plan.dtype)
        if self.path.channels_last:
            batch = batch.contiguous(memory_format=torch.channels_last)
        run_model(self.model, batch, self.path)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def execute(self, requests: list[Any]) -> list[Any]:
        if self.handler is not None:
            return self._execute_user_model(requests)
        images: list[np.ndarray] = []
        served: list[int] = []
        responses: list[Any] = [None] * len(requests)
        for index, request in enumerate(requests):
            try:
                element = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)
                if element.size != 1:
                    raise BadInput(f"send one image per request, got {element.size}")
                images.append(decode_image(bytes(element[0]), self.input_size))
                served.append(index)
            except BadInput as exc:
                refused = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)  # an HTTP 400
                responses[index] = pb_utils.InferenceResponse(output_tensors=[], error=refused)
        if images:
            batch = to_batch(images, self.device, self.plan.dtype, self.path.channels_last)
            logits = run_model(self.model, batch, self.path)
            for index, predictions in zip(served, top_k(logits, self.top_k), strict=True):
                classes = np.array([[p["class"] for p in predictions]], dtype=np.int64)
                probabilities = np.array([[p["probability"] for p in predictions]], dtype=np.float32)
                responses[index] = pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("CLASSES", classes),
                        pb_utils.Tensor("PROBABILITIES", probabilities),
                    ]
                )
        return responses

    def _execute_user_model(self, requests: list[Any]) -> list[Any]:
        """One batch through the handler's `run()`: each answer its JSON text, each rejection its own error."""
        responses: list[Any] = [None] * len(requests)
        rows: list[dict[str, bytes]] = []
        served: list[int] = []
        for index, request in enumerate(requests):
            element = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)
            if element.size != 1:
                responses[index] = _refused(f"send one body per request, got {element.size}")
                continue
            rows.append({"body": bytes(element[0])})
            served.append(index)
        ran = self.handler.run(rows) if rows else None
        for position, index in enumerate(served):
            assert ran is not None
            if position in ran.rejected:
                responses[index] = _refused(ran.rejected[position])
                continue
            answer = np.array([[ran.responses[position].encode()]], dtype=np.object_)
            responses[index] = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("ANSWER", answer)])
        return responses


def _refused(message: str) -> Any:
    """A request's own error (an HTTP 400); the rest of its batch is served."""
    return pb_utils.InferenceResponse(
        output_tensors=[], error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
    )


def _import_file(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import model definition {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
