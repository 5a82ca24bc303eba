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

The arithmetic is pure; :func:`measure_raw` and :func:`count_flops` import torch. The local runner
measures all three after the server has stopped (so they do not compete with it for the machine);
the load Job (`servinglab loadtest`) reports FLOPs and the theoretical figure for the accelerator
its server is pinned to, the raw figure needing the GPU it does not run on.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from servinglab import models, paths
from servinglab.results import meets_slo
from servinglab.spec import ExperimentSpec, ServerSpec

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
        # four significant digits: a tiny model uses a hundred-thousandth of a T4
        return float(f"{served_rps / reference:.4g}") if served_rps and reference else None

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
    notes = []
    if raw_rps is None:
        notes.append("raw throughput is measured by local runs (servinglab run), on the machine that serves")
    if accelerator is None:
        notes.append("no peak figure for this device (CPU); served/theoretical needs a known accelerator")
    elif peak is None:
        notes.append(f"{accelerator} has no {precision} hardware path")
    if notes:
        report["note"] = "; ".join(notes)
    return report


def accelerator_from_spec(server: ServerSpec) -> str | None:
    """The accelerator the server is pinned to by its node selector (GPU feature discovery's
    `nvidia.com/gpu.product`, e.g. Tesla-T4), if any."""
    if server.gpus == 0:
        return None
    product = server.node_selector.get("nvidia.com/gpu.product")
    return accelerator_of(product.replace("-", " ")) if product else None


def served_rps(entries: list[dict[str, Any]], slo_p99_ms: float | None) -> float | None:
    """The served figure a ceiling compares: the highest throughput, among levels within the SLO if set."""
    within = [
        float(e["throughputRps"])
        for e in entries
        if slo_p99_ms is None or meets_slo(e.get("latencyMs", {}).get("p99"), e["errors"], slo_p99_ms)
    ]
    return max(within, default=None)


def for_experiment(
    spec: ExperimentSpec, entries: list[dict[str, Any]], raw: tuple[float, str] | None
) -> dict[str, Any] | None:
    """The ceiling block for a finished run: `raw` is (in-process rps, device name) when measured
    (local runs); otherwise the accelerator comes from the server's node selector (the load Job)."""
    if spec.model.name not in models.BUILTINS:
        return None  # FLOPs are counted from the built-in models' code
    if raw is not None:
        raw_rps, device = raw
        accelerator = accelerator_of(device) if device != "cpu" else None
    else:
        raw_rps, accelerator = None, accelerator_from_spec(spec.server)
    served = served_rps(entries, spec.slo.p99_latency_ms)
    precision = str(spec.server.precision)
    return ceiling_report(served, count_flops(spec.model.name), raw_rps, accelerator, precision, spec.server.batch_size)


# -- measurements (torch) ----------------------------------------------------------------------------


def _imaging() -> ModuleType:
    """The handler's precision helpers, so the raw loop converts the model exactly as the server does."""
    return models.load_module(paths.handlers_dir() / "servinglab_imaging.py", "servinglab_imaging")


def _network(model_name: str, weights: bool = False) -> tuple[Any, int]:
    """The built-in model; with `weights`, the very weights its archive serves (calibrated
    BatchNorm: uncalibrated statistics can drive activations into slow denormal arithmetic)."""
    import torch

    builtin = models.get_builtin(model_name)
    source = models.load_module(builtin.source)
    torch.manual_seed(builtin.seed)
    network = source.build_model()
    if weights:
        archive = models.ensure_built(model_name)
        network.load_state_dict(torch.load(archive / models.WEIGHTS_FILE, map_location="cpu", weights_only=True))
    return network.eval(), int(source.INPUT_SIZE)


def count_flops(model_name: str) -> float:
    """FLOPs of one inference (batch 1, fp32) of a built-in model."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    network, size = _network(model_name)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:  # (inference_mode hides the ops from the counter)
        network(torch.zeros(1, 3, size, size))
    return float(counter.get_total_flops())


RAW_SEGMENTS = 5


def measure_raw(
    model_name: str, precision: str, batch_size: int, device_name: str = "cpu", seconds: float = 5.0
) -> tuple[float, str]:
    """Inferences per second of the model alone at this batch size and precision, the best of
    RAW_SEGMENTS equal parts of `seconds`; (rps, device name)."""
    import torch

    device = torch.device(device_name)
    imaging = _imaging()
    plan = imaging.plan_precision(precision, device)
    network, size = _network(model_name, weights=True)
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
        # The best of several segments: a ceiling is what the model reaches undisturbed, and a
        # shared machine's background work only ever slows a segment down.
        rates = []
        for _ in range(RAW_SEGMENTS):
            iterations, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds / RAW_SEGMENTS or iterations < 2:
                network(batch)
                iterations += 1
                if iterations % 4 == 0:
                    sync()
            sync()
            rates.append(iterations * batch_size / (time.perf_counter() - started))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return max(rates), name
