"""A model's size and work, counted with torch: parameters, FLOPs per inference (PyTorch's
FlopCounterMode over one forward pass at batch 1; a multiply-add is 2 FLOPs, matrix products and
convolutions only), and the bytes it moves (the roofline's other axis, :func:`bytes_moved`): its weights,
read once per batch, and its activations per inference.

Imported only by the programs that run as child processes (a model's build, the model probe, the raw
measurement): never by a process that generates load or reconciles. Also how those programs load a model
as servinglab serves it: a built-in with its seeded weights, or a packed TorchScript/.pt2/ONNX model with
its declared input, converted to a precision by the handler's own helpers. (An ONNX model's figures are
counted from its graph: :mod:`.onnxcount`.)
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import Any

from servinglab import paths
from servinglab.api.ceiling import DeclaredInput
from servinglab.models.catalogue import INPUT_FILE, get_builtin, load_module


def handler_imaging() -> ModuleType:
    """The handler's precision helpers, so the raw loop converts the model exactly as the server does."""
    return load_module(paths.handlers_dir() / "servinglab_imaging.py", "servinglab_imaging")


def handler_datapath() -> ModuleType:
    """The handler's data-path helpers (compile, padding), so the raw loop runs the model as served."""
    handler_imaging()  # imported by basename from the data-path module
    return load_module(paths.handlers_dir() / "servinglab_datapath.py", "servinglab_datapath")


def network(model_name: str, weights: bool = False) -> tuple[Any, int]:
    """The built-in model; with `weights`, the very weights its archive serves (calibrated
    BatchNorm: uncalibrated statistics can drive activations into slow denormal arithmetic)."""
    import torch

    builtin = get_builtin(model_name)
    source = load_module(builtin.source)
    torch.manual_seed(builtin.seed)
    built = source.build_model()
    if weights:
        from servinglab.models.builtins import WEIGHTS_FILE, ensure_built

        build = ensure_built(model_name)
        built.load_state_dict(torch.load(build / WEIGHTS_FILE, map_location="cpu", weights_only=True))
    return built.eval(), int(source.INPUT_SIZE)


def packed_file(directory: str) -> Path:
    """The model file servinglab packed in `directory` (model.pt, model.pt2 or model.onnx)."""
    folder = Path(directory)
    return next(p for p in (folder / "model.pt", folder / "model.pt2", folder / "model.onnx") if p.exists())


def packed_network(directory: str) -> tuple[Any, DeclaredInput]:
    """A model servinglab packed (TorchScript, .pt2, or ONNX in an ONNX Runtime session) on the CPU, and its
    declared input."""
    import torch

    folder = Path(directory)
    serialized = packed_file(directory)
    declared = DeclaredInput.model_validate_json((folder / INPUT_FILE).read_text())
    return handler_imaging().load_serialized(serialized, torch.device("cpu")), declared


def flops_of(module: Any, batch: Any) -> int:
    """FLOPs PyTorch's counter sees in one forward pass (matrix products and convolutions, 2 per
    multiply-add); raises what the forward pass raises."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:  # (inference_mode hides the ops from the counter)
        module(batch)
    return int(counter.get_total_flops())


def bytes_moved(module: Any, batch: Any) -> tuple[int, int]:
    """(weight bytes, activation bytes per sample) of one forward pass of `batch` (one sample), at the dtypes
    the module has. Weights: every parameter and buffer, read once per batch. Activations: what an unfused
    eager pass moves, every operator's outputs written once and read once by the next (views move nothing);
    fused kernels and caches move less, so the intensity from these bytes is a lower bound."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Traffic(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.written = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if not func.is_view:
                tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
                self.written += sum(t.numel() * t.element_size() for t in tensors)
            return out

    traffic = Traffic()
    with torch.no_grad(), traffic:
        module(batch)
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors), 2 * traffic.written


@functools.cache
def count_flops(model_name: str) -> float:
    """FLOPs of one inference (batch 1, fp32) of a built-in model."""
    import torch

    built, size = network(model_name)
    return float(flops_of(built, torch.zeros(1, 3, size, size)))


def builtin_counts(model_name: str) -> dict[str, int | float]:
    """Parameters, FLOPs and bytes moved per inference (at fp32) of a built-in model (what its build keeps)."""
    import torch

    network_, size = network(model_name)
    sample = torch.zeros(1, 3, size, size)
    weights, activations = bytes_moved(network_, sample)
    parameters = sum(p.numel() for p in network_.parameters())
    return {"parameters": parameters, "flopsPerInference": flops_of(network_, sample), "weightBytes": weights,
            "activationBytes": activations}  # fmt: skip
