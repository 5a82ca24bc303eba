"""The highest open-loop rate whose p99 latency meets the SLO (pure search over a probe function).

In the spirit of MLPerf's server-scenario peak finding and perf_analyzer's latency threshold: from
`minRps`, the rate doubles until one misses the SLO (or `maxRps` passes), which brackets the peak;
the bracket is then halved (geometrically: rates span orders of magnitude) until it is within
`precision` or the probe budget is spent. Whether a probe passes is the caller's to say (the SLO is
defined in :mod:`servinglab.measure.levels`: p99 within it, nothing failed or dropped, and the load
generator did not limit it, since a saturated generator cannot vouch for the server).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from servinglab.api import RateSearchSpec
from servinglab.api.results import PeakRate
from servinglab.loadgen.stats import LevelStats


def search_peak_rate(
    probe: Callable[[float], LevelStats], search: RateSearchSpec, passes: Callable[[LevelStats], bool]
) -> tuple[PeakRate, list[LevelStats]]:
    """Probe rates until the peak is bracketed within `search.precision`; (peak summary, probes).
    `passes` says whether a probe met the objective (:func:`servinglab.measure.levels.probe_passes`)."""
    probes: list[LevelStats] = []

    def run(rate: float) -> bool:
        stats = probe(rate)
        probes.append(stats)
        return passes(stats)

    low = search.min_rps
    if not run(low):
        return _summary(None, low, probes, search, "even minRps misses the SLO"), probes
    # Up in doublings from the floor (gentle on the server: overload only once), then bisect.
    high: float | None = None
    while high is None and len(probes) < search.max_probes:
        rate = min(low * 2, search.max_rps)
        if run(rate):
            low = rate
            if rate >= search.max_rps:
                return _summary(low, None, probes, search, "maxRps meets the SLO: the peak may be higher"), probes
        else:
            high = rate
    if high is None:
        return _summary(low, None, probes, search, "probe budget spent before a rate missed the SLO"), probes
    while len(probes) < search.max_probes and high / low - 1 > search.precision:
        middle = math.sqrt(low * high)
        if run(middle):
            low = middle
        else:
            high = middle
    return _summary(low, high, probes, search, None), probes


def _summary(
    peak: float | None, failed_at: float | None, probes: list[LevelStats], search: RateSearchSpec, note: str | None
) -> PeakRate:
    at_peak = next((p for p in probes if p.rate_rps == peak), None)
    p99 = at_peak.latency_ms.p99 if at_peak is not None else None
    return PeakRate(
        rate_rps=round(peak, 3) if peak is not None else None,
        p99_latency_ms=round(p99, 3) if p99 is not None else None,
        throughput_rps=round(at_peak.throughput_rps, 3) if at_peak is not None else None,
        first_failing_rps=round(failed_at, 3) if failed_at is not None else None,
        probes=len(probes),
        precision=search.precision,
        note=note,
    )
