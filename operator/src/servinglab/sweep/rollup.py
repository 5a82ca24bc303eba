"""A sweep's results: per trial its capacity within the SLO, the best configuration, the Pareto
front of throughput against p99 over every measured point, and why the sweep stopped (pure).

A trial *record* is what one trial leaves behind, locally a file `trials/<name>.json` and on the
cluster a child experiment's status: ``{"name", "order", "config", "state", "reason", "message",
"results"}``, where `state` is Succeeded (measured; `capacityRps` may still be None when no level
met the SLO) or Infeasible (out of memory, never ready, crashed: a result, not a sweep failure) and
`results` the experiment's results document. The local runner and the sweep reconciler build the
same records, so `servinglab sweep` and `kubectl get servingsweep` report the same document.
"""

from __future__ import annotations

from typing import Any

from servinglab.results import now_iso
from servinglab.sweep.search import OUT_OF_MEMORY, Outcome, pruned_by
from servinglab.sweepspec import ServingSweep, TrialConfig, axis_values, grid, space_size

SWEEP_RESULTS_KIND = "ServingSweepResults"
SUCCEEDED, INFEASIBLE = "Succeeded", "Infeasible"

#: Substrings of a failure that say which kind of infeasibility it was, checked in order.
_FAILURE_KINDS = (
    (OUT_OF_MEMORY, ("out of memory", "outofmemory", "memoryerror", "cannot allocate memory", "oomkilled")),
    ("NeverReady", ("not ready within", "did not answer a test request", "serverNotReady")),
    ("Crashed", ("exited with code", "servercrashed", "crashloop")),
    ("SettingsNotApplied", ("did not apply the requested settings",)),
    ("Unschedulable", ("unschedulable", "no node matching")),
)


def classify_failure(message: str) -> str:
    """OutOfMemory, NeverReady, Crashed, SettingsNotApplied or Failed, from a failure's message."""
    lowered = message.lower()
    for reason, needles in _FAILURE_KINDS:
        if any(needle.lower() in lowered for needle in needles):
            return reason
    return "Failed"


def meets_objective(level: dict[str, Any], slo_p99_ms: float | None, max_error_rate: float) -> bool:
    """A level counts when its p99 is within the SLO (if any) and its error share is allowed."""
    requests = max(int(level.get("requests") or 0), 1)
    if int(level.get("errors") or 0) / requests > max_error_rate:
        return False
    p99 = (level.get("latencyMs") or {}).get("p99")
    return slo_p99_ms is None or (p99 is not None and p99 <= slo_p99_ms)


def capacity(document: dict[str, Any], slo_p99_ms: float | None, max_error_rate: float) -> dict[str, Any] | None:
    """The trial's figure of merit: the peak rate the open-loop search found within the SLO, else the
    highest-throughput level that meets the objective; None when nothing does."""
    peak = document.get("peakRate") or {}
    if peak.get("rateRps") is not None:
        return {"capacityRps": peak["rateRps"], "p99LatencyMs": peak.get("p99LatencyMs"), "level": "peak rate"}
    levels = [e for e in document.get("results", []) if meets_objective(e, slo_p99_ms, max_error_rate)]
    if not levels:
        return None
    top = max(levels, key=lambda e: float(e["throughputRps"]))
    label = f"{top['concurrency']} users" if "concurrency" in top else f"{top.get('rateRps')} rps"
    return {"capacityRps": top["throughputRps"], "p99LatencyMs": top["latencyMs"].get("p99"), "level": label}


def record(
    sweep: ServingSweep,
    name: str,
    order: int,
    config: TrialConfig,
    document: dict[str, Any] | None,
    failure: str | None,
) -> dict[str, Any]:
    """The record of one finished trial (measured, or infeasible with the failure's kind)."""
    state = SUCCEEDED if document is not None else INFEASIBLE
    entry: dict[str, Any] = {
        "name": name,
        "order": order,
        "config": config.model_dump(by_alias=True, mode="json"),
        "state": state,
        "reason": None if failure is None else classify_failure(failure),
        "message": failure,
        "finishedAt": now_iso(),
    }
    if document is not None:
        slo = sweep.spec.template.slo.p99_latency_ms
        found = capacity(document, slo, sweep.spec.objective.max_error_rate)
        entry.update(found or {"capacityRps": None, "p99LatencyMs": None, "level": None})
        if found is None:
            entry["reason"] = "NoLevelWithinSlo"
        entry["readySeconds"] = document.get("reconfiguredSeconds", document.get("coldStartSeconds"))
        entry["reconfigured"] = "reconfiguredSeconds" in document
    entry["results"] = document
    return entry


def outcome(entry: dict[str, Any]) -> Outcome:
    """What the search needs of a record."""
    config = TrialConfig.model_validate(entry["config"])
    return Outcome(config, entry.get("capacityRps"), entry["state"] == SUCCEEDED, entry.get("reason"))


def points(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every measured level of every trial: (trial, configuration, level, throughput, p99)."""
    found = []
    for entry in entries:
        for level in (entry.get("results") or {}).get("results", []):
            p99 = (level.get("latencyMs") or {}).get("p99")
            if p99 is None or not level.get("throughputRps"):
                continue
            found.append({
                "trial": entry["name"], "config": entry["config"],
                "level": level.get("concurrency", level.get("rateRps")),
                "throughputRps": level["throughputRps"], "p99LatencyMs": p99,
            })  # fmt: skip
    return found


def pareto_front(candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points no other point beats on both throughput (higher) and p99 (lower), by p99."""
    ordered = sorted(candidates, key=lambda p: (p["p99LatencyMs"], -p["throughputRps"]))
    front, best_rps = [], float("-inf")
    for point in ordered:
        if point["throughputRps"] > best_rps:
            front.append(point)
            best_rps = point["throughputRps"]
    return front


def document(
    sweep: ServingSweep, entries: list[dict[str, Any]], stop_reason: str | None, started_at: str
) -> dict[str, Any]:
    """The sweep's results document (local `sweep.json`; on the cluster the full-results object)."""
    spec = sweep.spec
    ordered = sorted(entries, key=lambda e: e["order"])
    history = [outcome(e) for e in ordered]
    done = {o.config.key() for o in history}
    pruned = [
        {"config": c.model_dump(by_alias=True, mode="json"), "reason": why}
        for c in grid(spec)
        if c.key() not in done and (why := pruned_by(history, c))
    ]
    scored = [e for e in ordered if e.get("capacityRps") is not None]
    top = max(scored, key=lambda e: e["capacityRps"]) if scored else None
    counts = {state: sum(1 for e in ordered if e["state"] == state) for state in (SUCCEEDED, INFEASIBLE)}
    axes = axis_values(spec)
    return {
        "apiVersion": sweep.api_version,
        "kind": SWEEP_RESULTS_KIND,
        "sweep": sweep.metadata.name,
        "model": spec.template.model.name,
        "strategy": spec.strategy,
        "space": {
            name: [str(v) if name == "precision" else v for v in values]
            for name, values in zip(("batchSize", "maxBatchDelayMs", "workers", "precision"), axes, strict=False)
        }
        if spec.strategy != "list"
        else {"configurations": len(spec.configurations)},  # fmt: skip
        "gridSize": space_size(spec) if spec.strategy != "list" else len(spec.configurations),
        "objective": {"p99LatencyMs": spec.template.slo.p99_latency_ms, "maxErrorRate": spec.objective.max_error_rate},
        "trials": [{k: v for k, v in e.items() if k != "results"} for e in ordered],
        "counts": {**counts, "pruned": len(pruned), "run": len(ordered)},
        "pruned": pruned,
        "best": None
        if top is None
        else {
            "trial": top["name"],
            "config": top["config"],
            "capacityRps": top["capacityRps"],
            "p99LatencyMs": top["p99LatencyMs"],
            "level": top["level"],
        },  # fmt: skip
        "points": (every := points(ordered)),
        "front": pareto_front(every),
        "stopReason": stop_reason,
        "startedAt": started_at,
        "finishedAt": now_iso() if stop_reason else None,
    }
