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

And a **roofline** (:func:`roofline`, drawn by `servinglab report`): the model's arithmetic intensity (FLOPs
over the bytes one inference moves at the batch: its weights shared by the batch, its activations, counted
where the FLOPs are) places the served and raw points under the device's compute roof and its
memory-bandwidth roof (:data:`MEMORY_GBS`).

The raw figures come from :mod:`servinglab.measure.raw` (a child process, within `ceiling.rawSeconds`);
the local runner measures them after its server has stopped, the load Job cannot (it does not run on
the GPU) and reports FLOPs and the theoretical figure for the accelerator its server is pinned to.

The model alone runs in the **form that was served** (`server.form`: the TorchScript or ONNX file servinglab
built beside the model, torch.compile's mode; :func:`served_form_options`), so served/raw is what the server
loses. With `ceiling.forms`, every other form also runs alone at the formed batch, and :func:`best_form`
names the fastest with its gain over the served form: what a better form would gain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from servinglab.api import ExperimentSpec, ServerSpec
from servinglab.api.ceiling import BestForm, Ceiling, FormAlone, RawRow, RawSkip
from servinglab.api.datapath import CompileMode
from servinglab.api.forms import ModelForm
from servinglab.api.results import LevelResult
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


#: Peak memory bandwidth in GB/s of the same parts. Sources: NVIDIA datasheets — T4 320 (GDDR6), L4 300,
#: A10 600 (AWS quotes the same for the A10G of G5), A100 SXM4 80GB 2,039 (the 40GB part: 1,555; a roof is
#: the most the part named could do, so the faster variant), H100 SXM5 3,350 (HBM3), H200 SXM 4,800 (HBM3e).
MEMORY_GBS: dict[str, float] = {"T4": 320.0, "L4": 300.0, "A10G": 600.0, "A100": 2039.0, "H100": 3350.0, "H200": 4800.0}


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


#: The forms the model alone is measured in with `ceiling.forms` (the GPU adds TensorRT).
CPU_FORMS = (ModelForm.EAGER, ModelForm.TORCHSCRIPT, ModelForm.COMPILE, ModelForm.ONNXRUNTIME)
#: The file each form with one is served from, beside the model (the names :mod:`servinglab.models.forms` uses).
_FORM_FILES = {ModelForm.TORCHSCRIPT: "servinglab-form.pt", ModelForm.ONNXRUNTIME: "servinglab-form.onnx"}


def served_form_options(server: ServerSpec, folder: Path) -> dict[str, object]:
    """The raw probe's model options for the model as served: the data path's, the compile mode the form
    implies (form compile with dataPath.compile unset: default), and the form's file where it has one."""
    options = server.data_path.model_options(server.batch_size)
    if (mode := server.compile_mode()) is not CompileMode.NONE:
        options.update(compile=str(mode), batchSize=server.batch_size)
    if server.form is not None:
        options["form"] = str(server.form)  # also keeps one form's raw figures apart from another's in the cache
        built = folder / _FORM_FILES[server.form] if server.form in _FORM_FILES else None
        if built is not None and built.is_file():
            options["formFile"] = str(built)
    return options


def best_form(served_form: str, rows: Sequence[FormAlone]) -> BestForm | None:
    """The fastest form alone against the served form alone at the same batch (None when the served form
    was not measured alone: no gain to state)."""
    measured = {row.form: row.throughput_rps for row in rows if row.status == "measured" and row.throughput_rps}
    base = measured.get(served_form)
    if not base:
        return None
    form, rps = max(measured.items(), key=lambda item: item[1])
    return BestForm(form=form, rps=rps, served_form=served_form, served_form_rps=base, gain=round(rps / base, 3))


def plan(spec: ExperimentSpec, levels: Sequence[LevelResult]) -> list[int]:
    """The batch sizes a local run's raw probe measures for these results."""
    level = served_level(levels, spec.slo.p99_latency_ms)
    formed, _ = formed_batch_size(level, spec.server.batch_size)
    return scan_batch_sizes(formed, spec.server.batch_size)


# -- the roofline ---------------------------------------------------------------------------------------

#: Bytes per element relative to fp32, by precision (weights and activations both take the precision's type).
_ELEMENT_SCALE = {"fp32": 1.0, "tf32": 1.0, "fp16": 0.5, "bf16": 0.5}


@dataclass(frozen=True)
class RooflinePoint:
    """A measured throughput on the roofline: where the model's intensity at its batch puts it."""

    label: str
    batch_size: float
    intensity: float  # FLOPs per byte moved
    flops_per_second: float
    rps: float


@dataclass(frozen=True)
class Roofline:
    """The roofs of a device at a precision (None: not known) and the points under them."""

    precision: str
    device: str
    points: list[RooflinePoint]
    peak_flops: float | None  # FLOP/s
    bandwidth: float | None  # bytes/s
    unknown: list[str]  # what is not known, for people

    @property
    def ridge(self) -> float | None:
        """The intensity where the memory roof meets the compute roof (FLOPs per byte)."""
        return self.peak_flops / self.bandwidth if self.peak_flops and self.bandwidth else None

    def attainable(self, intensity: float) -> float | None:
        """The most FLOP/s the roofs allow at `intensity` (None when a roof is unknown)."""
        if self.peak_flops is None or self.bandwidth is None:
            return None
        return min(self.peak_flops, self.bandwidth * intensity)

    def bound(self, intensity: float) -> str | None:
        """'memory' left of the ridge, 'compute' right of it."""
        ridge = self.ridge
        return None if ridge is None else ("memory" if intensity < ridge else "compute")


def bytes_per_inference(weight_bytes: float, activation_bytes: float, batch_size: float, precision: str) -> float:
    """Bytes one inference moves at `batch_size`: the weights once per batch, the activations per inference,
    both counted at fp32 and scaled to the precision's element size."""
    return (weight_bytes / max(batch_size, 1.0) + activation_bytes) * _ELEMENT_SCALE.get(precision, 1.0)


def roofline(
    ceiling: Ceiling, weight_bytes: int | None, activation_bytes: int | None, precision: str, device: str
) -> Roofline:
    """The served and raw points of a ceiling under the roofs of its accelerator. Without the bytes moved
    (a model counted by an older servinglab) there are no points; without a known accelerator no roofs."""
    unknown = []
    accelerator = ceiling.accelerator
    peak = PEAK_TFLOPS.get(accelerator or "", {}).get(precision) if accelerator else None
    bandwidth = MEMORY_GBS.get(accelerator or "") if accelerator else None
    if accelerator is None:
        unknown.append(f"no compute or memory roof for {device} (servinglab knows these for NVIDIA GPUs only)")
    elif peak is None:
        unknown.append(f"{accelerator} has no {precision} compute roof")
    flops = float(ceiling.flops_per_inference)
    measured = [
        ("served", ceiling.served_rps, ceiling.formed_batch_size_mean or ceiling.raw_batch_size),
        ("model alone, formed batch", ceiling.raw_at_formed_batch_rps, ceiling.raw_batch_size),
        ("model alone, best batch", ceiling.raw_best_rps, ceiling.raw_best_batch_size),
    ]
    points = []
    if weight_bytes is None or activation_bytes is None or not flops:
        unknown.append("the bytes the model moves were not counted (rebuild it, or count it again): no intensity")
    else:
        for label, rps, batch in measured:
            if rps and batch:
                intensity = flops / bytes_per_inference(weight_bytes, activation_bytes, batch, precision)
                points.append(RooflinePoint(label, float(batch), intensity, rps * flops, rps))
        if not points:
            unknown.append("nothing was measured to place on it")
    return Roofline(precision, accelerator or device, points, peak * 1e12 if peak else None,
                    bandwidth * 1e9 if bandwidth else None, unknown)  # fmt: skip
