"""`servinglab report results.json`: PNG plots and one HTML page, readable without the JSON.

Plots (matplotlib, Agg backend, written next to the page):

* `latency-cdf.png` — the latency CDF of every level (from the exact per-level CDF in the results);
* `throughput-p99.png` — throughput and p99 against concurrency (closed loop) or offered rate (open
  loop), with the SLO line, unstable and generator-limited levels marked;
* `server-breakdown.png` — where the server's time went per level: queue wait per request, and
  preprocess / inference / postprocess per batch, with the mean batch size;
* `timeseries.png` — throughput and p99 window by window over each level's measured period (the
  stability windows); a shaped run (step, burst, trace) shows its offered rate and phase edges;
* `roofline.png` — the served and raw points under the device's compute and memory roofs
  (:mod:`servinglab.present.roofline`).

The page adds the configuration, the best level's bottleneck verdict (element id "verdict"), the full
results table with the trust checks and each level's verdict (class "verdict"; a document written before
verdicts existed is judged here), the best level, the peak rate found and the ceiling (served/raw,
served/theoretical). Works on local results and on a
cluster experiment's results document (`servinglab results NAME -o file.json`). Called by the command line.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from servinglab.api.results import ExperimentResults, LevelResult
from servinglab.measure.document import with_verdicts
from servinglab.measure.trust import trust_checks
from servinglab.present import roofline
from servinglab.present.page import html_page
from servinglab.present.tables import p99_cell, tails_legend, utilisation_notes

PLOTS = ("latency-cdf.png", "throughput-p99.png", "server-breakdown.png", "timeseries.png", "roofline.png")


def _x_axis(levels: list[LevelResult]) -> tuple[list[float], str]:
    if levels and levels[0].concurrency is None:
        return [float(level.rate_rps or 0) for level in levels], "offered rate (requests/s)"
    return [float(level.concurrency or 0) for level in levels], "concurrency (users)"


def render(document: ExperimentResults, out_dir: Path) -> Path:
    """Write the plots and index.html into `out_dir`; return the page's path."""
    import matplotlib

    matplotlib.use("Agg")
    out_dir.mkdir(parents=True, exist_ok=True)
    document = with_verdicts(document)
    levels = sorted(document.results, key=lambda level: (bool(level.peak_search_probe), level.rate_rps or 0))
    measured = [level for level in document.results if not level.peak_search_probe]
    _latency_cdf(levels, out_dir / PLOTS[0])
    _throughput_p99(measured, document.slo_p99_ms, out_dir / PLOTS[1])
    _breakdown(measured, out_dir / PLOTS[2])
    _time_series(levels, out_dir / PLOTS[3])
    roofline.draw(document, out_dir / PLOTS[4])
    page = out_dir / "index.html"
    page.write_text(_page(document))
    return page


def _latency_cdf(levels: list[LevelResult], path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    for level in levels:
        points = level.latency_cdf_ms or []
        if points:
            label = level.label + (" (search)" if level.peak_search_probe else "")
            axes.plot([ms for _, ms in points], [p / 100 for p, _ in points], label=label)
    axes.set_xscale("log")
    axes.set_xlabel("latency (ms, log scale)")
    axes.set_ylabel("fraction of requests")
    axes.set_title("Latency CDF per level (exact, every request)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(title="level", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _throughput_p99(levels: list[LevelResult], slo: float | None, path: Path) -> None:
    import matplotlib.pyplot as plt

    x, label = _x_axis(levels)
    figure, throughput_axes = plt.subplots(figsize=(8, 5))
    throughput = [level.throughput_rps for level in levels]
    throughput_axes.plot(x, throughput, "o-", color="tab:blue", label="throughput")
    throughput_axes.set_xlabel(label)
    throughput_axes.set_ylabel("throughput (responses/s)", color="tab:blue")
    p99_axes = throughput_axes.twinx()
    p99 = [level.latency_ms.p99 if level.latency_ms.p99 is not None else math.nan for level in levels]
    p99_axes.plot(x, p99, "s--", color="tab:red", label="p99")
    bounds = [level.latency_ms.p99_interval for level in levels]
    upper = [b.upper if b is not None and b.upper is not None else math.nan for b in bounds]
    if any(not math.isnan(value) for value in upper):  # what the SLO is judged on
        p99_axes.plot(x, upper, "v:", color="tab:red", alpha=0.5, label="p99 upper bound (95 %)")
    p99_axes.set_ylabel("p99 latency (ms)", color="tab:red")
    if slo:
        p99_axes.axhline(slo, color="tab:red", alpha=0.4, linestyle=":", label=f"SLO {slo:g} ms")
    for xi, yi, level in zip(x, throughput, levels, strict=True):
        flags = [mark.lower() for mark in trust_checks(level)[0] if mark in ("UNSTABLE", "GENERATOR-LIMITED")]
        if flags:
            throughput_axes.annotate(", ".join(flags), (xi, yi), textcoords="offset points", xytext=(4, 6),
                                     fontsize="small", color="tab:orange")  # fmt: skip
    if levels and levels[0].concurrency is None:
        throughput_axes.plot(x, x, color="grey", alpha=0.3, linewidth=1, label="offered")
    throughput_axes.set_title("Throughput and p99 by level")
    throughput_axes.grid(True, alpha=0.3)
    handles = throughput_axes.get_legend_handles_labels()[0] + p99_axes.get_legend_handles_labels()[0]
    throughput_axes.legend(handles=handles, loc="upper left", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _breakdown(levels: list[LevelResult], path: Path) -> None:
    import matplotlib.pyplot as plt

    labels = [level.label for level in levels]
    parts = (
        ("queue_ms_mean", "queue wait (per request)"),
        ("preprocess_ms_per_batch", "preprocess (per batch)"),
        ("inference_ms_per_batch", "inference (per batch)"),
        ("postprocess_ms_per_batch", "postprocess (per batch)"),
    )
    figure, axes = plt.subplots(figsize=(8, 5))
    bottom = [0.0] * len(levels)
    for key, name in parts:
        values = [float(getattr(level.server, key, None) or 0.0) for level in levels]
        axes.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for index, level in enumerate(levels):
        batch = level.server.mean_batch_size if level.server is not None else None
        if batch is not None:
            axes.annotate(f"batch {batch:.2g}", (index, bottom[index]), ha="center", va="bottom", fontsize="small")
    axes.set_xlabel("level")
    axes.set_ylabel("milliseconds")
    axes.set_title("Server-side time per level (the server's and the handler's counters)")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _time_series(levels: list[LevelResult], path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, (throughput_axes, p99_axes) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for level in levels:
        windows = level.stability.windows if level.stability is not None else []
        if not windows:
            continue
        start = windows[0].start
        times = [window.start - start for window in windows]
        throughput_axes.step(times, [w.throughput_rps for w in windows], where="post", label=level.label)
        p99_axes.step(times, [w.p99_ms for w in windows], where="post", label=level.label)
        timed = [phase for phase in level.phases or [] if phase.start is not None]
        for phase in timed:
            throughput_axes.axvline(float(phase.start or 0), color="grey", alpha=0.3, linewidth=1)
        if timed:
            edges = [float(phase.start or 0) for phase in timed]
            rates = [float(phase.rate_rps or 0) for phase in timed]
            throughput_axes.step(edges, rates, where="post", color="grey", linestyle=":", label="offered")
    throughput_axes.set_ylabel("throughput (responses/s)")
    p99_axes.set_ylabel("p99 latency (ms)")
    p99_axes.set_xlabel("seconds into the measured period")
    throughput_axes.set_title("Throughput and p99 per window (requests by their send time)")
    for axes in (throughput_axes, p99_axes):
        axes.grid(True, alpha=0.3)
    if throughput_axes.get_legend_handles_labels()[0]:
        throughput_axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _cell(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return html.escape(str(value))


def _facts(document: ExperimentResults) -> list[str]:
    """The sentences above the table: best level, peak rate, ceiling, cold start, precision."""
    facts = []
    if (best := document.best) is not None:
        facts.append(f"Best level: {best.label} at {best.throughput_rps:.1f} rps (p99 {_cell(best.p99_latency_ms)} ms)")
    if (legend := tails_legend(document)) is not None:
        facts.append(html.escape(legend))
    if (peak := document.peak_rate) is not None:
        note = f" ({html.escape(peak.note)})" if peak.note else ""
        facts.append(f"Peak rate within the SLO: {_cell(peak.rate_rps)} rps after {peak.probes} probes{note}")
    if document.utilisation is not None:
        facts += [html.escape(line) for line in utilisation_notes(document.utilisation)]
    if (ceiling := document.ceiling) is not None:
        note = f" — {html.escape(ceiling.note)}" if ceiling.note else ""
        facts.append(
            f"Ceiling: {ceiling.flops_per_inference / 1e9:.3g} GFLOPs per inference; the model alone "
            f"{_cell(ceiling.raw_at_formed_batch_rps)} rps at the formed batch size {ceiling.raw_batch_size} "
            f"(served/raw {_cell(ceiling.served_over_raw, 3)}), at best {_cell(ceiling.raw_best_rps)} rps at batch "
            f"{ceiling.raw_best_batch_size} (served/best raw {_cell(ceiling.served_over_best_raw, 3)}); theoretical "
            f"{_cell(ceiling.theoretical_rps)} rps on {_cell(ceiling.accelerator)} (served/theoretical "
            f"{ceiling.served_over_theoretical or '–'}){note}"
        )
        facts += [f"Raw batch {row.batch_size} skipped: {html.escape(row.reason)}" for row in ceiling.raw_skipped or []]
        if (reading := roofline.sentence(document)) is not None:
            facts.append(html.escape(reading))
    if cold := document.cold_start_seconds:
        warmup = document.warmup_seconds
        facts.append(f"Cold start: {cold:.1f} s" + (f" (handler warm-up {warmup:.1f} s of it)" if warmup else ""))
    if document.runtime is not None and document.runtime.precision_note:
        facts.append(html.escape(document.runtime.precision_note))
    if document.runtime is not None and document.runtime.data_path is not None and document.runtime.data_path.note:
        facts.append(f"Data path, as the workers ran it: {html.escape(document.runtime.data_path.note)}")
    return facts


def _page(document: ExperimentResults) -> str:
    server, load = document.server, document.load
    title = f"{document.experiment}: {document.model}"
    config = (
        f"{server.kind}: batch {server.batch_size}, max delay {server.max_batch_delay_ms} ms, "
        f"{server.workers} worker(s), {server.precision}"
        f"{', ' + server.data_path if server.data_path else ''}; load {load.mode if load else ''}"
    )
    rows = []
    for level in document.results:
        latency, breakdown = level.latency_ms, level.server
        marks, reasons = trust_checks(level)
        checks = [*marks, *(["peak-search probe"] if level.peak_search_probe else []), *reasons]
        cells = [
            level.label, level.throughput_rps, latency.p50, latency.p90, latency.p95, p99_cell(latency), latency.max,
            level.requests, level.errors, breakdown.mean_batch_size if breakdown else None,
            breakdown.queue_ms_mean if breakdown else None, breakdown.inference_ms_per_batch if breakdown else None,
            "; ".join(checks),
        ]  # fmt: skip
        verdict = f'<td class="verdict">{verdict_text(level)}</td>'
        rows.append("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in cells) + verdict + "</tr>")
    header = ["level", "rps", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "max ms", "requests", "errors", "batch",
              "queue ms", "infer ms/batch", "checks", "verdict"]  # fmt: skip
    table = f"<table><tr>{''.join(f'<th>{h}</th>' for h in header)}</tr>\n{''.join(rows)}\n</table>"
    intro = f"<p>{html.escape(config)}</p>\n{_best_verdict(document)}"
    return html_page(title, intro, _facts(document), table, PLOTS, images_last=True)


def verdict_text(level: LevelResult) -> str:
    """A level's verdict for the page (escaped): the bottleneck, the figures behind it, what to try."""
    verdict = level.verdict
    if verdict is None:
        return "–"
    return (f"<b>{html.escape(str(verdict.bottleneck))}</b>: {html.escape(verdict.because)}; "
            f"<i>try</i>: {html.escape(verdict.next)}")  # fmt: skip


def _best_verdict(document: ExperimentResults) -> str:
    """The best level's verdict in its own element (id "verdict"), above the facts."""
    best = document.best
    level = next((level for level in document.results if best is not None
                  and (level.concurrency, level.rate_rps) == (best.concurrency, best.rate_rps)), None)  # fmt: skip
    if level is None or level.verdict is None:
        return '<p id="verdict">Verdict: none (no level to judge)</p>'
    return f'<p id="verdict">Verdict at the best level ({html.escape(level.label)}): {verdict_text(level)}</p>'
