"""Several generator processes, one level: the merge is what one process would have computed over
the union of every request, and a generator that limited the load flags the level by number."""

from __future__ import annotations

import dataclasses
import random

import pytest

from servinglab.api import GeneratorLimits, StabilitySpec
from servinglab.api.figures import OpenLoopFigures
from servinglab.loadgen import shapes, sharing
from servinglab.loadgen.stats import LevelStats, Sample, generator_verdict, judge_stability, summarise

START = 1_800_000_000.0
STABILITY = StabilitySpec(window_seconds=2, windows=3, tolerance=0.2)


def generator_part(seed: int, users: int, errors: float, cpu: float, gap_ms: float) -> LevelStats:
    """One generator's level: 10 s of samples with its own latency distribution and error rate."""
    rng = random.Random(seed)
    samples = []
    for user in range(users):
        sent = START + rng.random() * 0.01
        while sent < START + 10:
            latency = rng.lognormvariate(3 + seed * 0.1, 0.5)
            error = "http_503" if rng.random() < errors else None
            samples.append(Sample(sent, latency, error))
            sent += latency / 1000 + user * 1e-6
    stats = summarise(users, samples)
    verdict = generator_verdict(cpu, [gap_ms] * 100, GeneratorLimits(), stats.latency_ms.p99)
    return dataclasses.replace(stats, generator=verdict)


def merge(parts: list[LevelStats], level: float, closed: bool = True) -> LevelStats:
    """The generators' 10 s levels merged (the pure half of servinglab.loadgen.generators, which runs them)."""
    return sharing.merge_levels(parts, START, 10.0, level, closed=closed, stability=STABILITY, limits=GeneratorLimits())


def test_the_merged_level_is_the_single_computation_over_every_sample() -> None:
    parts = [generator_part(1, 3, 0.01, 40.0, 0.2), generator_part(2, 5, 0.0, 55.0, 0.3)]
    merged = merge(parts, 8)

    union = [sample for part in parts for sample in part.samples]
    alone = summarise(8, union)
    assert merged.latency_ms == alone.latency_ms and merged.latency_cdf_ms == alone.latency_cdf_ms
    assert merged.requests == len(union) == parts[0].requests + parts[1].requests
    assert merged.errors_by_kind == alone.errors_by_kind == {"http_503": parts[0].errors}
    assert merged.throughput_rps == alone.throughput_rps
    assert merged.window_start == min(s.sent_at for s in union)
    assert merged.window_end == max(s.finished_at for s in union)
    windows = judge_stability(union, START, START + 10.0, STABILITY).windows
    assert merged.stability is not None and merged.stability.windows == windows
    # not what averaging the generators' own figures would give
    p99s = [part.latency_ms.p99 or 0.0 for part in parts]
    assert merged.latency_ms.p99 != pytest.approx((p99s[0] + p99s[1]) / 2)
    assert merged.generator is not None and merged.generator.generators == 2
    assert merged.generator.saturated is False


def test_a_saturated_generator_flags_the_level_and_is_named() -> None:
    parts = [generator_part(1, 3, 0.0, 30.0, 0.2), generator_part(2, 3, 0.0, 97.0, 0.2)]
    generator = merge(parts, 6).generator
    assert generator is not None and generator.saturated is True and generator.per_generator is not None
    assert str(generator.reason).startswith("generator 2 of 2: generator CPU 97%"), generator.reason
    assert [g.saturated for g in generator.per_generator] == [False, True]
    assert generator.cpu_percent == 97.0


def test_a_send_gap_is_judged_against_the_merged_p99() -> None:
    # a 12 ms send gap is material next to a ~20 ms p99, so the generator flags itself; it is not
    # next to the merged level's much slower p99 (the other generator's requests were slow)
    fast = generator_part(1, 2, 0.0, 30.0, 12.0)
    slow_samples = [Sample(START + i * 0.05, 2000.0) for i in range(200)]
    slow = dataclasses.replace(summarise(2, slow_samples), generator=fast.generator)
    assert fast.generator is not None and fast.generator.saturated is True
    merged = merge([fast, slow], 4)
    assert merged.generator is not None and merged.generator.saturated is False, merged.generator


def test_open_loop_counts_are_summed_and_the_sent_rate_is_the_unions() -> None:
    parts = []
    for number in range(2):
        samples = [Sample(START + i / 50 + number / 100, 5.0) for i in range(500)]
        samples += [Sample(START + 3.0 + number, 0.0, "dropped")] * (number + 1)
        stats = summarise(None, samples)
        figures = OpenLoopFigures(offered_rps=50.0, arrival="poisson", sent_rps=50.0, late_sends=2 + number,
                                  dropped_sends=number + 1)  # fmt: skip
        verdict = generator_verdict(20.0, [0.1], GeneratorLimits(), 5.0)
        parts.append(dataclasses.replace(stats, open_loop=figures, rate_rps=50.0, generator=verdict))
    merged = merge(parts, 100.0, closed=False)
    assert merged.rate_rps == 100.0 and merged.concurrency is None
    assert merged.open_loop == OpenLoopFigures(offered_rps=100.0, arrival="poisson", sent_rps=100.0, late_sends=5,
                                               dropped_sends=3)  # fmt: skip
    assert merged.errors_by_kind == {"dropped": 3}


def test_levels_are_split_evenly_and_auto_is_one_per_core() -> None:
    assert shapes.split_users(7, 3) == [3, 2, 2]
    assert shapes.split_users(1, 2) == [1, 0]
    assert sharing.split_rate(90.0, 3) == [30.0, 30.0, 30.0]
    assert sharing.resolve_count("auto") >= 1 and sharing.resolve_count(3) == 3
