"""How far a served result is from what the model and the hardware could do.

Three numbers put a served throughput in context:

* **FLOPs per inference**, counted from the model itself (PyTorch's FlopCounterMode over one forward
  pass at batch 1; a multiply-add counts as 2 FLOPs);
* **raw throughput**: the same model, weights precision and batch size run in-process in a tight
  loop — no server, no HTTP, no decoding — so served/raw is what serving costs;
* **theoretical throughput**: the accelerator's dense peak at that precision divided by the FLOPs
  per inference, so served/theoretical says how much of the chip the answer uses. Peaks are the
  vendors' dense (no structured sparsity) tensor/CUDA-core figures for the SXM/PCIe parts named;
  there is no entry for CPUs, whose peak depends on the exact part.

The arithmetic is pure; :func:`measure_raw` and :func:`count_flops` import torch and are called by
the local runner after the server has stopped (so they do not compete with it for the machine).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from types import ModuleType
from typing import Any

from servinglab import models, paths

#: Dense peak TFLOPS by accelerator and precision (None: the precision has no hardware path there).
#: Sources: NVIDIA datasheets — T4 (Turing: no TF32/BF16), L4, A10G (AWS G5), A100 SXM4, H100 SXM5,
#: H200 SXM (same compute as H100 SXM). Sparsity figures halved to dense.
PEAK_TFLOPS: dict[str, dict[str, float | None]] = {
    "T4": {"fp32": 8.1, "tf32": None, "fp16": 65.0, "bf16": None},
    "L4": {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0},
    "A10G": {"fp32": 31.2, "tf32": 35.0, "fp16": 70.0, "bf16": 70.0},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    "H100": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
}


def accelerator_of(device_name: str) -> str | None:
    """The PEAK_TFLOPS key for a device name such as 'Tesla T4' or 'NVIDIA H100 80GB HBM3'."""
    upper = device_name.upper().replace("-", " ")
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):  # A10G before A100's prefix checks
        if f" {key}" in f" {upper}" or upper.startswith(key):
            return key
    return None


def theoretical_rps(flops_per_inference: float, peak_tflops: float | None) -> float | None:
    """Inferences per second the peak would allow if every FLOP were useful."""
    if peak_tflops is None or flops_per_inference <= 0:
        return None
    return peak_tflops * 1e12 / flops_per_inference


def ceiling_report(
    served_rps: float | None,
    flops_per_inference: float,
    raw_rps: float | None,
    accelerator: str | None,
    precision: str,
    batch_size: int,
) -> dict[str, Any]:
    """The `ceiling` block of a results document: the three references and the two ratios."""
    peak = PEAK_TFLOPS.get(accelerator or "", {}).get(precision) if accelerator else None
    theoretical = theoretical_rps(flops_per_inference, peak)

    def ratio(reference: float | None) -> float | None:
        return round(served_rps / reference, 4) if served_rps and reference else None

    report: dict[str, Any] = {
        "flopsPerInference": int(flops_per_inference),
        "rawThroughputRps": round(raw_rps, 3) if raw_rps is not None else None,
        "rawBatchSize": batch_size,
        "accelerator": accelerator,
        "peakTflops": peak,
        "theoreticalRps": round(theoretical, 3) if theoretical is not None else None,
        "servedRps": served_rps,
        "servedOverRaw": ratio(raw_rps),
        "servedOverTheoretical": ratio(theoretical),
    }
    if accelerator is None:
        report["note"] = "no peak figure for this device (CPU); served/theoretical needs a known accelerator"
    elif peak is None:
        report["note"] = f"{accelerator} has no {precision} hardware path"
    return report


# -- measurements (torch) ----------------------------------------------------------------------------


def _imaging() -> ModuleType:
    """The handler's precision helpers, so the raw loop converts the model exactly as the server does."""
    path = paths.handlers_dir() / "servinglab_imaging.py"
    spec = importlib.util.spec_from_file_location("servinglab_imaging", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return sys.modules[spec.name]


def _network(model_name: str) -> tuple[Any, int]:
    import torch

    builtin = models.get_builtin(model_name)
    source = models._load_module(builtin.source)
    torch.manual_seed(builtin.seed)
    return source.build_model().eval(), int(source.INPUT_SIZE)


def count_flops(model_name: str) -> float:
    """FLOPs of one inference (batch 1, fp32) of a built-in model."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    network, size = _network(model_name)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:  # (inference_mode hides the ops from the counter)
        network(torch.zeros(1, 3, size, size))
    return float(counter.get_total_flops())


def measure_raw(
    model_name: str, precision: str, batch_size: int, device_name: str = "cpu", seconds: float = 5.0
) -> tuple[float, str]:
    """Inferences per second of the model alone at this batch size and precision; (rps, device)."""
    import torch

    device = torch.device(device_name)
    imaging = _imaging()
    plan = imaging.plan_precision(precision, device)
    network, size = _network(model_name)
    channels_last = device.type == "cuda"  # the handler's default
    network = imaging.apply_precision(network.to(device), plan, channels_last)
    batch = torch.randn(batch_size, 3, size, size, generator=torch.Generator().manual_seed(0))
    batch = batch.to(device=device, dtype=plan.dtype)
    if channels_last:
        batch = batch.contiguous(memory_format=torch.channels_last)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with torch.inference_mode():
        for _ in range(3):  # warm-up: allocator, cuDNN/oneDNN algorithm choice
            network(batch)
        sync()
        iterations, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds or iterations < 3:
            network(batch)
            iterations += 1
            if iterations % 4 == 0:
                sync()
        sync()
        elapsed = time.perf_counter() - started
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return iterations * batch_size / elapsed, name
