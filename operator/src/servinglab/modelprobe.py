"""Parameters and FLOPs of a packed user model (TorchScript or exported program), in a child process.

    python -m servinglab.modelprobe /path/to/packed-model-folder

Started by :func:`count` for the local runner and by `servinglab prepare-model` (the server pod's
init container), so the load-generating process never imports torch. The model is loaded with the
handler's own loader and run once at fp32 on the CPU on one sample of its declared input, under
PyTorch's FLOP counter (matrix products and convolutions: 2 FLOPs per multiply-add). A count that
cannot be made (an operator the counter does not know, a model that fails on zeros) is reported as
null with the reason, never guessed. The figures are kept beside the model (`servinglab-counts.json`).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from servinglab.models import COUNTS_FILE


def count(directory: Path, timeout: float = 300.0) -> dict[str, Any]:
    """{"parameters", "flopsPerInference", "countNote"} for a packed model; cached in the folder."""
    cached = directory / COUNTS_FILE
    if cached.is_file():
        counts: dict[str, Any] = json.loads(cached.read_text())
        return counts
    try:
        child = subprocess.run([sys.executable, "-m", "servinglab.modelprobe", str(directory)],
                               capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"parameters": None, "flopsPerInference": None, "countNote": f"not counted within {timeout:g} s"}
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        tail = (child.stderr.strip().splitlines() or ["no output"])[-1]
        return {"parameters": None, "flopsPerInference": None, "countNote": f"the model did not load: {tail}"}
    counts = json.loads(lines[-1])
    with contextlib.suppress(OSError):  # a read-only cache (a mounted folder) only costs a recount
        cached.write_text(json.dumps(counts))
    return counts


def _measure(directory: Path) -> dict[str, Any]:
    import torch

    from servinglab import ceiling

    imaging = ceiling.handler_imaging()
    model, declared = ceiling.packed_network(str(directory))
    parameters = sum(p.numel() for p in model.parameters())
    if declared["kind"] == "tensor":
        sample = imaging.zeros_sample(declared["shape"], declared["dtype"])
        batch = imaging.tensors_to_batch([sample], torch.device("cpu"), torch.float32)
    else:
        batch = torch.zeros((1, 3, int(declared["size"]), int(declared["size"])))
    note = None
    try:
        flops: int | None = ceiling.flops_of(model, batch)
    except Exception as exc:  # a counter gap must not stop the experiment: say so instead
        flops, note = None, f"FLOPs not counted: {type(exc).__name__}: {exc}"
    if flops == 0:
        flops, note = None, "FLOPs not counted: the counter saw no matrix product or convolution"
    return {"parameters": int(parameters), "flopsPerInference": flops, "countNote": note}


if __name__ == "__main__":
    print(json.dumps(_measure(Path(sys.argv[1]))), flush=True)
