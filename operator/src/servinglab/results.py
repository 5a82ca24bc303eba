"""Assemble the results document of one experiment (pure functions).

Field names match the ServingExperiment status the operator will write: a `results` list with one
entry per level (`concurrency`, `throughputRps`, `latencyMs` {p50, p90, p95, p99, max, ...},
`requests`, `errors`, `server` breakdown), `coldStartSeconds`, the requested and the effective
server settings, and the best level (highest throughput, among levels meeting the SLO if one is set).
"""

from __future__ import annotations

import platform
from datetime import UTC, datetime
from typing import Any

from servinglab import __version__
from servinglab.loadgen.stats import LevelStats
from servinglab.spec import ServingExperiment

RESULTS_KIND = "ServingExperimentResults"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def meets_slo(p99_ms: float | None, errors: int, slo_p99_ms: float) -> bool:
    """A level meets the latency objective when its p99 is within it and nothing failed."""
    return p99_ms is not None and p99_ms <= slo_p99_ms and errors == 0


def level_entry(
    stats: LevelStats, server_breakdown: dict[str, float | None], slo_p99_ms: float | None
) -> dict[str, Any]:
    entry = stats.to_json()
    entry["server"] = server_breakdown
    if slo_p99_ms is not None:
        entry["meetsSlo"] = meets_slo(stats.latency_ms.get("p99"), stats.errors, slo_p99_ms)
    return entry


def level_entries(
    stats: list[LevelStats],
    sweep_levels: int,
    breakdowns: dict[int, dict[str, float | None]],
    slo_p99_ms: float | None,
) -> list[dict[str, Any]]:
    """Results entries in run order; server breakdowns are keyed by level index; probes of the
    peak-rate search (after the first `sweep_levels`) are marked `peakSearchProbe`."""
    entries = []
    for index, level in enumerate(stats):
        entry = level_entry(level, breakdowns.get(index, {}), slo_p99_ms)
        if index >= sweep_levels:
            entry["peakSearchProbe"] = True
        entries.append(entry)
    return entries


def level_of(entry: dict[str, Any]) -> dict[str, Any]:
    """What identifies a level: {"concurrency": N} (closed loop) or {"rateRps": R} (open loop)."""
    return {"concurrency": entry["concurrency"]} if "concurrency" in entry else {"rateRps": entry.get("rateRps")}


def level_label(entry: dict[str, Any]) -> str:
    """A level for people: "4" users or "50 rps"."""
    return str(entry["concurrency"]) if "concurrency" in entry else f"{entry.get('rateRps', 0):g} rps"


def trust_checks(entry: dict[str, Any]) -> tuple[list[str], list[str]]:
    """A level's trust marks (stable / UNSTABLE / short; GENERATOR-LIMITED) and the reasons behind them."""
    marks, reasons = [], []
    stability = entry.get("stability")
    if stability is not None:
        stable = stability.get("stable")
        marks.append({True: "stable", False: "UNSTABLE", None: "short"}[stable])
        if stable is False:
            reasons.append(f"unstable after {stability.get('measuredSeconds')} s: {stability.get('reason')}")
    generator = entry.get("generator")
    if generator is not None and generator.get("saturated"):
        marks.append("GENERATOR-LIMITED")
        reasons.append(f"the load generator limited this level ({generator.get('reason')})")
    return marks, reasons


def best_level(entries: list[dict[str, Any]], slo_p99_ms: float | None) -> dict[str, Any] | None:
    """The level with the highest throughput; with an SLO, only levels that meet it qualify."""
    candidates = [e for e in entries if e["throughputRps"] > 0]
    if slo_p99_ms is not None:
        candidates = [e for e in candidates if e.get("meetsSlo")]
    if not candidates:
        return None
    best = max(candidates, key=lambda e: e["throughputRps"])
    return {
        **level_of(best),
        "throughputRps": best["throughputRps"],
        "p99LatencyMs": best["latencyMs"].get("p99"),
    }


def document(
    experiment: ServingExperiment,
    entries: list[dict[str, Any]],
    cold_start_seconds: float,
    effective: dict[str, Any],
    runtime: dict[str, Any],
    started_at: str,
    finished_at: str,
    peak_rate: dict[str, Any] | None = None,
    ceiling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec = experiment.spec
    slo = spec.slo.p99_latency_ms
    return {
        "apiVersion": experiment.api_version,
        "kind": RESULTS_KIND,
        "experiment": experiment.metadata.name,
        "model": spec.model.name,
        "server": {
            "batchSize": spec.server.batch_size,
            "maxBatchDelayMs": spec.server.max_batch_delay_ms,
            "workers": spec.server.workers,
            "precision": str(spec.server.precision),
            "effective": effective,
        },
        "load": {
            "mode": f"{spec.load.mode}-loop",
            **({"arrival": spec.load.arrival} if spec.load.mode == "open" else {}),
            "warmupSeconds": spec.load.warmup_seconds,
            "durationSeconds": spec.load.duration_seconds,
            "payload": str(spec.load.payload.format),
        },
        "slo": {"p99LatencyMs": slo} if slo is not None else None,
        "coldStartSeconds": round(cold_start_seconds, 3),
        "results": entries,
        "best": best_level(entries, slo),
        **({"peakRate": peak_rate} if peak_rate is not None else {}),
        **({"ceiling": ceiling} if ceiling is not None else {}),
        "runtime": runtime,
        "startedAt": started_at,
        "finishedAt": finished_at,
        "generator": {"servinglab": __version__, "python": platform.python_version()},
    }
