"""Measurement windows, the stability rule and the generator-saturation verdict (pure functions)."""

from __future__ import annotations

import pytest

from servinglab.api import GeneratorLimits, SpecError, parse_experiment
from servinglab.api.figures import MeanCi, SendGap
from servinglab.loadgen.stats import (
    Sample,
    Window,
    combine_repeats,
    generator_verdict,
    mean_ci95,
    spread,
    stability_verdict,
    summarise,
    windows,
)
from support.manifests import experiment


def steady(start: float, seconds: float, rate: float, latency_ms: float) -> list[Sample]:
    count = int(seconds * rate)
    return [Sample(start + i / rate, latency_ms) for i in range(count)]


def test_windows_split_by_send_time_and_drop_the_partial_last_one() -> None:
    samples = [*steady(100.0, 10.5, 10, 20.0), Sample(101.0, 5.0, error="http_500")]
    series = windows(samples, 100.0, 110.5, 2.0)
    assert len(series) == 5  # 10.5 s -> five whole 2 s windows
    assert [w.throughput_rps for w in series] == [10.0] * 5  # the error does not count
    assert all(w.p99_ms == 20.0 for w in series)
    assert series[2].start == 104.0


def test_window_p99_is_exact_nearest_rank() -> None:
    # 100 requests in one window, latencies 1..100 ms: p99 is the 99th smallest, 99 ms
    samples = [Sample(0.0 + i * 0.01, float(i + 1)) for i in range(100)]
    (window,) = windows(samples, 0.0, 1.0, 1.0)
    assert window.p99_ms == 99.0 and window.throughput_rps == 100.0


def test_spread() -> None:
    assert spread([10.0, 10.0, 10.0]) == 0.0
    assert spread([9.0, 10.0, 11.0]) == pytest.approx(0.2)


def w(throughput: float, p99: float | None) -> Window:
    return Window(0.0, 5.0, throughput, p99)


def test_level_is_stable_when_its_last_windows_agree_within_tolerance() -> None:
    # warm-up-like first window differs; only the last three are judged
    verdict = stability_verdict([w(50, 400), w(100, 200), w(104, 205), w(98, 196)], count=3, tolerance=0.1)
    assert verdict.stable is True
    assert verdict.throughput_spread == pytest.approx(6 / (302 / 3), abs=1e-4)


def test_drifting_p99_makes_a_level_unstable_and_says_which_figure() -> None:
    verdict = stability_verdict([w(100, 200), w(100, 260), w(100, 330)], count=3, tolerance=0.1)
    assert verdict.stable is False
    assert "p99 varies" in str(verdict.reason)


def test_too_few_windows_cannot_be_judged() -> None:
    verdict = stability_verdict([w(100, 200), w(100, 200)], count=3, tolerance=0.1)
    assert verdict.stable is None and "3 needed" in str(verdict.reason)


def test_a_window_without_successes_is_unstable() -> None:
    assert stability_verdict([w(100, 200), w(0, None), w(100, 200)], count=3, tolerance=0.5).stable is False


def test_generator_verdict_flags_cpu_and_send_gaps() -> None:
    limits = GeneratorLimits()
    calm = generator_verdict(20.0, [0.1] * 99 + [2.0], limits)
    assert calm.saturated is False and calm.reason is None
    busy = generator_verdict(97.0, [0.1] * 100, limits)
    assert busy.saturated is True and "generator CPU 97%" in str(busy.reason)
    starved = generator_verdict(30.0, [0.1] * 90 + [50.0] * 10, limits, latency_p99_ms=120.0)
    assert starved.saturated is True and "p99 send gap 50.0 ms > 10 ms, 42% of p99 latency" in str(starved.reason)
    assert starved.send_gap_ms == SendGap(p50=0.1, p99=50.0, max=50.0)
    # the same delays against a 2 s tail are noise, not a limit
    assert generator_verdict(30.0, [0.1] * 90 + [50.0] * 10, limits, latency_p99_ms=2000.0).saturated is False


def test_extension_limit_must_exceed_the_duration() -> None:
    document = experiment("x", load={"durationSeconds": 60, "stability": {"maxDurationSeconds": 30}})
    with pytest.raises(SpecError, match=r"stability.maxDurationSeconds: 30 is shorter than durationSeconds 60"):
        parse_experiment(document)


def test_confidence_interval_uses_student_t() -> None:
    # mean 10, sample standard deviation 1 (values 9, 10, 11), n = 3: half-width 4.303 / sqrt(3)
    interval = mean_ci95([9.0, 10.0, 11.0])
    assert interval.mean == 10.0 and interval.ci95 == pytest.approx(4.303 / 3**0.5, abs=1e-3)
    assert mean_ci95([5.0]) == MeanCi(mean=5.0, ci95=0.0)


def test_repeats_pool_every_request_and_report_each_run() -> None:
    fast = summarise(4, [Sample(0.0 + i * 0.01, 10.0) for i in range(100)])  # 100 requests in ~1 s
    slow = summarise(4, [Sample(100.0 + i * 0.02, 30.0) for i in range(100)])  # 100 requests in ~2 s
    combined = combine_repeats([fast, slow])
    assert combined.requests == 200 and combined.concurrency == 4
    # percentiles over all 200 requests: p50 is a 10 ms request, p99 a 30 ms one
    assert combined.latency_ms.p50 == 10.0 and combined.latency_ms.p99 == 30.0
    # throughput over the summed measured windows, not over the gap between the runs
    assert combined.throughput_rps == pytest.approx(200 / (fast.window_seconds + slow.window_seconds))
    repeats = combined.to_json()["repeats"]
    assert repeats["runs"] == 2 and repeats["p99Ms"] == [10.0, 30.0]
    assert repeats["throughputRpsMean"]["mean"] == pytest.approx(
        (fast.throughput_rps + slow.throughput_rps) / 2, abs=1e-3
    )
    assert combine_repeats([fast]) is fast


def test_while_requests_are_in_flight_only_answered_windows_are_judged() -> None:
    from servinglab.api import StabilitySpec
    from servinglab.loadgen.stats import judge_stability

    rule = StabilitySpec(window_seconds=1, windows=2, tolerance=0.1)
    # 100 requests/s of 500 ms each from t=0; at t=3 those sent after 2.5 s are still in flight
    answered = [Sample(i / 100, 500.0) for i in range(250)]
    naive = stability_verdict(windows(answered, 0.0, 3.0, 1.0), 2, 0.1)
    assert naive.stable is False  # the last window looks half as busy
    assert judge_stability(answered, 0.0, 3.0, rule, in_flight_at=3.0).stable is True
    # once everything is answered the whole period is judged
    complete = [Sample(i / 100, 500.0) for i in range(300)]
    assert len(judge_stability(complete, 0.0, 3.0, rule).windows) == 3


def test_sampling_noise_is_not_instability() -> None:
    # 48 vs 52 answers per window (a batch of 4 more or less): within the counting noise of ~50
    few = [Window(0.0, 5.0, 48 / 5, 900.0), Window(5.0, 5.0, 52 / 5, 400.0), Window(10.0, 5.0, 44 / 5, 700.0)]
    verdict = stability_verdict(few, count=3, tolerance=0.1)
    assert verdict.stable is True
    assert verdict.p99_compared is False  # under 100 answers a "p99" is the window's maximum
    assert verdict.throughput_tolerance == pytest.approx(2 / 44**0.5, abs=1e-4)
    # the same relative spread over thousands of answers is real
    many = [Window(0.0, 5.0, 4800 / 5, 90.0), Window(5.0, 5.0, 5200 / 5, 90.0), Window(10.0, 5.0, 4400 / 5, 90.0)]
    assert stability_verdict(many, count=3, tolerance=0.1).stable is False
