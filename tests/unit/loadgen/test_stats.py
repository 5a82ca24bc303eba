"""Exact percentiles, the throughput window and error accounting of one measured level."""

from __future__ import annotations

import random

import pytest

from servinglab.api.figures import Latency
from servinglab.loadgen.stats import Sample, percentile, summarise


def test_nearest_rank_percentiles_of_one_to_hundred() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 90) == 90.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0


def test_percentiles_are_observed_samples_not_interpolations() -> None:
    values = sorted([3.7, 1.25, 9.125, 4.5, 2.0])
    # ceil(0.5 * 5) = 3rd smallest; ceil(0.9 * 5) = 5th.
    assert percentile(values, 50) == 3.7
    assert percentile(values, 90) == 9.125
    assert percentile(values, 1) == 1.25


def test_sub_millisecond_precision_survives() -> None:
    """Locust would round these to whole milliseconds; we must not."""
    samples = [Sample(0.0, 0.25), Sample(0.001, 0.5), Sample(0.002, 0.75), Sample(0.003, 1.0)]
    stats = summarise(1, samples)
    assert stats.latency_ms.p50 == 0.5
    assert stats.latency_ms.p99 == 1.0


def test_percentile_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 50)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 0)


def test_percentiles_are_ordered_for_random_samples() -> None:
    rng = random.Random(4)
    samples = [Sample(i * 0.01, rng.lognormvariate(2, 1)) for i in range(5000)]
    latency = summarise(8, samples).latency_ms
    ordered = [getattr(latency, k) for k in ("min", "p50", "p90", "p95", "p99", "max")]
    assert ordered == sorted(ordered)


def test_throughput_uses_first_send_to_last_response() -> None:
    # 10 requests sent 0.1 s apart, each taking 50 ms: window = 0.0 .. 0.95 s.
    samples = [Sample(100.0 + i * 0.1, 50.0) for i in range(10)]
    stats = summarise(1, samples)
    assert stats.window_seconds == pytest.approx(0.95)
    assert stats.throughput_rps == pytest.approx(10 / 0.95)


def test_errors_count_but_do_not_enter_latency_or_throughput() -> None:
    samples = [
        Sample(0.0, 10.0),
        Sample(0.0, 20.0),
        Sample(0.5, 1000.0, "http_503"),
        Sample(0.6, 3.0, "http_503"),
        Sample(0.7, 5.0, "timeout"),
    ]
    stats = summarise(4, samples)
    assert stats.requests == 5
    assert stats.errors == 3
    assert stats.errors_by_kind == {"http_503": 2, "timeout": 1}
    assert stats.latency_ms.max == 20.0
    # window spans all measured requests (0.0 .. 1.5 s); only the 2 successes count as throughput
    assert stats.throughput_rps == pytest.approx(2 / 1.5)


def test_no_samples_gives_zero_throughput_and_no_latency() -> None:
    stats = summarise(2, [])
    assert stats.throughput_rps == 0.0
    assert stats.latency_ms == Latency()
    assert stats.to_json()["requests"] == 0
