"""How far a served result is from what the model and the hardware could do.

Three numbers put a served throughput in context:

* **FLOPs per inference**, counted from the model itself (PyTorch's FlopCounterMode over one forward
  pass at batch 1; a multiply-add counts as 2 FLOPs);
* **raw throughput**, the model alone in a tight loop (no server, no HTTP, no decoding), as two
  figures: at the batch size the server actually *formed* at the served level (from the handler's
  counters), so served/raw is what serving costs as it ran; and the *best* over batch sizes up to the
  configured maximum (powers of two), so served/best-raw says what a better configuration could reach;
* **theoretical throughput**: the accelerator's dense peak at that precision divided by the FLOPs
  per inference, so served/theoretical says how much of the chip the answer uses. Peaks are the
  vendors' dense (no structured sparsity) tensor/CUDA-core figures for the SXM/PCIe parts named;
  there is no entry for CPUs, whose peak depends on the exact part.

The arithmetic and the choice of batch sizes are pure; :func:`count_flops` and :func:`network` import
torch, and the raw figures are measured in a child process (:mod:`servinglab.rawprobe`) within the
`ceiling.rawSeconds` budget. The local runner measures after the server has stopped (so they do not
compete with it for the machine; a sweep's trials share a cache of the figures); the load Job
(`servinglab loadtest`) reports FLOPs and the theoretical figure for the accelerator its server is
pinned to, the raw figure needing the GPU it does not run on.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from servinglab import models, paths
from servinglab.results import meets_slo
from servinglab.api import ExperimentSpec, ServerSpec
from servinglab.tsconfig import powers_of_two_up_to

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


def ratio(served: float | None, reference: float | None) -> float | None:
    """served / reference to four significant digits (a tiny model uses a hundred-thousandth of a T4)."""
    return float(f"{served / reference:.4g}") if served and reference else None


def formed_batch_size(level: dict[str, Any] | None, configured: int) -> tuple[int, float | None]:
    """(batch size to measure the model alone at, the server's mean formed batch) for a served level:
    the mean batch TorchServe formed, rounded, within 1..configured; the configured size when unknown."""
    mean = ((level or {}).get("server") or {}).get("meanBatchSize")
    if mean is None:
        return configured, None
    return max(1, min(configured, round(float(mean)))), float(mean)


def scan_batch_sizes(formed: int, configured: int) -> list[int]:
    """The sizes the raw probe measures, in order: the formed size first, then powers of two up to the
    configured maximum (and the maximum itself), smallest first so each estimates the next's time."""
    return [formed, *(size for size in powers_of_two_up_to(configured) if size != formed)]


def raw_block(formed_mean: float | None, formed: int, figures: Any | None, budget: float) -> dict[str, Any]:
    """The raw part of the ceiling from a probe's :class:`~servinglab.rawprobe.RawFigures`."""
    if figures is None:
        return {"rawBatchSize": formed, "formedBatchSizeMean": formed_mean}
    rows = [figures.measured[b] for b in sorted(figures.measured)]
    best = max(rows, key=lambda row: row["throughputRps"], default=None)
    at_formed = figures.measured.get(formed)
    return {
        "rawBatchSize": formed,
        "formedBatchSizeMean": formed_mean,
        "rawAtFormedBatchRps": at_formed["throughputRps"] if at_formed else None,
        "rawBestRps": best["throughputRps"] if best else None,
        "rawBestBatchSize": best["batchSize"] if best else None,
        "rawDevice": figures.device,
        "rawBudgetSeconds": budget,
        "rawMeasureSeconds": figures.measure_seconds,
        "rawSetupSeconds": figures.setup_seconds,
        "rawTable": rows,
        "rawSkipped": [{"batchSize": b, "reason": why} for b, why in sorted(figures.skipped.items())],
        "rawReusedBatchSizes": figures.from_cache,
    }


def ceiling_report(
    served_rps: float | None,
    flops_per_inference: float,
    raw: dict[str, Any],
    accelerator: str | None,
    precision: str,
) -> dict[str, Any]:
    """The `ceiling` block of a results document: the references and the ratios to them."""
    peak = PEAK_TFLOPS.get(accelerator or "", {}).get(precision) if accelerator else None
    theoretical = theoretical_rps(flops_per_inference, peak)
    report: dict[str, Any] = {
        "flopsPerInference": int(flops_per_inference),
        **raw,
        "accelerator": accelerator,
        "peakTflops": peak,
        "theoreticalRps": round(theoretical, 3) if theoretical is not None else None,
        "servedRps": served_rps,
        "servedOverRaw": ratio(served_rps, raw.get("rawAtFormedBatchRps")),
        "servedOverBestRaw": ratio(served_rps, raw.get("rawBestRps")),
        "servedOverTheoretical": ratio(served_rps, theoretical),
    }
    notes = []
    if "rawTable" not in raw:
        notes.append("raw throughput is measured by local runs (servinglab run), on the machine that serves")
    elif raw.get("rawAtFormedBatchRps") is None:
        notes.append(f"the model alone could not be measured at the formed batch size {raw['rawBatchSize']}")
    if raw.get("formedBatchSizeMean") is None and "rawTable" in raw:
        notes.append("the formed batch size is unknown (no handler counters); the configured one is used")
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


def served_level(entries: list[dict[str, Any]], slo_p99_ms: float | None) -> dict[str, Any] | None:
    """The level a ceiling compares: the highest throughput, among levels within the SLO if set."""
    within: list[dict[str, Any]] = [
        e
        for e in entries
        if slo_p99_ms is None or meets_slo(e.get("latencyMs", {}).get("p99"), e["errors"], slo_p99_ms)
    ]
    return max(within, key=lambda e: float(e["throughputRps"])) if within else None


def for_experiment(
    spec: ExperimentSpec,
    entries: list[dict[str, Any]],
    figures: Any | None = None,
    device_kind: str | None = None,
    flops: float | None = None,
) -> dict[str, Any] | None:
    """The ceiling block for a finished run. `figures` are the raw probe's (local runs, measured at
    :func:`plan` 's sizes on `device_kind` "cpu"/"cuda"); without them (the load Job) the accelerator
    comes from the server's node selector."""
    if spec.model.name not in models.BUILTINS and flops is None:
        return None  # FLOPs are counted from the built-in models' code, or given for the user's
    level = served_level(entries, spec.slo.p99_latency_ms)
    formed, mean = formed_batch_size(level, spec.server.batch_size)
    if figures is not None:
        accelerator = accelerator_of(figures.device) if device_kind == "cuda" else None
    else:
        accelerator = accelerator_from_spec(spec.server)
    served = float(level["throughputRps"]) if level is not None else None
    raw = raw_block(mean, formed, figures, spec.ceiling.raw_seconds)
    counted = count_flops(spec.model.name) if flops is None else flops
    return ceiling_report(served, counted, raw, accelerator, str(spec.server.precision))


def plan(spec: ExperimentSpec, entries: list[dict[str, Any]]) -> list[int]:
    """The batch sizes a local run's raw probe measures for these results."""
    level = served_level(entries, spec.slo.p99_latency_ms)
    formed, _ = formed_batch_size(level, spec.server.batch_size)
    return scan_batch_sizes(formed, spec.server.batch_size)


# -- measurements (torch) ----------------------------------------------------------------------------


def handler_imaging() -> ModuleType:
    """The handler's precision helpers, so the raw loop converts the model exactly as the server does."""
    return models.load_module(paths.handlers_dir() / "servinglab_imaging.py", "servinglab_imaging")


def network(model_name: str, weights: bool = False) -> tuple[Any, int]:
    """The built-in model; with `weights`, the very weights its archive serves (calibrated
    BatchNorm: uncalibrated statistics can drive activations into slow denormal arithmetic)."""
    import torch

    builtin = models.get_builtin(model_name)
    source = models.load_module(builtin.source)
    torch.manual_seed(builtin.seed)
    built = source.build_model()
    if weights:
        archive = models.ensure_built(model_name)
        built.load_state_dict(torch.load(archive / models.WEIGHTS_FILE, map_location="cpu", weights_only=True))
    return built.eval(), int(source.INPUT_SIZE)


def packed_network(directory: str) -> tuple[Any, dict[str, Any]]:
    """A model servinglab packed (TorchScript or .pt2) on the CPU, and its declared input."""
    import torch

    from servinglab.modelsource import INPUT_FILE

    folder = Path(directory)
    serialized = next(p for p in (folder / "model.pt", folder / "model.pt2") if p.exists())
    declared: dict[str, Any] = json.loads((folder / INPUT_FILE).read_text())
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


@functools.cache
def count_flops(model_name: str) -> float:
    """FLOPs of one inference (batch 1, fp32) of a built-in model."""
    import torch

    built, size = network(model_name)
    return float(flops_of(built, torch.zeros(1, 3, size, size)))
