"""`servinglab report sweep.json`: a sweep's plots and page (matplotlib Agg, HTML).

* `pareto.png` — every measured point of every trial, throughput against p99, coloured by precision
  (one marker shape per server when the sweep compared servers), each p99 with its 95 % bounds as an error
  bar (none where a level was too short for them); the Pareto front drawn through its points; the SLO as a
  vertical line; the best configuration marked;
* `cost_front.png` — every priced point, cost per million inferences against the p99's upper bound (the
  p99 itself, hollow, where a level had no bound), the bounds as error bars, and the cost front drawn
  through; without a price, the reason there is none;
* `capacity.png` — capacity within the SLO as a batch size x max delay heat map, one panel per server,
  precision and worker count (blank: not run; a cross: infeasible or pruned);
* `index.html` — the best configuration with its confidence (the confirmation's interval, or the tie), its
  verdict (id "verdict"), each server's best when it compared servers, why the sweep stopped, and the
  trial table (server, configuration, and each trial's verdict, class "verdict"), and the cost front's
  table (id "cost-front": configuration, cost per million, p99 with its interval).

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

PLOTS = ("pareto.png", "capacity.png", "cost_front.png")
_COLOURS = {"fp32": "tab:blue", "tf32": "tab:green", "fp16": "tab:orange", "bf16": "tab:red"}
_MARKERS = ("o", "s", "^", "D")


def render_sweep(document: SweepResults, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    out_dir.mkdir(parents=True, exist_ok=True)
    _pareto(document, out_dir / PLOTS[0])
    _capacity(document, out_dir / PLOTS[1])
    _cost_front(document, out_dir / PLOTS[2])
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
                _p99_bars(axes, mine, [p.throughput_rps for p in mine], colour)
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
    axes.set_xlabel("p99 latency (ms); bars: its bounds at 95 %")
    axes.set_ylabel("throughput (requests/s)")
    axes.set_title(f"{document.sweep}: every measured point")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _p99_bars(axes: Any, points: list[SweepPoint], heights: list[float], colour: str) -> None:
    """Each point's p99 bounds as a horizontal error bar around its p99 (a missing bound: no arm that side)."""
    bounded = [(p, y) for p, y in zip(points, heights, strict=True) if p.p99_lower_ms is not None
               or p.p99_upper_ms is not None]  # fmt: skip
    if not bounded:
        return
    lows = [p.p99_latency_ms - p.p99_lower_ms if p.p99_lower_ms is not None else 0.0 for p, _ in bounded]
    highs = [p.p99_upper_ms - p.p99_latency_ms if p.p99_upper_ms is not None else 0.0 for p, _ in bounded]
    axes.errorbar([p.p99_latency_ms for p, _ in bounded], [y for _, y in bounded], xerr=[lows, highs], fmt="none",
                  ecolor=colour, alpha=0.35, elinewidth=0.8, capsize=2)  # fmt: skip


def _cost_front(document: SweepResults, path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    priced = [p for p in document.points if p.cost_per_million is not None]
    front = document.cost_front
    if front is None or not priced:
        axes.axis("off")
        axes.text(0.5, 0.5, f"No cost front:\n{document.cost_front_reason or 'no priced point'}", ha="center",
                  va="center", wrap=True)  # fmt: skip
    else:
        bounded = [p for p in priced if p.p99_upper_ms is not None]
        unbounded = [p for p in priced if p.p99_upper_ms is None]
        if bounded:
            axes.scatter([p.p99_bound_ms for p in bounded], [p.cost_per_million or 0.0 for p in bounded], s=18,
                         alpha=0.6, color="tab:blue", label="p99 upper bound (95 %)")  # fmt: skip
        if unbounded:
            axes.scatter([p.p99_latency_ms for p in unbounded], [p.cost_per_million or 0.0 for p in unbounded], s=22,
                         facecolors="none", edgecolors="tab:red", label="p99 (too few samples to bound)")  # fmt: skip
        # the interval as a bar from the lower bound up to the plotted upper bound
        lows = [p.p99_bound_ms - (p.p99_lower_ms if p.p99_lower_ms is not None else p.p99_latency_ms) for p in priced]
        axes.errorbar([p.p99_bound_ms for p in priced], [p.cost_per_million or 0.0 for p in priced], fmt="none",
                      xerr=[lows, [0.0] * len(priced)], ecolor="grey", alpha=0.4, elinewidth=0.8)  # fmt: skip
        axes.plot([p.p99_bound_ms for p in front], [p.cost_per_million or 0.0 for p in front], "k-o", markersize=4,
                  linewidth=1.2, label="cost front")  # fmt: skip
        slo = document.objective.p99_latency_ms
        if slo:
            axes.axvline(slo, color="grey", linestyle="--", label=f"SLO p99 {slo:g} ms")
        axes.set_xscale("log")
        axes.set_xlabel("p99 latency, upper bound at 95 % (ms)")
        currency = _currency(document)
        axes.set_ylabel(f"cost per million inferences{f' ({currency})' if currency else ''}")
        axes.legend(fontsize="small")
    axes.set_title(f"{document.sweep}: cost against p99")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _currency(document: SweepResults) -> str | None:
    """The currency of the sweep's prices (the trials' cost figures), when they name one."""
    return next((t.cost.currency for t in document.trials if t.cost is not None and t.cost.currency), None)


def _p99_marked(point: SweepPoint) -> str:
    """A p99 with its interval marker: `12.3 [10.1, 15.2]`, or `12.3 (no bound)` for a level too short for one."""
    low, high = point.p99_lower_ms, point.p99_upper_ms
    if high is None:
        return f"{point.p99_latency_ms:.1f} (no bound)"
    return f"{point.p99_latency_ms:.1f} [{'–' if low is None else f'{low:.1f}'}, {high:.1f}]"


def _cost_table(document: SweepResults) -> str:
    """The cost front's points, by p99's upper bound: configuration, level, cost per million, p99 with its
    interval; or why there is none."""
    front = document.cost_front
    if front is None:
        reason = html.escape(document.cost_front_reason or "no priced point")
        return f'<h2>Cost front</h2>\n<p id="cost-front">No cost front: {reason}</p>'
    header = ["trial", "server", "configuration", "at", "cost per million", "throughput rps",
              "p99 ms [95 % bounds]"]  # fmt: skip
    rows = []
    for point in front:
        config = point.config
        setting = (f"b{config.batch_size} d{config.max_batch_delay_ms} w{config.workers} {config.precision}"
                   + (f" {config.path.label()}" if config.data_path is not None else ""))  # fmt: skip
        cells = [point.trial, server_of(config, document), setting, "-" if point.level is None else f"{point.level:g}",
                 f"{point.cost_per_million:.4g}", point.throughput_rps, _p99_marked(point)]  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in cells) + "</tr>")
    note = ("<p>Ranked by the p99's upper bound at 95 % (the p99 itself where a level was too short for a bound); "
            "[lower, upper] are the p99's bounds.</p>")  # fmt: skip
    return (f'<h2>Cost front</h2>\n{note}\n<table id="cost-front"><tr>{"".join(f"<th>{h}</th>" for h in header)}'
            f"</tr>\n{''.join(rows)}\n</table>")  # fmt: skip


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
    """A capacity panel's name: the precision, with the data path when it is not the handler's default, and the
    form when the trial names one."""
    name = f"{config.precision} {config.path.label()}" if config.data_path is not None else str(config.precision)
    return f"{name} {config.form}" if config.form is not None else name


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
        f"Cost front: {len(document.cost_front)} points"
        if document.cost_front is not None
        else f"Cost front: none ({html.escape(document.cost_front_reason or 'no priced point')})",
    ]
    bests = []
    for rank, top in enumerate(document.best_per_kind or ([best] if best is not None else [])):
        config = top.config
        figure = f"{_cell(top.capacity_rps)} rps at p99 {_cell(top.p99_latency_ms)} ms ({html.escape(top.trial)})"
        setting = f"batch {config.batch_size}, max delay {config.max_batch_delay_ms} ms, {config.workers} worker(s)"
        path = f", {config.path.describe()}" if config.data_path is not None else ""
        path += f", form {config.form}" if config.form is not None else ""
        which = "Best within the SLO" if rank == 0 else "Best"
        where = f" on {server_of(config, document)}" if document.best_per_kind else ""
        bests.append(f"<b>{which}</b>{html.escape(where)}: {setting}, {config.precision}{html.escape(path)}: {figure}")
    if best is not None:
        bests.insert(1, html.escape(winner_sentence(document)))
    facts = bests + facts
    header = ["#", "trial", "server", "batch", "delay ms", "workers", "precision", "data path", "form", "state",
              "capacity rps", "p99 ms", "at", "ready s", "reason", "verdict"]  # fmt: skip
    rows = []
    for trial in document.trials:
        config = trial.config
        cells = [trial.order + 1, trial.name, server_of(config, document), config.batch_size,
                 config.max_batch_delay_ms, config.workers, str(config.precision), config.path_for_people(),
                 str(config.form or "as it comes"), trial.state, trial.capacity_rps, trial.p99_latency_ms,
                 trial.level, trial.ready_seconds, trial.reason]  # fmt: skip
        verdict = f'<td class="verdict">{_verdict(trial.verdict)}</td>'
        rows.append("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in cells) + verdict + "</tr>")
    table = f"<table><tr>{''.join(f'<th>{h}</th>' for h in header)}</tr>\n{''.join(rows)}\n</table>"
    table += "\n" + _cost_table(document)
    intro = f'<p id="verdict">Verdict at the best configuration: {_verdict(best.verdict if best else None)}</p>'
    return html_page(title, intro, facts, table, PLOTS, images_last=False)


def _verdict(verdict: Verdict | None) -> str:
    if verdict is None:
        return "–"
    return (f"<b>{html.escape(str(verdict.bottleneck))}</b>: {html.escape(verdict.because)}; <i>try</i>: "
            f"{html.escape(verdict.next)}")  # fmt: skip
