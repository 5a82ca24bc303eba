"""Triton's Python backend entry point: servinglab's built-in image classifiers served by Triton.

servinglab writes it into the model repository as `<model>/1/model.py`, beside `servinglab_imaging.py`
(the decoding, batching and precision code every server runs) and the model's build (`build/`: its
`model.py` with `build_model()` and its seeded weights). The model configuration's parameters say the
precision, the warm-up and the top-k of the answer (servinglab's renderer writes them from the spec).

One request carries one encoded image (JPEG, PNG or a .npy uint8 tensor) as the one element of the BYTES
input; Triton's dynamic batcher hands `execute` the requests of a batch. A request that cannot be decoded
gets its own error; the rest of the batch is served. The answer is the top-k classes and probabilities.

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

from servinglab_imaging import (  # noqa: E402
    BadInput,
    apply_precision,
    decode_image,
    plan_precision,
    to_batch,
    top_k,
    warm_up,
)

#: The model's build, beside this file.
BUILD_DIR = "build"


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
        self.channels_last = self.device.type == "cuda"  # pays off with cuDNN convolutions
        self.plan = plan_precision(parameters.get("precision", "fp32"), self.device)
        print(f"servinglab precision: {self.plan.note}", flush=True)

        build = Path(__file__).resolve().parent / BUILD_DIR
        definition = _import_file(build / "model.py", f"servinglab_model_{args['model_instance_name']}")
        self.input_size = int(getattr(definition, "INPUT_SIZE", 224))
        model = definition.build_model()
        model.load_state_dict(torch.load(build / "weights.pt", map_location="cpu", weights_only=True))
        self.model = apply_precision(model.to(self.device).eval(), self.plan, self.channels_last)

        sizes = [int(size) for size in parameters.get("warmup_batch_sizes", "").split(",") if size]
        report = warm_up(self._forward_zeros, sizes, float(parameters.get("warmup_seconds", "60")))
        print(f"servinglab warm-up: {json.dumps(report)}", flush=True)

    def _forward_zeros(self, size: int) -> None:
        batch = torch.zeros((size, 3, self.input_size, self.input_size), device=self.device, dtype=self.plan.dtype)
        if self.channels_last:
            batch = batch.contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            self.model(batch)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def execute(self, requests: list[Any]) -> list[Any]:
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
            batch = to_batch(images, self.device, self.plan.dtype, self.channels_last)
            with torch.inference_mode():
                logits = self.model(batch)
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


def _import_file(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import model definition {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
