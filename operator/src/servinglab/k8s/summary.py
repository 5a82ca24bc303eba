"""From the load Job's results to the experiment's status (pure functions).

`status.results` is compact: one entry per level with throughput, the latency percentiles, errors,
the server-side breakdown, GPU figures, and the two trust flags: `stable` (its last windows agreed)
and `generatorSaturated` (the load generator, not the server, limited it). The full document (every
field the load generator wrote, errors by kind, windows, window timestamps) stays in the results
ConfigMap the status references.
"""

from __future__ import annotations

from typing import Any

from servinglab import results as local_results

_LATENCY_KEYS = ("p50", "p90", "p95", "p99", "max")


def level_status(entry: dict[str, Any], gpu: dict[str, float | None] | None, slo: float | None) -> dict[str, Any]:
    latency = entry.get("latencyMs", {})
    server = entry.get("server") or {}
    compact: dict[str, Any] = {
        **local_results.level_of(entry),
        "throughputRps": entry["throughputRps"],
        "latencyMs": {k: latency[k] for k in _LATENCY_KEYS if k in latency},
        "requests": entry["requests"],
        "errors": entry["errors"],
        "server": {
            k: server[k]
            for k in ("queueMsMean", "serverLatencyMsMean", "inferenceMsPerBatch", "meanBatchSize")
            if server.get(k) is not None
        },
    }
    if entry.get("peakSearchProbe"):
        compact["peakSearchProbe"] = True
    if "openLoop" in entry:
        compact["openLoop"] = {k: entry["openLoop"][k] for k in ("sentRps", "lateSends", "droppedSends")}
    if "stability" in entry:
        compact["stable"] = entry["stability"].get("stable")
    if "generator" in entry:
        compact["generatorSaturated"] = entry["generator"]["saturated"]
    if gpu:
        compact["gpu"] = {k: v for k, v in gpu.items() if v is not None}
    if slo is not None:
        compact["meetsSlo"] = local_results.meets_slo(latency.get("p99"), entry["errors"], slo)
    return compact


def summarise(
    levels: list[dict[str, Any]], slo: float | None, state: str, peak_rate: dict[str, Any] | None = None
) -> dict[str, Any]:
    best = local_results.best_level(levels, slo)
    summary: dict[str, Any] = {"state": state, "levels": len(levels)}
    if best is not None:
        if "concurrency" in best:
            summary["bestConcurrency"] = best["concurrency"]
        else:
            summary["bestRateRps"] = best["rateRps"]
        summary |= {"bestThroughputRps": best["throughputRps"], "bestP99LatencyMs": best["p99LatencyMs"]}
    if peak_rate is not None:
        summary["peakRateRps"] = peak_rate.get("rateRps")
    return summary
