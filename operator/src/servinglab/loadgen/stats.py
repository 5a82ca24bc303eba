"""Exact statistics of one measured load level, from raw per-request samples (pure functions).

Percentiles use the nearest-rank definition: the p-th percentile is the smallest sample such that at
least p% of samples are <= it. Every reported value is an observed latency (no interpolation, no
buckets), and p50 <= p90 <= p95 <= p99 <= max holds by construction.

Throughput is successful responses divided by the measured window, which runs from the first
measured request's send to the last measured response. A request is measured when it was sent inside
the level's measurement period (after warm-up); every such request is waited for, so slow tails are
not cut off at the end of the period.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from servinglab.api import GeneratorLimits, StabilitySpec
from servinglab.api.figures import (
    GeneratorVerdict,
    Latency,
    MeanCi,
    OneGenerator,
    OpenLoopFigures,
    PhaseFigures,
    Repeats,
    SendGap,
    Stability,
)
from servinglab.api.figures import Window as WindowFigures
from servinglab.api.results import to_json

PERCENTILES = (50, 90, 95, 99)
CDF_STEP_PERCENT = 0.5  # the stored latency CDF: exact nearest-rank values every half percent


@dataclass(frozen=True)
class Sample:
    """One request: when it was sent (epoch seconds), how long it took, and its error kind if any."""

    sent_at: float
    latency_ms: float
    error: str | None = None

    @property
    def finished_at(self) -> float:
        return self.sent_at + self.latency_ms / 1000.0


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values; p in (0, 100]."""
    if not sorted_values:
        raise ValueError("percentile of no samples")
    if not 0 < p <= 100:
        raise ValueError(f"percentile {p} is outside (0, 100]")
    rank = math.ceil(p / 100.0 * len(sorted_values))
    return sorted_values[max(rank, 1) - 1]


@dataclass(frozen=True)
class LevelStats:
    """What one level measured, exact (unrounded); field names follow the results JSON / CR status, and
    every part is the typed model :class:`servinglab.api.results.LevelResult` holds it in."""

    concurrency: int | None  # closed loop: users; None for an open-loop level
    requests: int
    errors: int
    errors_by_kind: dict[str, int]
    throughput_rps: float
    window_seconds: float
    latency_ms: Latency = field(default_factory=Latency)
    window_start: float = 0.0
    window_end: float = 0.0
    latency_cdf_ms: list[list[float]] = field(default_factory=list)  # [percent, ms] pairs, for plots
    stability: Stability | None = None
    generator: GeneratorVerdict | None = None
    rate_rps: float | None = None  # open loop: the offered rate
    open_loop: OpenLoopFigures | None = None  # open loop: late and dropped sends, sent rate
    repeats: Repeats | None = None  # repeats > 1: every run's figures, mean and 95% CI
    phases: list[PhaseFigures] | None = None  # a shaped run (step, burst, trace): each phase's figures
    samples: tuple[Sample, ...] = field(default=(), repr=False, compare=False)  # kept for pooling repeats

    def to_json(self) -> dict[str, object]:
        """The level for people and tools (camelCase, rounded to the µs and the mrps, None left out)."""
        level: dict[str, object] = (
            {"concurrency": self.concurrency} if self.concurrency is not None else {"rateRps": self.rate_rps}
        )
        parts = {"stability": self.stability, "generator": self.generator, "openLoop": self.open_loop,
                 "repeats": self.repeats}  # fmt: skip
        return {
            **level,
            "throughputRps": round(self.throughput_rps, 3),
            "latencyMs": to_json(rounded(self.latency_ms)),
            "requests": self.requests,
            "errors": self.errors,
            "errorsByKind": dict(self.errors_by_kind),
            "windowSeconds": round(self.window_seconds, 3),
            "windowStart": round(self.window_start, 3),
            "windowEnd": round(self.window_end, 3),
            "latencyCdfMs": self.latency_cdf_ms,
            **{name: to_json(part) for name, part in parts.items() if part is not None},
            **({"phases": [to_json(phase) for phase in self.phases]} if self.phases is not None else {}),
        }


def rounded(latency: Latency) -> Latency:
    """The percentiles to the µs (as results keep them)."""
    return latency.model_copy(update={name: round(value, 3) for name, value in latency if isinstance(value, float)})


def latency_cdf(sorted_ms: Sequence[float]) -> list[list[float]]:
    """[percent, latency] from the minimum (0) to the maximum (100) in CDF_STEP_PERCENT steps."""
    if not sorted_ms:
        return []
    steps = int(100 / CDF_STEP_PERCENT)
    points = [[0.0, round(sorted_ms[0], 3)]]
    points += [
        [i * CDF_STEP_PERCENT, round(percentile(sorted_ms, i * CDF_STEP_PERCENT), 3)] for i in range(1, steps + 1)
    ]
    return points


def summarise(concurrency: int | None, samples: Iterable[Sample]) -> LevelStats:
    """Exact latency percentiles (successful requests) and throughput over the measured window."""
    samples = list(samples)
    ok = sorted(s.latency_ms for s in samples if s.error is None)
    errors = Counter(s.error for s in samples if s.error is not None)
    start = end = 0.0
    if samples:
        start, end = min(s.sent_at for s in samples), max(s.finished_at for s in samples)
    window = end - start
    latency = Latency()
    if ok:
        p50, p90, p95, p99 = (percentile(ok, p) for p in PERCENTILES)
        latency = Latency(p50=p50, p90=p90, p95=p95, p99=p99, max=ok[-1], min=ok[0], mean=math.fsum(ok) / len(ok))
    return LevelStats(
        samples=tuple(samples),
        latency_cdf_ms=latency_cdf(ok),
        concurrency=concurrency,
        requests=len(samples),
        errors=sum(errors.values()),
        errors_by_kind=dict(sorted(errors.items())),
        throughput_rps=len(ok) / window if window > 0 else 0.0,
        window_seconds=window,
        latency_ms=latency,
        window_start=start,
        window_end=end,
    )


@dataclass(frozen=True)
class Window:
    """Requests sent in [start, start + seconds): successful throughput and exact p99 latency."""

    start: float
    seconds: float
    throughput_rps: float
    p99_ms: float | None

    @property
    def requests(self) -> int:
        """Answered requests sent in the window."""
        return round(self.throughput_rps * self.seconds)

    def figures(self) -> WindowFigures:
        p99 = round(self.p99_ms, 3) if self.p99_ms is not None else None
        return WindowFigures(start=round(self.start, 3), throughput_rps=round(self.throughput_rps, 3), p99_ms=p99)


def windows(samples: Iterable[Sample], start: float, end: float, seconds: float) -> list[Window]:
    """Consecutive whole windows of `seconds` from `start` up to `end` (a partial last one is left out)."""
    count = max(0, math.floor((end - start) / seconds + 1e-6))  # 5.9999999 s of 2 s windows is three
    buckets: list[list[float]] = [[] for _ in range(count)]
    for sample in samples:
        index = int((sample.sent_at - start) // seconds)
        if 0 <= index < count and sample.error is None:
            buckets[index].append(sample.latency_ms)
    result = []
    for index, latencies in enumerate(buckets):
        latencies.sort()
        p99 = percentile(latencies, 99) if latencies else None
        result.append(Window(start + index * seconds, seconds, len(latencies) / seconds, p99))
    return result


def spread(values: Sequence[float]) -> float:
    """(max - min) / mean: 0 when the values agree exactly."""
    mean = math.fsum(values) / len(values)
    return (max(values) - min(values)) / mean if mean > 0 else math.inf


#: A p99 needs this many answers in a window to be a p99 and not simply the window's maximum.
MIN_REQUESTS_FOR_P99 = 100


def stability_verdict(series: Sequence[Window], count: int, tolerance: float) -> Stability:
    """Whether the last `count` windows agree within `tolerance` on throughput and on p99.

    Two guards keep sampling noise from passing for instability: throughput is judged against the
    larger of `tolerance` and the counting noise of the smallest window (2/sqrt(n), about two
    standard deviations of a count of n), and p99 is compared only when every window answered at
    least MIN_REQUESTS_FOR_P99 requests. `stable` is None when there are too few windows to judge.
    """
    verdict = Stability(windows=[w.figures() for w in series], tolerance=tolerance)
    last = list(series[-count:])
    if len(last) < count:
        return verdict.model_copy(update={"reason": f"{len(series)} window(s), {count} needed"})
    if any(w.p99_ms is None for w in last):
        return verdict.model_copy(update={"stable": False, "reason": "a window without successful requests"})
    fewest = min(w.requests for w in last)
    throughput_tolerance = max(tolerance, 2 / math.sqrt(fewest))
    spreads = {"throughput": spread([w.throughput_rps for w in last])}
    figures: dict[str, float | bool] = {
        "throughput_spread": round(spreads["throughput"], 4), "throughput_tolerance": round(throughput_tolerance, 4)
    }  # fmt: skip
    if fewest >= MIN_REQUESTS_FOR_P99:
        spreads["p99"] = spread([w.p99_ms for w in last if w.p99_ms is not None])
        figures["p99_spread"] = round(spreads["p99"], 4)
    else:
        figures["p99_compared"] = False  # fewer than MIN_REQUESTS_FOR_P99 answers: its "p99" is its maximum
    limits = {"throughput": throughput_tolerance, "p99": tolerance}
    over = {name: value for name, value in spreads.items() if value > limits[name]}
    if not over:
        return verdict.model_copy(update={**figures, "stable": True})
    worst = max(over, key=lambda name: over[name] / limits[name])
    reason = f"{worst} varies {over[worst]:.0%} across the last {count}"
    return verdict.model_copy(update={**figures, "stable": False, "reason": reason})


def judge_stability(
    samples: Sequence[Sample], start: float, end: float, rule: StabilitySpec, in_flight_at: float | None = None
) -> Stability:
    """The stability verdict over [start, end).

    While requests are still in flight (`in_flight_at` = now), the last window would be missing its
    slowest answers; the period is then cut at now minus the slowest latency seen so far, so only
    windows whose requests have had time to be answered are judged.
    """
    if in_flight_at is not None:
        slowest = max((sample.latency_ms for sample in samples), default=0.0) / 1000.0
        end = min(end, in_flight_at - slowest)
    return stability_verdict(windows(samples, start, end, rule.window_seconds), rule.windows, rule.tolerance)


def extension_seconds(
    samples: Sequence[Sample], start: float, measured: float, rule: StabilitySpec, now: float
) -> float:
    """At the end of a level's measured period: how much longer to measure. One more window while the
    level is unstable and `rule.maxDurationSeconds` allows it, else 0."""
    limit = rule.max_duration_seconds
    if not limit or measured >= limit:
        return 0.0
    if judge_stability(samples, start, start + measured, rule, in_flight_at=now).stable is not False:
        return 0.0
    return min(rule.window_seconds, limit - measured)


def generator_verdict(
    cpu_percent: float, send_gaps_ms: list[float], limits: GeneratorLimits, latency_p99_ms: float | None = None
) -> GeneratorVerdict:
    """Did the load generator limit this level?

    Its CPU says so (gevent runs on one core; time waiting for the core counts, see
    :class:`CpuMeter`), or its send delays do: a p99 delay above
    `maxSendGapMs` that is also a material share (`maxSendGapShare`) of the p99 latency being
    measured — a late send shifts load and, in the open loop, adds to the measured latency.
    """
    gaps = sorted(send_gaps_ms)
    gap_p99 = percentile(gaps, 99) if gaps else 0.0
    reasons = _limit_reasons(cpu_percent, gap_p99, limits, latency_p99_ms)
    return GeneratorVerdict(
        cpu_percent=round(cpu_percent, 1),
        send_gap_ms=SendGap(
            p50=round(percentile(gaps, 50), 3) if gaps else None,
            p99=round(gap_p99, 3),
            max=round(gaps[-1], 3) if gaps else None,
        ),
        saturated=bool(reasons),
        reason="; ".join(reasons) if reasons else None,
    )


def _limit_reasons(
    cpu_percent: float, gap_p99: float, limits: GeneratorLimits, latency_p99_ms: float | None
) -> list[str]:
    reasons = []
    if cpu_percent >= limits.max_cpu_percent:
        reasons.append(f"generator CPU {cpu_percent:.0f}% >= {limits.max_cpu_percent:g}%")
    material = latency_p99_ms is None or gap_p99 > limits.max_send_gap_share * latency_p99_ms
    if gap_p99 > limits.max_send_gap_ms and material:
        share = f", {gap_p99 / latency_p99_ms:.0%} of p99 latency" if latency_p99_ms else ""
        reasons.append(f"p99 send gap {gap_p99:.1f} ms > {limits.max_send_gap_ms:g} ms{share}")
    return reasons


def merge_generator_verdicts(
    verdicts: Sequence[OneGenerator], limits: GeneratorLimits, latency_p99_ms: float | None
) -> GeneratorVerdict:
    """One level driven by several generator processes: each is judged again against the merged p99
    latency (a send gap is material or not relative to what the level measured), and any generator
    that limited the load flags the level, by number. The level's CPU and send gap are the worst
    generator's; every generator's own verdict is kept."""
    judged = []
    for verdict in verdicts:
        reasons = _limit_reasons(verdict.cpu_percent or 0.0, _gap_p99(verdict), limits, latency_p99_ms)
        own = OneGenerator(cpu_percent=verdict.cpu_percent, send_gap_ms=verdict.send_gap_ms)
        judged.append(own.model_copy(update={"saturated": bool(reasons), "reason": "; ".join(reasons) or None}))
    flagged = [f"generator {i + 1} of {len(judged)}: {v.reason}" for i, v in enumerate(judged) if v.saturated]
    return GeneratorVerdict(
        generators=len(judged),
        cpu_percent=max(v.cpu_percent or 0.0 for v in judged),
        send_gap_ms=max(judged, key=_gap_p99).send_gap_ms,
        saturated=bool(flagged),
        reason="; ".join(flagged) or None,
        per_generator=judged,
    )


def _gap_p99(verdict: OneGenerator) -> float:
    return verdict.send_gap_ms.p99 if verdict.send_gap_ms is not None else 0.0


# Two-sided 95 % Student t critical values by degrees of freedom (1..30); 1.96 beyond.
# fmt: off
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# fmt: on


def mean_ci95(values: Sequence[float]) -> MeanCi:
    """Mean and the half-width of its 95 % confidence interval (Student t, sample standard deviation)."""
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return MeanCi(mean=round(mean, 3), ci95=0.0)
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
    return MeanCi(mean=round(mean, 3), ci95=round(t * math.sqrt(variance / n), 3))


def combine_repeats(runs: Sequence[LevelStats]) -> LevelStats:
    """One level run several times: percentiles exact over every request of every run, throughput
    over the summed measured windows, and each run's throughput and p99 with mean ± 95 % CI."""
    first = runs[0]
    if len(runs) == 1:
        return first
    pooled = summarise(first.concurrency, [s for run in runs for s in run.samples])
    ok = sum(run.requests - run.errors for run in runs)
    window = math.fsum(run.window_seconds for run in runs)
    throughputs = [run.throughput_rps for run in runs]
    p99s = [run.latency_ms.p99 for run in runs if run.latency_ms.p99 is not None]
    repeats = Repeats(
        runs=len(runs),
        throughput_rps=[round(t, 3) for t in throughputs],
        p99_ms=[round(p, 3) for p in p99s],
        throughput_rps_mean=mean_ci95(throughputs),
        p99_ms_mean=mean_ci95(p99s) if p99s else None,
    )
    return dataclasses.replace(
        pooled,
        throughput_rps=ok / window if window > 0 else 0.0,
        window_seconds=window,
        window_start=first.window_start,
        window_end=runs[-1].window_end,
        rate_rps=first.rate_rps,
        stability=runs[-1].stability,
        generator=next((run.generator for run in runs if run.generator and run.generator.saturated), first.generator),
        open_loop=runs[-1].open_loop,
        repeats=repeats,
    )
