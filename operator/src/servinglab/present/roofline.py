"""The roofline of an experiment's report: `roofline.png` and the sentence that reads it (matplotlib Agg).

Log-log: arithmetic intensity (FLOPs per byte the model moves at the batch) against FLOP/s. The memory roof
rises with intensity up to the ridge, the compute roof is flat after it; the served level and the model alone
(at the formed batch and at its best batch) are points under them. Where the device has no known roofs
(a CPU, an unknown GPU) the points are drawn alone and the figure says what is not known; where the bytes
were not counted there are no points and the figure says that. The arithmetic is
:func:`servinglab.measure.ceiling.roofline`. Called by :mod:`servinglab.present.report`.
"""

from __future__ import annotations

from pathlib import Path

from servinglab.api.results import ExperimentResults
from servinglab.measure.ceiling import Roofline, roofline

_MARKERS = {"served": ("o", "tab:blue"), "model alone, formed batch": ("s", "tab:orange"),
            "model alone, best batch": ("^", "tab:green")}  # fmt: skip


def of(document: ExperimentResults) -> Roofline | None:
    """The document's roofline, or None without a ceiling (the ceiling off, or a run that measured nothing)."""
    ceiling, model = document.ceiling, document.model_info
    if ceiling is None:
        return None
    device = document.runtime.device if document.runtime is not None and document.runtime.device else "this device"
    return roofline(ceiling, model.weight_bytes if model else None, model.activation_bytes if model else None,
                    document.server.precision or "fp32", device)  # fmt: skip


def draw(document: ExperimentResults, path: Path) -> None:
    import matplotlib.pyplot as plt

    found = of(document)
    figure, axes = plt.subplots(figsize=(8, 5))
    notes = ["no ceiling in these results (ceiling.enabled: false)"] if found is None else list(found.unknown)
    if found is not None and found.points:
        low = min(p.intensity for p in found.points) / 4
        high = max([p.intensity for p in found.points] + [found.ridge or 0]) * 4
        if found.bandwidth is not None and found.peak_flops is not None:
            ridge = found.peak_flops / found.bandwidth
            xs = [low, max(low, min(ridge, high)), high]
            roofs = f"roofs: {found.bandwidth / 1e9:,.0f} GB/s, {found.peak_flops / 1e12:g} TFLOP/s"
            ys = [min(found.peak_flops, found.bandwidth * x) for x in xs]
            axes.plot(xs, ys, color="black", linewidth=1.5, label=roofs)
            axes.axvline(ridge, color="grey", linestyle=":", linewidth=1, label=f"ridge {ridge:.0f} FLOP/byte")
        for point in found.points:
            marker, colour = _MARKERS.get(point.label, ("x", "tab:red"))
            axes.scatter([point.intensity], [point.flops_per_second], marker=marker, color=colour, s=60, zorder=5,
                         label=f"{point.label}: {point.rps:,.1f} rps at batch {point.batch_size:g}")  # fmt: skip
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlim(low, high)
        tops = [p.flops_per_second for p in found.points] + [found.peak_flops or 0]
        axes.set_ylim(min(p.flops_per_second for p in found.points) / 4, max(tops) * 6)  # room for the notes
        axes.legend(fontsize="small", loc="best")
    if notes:
        axes.text(0.02, 0.98, "\n".join(notes), transform=axes.transAxes, va="top", fontsize="small", wrap=True,
                  color="dimgrey")  # fmt: skip
    axes.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    axes.set_ylabel("FLOP/s")
    precision = document.server.precision or "fp32"
    axes.set_title(f"Roofline: {precision} on {found.device if found is not None else 'this device'}")
    axes.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def sentence(document: ExperimentResults) -> str | None:
    """The roofline for people: the intensity at the served batch, which roof binds there, and what is unknown."""
    found = of(document)
    if found is None:
        return None
    served = next((p for p in found.points if p.label == "served"), None)
    if served is None:
        return "Roofline: " + "; ".join(found.unknown)
    at = served.intensity
    text = f"Roofline: {at:.1f} FLOPs per byte at the served batch {served.batch_size:g} ({found.precision})"
    attainable = found.attainable(at)
    if attainable is not None:
        text += (
            f"; {found.device}'s ridge is at {found.ridge or 0:.0f} FLOPs per byte, so the roofs make it "
            f"{found.bound(at)}-bound: they allow {attainable / 1e12:.3g} TFLOP/s, the server ran "
            f"{served.flops_per_second / 1e12:.3g} ({served.flops_per_second / attainable:.2%} of the roof)"
        )
    return text + ("; " + "; ".join(found.unknown) if found.unknown else "")
