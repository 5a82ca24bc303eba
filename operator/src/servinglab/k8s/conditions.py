"""Status conditions in the Kubernetes convention (pure functions).

Each condition is keyed by `type` (`ServerReady`, `LoadTestComplete`, `GPUMetricsAvailable`,
`Succeeded`, `Failed`, and `Queued` while waiting for a GPU), has a `status` of True/False/Unknown,
a CamelCase `reason`, a human `message` and a `lastTransitionTime` that changes only when the status does.
"""

from __future__ import annotations

from typing import Any

from servinglab.results import now_iso

SERVER_READY = "ServerReady"
LOAD_TEST_COMPLETE = "LoadTestComplete"
GPU_METRICS = "GPUMetricsAvailable"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
QUEUED = "Queued"

Condition = dict[str, Any]


now = now_iso  # RFC 3339 seconds, as Kubernetes writes timestamps


def set_condition(
    conditions: list[Condition],
    kind: str,
    status: bool | None,
    reason: str,
    message: str,
    generation: int | None = None,
) -> list[Condition]:
    """A new list with `kind` set; the transition time is kept when the status did not change."""
    value = {True: "True", False: "False", None: "Unknown"}[status]
    previous = next((c for c in conditions if c.get("type") == kind), None)
    changed = previous is None or previous.get("status") != value
    condition: Condition = {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now() if changed else previous.get("lastTransitionTime", now()),  # type: ignore[union-attr]
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return [c for c in conditions if c.get("type") != kind] + [condition]


def get(conditions: list[Condition], kind: str) -> Condition | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def is_true(conditions: list[Condition], kind: str) -> bool:
    condition = get(conditions, kind)
    return condition is not None and condition.get("status") == "True"


def finished(conditions: list[Condition]) -> bool:
    """Succeeded or Failed: a finished experiment is never touched again."""
    return is_true(conditions, SUCCEEDED) or is_true(conditions, FAILED)
