"""The highest open-loop rate whose p99 latency meets the SLO (pure search over a probe function).

In the spirit of MLPerf's server-scenario peak finding and perf_analyzer's latency threshold: from
`minRps`, the rate doubles until one misses the SLO (or `maxRps` passes), which brackets the peak;
the bracket is then halved (geometrically: rates span orders of magnitude) until it is within
`precision` or the probe budget is spent. A probe passes when its p99 is within the SLO, nothing
failed or was dropped, and the load generator did not limit it (a saturated generator cannot vouch
for the server).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from servinglab.loadgen.stats import LevelStats
from servinglab.results import meets_slo
from servinglab.spec import RateSearchSpec


def passes(stats: LevelStats, slo_p99_ms: float) -> bool:
    saturated = bool((stats.generator or {}).get("saturated"))
    return meets_slo(stats.latency_ms.get("p99"), stats.errors, slo_p99_ms) and not saturated


def search_peak_rate(
    probe: Callable[[float], LevelStats], search: RateSearchSpec, slo_p99_ms: float
) -> tuple[dict[str, Any], list[LevelStats]]:
    """Probe rates until the peak is bracketed within `search.precision`; (peak summary, probes)."""
    probes: list[LevelStats] = []

    def run(rate: float) -> bool:
        stats = probe(rate)
        probes.append(stats)
        return passes(stats, slo_p99_ms)

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
) -> dict[str, Any]:
    at_peak = next((p for p in probes if p.rate_rps == peak), None)
    return {
        "rateRps": round(peak, 3) if peak is not None else None,
        "p99LatencyMs": at_peak.latency_ms.get("p99") if at_peak is not None else None,
        "throughputRps": round(at_peak.throughput_rps, 3) if at_peak is not None else None,
        "firstFailingRps": round(failed_at, 3) if failed_at is not None else None,
        "probes": len(probes),
        "precision": search.precision,
        **({"note": note} if note else {}),
    }
