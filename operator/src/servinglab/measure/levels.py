"""From a measured level's statistics to its typed result, and which level is best (pure functions).

The SLO is defined here once (:func:`meets_slo`, for the experiment's levels, the peak-rate search and a
sweep's capacity alike): a level meets it when its p99's upper bound at 95 % (:mod:`servinglab.measure.tails`)
is within the objective and its errors are within the allowed share (none, but in a sweep with
`objective.maxErrorRate`). A level too short for that bound is judged on its p99 itself and marked
uncertain (`sloUncertain`), so short smoke runs keep their verdict and say that it is soft. The best
level is the one with the highest throughput among those that meet it (all levels when no SLO is set);
the ceiling compares the served throughput of that same level. Used by the measurement
driver, the operator's status writer, the sweep roll-up and the reports.
"""

from __future__ import annotations

from collections.abc import Sequence

from servinglab.api.figures import GpuFigures, Latency, ServerBreakdown
from servinglab.api.results import BestLevel, LevelResult
from servinglab.api.verdicts import CpuFigures
from servinglab.loadgen.stats import LevelStats, rounded
from servinglab.measure.tails import latency_intervals


def judged_p99(latency: Latency) -> tuple[float | None, bool]:
    """The p99 the SLO is judged on, and whether that is uncertain: its upper bound at 95 % when the level
    had enough samples for one; else the p99 itself (uncertain when the level is known to be too short,
    certain as before for documents written without bounds)."""
    bounds = latency.p99_interval
    if bounds is not None and bounds.upper is not None:
        return bounds.upper, False
    return latency.p99, bounds is not None


def meets_slo(
    latency: Latency, errors: int, requests: int, slo_p99_ms: float | None, max_error_rate: float = 0.0
) -> bool:
    """The one SLO predicate: the p99 (its upper bound when there is one) within `slo_p99_ms` (any p99 when
    None), and at most `max_error_rate` of the requests failed (by default none)."""
    if errors / max(requests, 1) > max_error_rate:
        return False
    p99, _ = judged_p99(latency)
    return slo_p99_ms is None or (p99 is not None and p99 <= slo_p99_ms)


def level_meets_slo(level: LevelResult, slo_p99_ms: float | None, max_error_rate: float = 0.0) -> bool:
    return meets_slo(level.latency_ms, level.errors, level.requests, slo_p99_ms, max_error_rate)


def latency_of(stats: LevelStats) -> Latency:
    """The level's percentiles and, from its samples, their confidence bounds (none without samples)."""
    latency = rounded(stats.latency_ms)
    ok = sorted(sample.latency_ms for sample in stats.samples if sample.error is None)
    return latency.model_copy(update={"intervals": latency_intervals(ok)}) if ok else latency


def probe_passes(stats: LevelStats, slo_p99_ms: float) -> bool:
    """A probe of the peak-rate search passes when it meets the SLO and the load generator did not limit
    it (a saturated generator cannot vouch for the server)."""
    saturated = stats.generator is not None and stats.generator.saturated
    return meets_slo(latency_of(stats), stats.errors, stats.requests, slo_p99_ms) and not saturated


def level_result(
    stats: LevelStats, server: ServerBreakdown | None, slo_p99_ms: float | None, probe: bool = False
) -> LevelResult:
    """The typed result of one level: the generator's exact figures, the server's breakdown over the
    same window, whether it met the SLO, and whether it was a probe of the peak-rate search."""
    latency = latency_of(stats)
    judged = slo_p99_ms is not None and latency.p99 is not None
    return LevelResult(
        concurrency=stats.concurrency,
        rate_rps=stats.rate_rps if stats.concurrency is None else None,
        throughput_rps=round(stats.throughput_rps, 3),
        latency_ms=latency,
        requests=stats.requests,
        errors=stats.errors,
        errors_by_kind=dict(stats.errors_by_kind),
        window_seconds=round(stats.window_seconds, 3),
        window_start=round(stats.window_start, 3),
        window_end=round(stats.window_end, 3),
        latency_cdf_ms=stats.latency_cdf_ms,
        stability=stats.stability,
        generator=stats.generator,
        open_loop=stats.open_loop,
        repeats=stats.repeats,
        phases=list(stats.phases) if stats.phases is not None else None,
        server=server,
        meets_slo=meets_slo(latency, stats.errors, stats.requests, slo_p99_ms) if slo_p99_ms is not None else None,
        slo_uncertain=True if judged and judged_p99(latency)[1] else None,
        peak_search_probe=True if probe else None,
    )


def level_results(
    stats: Sequence[LevelStats],
    sweep_levels: int,
    breakdowns: dict[int, ServerBreakdown],
    slo_p99_ms: float | None,
) -> list[LevelResult]:
    """Results in run order; server breakdowns are keyed by level index; the levels after the first
    `sweep_levels` are probes of the peak-rate search."""
    return [
        level_result(level, breakdowns.get(index), slo_p99_ms, probe=index >= sweep_levels)
        for index, level in enumerate(stats)
    ]


def with_device(level: LevelResult, cpu: CpuFigures | None, gpu: GpuFigures | None) -> LevelResult:
    """The level with its device figures over the same window; the energy per successful inference is
    the window's energy over the requests that succeeded in it."""
    if gpu is not None and gpu.energy_joules is not None and level.requests > level.errors:
        per = round(gpu.energy_joules / (level.requests - level.errors), 6)
        gpu = gpu.model_copy(update={"energy_per_inference_joules": per})
    return level.model_copy(update={"cpu": cpu, "gpu": gpu})


def within_slo(levels: Sequence[LevelResult], slo_p99_ms: float | None) -> list[LevelResult]:
    """The levels that count for the best level and the ceiling: all, or those within the SLO."""
    return [level for level in levels if slo_p99_ms is None or level_meets_slo(level, slo_p99_ms)]


def served_level(levels: Sequence[LevelResult], slo_p99_ms: float | None) -> LevelResult | None:
    """The level a ceiling compares: the highest throughput, among levels within the SLO if one is set."""
    candidates = within_slo(levels, slo_p99_ms)
    return max(candidates, key=lambda level: level.throughput_rps) if candidates else None


def best_level(levels: Sequence[LevelResult], slo_p99_ms: float | None) -> BestLevel | None:
    """The level with the highest throughput (more than none); with an SLO, only levels that meet it."""
    top = served_level([level for level in levels if level.throughput_rps > 0], slo_p99_ms)
    if top is None:
        return None
    return BestLevel(
        concurrency=top.concurrency, rate_rps=top.rate_rps, throughput_rps=top.throughput_rps,
        p99_latency_ms=top.latency_ms.p99,
        p99_upper_ms=top.latency_ms.p99_interval.upper if top.latency_ms.p99_interval is not None else None,
        cost=top.cost,
    )  # fmt: skip
