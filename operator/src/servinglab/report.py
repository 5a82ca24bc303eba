"""`servinglab report results.json`: PNG plots and one HTML page, readable without the JSON.

Plots (matplotlib, Agg backend, written next to the page):

* `latency-cdf.png` — the latency CDF of every level (from the exact per-level CDF in the results);
* `throughput-p99.png` — throughput and p99 against concurrency (closed loop) or offered rate (open
  loop), with the SLO line, unstable and generator-limited levels marked;
* `server-breakdown.png` — where the server's time went per level: queue wait per request, and
  preprocess / inference / postprocess per batch, with the mean batch size;
* `timeseries.png` — throughput and p99 window by window over each level's measured period (the
  stability windows); a shaped run (step, burst, trace) shows its offered rate and phase edges.

The page adds the configuration, the full results table with the trust checks, the best level, the
peak rate found and the ceiling (served/raw, served/theoretical). Works on local results and on a
cluster experiment's results document (`servinglab results NAME -o file.json`).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from servinglab.results import level_label, trust_checks

PLOTS = ("latency-cdf.png", "throughput-p99.png", "server-breakdown.png", "timeseries.png")


def _x_axis(entries: list[dict[str, Any]]) -> tuple[list[float], str]:
    if entries and "rateRps" in entries[0]:
        return [float(e["rateRps"]) for e in entries], "offered rate (requests/s)"
    return [float(e["concurrency"]) for e in entries], "concurrency (users)"


def render(document: dict[str, Any], out_dir: Path) -> Path:
    """Write the plots and index.html into `out_dir`; return the page's path."""
    import matplotlib

    matplotlib.use("Agg")
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = sorted(
        document.get("results", []), key=lambda e: (e.get("peakSearchProbe", False), e.get("rateRps") or 0)
    )
    sweep = [e for e in document.get("results", []) if not e.get("peakSearchProbe")]
    _latency_cdf(entries, out_dir / PLOTS[0])
    _throughput_p99(sweep, document, out_dir / PLOTS[1])
    _breakdown(sweep, out_dir / PLOTS[2])
    _time_series(entries, out_dir / PLOTS[3])
    page = out_dir / "index.html"
    page.write_text(_page(document))
    return page


def _latency_cdf(entries: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    for entry in entries:
        points = entry.get("latencyCdfMs") or []
        if points:
            label = level_label(entry) + (" (search)" if entry.get("peakSearchProbe") else "")
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


def _throughput_p99(entries: list[dict[str, Any]], document: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    x, label = _x_axis(entries)
    figure, throughput_axes = plt.subplots(figsize=(8, 5))
    throughput = [e["throughputRps"] for e in entries]
    throughput_axes.plot(x, throughput, "o-", color="tab:blue", label="throughput")
    throughput_axes.set_xlabel(label)
    throughput_axes.set_ylabel("throughput (responses/s)", color="tab:blue")
    p99_axes = throughput_axes.twinx()
    p99 = [e.get("latencyMs", {}).get("p99") for e in entries]
    p99_axes.plot(x, p99, "s--", color="tab:red", label="p99")
    p99_axes.set_ylabel("p99 latency (ms)", color="tab:red")
    slo = (document.get("slo") or {}).get("p99LatencyMs")
    if slo:
        p99_axes.axhline(slo, color="tab:red", alpha=0.4, linestyle=":", label=f"SLO {slo:g} ms")
    for xi, yi, entry in zip(x, throughput, entries, strict=True):
        flags = [mark.lower() for mark in trust_checks(entry)[0] if mark in ("UNSTABLE", "GENERATOR-LIMITED")]
        if flags:
            throughput_axes.annotate(", ".join(flags), (xi, yi), textcoords="offset points", xytext=(4, 6),
                                     fontsize="small", color="tab:orange")  # fmt: skip
    if "rateRps" in (entries[0] if entries else {}):
        throughput_axes.plot(x, x, color="grey", alpha=0.3, linewidth=1, label="offered")
    throughput_axes.set_title("Throughput and p99 by level")
    throughput_axes.grid(True, alpha=0.3)
    handles = throughput_axes.get_legend_handles_labels()[0] + p99_axes.get_legend_handles_labels()[0]
    throughput_axes.legend(handles=handles, loc="upper left", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _breakdown(entries: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    labels = [level_label(e) for e in entries]
    parts = (
        ("queueMsMean", "queue wait (per request)"),
        ("preprocessMsPerBatch", "preprocess (per batch)"),
        ("inferenceMsPerBatch", "inference (per batch)"),
        ("postprocessMsPerBatch", "postprocess (per batch)"),
    )
    figure, axes = plt.subplots(figsize=(8, 5))
    bottom = [0.0] * len(entries)
    for key, name in parts:
        values = [float((e.get("server") or {}).get(key) or 0.0) for e in entries]
        axes.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for index, entry in enumerate(entries):
        batch = (entry.get("server") or {}).get("meanBatchSize")
        if batch is not None:
            axes.annotate(f"batch {batch:.2g}", (index, bottom[index]), ha="center", va="bottom", fontsize="small")
    axes.set_xlabel("level")
    axes.set_ylabel("milliseconds")
    axes.set_title("Server-side time per level (TorchServe counters, handler counters)")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _time_series(entries: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, (throughput_axes, p99_axes) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for entry in entries:
        windows = (entry.get("stability") or {}).get("windows") or []
        if not windows:
            continue
        start = float(windows[0]["start"])
        times = [float(w["start"]) - start for w in windows]
        label = level_label(entry)
        throughput_axes.step(times, [w["throughputRps"] for w in windows], where="post", label=label)
        p99_axes.step(times, [w["p99Ms"] for w in windows], where="post", label=label)
        phases = entry.get("phases") or []
        for phase in (p for p in phases if "start" in p):
            throughput_axes.axvline(float(phase["start"]), color="grey", alpha=0.3, linewidth=1)
        if phases:
            edges = [float(p["start"]) for p in phases if "start" in p]
            rates = [float(p["rateRps"]) for p in phases if "start" in p]
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


def _facts(document: dict[str, Any]) -> list[str]:
    """The sentences above the table: best level, peak rate, ceiling, cold start, precision."""
    facts = []
    if best := document.get("best"):
        p99 = _cell(best.get("p99LatencyMs"))
        facts.append(f"Best level: {level_label(best)} at {best['throughputRps']:.1f} rps (p99 {p99} ms)")
    if peak := document.get("peakRate"):
        note = f" ({html.escape(peak['note'])})" if peak.get("note") else ""
        facts.append(
            f"Peak rate within the SLO: {_cell(peak.get('rateRps'))} rps after {peak.get('probes')} probes{note}"
        )
    if ceiling := document.get("ceiling"):
        raw, batch = _cell(ceiling.get("rawAtFormedBatchRps")), ceiling.get("rawBatchSize")
        best, best_batch = _cell(ceiling.get("rawBestRps")), ceiling.get("rawBestBatchSize")
        theoretical, on = _cell(ceiling.get("theoreticalRps")), _cell(ceiling.get("accelerator"))
        note = f" — {html.escape(ceiling['note'])}" if ceiling.get("note") else ""
        facts.append(
            f"Ceiling: {ceiling['flopsPerInference'] / 1e9:.3g} GFLOPs per inference; the model alone "
            f"{raw} rps at the formed batch size {batch} (served/raw {_cell(ceiling.get('servedOverRaw'), 3)}), "
            f"at best {best} rps at batch {best_batch} (served/best raw {_cell(ceiling.get('servedOverBestRaw'), 3)}); "
            f"theoretical {theoretical} rps on {on} (served/theoretical {ceiling.get('servedOverTheoretical') or '–'})"
            f"{note}"
        )
        skipped = ceiling.get("rawSkipped") or []
        facts += [f"Raw batch {row['batchSize']} skipped: {html.escape(row['reason'])}" for row in skipped]
    if cold := document.get("coldStartSeconds"):
        warmup = document.get("warmupSeconds")
        facts.append(f"Cold start: {cold:.1f} s" + (f" (handler warm-up {warmup:.1f} s of it)" if warmup else ""))
    if precision_note := (document.get("runtime") or {}).get("precisionNote"):
        facts.append(html.escape(str(precision_note)))
    return facts


def _page(document: dict[str, Any]) -> str:
    server = document.get("server", {})
    title = f"{document.get('experiment', 'experiment')}: {document.get('model', '')}"
    config = (
        f"batch {server.get('batchSize')}, max delay {server.get('maxBatchDelayMs')} ms, "
        f"{server.get('workers')} worker(s), {server.get('precision')}; load {document.get('load', {}).get('mode', '')}"
    )
    rows = []
    for entry in document.get("results", []):
        latency, breakdown = entry.get("latencyMs", {}), entry.get("server") or {}
        marks, reasons = trust_checks(entry)
        checks = [*marks, *(["peak-search probe"] if entry.get("peakSearchProbe") else []), *reasons]
        cells = [
            level_label(entry), entry["throughputRps"], *(latency.get(k) for k in ("p50", "p90", "p95", "p99", "max")),
            entry.get("requests"), entry.get("errors"), breakdown.get("meanBatchSize"), breakdown.get("queueMsMean"),
            breakdown.get("inferenceMsPerBatch"), "; ".join(checks),
        ]  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in cells) + "</tr>")
    header = ["level", "rps", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "max ms", "requests", "errors", "batch",
              "queue ms", "infer ms/batch", "checks"]  # fmt: skip
    facts = _facts(document)
    table = f"<table><tr>{''.join(f'<th>{h}</th>' for h in header)}</tr>\n{''.join(rows)}\n</table>"
    return html_page(title, f"<p>{html.escape(config)}</p>", facts, table, PLOTS, images_last=True)


def html_page(title: str, intro: str, facts: list[str], table: str, images: tuple[str, ...], images_last: bool) -> str:
    """The report page both reports share: title, facts, the table and the plots."""
    figures = "".join(f'<figure><img src="{name}" alt="{name}"></figure>' for name in images)
    body = f"{table}\n{figures}" if images_last else f"{figures}\n{table}"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
td:last-child {{ text-align: left; }} figure {{ display: inline-block; margin: 0.5em; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
{intro}
<ul>{"".join(f"<li>{fact}</li>" for fact in facts)}</ul>
{body}
</body></html>
"""
