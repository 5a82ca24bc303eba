"""Tails you can certify (pure): each percentile's distribution-free bounds from order statistics, against a
brute-force binomial sum; the level too short for its p99's bound and how many requests it needed; and
the one SLO predicate, judged on the p99's upper bound, for an experiment's levels and a sweep's capacity.
"""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest

from servinglab.api.results import ExperimentResults, LevelResult
from servinglab.loadgen.stats import Sample, summarise
from servinglab.measure import tails
from servinglab.measure.levels import best_level, level_result, probe_passes
from servinglab.present import tables
from servinglab.sweep import rollup


def reference_ranks(n: int, q: Fraction, confidence: Fraction) -> tuple[int | None, int | None]:
    """The 1-based ranks of the bounds, by definition and in exact arithmetic: the smallest u with
    P(K <= u-1) >= c, the largest l with P(K >= l) >= c, for K ~ Binomial(n, q)."""
    cdf, total = [], Fraction(0)
    for j in range(n + 1):
        total += comb(n, j) * q**j * (1 - q) ** (n - j)
        cdf.append(total)  # cdf[k] = P(K <= k)
    upper = next((u for u in range(1, n + 1) if cdf[u - 1] >= confidence), None)
    lower = max((rank for rank in range(1, n + 1) if 1 - cdf[rank - 1] >= confidence), default=None)
    return lower, upper


@pytest.mark.parametrize("n", [1, 5, 20, 59, 100, 298, 299, 300, 420])
@pytest.mark.parametrize("q", [Fraction(1, 2), Fraction(9, 10), Fraction(95, 100), Fraction(99, 100)])
def test_bounds_ranks_match_the_binomial_sums(n: int, q: Fraction) -> None:
    assert (tails.lower_rank(n, float(q)), tails.upper_rank(n, float(q))) == reference_ranks(n, q, Fraction(95, 100))


def test_a_large_level_gets_its_bounds_quickly_and_around_the_percentile() -> None:
    n = 200_000
    upper, lower = tails.upper_rank(n, 0.99), tails.lower_rank(n, 0.99)
    assert lower is not None and upper is not None
    assert lower < 0.99 * n < upper  # about 1.645 standard deviations (44.5 ranks) either side
    assert abs(upper - 0.99 * n - 1.645 * (n * 0.99 * 0.01) ** 0.5) < 3
    assert abs(0.99 * n - lower - 1.645 * (n * 0.99 * 0.01) ** 0.5) < 3


@pytest.mark.parametrize(("q", "confidence"), [(0.99, 0.95), (0.95, 0.95), (0.5, 0.95), (0.99, 0.99), (0.9, 0.8)])
def test_the_samples_needed_are_the_fewest_with_an_upper_bound(q: float, confidence: float) -> None:
    needed = tails.samples_needed(q, confidence)
    assert tails.upper_rank(needed, q, confidence) is not None
    assert tails.upper_rank(needed - 1, q, confidence) is None


def test_p99_at_95_percent_needs_299_requests() -> None:
    assert tails.samples_needed(0.99) == 299


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="quantile q must be in"):
        tails.upper_rank(10, 1.0)
    with pytest.raises(ValueError, match="confidence must be in"):
        tails.samples_needed(0.99, 1.0)


def level(latencies: list[float], errors: int = 0, every: float = 0.01) -> list[Sample]:
    """A level's samples: one request `every` seconds with these latencies, then `errors` failed ones."""
    ok = [Sample(i * every, value) for i, value in enumerate(latencies)]
    return ok + [Sample(10.0 + i, 1.0, "http-500") for i in range(errors)]


def test_a_level_reports_each_percentiles_interval_from_its_samples() -> None:
    values = [float(v) for v in range(1, 1001)]  # 1..1000 ms, shuffled order must not matter
    stats = summarise(4, level(values[::-1]))
    result = level_result(stats, None, slo_p99_ms=None)
    intervals = result.latency_ms.intervals
    assert intervals is not None and intervals.p99 is not None and intervals.p50 is not None
    low, high = reference_ranks(1000, Fraction(99, 100), Fraction(95, 100))
    assert low is not None and high is not None
    lower, upper, p99 = intervals.p99.lower, intervals.p99.upper, result.latency_ms.p99
    assert (lower, upper) == (values[low - 1], values[high - 1])
    assert lower is not None and upper is not None and p99 is not None and lower <= p99 <= upper
    assert intervals.p99.confidence == 0.95 and intervals.p99.samples == 1000 and intervals.p99.samples_needed is None
    median_low, median_high = intervals.p50.lower, intervals.p50.upper
    assert median_low is not None and median_high is not None and median_low < 500.0 < median_high


def test_a_level_too_short_for_its_p99_says_so_and_how_many_it_needed() -> None:
    stats = summarise(2, level([float(v) for v in range(1, 121)]))  # 120 requests
    result = level_result(stats, None, slo_p99_ms=500.0)
    bounds = result.latency_ms.p99_interval
    assert bounds is not None and bounds.upper is None and bounds.too_short
    assert bounds.samples == 120 and bounds.samples_needed == 299
    # judged on the p99 itself (as before), and marked uncertain
    assert result.meets_slo is True and result.slo_uncertain is True
    assert level_result(stats, None, slo_p99_ms=100.0).meets_slo is False
    document = ExperimentResults(experiment="e", model="m", results=[result])
    assert tables.p99_cell(result.latency_ms) == "119.0*"
    legend = tables.tails_legend(document)
    assert legend is not None and "120 successful requests, 299 needed" in legend


def test_the_slo_is_judged_on_the_p99s_upper_bound() -> None:
    stats = summarise(8, level([float(v) for v in range(1, 1001)]))  # p99 990 ms, its upper bound 996 ms
    assert stats.latency_ms.p99 == 990.0
    within_the_point_only = level_result(stats, None, slo_p99_ms=993.0)
    assert within_the_point_only.meets_slo is False and within_the_point_only.slo_uncertain is None
    assert level_result(stats, None, slo_p99_ms=996.0).meets_slo is True
    assert not probe_passes(stats, 993.0) and probe_passes(stats, 996.0)  # the peak-rate search: the same
    assert best_level([within_the_point_only], 993.0) is None
    best = best_level([level_result(stats, None, slo_p99_ms=996.0)], 996.0)
    assert best is not None and best.p99_upper_ms == 996.0
    assert tables.p99_cell(within_the_point_only.latency_ms) == "990.0 ≤996.0"
    # a failed request fails the level, whatever its tail
    assert level_result(summarise(8, level([1.0] * 400, errors=1)), None, 996.0).meets_slo is False


def sweep_capacity(levels: list[LevelResult], slo: float, max_error_rate: float = 0.0) -> float | None:
    found = rollup.capacity(ExperimentResults(experiment="t", model="m", results=levels), slo, max_error_rate)
    return found.capacity_rps if found is not None else None


def test_a_sweeps_capacity_uses_the_same_predicate() -> None:
    slow = level_result(summarise(8, level([float(v) for v in range(1, 1001)])), None, slo_p99_ms=None)
    fast = level_result(summarise(4, level([1.0] * 500, every=0.02)), None, slo_p99_ms=None)
    assert slow.throughput_rps > fast.throughput_rps
    assert sweep_capacity([fast, slow], 993.0) == fast.throughput_rps  # the slow level's bound is over
    assert sweep_capacity([fast, slow], 996.0) == slow.throughput_rps
    flaky = level_result(summarise(8, level([1.0] * 990, errors=10)), None, slo_p99_ms=None)
    assert sweep_capacity([flaky], 996.0) is None
    assert sweep_capacity([flaky], 996.0, max_error_rate=0.05) == flaky.throughput_rps


def test_the_status_keeps_the_p99_bound_alone() -> None:
    result = level_result(summarise(8, level([float(v) for v in range(1, 1001)])), None, slo_p99_ms=996.0)
    compact = result.compact()
    assert compact.latency_ms.intervals is not None and compact.latency_ms.intervals.p50 is None
    assert compact.latency_ms.intervals.p99 == result.latency_ms.p99_interval
    # an earlier document, without bounds, reads and is judged on its p99 as before (not uncertain)
    old = LevelResult.model_validate({"concurrency": 1, "throughputRps": 5.0, "latencyMs": {"p99": 10.0},
                                      "requests": 50, "errors": 0})  # fmt: skip
    assert sweep_capacity([old], 10.0) == 5.0 and tables.p99_cell(old.latency_ms) == "10.0"
