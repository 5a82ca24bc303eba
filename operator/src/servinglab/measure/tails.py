"""How sure a percentile is: distribution-free confidence bounds from order statistics (pure functions).

A level reports its nearest-rank percentiles; with n samples, the true q-quantile lies below the sorted
sample x_(u) exactly when fewer than u samples fall below it, and the count of samples below the true
quantile is Binomial(n, q) whatever the latency distribution. So the upper bound at confidence c is x_(u)
for the smallest rank u with P(K <= u - 1) >= c, and the lower bound x_(l) for the largest l with
P(K >= l) >= c (as MLPerf LoadGen's early stopping reasons about its tail). Each bound is *one-sided* at
`confidence` (0.95): the SLO question is "is the true p99 within the objective?", which the upper bound
answers alone; the two together bracket the percentile with at least 90 %. With ties (discrete latencies)
the bounds only get more conservative.

When n is too small no rank reaches the confidence: for p99 at 95 %, the top sample is an upper bound only
once 1 - 0.99^n >= 0.95, n >= 299 (:func:`samples_needed` computes it). Such a bound is absent, and the
interval says how many samples it needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from servinglab.api.figures import LatencyIntervals, PercentileInterval

CONFIDENCE = 0.95
#: Terms of the binomial further than this many standard deviations (plus as many counts) from its mean
#: are below 1e-300 and left out: the sums stay short for a million samples.
_REACH = 40.0
#: Sums in floating point: a probability this close to the confidence counts as reaching it (an exact tie,
#: such as P(K >= 1) = 0.95 for n = 1 and q = 0.95, must not hinge on the last bit).
_SLACK = 1e-12


def _check(n: int, q: float, confidence: float) -> None:
    if n < 0:
        raise ValueError(f"samples must be >= 0, got {n}")
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile q must be in (0, 1), got {q}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def binomial_cdf(n: int, q: float) -> tuple[int, list[float]]:
    """P(K <= k) for K ~ Binomial(n, q), as (lo, values) for k = lo, lo + 1, ..., hi: below lo it is 0 and
    above hi 1 to within 1e-300. Each term is computed in log space (lgamma), so nothing under- or overflows."""
    mean, sd = n * q, math.sqrt(n * q * (1.0 - q))
    lo = max(0, math.floor(mean - _REACH * (sd + 1.0)))
    hi = min(n, math.ceil(mean + _REACH * (sd + 1.0)))
    log_q, log_p = math.log(q), math.log1p(-q)
    head = math.lgamma(n + 1)
    total, values = 0.0, []
    for k in range(lo, hi + 1):
        total += math.exp(head - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_q + (n - k) * log_p)
        values.append(min(total, 1.0))
    return lo, values


def _cdf_at(table: tuple[int, list[float]], k: int) -> float:
    lo, values = table
    if k < lo:
        return 0.0
    return values[k - lo] if k - lo < len(values) else 1.0


def upper_rank(n: int, q: float, confidence: float = CONFIDENCE) -> int | None:
    """The smallest 1-based rank u <= n with P(K <= u - 1) >= confidence; None when no sample is high enough."""
    _check(n, q, confidence)
    if n == 0:
        return None
    table = binomial_cdf(n, q)
    for k in range(table[0], n):
        if _cdf_at(table, k) >= confidence - _SLACK:
            return k + 1
    return None


def lower_rank(n: int, q: float, confidence: float = CONFIDENCE) -> int | None:
    """The largest 1-based rank l with P(K >= l) >= confidence, i.e. P(K <= l - 1) <= 1 - confidence; None
    when even the smallest sample is not low enough."""
    _check(n, q, confidence)
    if n == 0:
        return None
    table = binomial_cdf(n, q)
    found = None
    for k in range(max(table[0] - 1, 0), n):  # below the table's start the CDF is 0
        if _cdf_at(table, k) > 1.0 - confidence + _SLACK:
            break
        found = k + 1
    return found


def samples_needed(q: float, confidence: float = CONFIDENCE) -> int:
    """The fewest samples for which the q-quantile has an upper bound at `confidence`: the top sample bounds
    it with probability 1 - q^n, so the smallest n with q^n <= 1 - confidence."""
    _check(1, q, confidence)
    n = max(1, math.ceil(math.log1p(-confidence) / math.log(q)))
    while n > 1 and q ** (n - 1) <= 1.0 - confidence + _SLACK:  # the logarithms' rounding, either way
        n -= 1
    while q**n > 1.0 - confidence + _SLACK:
        n += 1
    return n


def interval(sorted_values: Sequence[float], q: float, confidence: float = CONFIDENCE) -> PercentileInterval:
    """The q-quantile's bounds among the sorted samples; a bound that does not exist is absent, and an absent
    upper bound comes with the number of samples it needs."""
    n = len(sorted_values)
    low, high = lower_rank(n, q, confidence), upper_rank(n, q, confidence)
    return PercentileInterval(
        lower=round(sorted_values[low - 1], 3) if low is not None else None,
        upper=round(sorted_values[high - 1], 3) if high is not None else None,
        confidence=confidence, samples=n,
        samples_needed=samples_needed(q, confidence) if high is None else None,
    )  # fmt: skip


def latency_intervals(sorted_ms: Sequence[float], confidence: float = CONFIDENCE) -> LatencyIntervals | None:
    """The bounds of p50, p90, p95 and p99 of a level's successful latencies (None when there are none)."""
    if not sorted_ms:
        return None
    return LatencyIntervals(
        p50=interval(sorted_ms, 0.50, confidence), p90=interval(sorted_ms, 0.90, confidence),
        p95=interval(sorted_ms, 0.95, confidence), p99=interval(sorted_ms, 0.99, confidence),
    )  # fmt: skip
