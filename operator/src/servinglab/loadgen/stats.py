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
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from servinglab.api import GeneratorLimits, StabilitySpec

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
    """What one level measured; field names follow the results JSON / CR status."""

    concurrency: int | None  # closed loop: users; None for an open-loop level
    requests: int
    errors: int
    errors_by_kind: dict[str, int]
    throughput_rps: float
    window_seconds: float
    latency_ms: dict[str, float] = field(default_factory=dict)
    window_start: float = 0.0
    window_end: float = 0.0
    latency_cdf_ms: list[list[float]] = field(default_factory=list)  # [percent, ms] pairs, for plots
    stability: dict[str, object] | None = None
    generator: dict[str, object] | None = None
    rate_rps: float | None = None  # open loop: the offered rate
    open_loop: dict[str, object] | None = None  # open loop: late and dropped sends, sent rate
    repeats: dict[str, object] | None = None  # repeats > 1: every run's figures, mean and 95% CI
    phases: list[dict[str, object]] | None = None  # a shaped run (step, burst, trace): each phase's figures
    samples: tuple[Sample, ...] = field(default=(), repr=False, compare=False)  # kept for pooling repeats

    def to_json(self) -> dict[str, object]:
        level: dict[str, object] = (
            {"concurrency": self.concurrency} if self.concurrency is not None else {"rateRps": self.rate_rps}
        )
        return {
            **level,
            "throughputRps": round(self.throughput_rps, 3),
            "latencyMs": {k: round(v, 3) for k, v in self.latency_ms.items()},
            "requests": self.requests,
            "errors": self.errors,
            "errorsByKind": dict(self.errors_by_kind),
            "windowSeconds": round(self.window_seconds, 3),
            "windowStart": round(self.window_start, 3),
            "windowEnd": round(self.window_end, 3),
            "latencyCdfMs": self.latency_cdf_ms,
            **({"stability": self.stability} if self.stability is not None else {}),
            **({"generator": self.generator} if self.generator is not None else {}),
            **({"openLoop": self.open_loop} if self.open_loop is not None else {}),
            **({"repeats": self.repeats} if self.repeats is not None else {}),
            **({"phases": self.phases} if self.phases is not None else {}),
        }


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
    latency: dict[str, float] = {}
    if ok:
        latency = {f"p{p}": percentile(ok, p) for p in PERCENTILES}
        latency["max"] = ok[-1]
        latency["min"] = ok[0]
        latency["mean"] = math.fsum(ok) / len(ok)
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

    def to_json(self) -> dict[str, object]:
        p99 = round(self.p99_ms, 3) if self.p99_ms is not None else None
        return {"start": round(self.start, 3), "throughputRps": round(self.throughput_rps, 3), "p99Ms": p99}


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


def stability_verdict(series: Sequence[Window], count: int, tolerance: float) -> dict[str, object]:
    """Whether the last `count` windows agree within `tolerance` on throughput and on p99.

    Two guards keep sampling noise from passing for instability: throughput is judged against the
    larger of `tolerance` and the counting noise of the smallest window (2/sqrt(n), about two
    standard deviations of a count of n), and p99 is compared only when every window answered at
    least MIN_REQUESTS_FOR_P99 requests. `stable` is None when there are too few windows to judge.
    """
    verdict: dict[str, object] = {"windows": [w.to_json() for w in series], "tolerance": tolerance}
    last = list(series[-count:])
    if len(last) < count:
        return {**verdict, "stable": None, "reason": f"{len(series)} window(s), {count} needed"}
    if any(w.p99_ms is None for w in last):
        return {**verdict, "stable": False, "reason": "a window without successful requests"}
    fewest = min(w.requests for w in last)
    throughput_tolerance = max(tolerance, 2 / math.sqrt(fewest))
    spreads = {"throughput": spread([w.throughput_rps for w in last])}
    verdict.update(throughputSpread=round(spreads["throughput"], 4), throughputTolerance=round(throughput_tolerance, 4))
    if fewest >= MIN_REQUESTS_FOR_P99:
        spreads["p99"] = spread([w.p99_ms for w in last if w.p99_ms is not None])
        verdict["p99Spread"] = round(spreads["p99"], 4)
    else:
        verdict["p99Compared"] = False  # fewer than MIN_REQUESTS_FOR_P99 answers: its "p99" is its maximum
    limits = {"throughput": throughput_tolerance, "p99": tolerance}
    over = {name: value for name, value in spreads.items() if value > limits[name]}
    if not over:
        return {**verdict, "stable": True}
    worst = max(over, key=lambda name: over[name] / limits[name])
    return {**verdict, "stable": False, "reason": f"{worst} varies {over[worst]:.0%} across the last {count}"}


def judge_stability(
    samples: Sequence[Sample], start: float, end: float, rule: StabilitySpec, in_flight_at: float | None = None
) -> dict[str, object]:
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
    if judge_stability(samples, start, start + measured, rule, in_flight_at=now)["stable"] is not False:
        return 0.0
    return min(rule.window_seconds, limit - measured)


class CpuMeter:
    """How busy this thread (the generator's event loop) was since creation, as a percentage of one
    core over the wall time: the time it ran on a core *or waited in the run queue for one*.

    CPU time alone reads low for a generator that never idles but shares its core with other busy
    processes (a contended host or node, a CPU-throttled pod): it gets less CPU because others take
    it, not because it has time to spare, and a starved generator would pass for a calm one. Linux's
    scheduler statistics (/proc/thread-self/schedstat) give both times; without them (another OS, a
    kernel without them) it falls back to the process's CPU time.
    """

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._schedstat = _schedstat_seconds() is not None
        self._busy = self._used()
        self._wall = time.monotonic()

    def _used(self) -> float:
        if self._schedstat and (busy := _schedstat_seconds()) is not None:
            return busy
        times = self._process.cpu_times()
        return float(times.user + times.system)

    def percent(self) -> float:
        wall = time.monotonic() - self._wall
        return 100.0 * (self._used() - self._busy) / wall if wall > 0 else 0.0


def _schedstat_seconds() -> float | None:
    """This thread's time on a core plus its time waiting for one, in seconds (None: not readable).
    Read by the thread measured: the event loop's, which the meter is created and read in."""
    try:
        with open("/proc/thread-self/schedstat") as schedstat:
            on_cpu_ns, waiting_ns = schedstat.read().split()[:2]
        return (int(on_cpu_ns) + int(waiting_ns)) / 1e9
    except (OSError, ValueError):
        return None


def generator_verdict(
    cpu_percent: float, send_gaps_ms: list[float], limits: GeneratorLimits, latency_p99_ms: float | None = None
) -> dict[str, object]:
    """Did the load generator limit this level?

    Its CPU says so (gevent runs on one core; time waiting for the core counts, see
    :class:`CpuMeter`), or its send delays do: a p99 delay above
    `maxSendGapMs` that is also a material share (`maxSendGapShare`) of the p99 latency being
    measured — a late send shifts load and, in the open loop, adds to the measured latency.
    """
    gaps = sorted(send_gaps_ms)
    gap_p99 = percentile(gaps, 99) if gaps else 0.0
    reasons = _limit_reasons(cpu_percent, gap_p99, limits, latency_p99_ms)
    return {
        "cpuPercent": round(cpu_percent, 1),
        "sendGapMs": {
            "p50": round(percentile(gaps, 50), 3) if gaps else None,
            "p99": round(gap_p99, 3),
            "max": round(gaps[-1], 3) if gaps else None,
        },
        "saturated": bool(reasons),
        **({"reason": "; ".join(reasons)} if reasons else {}),
    }


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
    verdicts: Sequence[dict[str, Any]], limits: GeneratorLimits, latency_p99_ms: float | None
) -> dict[str, object]:
    """One level driven by several generator processes: each is judged again against the merged p99
    latency (a send gap is material or not relative to what the level measured), and any generator
    that limited the load flags the level, by number. The level's CPU and send gap are the worst
    generator's; every generator's own verdict is kept."""
    judged = []
    for verdict in verdicts:
        cpu, gap_p99 = float(verdict["cpuPercent"]), float(verdict["sendGapMs"]["p99"])
        reasons = _limit_reasons(cpu, gap_p99, limits, latency_p99_ms)
        own = {key: value for key, value in verdict.items() if key not in ("saturated", "reason")}
        judged.append({**own, "saturated": bool(reasons), **({"reason": "; ".join(reasons)} if reasons else {})})
    flagged = [f"generator {i + 1} of {len(judged)}: {v['reason']}" for i, v in enumerate(judged) if v["saturated"]]
    worst_gap = max(judged, key=lambda v: float(v["sendGapMs"]["p99"]))
    return {
        "generators": len(judged),
        "cpuPercent": max(float(v["cpuPercent"]) for v in judged),
        "sendGapMs": worst_gap["sendGapMs"],
        "saturated": bool(flagged),
        **({"reason": "; ".join(flagged)} if flagged else {}),
        "perGenerator": judged,
    }


# Two-sided 95 % Student t critical values by degrees of freedom (1..30); 1.96 beyond.
# fmt: off
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# fmt: on


def mean_ci95(values: Sequence[float]) -> dict[str, float]:
    """Mean and the half-width of its 95 % confidence interval (Student t, sample standard deviation)."""
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return {"mean": round(mean, 3), "ci95": 0.0}
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
    return {"mean": round(mean, 3), "ci95": round(t * math.sqrt(variance / n), 3)}


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
    p99s = [float(run.latency_ms["p99"]) for run in runs if "p99" in run.latency_ms]
    repeats: dict[str, object] = {
        "runs": len(runs),
        "throughputRps": [round(t, 3) for t in throughputs],
        "p99Ms": [round(p, 3) for p in p99s],
        "throughputRpsMean": mean_ci95(throughputs),
        **({"p99MsMean": mean_ci95(p99s)} if p99s else {}),
    }
    return dataclasses.replace(
        pooled,
        throughput_rps=ok / window if window > 0 else 0.0,
        window_seconds=window,
        window_start=first.window_start,
        window_end=runs[-1].window_end,
        rate_rps=first.rate_rps,
        stability=runs[-1].stability,
        generator=max((run.generator or {} for run in runs), key=lambda g: bool(g.get("saturated"))) or None,
        open_loop=runs[-1].open_loop,
        repeats=repeats,
    )
