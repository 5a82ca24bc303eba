"""A sweep's measured points and its two Pareto fronts over them (pure).

* the throughput front: the points no other point beats on both throughput (higher) and p99 (lower);
* the cost front: among the priced points, those no other beats on both cost per million inferences and
  p99 (both lower). It ranks by the p99's *upper bound* at 95 % where the level has one (the p99 itself
  where the level was too short for a bound): a point whose measured p99 is low only by luck of a short run
  does not push a well-measured one off the front. A sweep with no priced point has no cost front, and a
  reason, never a front of zeros.
"""

from __future__ import annotations

from collections.abc import Sequence

from servinglab.api.cost import NO_PRICE
from servinglab.api.forms import FORM_DISAGREES
from servinglab.api.trials import SweepPoint, TrialRecord

NOTHING_MEASURED = "no measured point yet"
NOTHING_PRICED = f"no measured point has a cost per million ({NO_PRICE})"


def points(records: Sequence[TrialRecord]) -> list[SweepPoint]:
    """Every measured level of every trial: (trial, configuration, level, throughput, p99 and its bounds,
    cost per million); none of a trial whose form disagreed with eager fp32 (its speed is not the model's)."""
    found = []
    for record in records:
        measured = record.results is not None and record.reason != FORM_DISAGREES
        for level in record.results.results if record.results is not None and measured else []:
            p99 = level.latency_ms.p99
            if p99 is None or not level.throughput_rps:
                continue
            which = level.concurrency if level.concurrency is not None else level.rate_rps
            bounds = level.latency_ms.p99_interval
            found.append(SweepPoint(trial=record.name, config=record.config, level=which,
                                    throughput_rps=level.throughput_rps, p99_latency_ms=p99,
                                    cost_per_million=level.cost.cost_per_million if level.cost else None,
                                    p99_lower_ms=bounds.lower if bounds else None,
                                    p99_upper_ms=bounds.upper if bounds else None))  # fmt: skip
    return found


def pareto_front(candidates: Sequence[SweepPoint]) -> list[SweepPoint]:
    """The points no other point beats on both throughput (higher) and p99 (lower), by p99."""
    ordered = sorted(candidates, key=lambda p: (p.p99_latency_ms, -p.throughput_rps))
    front, best_rps = [], float("-inf")
    for point in ordered:
        if point.throughput_rps > best_rps:
            front.append(point)
            best_rps = point.throughput_rps
    return front


def cost_front(candidates: Sequence[SweepPoint]) -> tuple[list[SweepPoint] | None, str | None]:
    """The priced points no other priced point beats on both cost per million and p99's upper bound (both
    lower), by that bound; or None and why, when no point is priced."""
    priced = [(p.cost_per_million, p) for p in candidates if p.cost_per_million is not None]
    if not priced:
        return None, NOTHING_PRICED if candidates else NOTHING_MEASURED
    ordered = sorted(priced, key=lambda pair: (pair[1].p99_bound_ms, pair[0]))
    front, cheapest = [], float("inf")
    for cost, point in ordered:
        if cost < cheapest:
            front.append(point)
            cheapest = cost
    return front, None
