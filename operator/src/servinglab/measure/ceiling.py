"""How far a served result is from what the model and the hardware could do (pure arithmetic).

Three numbers put a served throughput in context:

* **FLOPs per inference**, counted from the model itself when it was built or prepared (PyTorch's
  FlopCounterMode over one forward pass at batch 1, in a child process; a multiply-add is 2 FLOPs);
* **raw throughput**, the model alone in a tight loop (no server, no HTTP, no decoding), as two
  figures: at the batch size the server actually *formed* at the served level (from the handler's
  counters), so served/raw is what serving costs as it ran; and the *best* over batch sizes up to the
  configured maximum (powers of two), so served/best-raw says what a better configuration could reach;
* **theoretical throughput**: the accelerator's dense peak at that precision divided by the FLOPs per
  inference, so served/theoretical says how much of the chip the answer uses. Peaks are the vendors'
  dense (no structured sparsity) tensor/CUDA-core figures for the SXM/PCIe parts named; there is no
  entry for CPUs, whose peak depends on the exact part.

The raw figures come from :mod:`servinglab.measure.raw` (a child process, within `ceiling.rawSeconds`);
the local runner measures them after its server has stopped, the load Job cannot (it does not run on
the GPU) and reports FLOPs and the theoretical figure for the accelerator its server is pinned to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servinglab.api import ExperimentSpec, ServerSpec
from servinglab.api.results import Ceiling, LevelResult, RawRow, RawSkip
from servinglab.measure.levels import served_level
from servinglab.measure.raw.figures import RawFigures

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


def powers_of_two_up_to(largest: int) -> list[int]:
    """1, 2, 4, ... below `largest`, and `largest` itself: the batch sizes warmed up and scanned."""
    return sorted({min(2**i, largest) for i in range(largest.bit_length() + 1)})


def formed_batch_size(level: LevelResult | None, configured: int) -> tuple[int, float | None]:
    """(batch size to measure the model alone at, the server's mean formed batch) for a served level:
    the mean batch the server formed, rounded, within 1..configured; the configured size when unknown."""
    mean = level.server.mean_batch_size if level is not None and level.server is not None else None
    if mean is None:
        return configured, None
    return max(1, min(configured, round(mean))), float(mean)


def scan_batch_sizes(formed: int, configured: int) -> list[int]:
    """The sizes the raw probe measures, in order: the formed size first, then powers of two up to the
    configured maximum (and the maximum itself), smallest first so each estimates the next's time."""
    return [formed, *(size for size in powers_of_two_up_to(configured) if size != formed)]


def accelerator_from_spec(server: ServerSpec) -> str | None:
    """The accelerator the server is pinned to by its node selector (GPU feature discovery's
    `nvidia.com/gpu.product`, e.g. Tesla-T4), if any."""
    if server.gpus == 0:
        return None
    product = server.node_selector.get("nvidia.com/gpu.product")
    return accelerator_of(product.replace("-", " ")) if product else None


@dataclass(frozen=True)
class RawPart:
    """The raw half of a ceiling: at which batch size the model alone is compared, and what it measured."""

    batch_size: int
    formed_mean: float | None
    figures: RawFigures | None
    budget_seconds: float

    def at(self, batch_size: int) -> RawRow | None:
        return self.figures.measured.get(batch_size) if self.figures is not None else None

    @property
    def best(self) -> RawRow | None:
        rows = list(self.figures.measured.values()) if self.figures is not None else []
        return max(rows, key=lambda row: row.throughput_rps) if rows else None


def raw_block(formed_mean: float | None, formed: int, figures: RawFigures | None, budget: float) -> RawPart:
    """The raw part of a ceiling from a probe's figures (None: not measured, as in the load Job)."""
    return RawPart(formed, formed_mean, figures, budget)


def _notes(ceiling: Ceiling, measured: bool, precision: str) -> str | None:
    notes = []
    if not measured:
        notes.append("raw throughput is measured by local runs (servinglab run), on the machine that serves")
    elif ceiling.raw_at_formed_batch_rps is None:
        notes.append(f"the model alone could not be measured at the formed batch size {ceiling.raw_batch_size}")
    if ceiling.formed_batch_size_mean is None and measured:
        notes.append("the formed batch size is unknown (no handler counters); the configured one is used")
    if ceiling.accelerator is None:
        notes.append("no peak figure for this device (CPU); served/theoretical needs a known accelerator")
    elif ceiling.peak_tflops is None:
        notes.append(f"{ceiling.accelerator} has no {precision} hardware path")
    return "; ".join(notes) or None


def ceiling_report(
    served_rps: float | None, flops_per_inference: float, raw: RawPart, accelerator: str | None, precision: str
) -> Ceiling:
    """The ceiling of a served throughput: the references and the ratios to them."""
    peak = PEAK_TFLOPS.get(accelerator or "", {}).get(precision) if accelerator else None
    theoretical = theoretical_rps(flops_per_inference, peak)
    figures, at_formed, best = raw.figures, raw.at(raw.batch_size), raw.best
    ceiling = Ceiling(
        flops_per_inference=int(flops_per_inference),
        raw_batch_size=raw.batch_size,
        formed_batch_size_mean=raw.formed_mean,
        raw_at_formed_batch_rps=at_formed.throughput_rps if at_formed else None,
        raw_best_rps=best.throughput_rps if best else None,
        raw_best_batch_size=best.batch_size if best else None,
        raw_device=figures.device if figures else None,
        raw_budget_seconds=raw.budget_seconds if figures else None,
        raw_measure_seconds=figures.measure_seconds if figures else None,
        raw_setup_seconds=figures.setup_seconds if figures else None,
        raw_table=[figures.measured[b] for b in sorted(figures.measured)] if figures else None,
        raw_skipped=[RawSkip(batch_size=b, reason=why) for b, why in sorted(figures.skipped.items())]
        if figures
        else None,
        raw_reused_batch_sizes=figures.from_cache if figures else None,
        accelerator=accelerator,
        peak_tflops=peak,
        theoretical_rps=round(theoretical, 3) if theoretical is not None else None,
        served_rps=served_rps,
        served_over_raw=ratio(served_rps, at_formed.throughput_rps if at_formed else None),
        served_over_best_raw=ratio(served_rps, best.throughput_rps if best else None),
        served_over_theoretical=ratio(served_rps, theoretical),
    )
    return ceiling.model_copy(update={"note": _notes(ceiling, figures is not None, precision)})


def ceiling_of(
    spec: ExperimentSpec,
    levels: Sequence[LevelResult],
    flops_per_inference: float,
    figures: RawFigures | None = None,
    device_kind: str | None = None,
) -> Ceiling:
    """The ceiling of a finished run. `figures` are the raw probe's (local runs, measured at
    :func:`plan`'s sizes on `device_kind` "cpu"/"cuda"); without them (the load Job) the accelerator
    comes from the server's node selector."""
    level = served_level(levels, spec.slo.p99_latency_ms)
    formed, mean = formed_batch_size(level, spec.server.batch_size)
    if figures is not None:
        accelerator = accelerator_of(figures.device) if device_kind == "cuda" else None
    else:
        accelerator = accelerator_from_spec(spec.server)
    served = level.throughput_rps if level is not None else None
    raw = raw_block(mean, formed, figures, spec.ceiling.raw_seconds)
    return ceiling_report(served, flops_per_inference, raw, accelerator, str(spec.server.precision))


def plan(spec: ExperimentSpec, levels: Sequence[LevelResult]) -> list[int]:
    """The batch sizes a local run's raw probe measures for these results."""
    level = served_level(levels, spec.slo.p99_latency_ms)
    formed, _ = formed_batch_size(level, spec.server.batch_size)
    return scan_batch_sizes(formed, spec.server.batch_size)
