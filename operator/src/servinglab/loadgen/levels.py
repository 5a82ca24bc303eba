"""Run the load section of an experiment: closed-loop levels, or open-loop rates and the peak search.

The one place that turns `spec.load` into level runs, shared by the local runner and `servinglab
loadtest` (the Kubernetes Job), so both produce the same levels. Level hooks receive the level's
index in the run (sweep levels first, then the peak-search probes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from servinglab.loadgen import closed_loop, open_loop
from servinglab.loadgen.closed_loop import WindowHook
from servinglab.loadgen.peak import search_peak_rate
from servinglab.loadgen.stats import LevelStats
from servinglab.spec import LoadSpec


@dataclass(frozen=True)
class Target:
    """Where requests go and what they carry."""

    url: str
    path: str
    payloads: Sequence[bytes]
    content_type: str


@dataclass
class LoadOutcome:
    levels: list[LevelStats] = field(default_factory=list)
    sweep_levels: int = 0  # levels[:sweep_levels] are the requested levels, the rest peak-search probes
    peak: dict[str, Any] | None = None


def run_load(
    load: LoadSpec,
    slo_p99_ms: float | None,
    target: Target,
    on_progress: closed_loop.ProgressFn | None = None,
    on_window_start: WindowHook | None = None,
    on_window_end: WindowHook | None = None,
) -> LoadOutcome:
    if load.mode == "closed":
        plan = closed_loop.LoadPlan(
            target=target.url, path=target.path, payloads=target.payloads, content_type=target.content_type,
            request_timeout_seconds=load.request_timeout_seconds, stability=load.stability,
            generator_limits=load.generator,
        )  # fmt: skip
        stats = closed_loop.run_levels(
            plan, load.concurrency, load.warmup_seconds, load.duration_seconds,
            on_progress=on_progress, on_window_start=on_window_start, on_window_end=on_window_end,
        )  # fmt: skip
        return LoadOutcome(stats, len(stats))

    open_plan = open_loop.OpenLoopPlan(
        target=target.url, path=target.path, payloads=target.payloads, content_type=target.content_type,
        request_timeout_seconds=load.request_timeout_seconds, arrival=load.arrival, max_in_flight=load.max_in_flight,
        seed=load.payload.seed, stability=load.stability, generator_limits=load.generator,
    )  # fmt: skip

    def run(rates: Sequence[float], first_index: int) -> list[LevelStats]:
        return open_loop.run_rates(
            open_plan, rates, load.warmup_seconds, load.duration_seconds, on_progress=on_progress,
            on_window_start=on_window_start, on_window_end=on_window_end, first_index=first_index,
        )  # fmt: skip

    outcome = LoadOutcome()
    outcome.levels = run(load.rates, 0)
    outcome.sweep_levels = len(outcome.levels)
    if load.rate_search is not None and slo_p99_ms is not None:

        def probe(rate: float) -> LevelStats:
            (stats,) = run([rate], len(outcome.levels))
            outcome.levels.append(stats)
            return stats

        outcome.peak, _ = search_peak_rate(probe, load.rate_search, slo_p99_ms)
    return outcome
