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

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PERCENTILES = (50, 90, 95, 99)


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

    concurrency: int
    requests: int
    errors: int
    errors_by_kind: dict[str, int]
    throughput_rps: float
    window_seconds: float
    latency_ms: dict[str, float] = field(default_factory=dict)
    window_start: float = 0.0
    window_end: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "throughputRps": round(self.throughput_rps, 3),
            "latencyMs": {k: round(v, 3) for k, v in self.latency_ms.items()},
            "requests": self.requests,
            "errors": self.errors,
            "errorsByKind": dict(self.errors_by_kind),
            "windowSeconds": round(self.window_seconds, 3),
            "windowStart": round(self.window_start, 3),
            "windowEnd": round(self.window_end, 3),
        }


def summarise(concurrency: int, samples: Iterable[Sample]) -> LevelStats:
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
