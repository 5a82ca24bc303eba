"""From a measured level's statistics to its typed result, and which level is best (pure functions).

The SLO is defined here once: a level meets it when its p99 is within the objective and nothing failed.
The best level is the one with the highest throughput among those that meet it (all levels when no SLO
is set); the ceiling compares the served throughput of that same level. Used by the measurement
driver, the operator's status writer, the sweep roll-up and the reports.
"""

from __future__ import annotations

from collections.abc import Sequence

from servinglab.api.results import (
    BestLevel,
    GeneratorVerdict,
    GpuFigures,
    Latency,
    LevelResult,
    OpenLoopFigures,
    PhaseFigures,
    Repeats,
    ServerBreakdown,
    Stability,
)
from servinglab.api.verdicts import CpuFigures
from servinglab.loadgen.stats import LevelStats


def meets_slo(p99_ms: float | None, errors: int, slo_p99_ms: float) -> bool:
    """A level meets the latency objective when its p99 is within it and nothing failed."""
    return p99_ms is not None and p99_ms <= slo_p99_ms and errors == 0


def level_meets_slo(level: LevelResult, slo_p99_ms: float) -> bool:
    return meets_slo(level.latency_ms.p99, level.errors, slo_p99_ms)


def probe_passes(stats: LevelStats, slo_p99_ms: float) -> bool:
    """A probe of the peak-rate search passes when it meets the SLO and the load generator did not limit
    it (a saturated generator cannot vouch for the server)."""
    saturated = bool((stats.generator or {}).get("saturated"))
    return meets_slo(stats.latency_ms.get("p99"), stats.errors, slo_p99_ms) and not saturated


def level_result(
    stats: LevelStats, server: ServerBreakdown | None, slo_p99_ms: float | None, probe: bool = False
) -> LevelResult:
    """The typed result of one level: the generator's exact figures, the server's breakdown over the
    same window, whether it met the SLO, and whether it was a probe of the peak-rate search."""
    p99 = stats.latency_ms.get("p99")
    return LevelResult(
        concurrency=stats.concurrency,
        rate_rps=stats.rate_rps if stats.concurrency is None else None,
        throughput_rps=round(stats.throughput_rps, 3),
        latency_ms=Latency.model_validate({k: round(v, 3) for k, v in stats.latency_ms.items()}),
        requests=stats.requests,
        errors=stats.errors,
        errors_by_kind=dict(stats.errors_by_kind),
        window_seconds=round(stats.window_seconds, 3),
        window_start=round(stats.window_start, 3),
        window_end=round(stats.window_end, 3),
        latency_cdf_ms=stats.latency_cdf_ms,
        stability=Stability.model_validate(stats.stability) if stats.stability is not None else None,
        generator=GeneratorVerdict.model_validate(stats.generator) if stats.generator is not None else None,
        open_loop=OpenLoopFigures.model_validate(stats.open_loop) if stats.open_loop is not None else None,
        repeats=Repeats.model_validate(stats.repeats) if stats.repeats is not None else None,
        phases=[PhaseFigures.model_validate(p) for p in stats.phases] if stats.phases is not None else None,
        server=server,
        meets_slo=meets_slo(p99, stats.errors, slo_p99_ms) if slo_p99_ms is not None else None,
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
    )  # fmt: skip
