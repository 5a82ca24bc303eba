"""Open-loop schedules (Poisson timing statistics) and the peak-rate search (pure functions)."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from functools import partial

import pytest

from servinglab.api import RateSearchSpec
from servinglab.api.figures import GeneratorVerdict, Latency
from servinglab.loadgen.arrivals import arrival_offsets
from servinglab.loadgen.peak import search_peak_rate
from servinglab.loadgen.stats import LevelStats
from servinglab.measure.levels import probe_passes


def test_constant_arrivals_are_evenly_spaced() -> None:
    offsets = arrival_offsets(50.0, 2.0, "constant", seed=1)
    assert len(offsets) == 100
    assert offsets[0] == 0.0 and offsets[-1] == pytest.approx(1.98)
    assert {round(b - a, 9) for a, b in itertools.pairwise(offsets)} == {0.02}


def test_poisson_arrivals_have_exponential_gaps_at_the_requested_rate() -> None:
    rate, seconds = 200.0, 300.0
    offsets = arrival_offsets(rate, seconds, "poisson", seed=7)
    expected = rate * seconds  # 60 000; a Poisson count has standard deviation sqrt(mean)
    assert abs(len(offsets) - expected) < 4 * math.sqrt(expected)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.02)
    # exponential: standard deviation equals the mean (coefficient of variation 1)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.03)
    # Kolmogorov-Smirnov against 1 - exp(-rate x): below the 1 % critical value 1.63 / sqrt(n)
    gaps.sort()
    n = len(gaps)
    d = max(
        max(abs((i + 1) / n - (1 - math.exp(-rate * g))), abs(i / n - (1 - math.exp(-rate * g))))
        for i, g in enumerate(gaps)
    )
    assert d < 1.63 / math.sqrt(n)
    # counts per second are Poisson too: variance ≈ mean
    per_second = [0] * int(seconds)
    for offset in offsets:
        per_second[int(offset)] += 1
    assert statistics.pvariance(per_second) / statistics.fmean(per_second) == pytest.approx(1.0, abs=0.25)


def test_schedules_are_reproducible_and_seed_dependent() -> None:
    assert arrival_offsets(30, 5, "poisson", seed=3) == arrival_offsets(30, 5, "poisson", seed=3)
    assert arrival_offsets(30, 5, "poisson", seed=3) != arrival_offsets(30, 5, "poisson", seed=4)


def test_bad_arrival_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="rate 0"):
        arrival_offsets(0, 1, "poisson", seed=0)
    with pytest.raises(ValueError, match="'bursty'"):
        arrival_offsets(1, 1, "bursty", seed=0)


def fake_server(capacity_rps: float, slo_ms: float = 100.0, saturated_above: float | None = None):  # type: ignore[no-untyped-def]
    """A server whose p99 stays at 20 ms below its capacity and explodes above it."""
    probed: list[float] = []

    def probe(rate: float) -> LevelStats:
        probed.append(rate)
        p99 = 20.0 if rate <= capacity_rps else 20.0 + 50.0 * (rate - capacity_rps)
        generator = GeneratorVerdict(saturated=saturated_above is not None and rate > saturated_above)
        return LevelStats(
            None, 100, 0, {}, min(rate, capacity_rps), 10.0, Latency(p99=p99), generator=generator, rate_rps=rate
        )

    return probe, probed


def within(slo_p99_ms: float) -> Callable[[LevelStats], bool]:
    """The SLO the peak search judges its probes by, as the measurement driver gives it."""
    return partial(probe_passes, slo_p99_ms=slo_p99_ms)


def test_peak_search_brackets_the_capacity_within_the_precision() -> None:
    probe, probed = fake_server(capacity_rps=73.0)
    search = RateSearchSpec(min_rps=10, max_rps=400, precision=0.05, max_probes=16)
    peak, probes = search_peak_rate(probe, search, within(100.0))
    # p99 <= 100 ms up to 73 + 80/50 = 74.6 rps
    assert peak.rate_rps <= 74.6 < peak.first_failing_rps
    assert peak.first_failing_rps / peak.rate_rps - 1 <= 0.05
    assert peak.p99_latency_ms <= 100.0
    assert probed[:5] == [10, 20, 40, 80, 56.568542494923804]  # doublings to the first miss, then bisection
    assert len(probes) == peak.probes <= 16


def test_peak_search_reports_an_unreached_ceiling_and_an_impossible_floor() -> None:
    probe, _ = fake_server(capacity_rps=1000.0)
    peak, probes = search_peak_rate(probe, RateSearchSpec(min_rps=10, max_rps=400, max_probes=10), within(100.0))
    assert peak.rate_rps == 400 and "may be higher" in peak.note and len(probes) == 7  # 10, 20, ... 320, 400
    probe, _ = fake_server(capacity_rps=1.0)
    peak, _ = search_peak_rate(probe, RateSearchSpec(min_rps=10, max_rps=400), within(100.0))
    assert peak.rate_rps is None and "minRps misses the SLO" in peak.note


def test_a_probe_the_generator_limited_does_not_count_as_passing() -> None:
    probe, _ = fake_server(capacity_rps=300.0, saturated_above=120.0)
    peak, _ = search_peak_rate(probe, RateSearchSpec(min_rps=10, max_rps=400, max_probes=20), within(100.0))
    assert peak.rate_rps <= 120.0 < peak.first_failing_rps
