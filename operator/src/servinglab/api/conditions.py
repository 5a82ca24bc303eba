"""Status conditions in the Kubernetes convention, typed, and the pure functions that set them.

Each condition is keyed by `type` (`ServerReady`, `LoadTestComplete`, `GPUMetricsAvailable`,
`Succeeded`, `Failed`, `Queued` while waiting for a GPU; a sweep's `Running`), has a `status` of
True/False/Unknown, a CamelCase `reason` (a :class:`~servinglab.api.reasons.Reason`), a human `message`
and a `lastTransitionTime` that changes only when the status does. Used by both reconcilers and by `servinglab results`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from servinglab.api.reasons import Reason

SERVER_READY = "ServerReady"
LOAD_TEST_COMPLETE = "LoadTestComplete"
GPU_METRICS = "GPUMetricsAvailable"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
QUEUED = "Queued"
RUNNING = "Running"

ConditionStatus = Literal["True", "False", "Unknown"]


def now() -> str:
    """RFC 3339 to the second, as Kubernetes writes timestamps."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch(timestamp: str) -> float:
    """Seconds since the epoch of a timestamp :func:`now` wrote."""
    return datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


class Condition(BaseModel):
    """One condition of an experiment's or a sweep's status."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    type: str
    status: ConditionStatus
    #: Written as a Reason; read as text, so a condition an older operator wrote still reads back.
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


def set_condition(
    conditions: list[Condition],
    kind: str,
    status: bool | None,
    reason: Reason,
    message: str,
    generation: int | None = None,
) -> list[Condition]:
    """A new list with `kind` set; the transition time is kept when the status did not change."""
    value: ConditionStatus = "True" if status is True else "False" if status is False else "Unknown"
    previous = get(conditions, kind)
    changed = previous is None or previous.status != value
    since = now() if changed or previous is None else previous.last_transition_time or now()
    condition = Condition(
        type=kind, status=value, reason=reason, message=message, last_transition_time=since,
        observed_generation=generation,
    )  # fmt: skip
    return [c for c in conditions if c.type != kind] + [condition]


def get(conditions: list[Condition], kind: str) -> Condition | None:
    return next((c for c in conditions if c.type == kind), None)


def is_true(conditions: list[Condition], kind: str) -> bool:
    condition = get(conditions, kind)
    return condition is not None and condition.status == "True"


def finished(conditions: list[Condition]) -> bool:
    """Succeeded or Failed: a finished experiment or sweep is never touched again."""
    return is_true(conditions, SUCCEEDED) or is_true(conditions, FAILED)
