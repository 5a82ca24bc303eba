"""How one level is shared between load generators, and their results merged back (pure: no gevent,
so the merge can be checked on its own).

Used by :mod:`servinglab.loadgen.generators` (which runs the generators) and :mod:`levels`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from servinglab.api import GeneratorLimits, StabilitySpec
from servinglab.api.figures import OneGenerator, OpenLoopFigures
from servinglab.loadgen import shapes
from servinglab.loadgen.stats import LevelStats, judge_stability, merge_generator_verdicts, summarise


def resolve_count(generators: int | str) -> int:
    """`auto` is one generator per core of this machine."""
    return (os.cpu_count() or 1) if generators == "auto" else int(generators)


def split_rate(rate: float, count: int) -> list[float]:
    return [rate / count] * count


def merge_levels(
    parts: Sequence[LevelStats],
    measure_from: float,
    measured_seconds: float,
    level: float,
    *,
    closed: bool,
    stability: StabilitySpec,
    limits: GeneratorLimits,
    schedule: shapes.Schedule | None = None,
) -> LevelStats:
    """The level (users if `closed`, else the offered rate) as one process would have measured it,
    from every generator's samples; a shaped run's phases from the whole schedule."""
    samples = [sample for part in parts for sample in part.samples]
    stats = summarise(int(level) if closed else None, samples)
    verdict = judge_stability(samples, measure_from, measure_from + measured_seconds, stability)
    verdict = verdict.model_copy(update={"measured_seconds": round(measured_seconds, 3)})
    generators = [part.generator or OneGenerator() for part in parts]
    generator = merge_generator_verdicts(generators, limits, stats.latency_ms.p99)
    open_loop_figures = None
    if not closed:
        figures = [part.open_loop for part in parts if part.open_loop is not None]
        sent = sum(1 for sample in samples if sample.error != "dropped")
        open_loop_figures = OpenLoopFigures(
            offered_rps=level,
            arrival=figures[0].arrival if figures else None,
            sent_rps=round(sent / measured_seconds, 3) if measured_seconds > 0 else 0.0,
            late_sends=sum(f.late_sends for f in figures),
            dropped_sends=sum(f.dropped_sends for f in figures),
        )
    phases = shapes.phase_figures(samples, measure_from, schedule) if schedule is not None else None
    return dataclasses.replace(
        stats,
        stability=verdict,
        generator=generator,
        rate_rps=None if closed else level,
        open_loop=open_loop_figures,
        phases=phases,
    )
