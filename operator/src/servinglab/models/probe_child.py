"""The child process of the model probe (:mod:`.probe`): loads a packed model with the handler's own loader
and counts its parameters, FLOPs and bytes moved on one sample of its declared input; prints one JSON line.

It runs the user's code (loading a `.pt2` unpickles), which is why it is a process of its own, started
where nothing is at stake (no cache, no credentials). An ONNX model is run once in ONNX Runtime on that
sample, through the handler's own session (its output must be a batch the handler can answer from), and
counted from its graph (:mod:`.onnxcount`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from servinglab.api.ceiling import DeclaredInput
from servinglab.models import counting
from servinglab.models.probe import ModelCounts


def _probe_batch(imaging: Any, declared: DeclaredInput) -> Any:
    """One sample of the declared input, all zeros, as the handler feeds it at fp32."""
    import torch

    if declared.kind == "tensor":
        sample = imaging.zeros_sample(declared.shape, declared.dtype)
        return imaging.tensors_to_batch([sample], torch.device("cpu"), torch.float32)
    if declared.size is None:
        raise ValueError("the packed model's declared image input has no size")
    return torch.zeros((1, 3, declared.size, declared.size))


def _measure_onnx(directory: Path) -> ModelCounts:
    """An ONNX model: run once on the probe sample in the handler's session (raises what the run raises, or
    when the output is not a batch of one the handler can answer), then counted from its graph."""
    import onnx

    from servinglab.models import onnxcount

    imaging = counting.handler_imaging()
    model, declared = counting.packed_network(str(directory))
    output = model(_probe_batch(imaging, declared))
    if output.ndim < 1 or output.shape[0] != 1 or (declared.kind == "image" and output.ndim != 2):
        wanted = "[batch, classes] (an image model is answered with its top classes)" if declared.kind == "image" \
            else "batch first"  # fmt: skip
        raise ValueError(f"the ONNX model's first output has shape {list(output.shape)} for one sample; the "
                         f"handler takes it as {wanted}")  # fmt: skip
    graph = onnx.load_model(str(counting.packed_file(str(directory))), load_external_data=False)
    return onnxcount.count(graph, declared)


def _measure(directory: Path) -> ModelCounts:
    if counting.packed_file(str(directory)).suffix == ".onnx":
        return _measure_onnx(directory)
    imaging = counting.handler_imaging()
    model, declared = counting.packed_network(str(directory))
    parameters = sum(p.numel() for p in model.parameters())
    batch = _probe_batch(imaging, declared)
    note = None
    try:
        flops: int | None = counting.flops_of(model, batch)
    except Exception as exc:  # a counter gap must not stop the experiment: say so instead
        flops, note = None, f"FLOPs not counted: {type(exc).__name__}: {exc}"
    if flops == 0:
        flops, note = None, "FLOPs not counted: the counter saw no matrix product or convolution"
    weights: int | None = None
    activations: int | None = None
    if flops is not None:  # the same pass again, counting bytes (it ran once already: it runs)
        try:
            weights, activations = counting.bytes_moved(model, batch)
        except Exception as exc:  # as above: said, not guessed
            note = f"bytes moved not counted: {type(exc).__name__}: {exc}"
    return ModelCounts(parameters=int(parameters), flops_per_inference=flops, weight_bytes=weights,
                       activation_bytes=activations, count_note=note)  # fmt: skip


if __name__ == "__main__":
    print(_measure(Path(sys.argv[1])).line(), flush=True)
