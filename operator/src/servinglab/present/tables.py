"""The results tables a person reads in a terminal: one experiment's levels, one sweep's trials.

Both print the same thing for a local run and for a cluster experiment (`servinglab results`), since
both are typed documents of the same family. Called by the command line.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from servinglab.api import TrialConfig
from servinglab.api.ceiling import Ceiling
from servinglab.api.figures import Latency
from servinglab.api.results import ExperimentResults, PeakRate
from servinglab.api.states import Confidence, ConfirmationState
from servinglab.api.trials import SweepResults, TrialRecord
from servinglab.api.utilisation import UtilisationSearch
from servinglab.measure.trust import trust_checks

# Wide enough for the results table when output goes to a file or a CI log, not a terminal.
stdout = Console(width=None if sys.stdout.isatty() else 160)


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_results(document: ExperimentResults) -> None:
    """One row per level, the trust warnings under it, then cold start, best level, peak rate and
    ceiling."""
    server = document.server
    title = (
        f"{document.experiment}: {document.model} on {server.kind}"
        f" batch={server.batch_size} delay={server.max_batch_delay_ms}ms workers={server.workers} "
        f"precision={server.precision}"
    )
    table = Table(title=title, title_justify="left")
    for column in ("level", "rps", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "max ms"):
        table.add_column(column, justify="right")
    for column in ("requests", "errors", "batch", "queue ms", "infer ms/batch"):
        table.add_column(column, justify="right")
    slo = document.slo_p99_ms
    if slo is not None:
        table.add_column(f"p99≤{slo:g}", justify="center")
    table.add_column("checks", justify="left")
    table.add_column("verdict", justify="left")
    warnings = []
    for level in document.results:
        latency, breakdown = level.latency_ms, level.server
        row = [
            level.label + (" (search)" if level.peak_search_probe else ""),
            f"{level.throughput_rps:.1f}",
            *(ms(value) for value in (latency.p50, latency.p90, latency.p95)),
            p99_cell(latency),
            ms(latency.max),
            str(level.requests),
            str(level.errors),
            num(breakdown.mean_batch_size if breakdown else None, 2),
            num(breakdown.queue_ms_mean if breakdown else None, 1),
            num(breakdown.inference_ms_per_batch if breakdown else None, 1),
        ]
        if slo is not None:
            row.append(("yes" if level.meets_slo else "no") + ("*" if level.slo_uncertain else ""))
        marks, why = trust_checks(level)
        row.append(" ".join(marks) or "-")
        row.append(str(level.verdict.bottleneck) if level.verdict is not None else "-")
        warnings += [f"level {level.label}: {reason}" for reason in why]
        table.add_row(*row)
    stdout.print(table)
    # soft wraps only: a line is never broken inside a finding, whatever the width (a pipe's is 160)
    for warning in warnings:
        stdout.print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
    for line in verdict_lines(document):
        stdout.print(line, highlight=False, markup=False, soft_wrap=True)
    stdout.print("; ".join(notes(document)), highlight=False, soft_wrap=True)
    if legend := tails_legend(document):
        stdout.print(legend, highlight=False, markup=False, soft_wrap=True)


def p99_cell(latency: Latency) -> str:
    """The p99 with its upper bound at 95 % ("12.3 ≤14.0"), or a `*` when the level was too short for one."""
    bounds = latency.p99_interval
    if latency.p99 is None or bounds is None:
        return ms(latency.p99)
    return f"{ms(latency.p99)}*" if bounds.upper is None else f"{ms(latency.p99)} ≤{ms(bounds.upper)}"


def tails_legend(document: ExperimentResults) -> str | None:
    """What the p99 column's marks mean, when it shows any: the upper bound, and the levels too short for one."""
    bounded = [level.latency_ms.p99_interval for level in document.results if level.latency_ms.p99 is not None]
    known = [bounds for bounds in bounded if bounds is not None]
    if not known:
        return None
    legend = f"p99 ≤x: x bounds the true p99 at {known[0].confidence:.0%} confidence (order statistics)"
    short = [bounds for bounds in known if bounds.upper is None]
    if short:
        needed = max(bounds.samples_needed or 0 for bounds in short)
        legend += (f"; *: too short for that bound ({min(b.samples for b in short)} successful requests, "
                   f"{needed} needed): the SLO is judged on the p99 itself, uncertain")  # fmt: skip
    return legend


def verdict_lines(document: ExperimentResults) -> list[str]:
    """One line per judged level: its bottleneck, the figures behind it, the next change to try."""
    return [
        f"verdict at {level.label}: {level.verdict.bottleneck}: {level.verdict.because}; try: {level.verdict.next}"
        for level in document.results
        if level.verdict is not None
    ]


def notes(document: ExperimentResults) -> list[str]:
    """The sentences under the table: cold start, best level, peak rate, ceiling, precision."""
    warmup = f" (handler warm-up {document.warmup_seconds:.1f} s)" if document.warmup_seconds else ""
    found = [f"cold start {document.cold_start_seconds or 0:.1f} s{warmup}"]
    if document.best is not None:
        found.append(f"best: level {document.best.label} at {document.best.throughput_rps:.1f} rps")
    if document.peak_rate is not None:
        found.append(peak_note(document.peak_rate))
    if document.utilisation is not None:
        found += utilisation_notes(document.utilisation)
    if document.ceiling is not None:
        found.append(ceiling_note(document.ceiling))
    precision_note = document.runtime.precision_note if document.runtime is not None else None
    if precision_note:
        found.append(precision_note)
    data_path = document.runtime.data_path if document.runtime is not None else None
    if data_path is not None and data_path.note:
        found.append(f"data path: {data_path.note}")
    return found


def peak_note(peak: PeakRate) -> str:
    if peak.rate_rps is None:
        return f"peak rate: none found ({peak.note})"
    return (
        f"peak rate within the SLO: {peak.rate_rps:g} rps (p99 {ms(peak.p99_latency_ms)} ms, "
        f"{peak.probes} probes{'; ' + peak.note if peak.note else ''})"
    )


def utilisation_notes(search: UtilisationSearch) -> list[str]:
    """The utilisation search's answer, then the probes that led there (load: utilisation, rps, p99)."""
    aim = f"{search.resource.upper()} utilisation {search.target:g} ± {search.tolerance:g}"
    if search.reached:
        head = (f"{aim} held at {search.load_label}: {search.utilisation or 0:.3g}, "
                f"{search.throughput_rps or 0:.1f} rps, p99 {ms((search.latency_ms or {}).get('p99'))} ms")  # fmt: skip
    else:
        head = f"{aim} never reached: {search.reason} ({search.note})"
    steps = "; ".join(
        f"{f'c={step.concurrency}' if step.concurrency is not None else f'{step.rate_rps or 0:g} rps'}: "
        f"{'?' if step.utilisation is None else f'{step.utilisation:.3g}'}, {step.throughput_rps:.1f} rps, "
        f"p99 {ms(step.p99_latency_ms)} ms"
        for step in search.steps
    )
    return [head, f"utilisation probes ({search.probes}): {steps or 'none'}"]


def ceiling_note(ceiling: Ceiling) -> str:
    parts = [f"ceiling: {ceiling.flops_per_inference / 1e9:.3g} GFLOPs/inference"]
    if ceiling.served_over_raw is not None:
        parts.append(
            f"served {ceiling.served_rps or 0:.1f} rps = {ceiling.served_over_raw:.0%} of the model alone at the "
            f"formed batch size {ceiling.raw_batch_size} ({ceiling.raw_at_formed_batch_rps or 0:.1f} rps in-process)"
        )
    if ceiling.served_over_best_raw is not None:
        parts.append(
            f"{ceiling.served_over_best_raw:.0%} of its best ({ceiling.raw_best_rps or 0:.1f} rps at batch "
            f"{ceiling.raw_best_batch_size})"
        )
    if ceiling.served_over_theoretical is not None:
        parts.append(
            f"{ceiling.served_over_theoretical:.3g} of the {ceiling.accelerator} peak "
            f"({ceiling.theoretical_rps or 0:.0f} rps at {ceiling.peak_tflops:g} TFLOPS)"
        )
    elif ceiling.note:
        parts.append(ceiling.note)
    return ", ".join(parts)


def server_of(config: TrialConfig, document: SweepResults) -> str:
    """The server a trial ran on: its own kind, or the template's (the document's)."""
    return config.kind or document.server_kind or "-"


def print_sweep(document: SweepResults) -> None:
    """One row per trial (server and configuration), then the best configuration (each server's, when the
    sweep compared servers), the front and why the sweep stopped."""
    slo = document.objective.p99_latency_ms
    title = f"{document.sweep}: {document.model}, {document.strategy}" + (f", p99 <= {slo:g} ms" if slo else "")
    table = Table(title=title, title_justify="left")
    paths = any(trial.config.data_path is not None for trial in document.trials)  # a column when varied
    forms = any(trial.config.form is not None for trial in document.trials)
    columns = ("#", "server", "batch", "delay", "workers", "precision", *(["data path"] if paths else []),
               *(["form"] if forms else []), "state", "capacity rps", "p99 ms", "at", "ready s", "verdict")  # fmt: skip
    for column in columns:
        left = column in ("server", "precision", "data path", "form", "state", "at", "verdict")
        table.add_column(column, justify="left" if left else "right")
    best = document.best.trial if document.best is not None else None
    for trial in document.trials:
        config = trial.config
        state = trial.state if not trial.reason else f"{trial.state} ({trial.reason})"
        ready = trial.ready_seconds
        table.add_row(
            str(trial.order + 1) + (" *" if trial.name == best else ""), server_of(config, document),
            str(config.batch_size), str(config.max_batch_delay_ms), str(config.workers), str(config.precision),
            *([config.path_for_people()] if paths else []), *([str(config.form or "-")] if forms else []), state,
            num(trial.capacity_rps, 1),
            ms(trial.p99_latency_ms), trial.level or "-",
            "-" if ready is None else f"{ready:.1f}" + (" (reconfigured)" if trial.reconfigured else ""),
            str(trial.verdict.bottleneck) if trial.verdict is not None else "-",
        )  # fmt: skip
    stdout.print(table)
    counts = document.counts
    found = [f"{counts.run} trials run of {document.grid_size} configurations ({counts.pruned} pruned)"]
    left_out = sorted({p.reason for p in document.pruned if p.config.form is not None and "form" in p.reason})
    if left_out:  # the forms the rest of a configuration cannot run, each reason once
        found.append("left out: " + "; ".join(left_out))
    for top in document.best_per_kind or ([document.best] if document.best is not None else []):
        config = top.config
        where = f" on {server_of(config, document)}" if document.best_per_kind else ""
        path = f", {config.path.describe()}" if config.data_path else ""
        path += f", form {config.form}" if config.form is not None else ""
        found.append(
            f"best{where}: batch {config.batch_size}, delay {config.max_batch_delay_ms} ms, "
            f"{config.workers} worker(s), {config.precision}{path} at "
            f"{top.capacity_rps:.1f} rps (p99 {ms(top.p99_latency_ms)} ms, {top.level})"
        )
    if document.best is not None:
        found.append(winner_sentence(document))
        if (verdict := document.best.verdict) is not None:
            found.append(f"its verdict: {verdict.bottleneck}: {verdict.because}; try: {verdict.next}")
    else:
        found.append("no configuration met the objective")
    found.append(f"Pareto front: {len(document.front)} points")
    if document.cost_front is not None:  # ranked by the p99's upper bound
        found.append(f"cost front: {len(document.cost_front)} points (cost per million against p99's upper bound)")
    elif document.cost_front_reason:
        found.append(f"no cost front: {document.cost_front_reason}")
    found.append(f"stopped: {document.stop_reason or 'not finished'}")
    stdout.print("; ".join(found), highlight=False, soft_wrap=True)  # no line breaks inside a finding


def winner_sentence(document: SweepResults) -> str:
    """How sure the sweep is of its best: the confirmation's interval, or the tie, or that it was not confirmed."""
    best, confirmation = document.best, document.confirmation
    if best is None:
        return "no winner"
    if confirmation is not None and confirmation.state == ConfirmationState.NONE_WITHIN_SLO:
        return f"winner not confirmed: {confirmation.note}"
    if confirmation is None or best.confidence in (None, Confidence.UNCONFIRMED):
        return "winner not confirmed (one measurement per trial; spec.confirm.rounds is 0 or one trial measured)"
    if best.confidence == Confidence.CONFIRMING:
        done = sum(len(c.runs_rps) + len(c.missed or []) for c in confirmation.candidates)
        return f"confirming the winner: {done} runs in"
    if best.low_rps is not None and best.high_rps is not None:
        interval = f"{best.low_rps:.1f}..{best.high_rps:.1f} rps (95 %)"
    else:  # one run within the SLO: no spread to estimate
        interval = f"{best.capacity_rps:.1f} rps (too few runs within the SLO for an interval)"
    misses = [f"{c.trial} {len(c.missed)}/{confirmation.rounds}" for c in confirmation.candidates if c.missed]
    if misses:  # runs that missed the objective: counted as such, not averaged in as 0 rps
        interval += f"; runs that missed the SLO: {', '.join(misses)}"
    if best.confidence == Confidence.TIE:
        return (f"a tie: {best.trial} ({interval}) cannot be told from {', '.join(best.tied_with or [])} after "
                f"{confirmation.rounds} alternated rounds; the cheapest is named")  # fmt: skip
    count = len(confirmation.candidates)
    return f"winner confirmed over {confirmation.rounds} alternated rounds of the best {count}: {interval}"


def trial_line(record: TrialRecord) -> str:
    """One line per finished trial (or confirmation run), while a sweep runs."""
    found = record.capacity_rps
    figure = f"{found:.1f} rps within the SLO" if found is not None else (record.reason or "-")
    verdict = f" ({record.verdict.bottleneck})" if record.verdict is not None else ""
    what = "Confirmation" if record.confirms is not None else "Trial"
    return f"{what} {record.name}: {record.state}, {figure}{verdict}"
