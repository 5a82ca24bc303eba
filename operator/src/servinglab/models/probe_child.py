"""The child process of the model probe (:mod:`.probe`): loads a packed model with the handler's own loader
and counts its parameters, FLOPs and bytes moved on one sample of its declared input; prints one JSON line.

It runs the user's code (loading a `.pt2` unpickles), which is why it is a process of its own, started
where nothing is at stake (no cache, no credentials).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from servinglab.models import counting


def _measure(directory: Path) -> dict[str, Any]:
    import torch

    imaging = counting.handler_imaging()
    model, declared = counting.packed_network(str(directory))
    parameters = sum(p.numel() for p in model.parameters())
    if declared["kind"] == "tensor":
        sample = imaging.zeros_sample(declared["shape"], declared["dtype"])
        batch = imaging.tensors_to_batch([sample], torch.device("cpu"), torch.float32)
    else:
        batch = torch.zeros((1, 3, int(declared["size"]), int(declared["size"])))
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
    return {"parameters": int(parameters), "flopsPerInference": flops, "weightBytes": weights,
            "activationBytes": activations, "countNote": note}  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(_measure(Path(sys.argv[1]))), flush=True)
