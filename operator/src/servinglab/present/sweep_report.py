"""`servinglab report sweep.json`: a sweep's plots and page (matplotlib Agg, HTML).

* `pareto.png` — every measured point of every trial, throughput against p99, coloured by precision
  (one marker shape per server when the sweep compared servers); the Pareto front drawn through its
  points; the SLO as a vertical line; the best configuration marked;
* `capacity.png` — capacity within the SLO as a batch size x max delay heat map, one panel per server,
  precision and worker count (blank: not run; a cross: infeasible or pruned);
* `index.html` — the best configuration with its confidence (the confirmation's interval, or the tie), its
  verdict (id "verdict"), each server's best when it compared servers, why the sweep stopped, and the
  trial table (server, configuration, and each trial's verdict, class "verdict").

Called by the CLI for documents of kind ServingSweepResults (local `sweep.json`, or a cluster sweep's
document from `servinglab results --sweep NAME -o file.json`).
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from servinglab.api import TrialConfig
from servinglab.api.trials import SweepPoint, SweepResults
from servinglab.api.verdicts import Verdict
from servinglab.present.page import html_page
from servinglab.present.tables import server_of, winner_sentence

PLOTS = ("pareto.png", "capacity.png")
_COLOURS = {"fp32": "tab:blue", "tf32": "tab:green", "fp16": "tab:orange", "bf16": "tab:red"}
_MARKERS = ("o", "s", "^", "D")


def render_sweep(document: SweepResults, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    out_dir.mkdir(parents=True, exist_ok=True)
    _pareto(document, out_dir / PLOTS[0])
    _capacity(document, out_dir / PLOTS[1])
    page = out_dir / "index.html"
    page.write_text(_page(document))
    return page


def _pareto(document: SweepResults, path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    servers = sorted({server_of(p.config, document) for p in document.points})
    for precision, colour in _COLOURS.items():
        for server, marker in zip(servers, _MARKERS, strict=False):
            mine = [p for p in document.points
                    if str(p.config.precision) == precision and server_of(p.config, document) == server]  # fmt: skip
            if mine:
                label = precision if len(servers) == 1 else f"{server}, {precision}"
                axes.scatter([p.p99_latency_ms for p in mine], [p.throughput_rps for p in mine], s=18, alpha=0.5,
                             color=colour, marker=marker, label=label)  # fmt: skip
    front: list[SweepPoint] = document.front
    if front:
        axes.plot([p.p99_latency_ms for p in front], [p.throughput_rps for p in front], "k-o", markersize=4,
                  linewidth=1.2, label="Pareto front")  # fmt: skip
    slo = document.objective.p99_latency_ms
    if slo:
        axes.axvline(slo, color="grey", linestyle="--", label=f"SLO p99 {slo:g} ms")
    if (best := document.best) is not None:
        at = best.p99_latency_ms if best.p99_latency_ms is not None else math.nan
        axes.scatter([at], [best.capacity_rps], marker="*", s=220, color="gold", edgecolors="black", zorder=5,
                     label="best within the SLO")  # fmt: skip
    axes.set_xscale("log")
    axes.set_xlabel("p99 latency (ms)")
    axes.set_ylabel("throughput (requests/s)")
    axes.set_title(f"{document.sweep}: every measured point")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _capacity(document: SweepResults, path: Path) -> None:
    import matplotlib.pyplot as plt

    trials = document.trials
    configs = [t.config for t in trials] + [p.config for p in document.pruned]
    space = document.space  # the whole space (grid/search), so untried cells show as blanks
    batches = sorted({c.batch_size for c in configs} | set(space.batch_size or [])) or [0]
    delays = sorted({c.max_batch_delay_ms for c in configs} | set(space.max_batch_delay_ms or [])) or [0]
    panels = sorted({(server_of(c, document), _variant(c), c.workers) for c in configs}) or [("-", "-", 0)]
    several = len({server for server, _, _ in panels}) > 1
    columns = min(len(panels), 3)
    rows = math.ceil(len(panels) / columns)
    figure, grid = plt.subplots(
        rows, columns, figsize=(4.2 * columns + 1, 3.4 * rows), squeeze=False, layout="constrained"
    )
    top = max((t.capacity_rps or 0 for t in trials), default=0) or 1
    for index, panel in enumerate(panels):
        server, precision, workers = panel
        axes = grid[index // columns][index % columns]
        values = [[math.nan] * len(batches) for _ in delays]
        crosses = []
        for trial in trials:
            config = trial.config
            if (server_of(config, document), _variant(config), config.workers) != panel:
                continue
            row, column = delays.index(config.max_batch_delay_ms), batches.index(config.batch_size)
            if trial.capacity_rps is not None:
                values[row][column] = trial.capacity_rps
            else:
                crosses.append((column, row))
        for pruned in document.pruned:
            config = pruned.config
            if (server_of(config, document), _variant(config), config.workers) == panel:
                crosses.append((batches.index(config.batch_size), delays.index(config.max_batch_delay_ms)))
        image = axes.imshow(values, origin="lower", cmap="viridis", vmin=0, vmax=top, aspect="auto")
        for column, row in crosses:
            axes.text(column, row, "x", ha="center", va="center", color="crimson")
        axes.set_xticks(range(len(batches)), [str(b) for b in batches], fontsize="small")
        axes.set_yticks(range(len(delays)), [str(d) for d in delays], fontsize="small")
        axes.set_xlabel("batch size")
        axes.set_ylabel("max delay (ms)")
        axes.set_title((f"{server}, " if several else "") + f"{precision}, {workers} worker(s)", fontsize="medium")
    for index in range(len(panels), rows * columns):
        grid[index // columns][index % columns].axis("off")
    figure.colorbar(image, ax=grid, label="capacity within the SLO (rps)", shrink=0.8)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _variant(config: TrialConfig) -> str:
    """A capacity panel's name: the precision, with the data path when it is not the handler's default."""
    return f"{config.precision} {config.path.label()}" if config.data_path is not None else str(config.precision)


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}" if isinstance(value, float) else html.escape(str(value))


def _page(document: SweepResults) -> str:
    title = f"Sweep {document.sweep}: {document.model}"
    counts, best = document.counts, document.best
    facts = [
        f"{counts.run} trials run of {document.grid_size} configurations "
        f"({counts.pruned} pruned, {counts.infeasible} infeasible), strategy {document.strategy}",
        f"Stopped: {html.escape(str(document.stop_reason or 'not finished'))}",
        f"Pareto front: {len(document.front)} of {len(document.points)} measured points",
    ]
    bests = []
    for rank, top in enumerate(document.best_per_kind or ([best] if best is not None else [])):
        config = top.config
        figure = f"{_cell(top.capacity_rps)} rps at p99 {_cell(top.p99_latency_ms)} ms ({html.escape(top.trial)})"
        setting = f"batch {config.batch_size}, max delay {config.max_batch_delay_ms} ms, {config.workers} worker(s)"
        path = f", {config.path.describe()}" if config.data_path is not None else ""
        which = "Best within the SLO" if rank == 0 else "Best"
        where = f" on {server_of(config, document)}" if document.best_per_kind else ""
        bests.append(f"<b>{which}</b>{html.escape(where)}: {setting}, {config.precision}{html.escape(path)}: {figure}")
    if best is not None:
        bests.insert(1, html.escape(winner_sentence(document)))
    facts = bests + facts
    header = ["#", "trial", "server", "batch", "delay ms", "workers", "precision", "data path", "state",
              "capacity rps", "p99 ms", "at", "ready s", "reason", "verdict"]  # fmt: skip
    rows = []
    for trial in document.trials:
        config = trial.config
        cells = [trial.order + 1, trial.name, server_of(config, document), config.batch_size,
                 config.max_batch_delay_ms, config.workers, str(config.precision), config.path_for_people(),
                 trial.state, trial.capacity_rps, trial.p99_latency_ms, trial.level, trial.ready_seconds,
                 trial.reason]  # fmt: skip
        verdict = f'<td class="verdict">{_verdict(trial.verdict)}</td>'
        rows.append("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in cells) + verdict + "</tr>")
    table = f"<table><tr>{''.join(f'<th>{h}</th>' for h in header)}</tr>\n{''.join(rows)}\n</table>"
    intro = f'<p id="verdict">Verdict at the best configuration: {_verdict(best.verdict if best else None)}</p>'
    return html_page(title, intro, facts, table, PLOTS, images_last=False)


def _verdict(verdict: Verdict | None) -> str:
    if verdict is None:
        return "–"
    return (f"<b>{html.escape(str(verdict.bottleneck))}</b>: {html.escape(verdict.because)}; <i>try</i>: "
            f"{html.escape(verdict.next)}")  # fmt: skip
