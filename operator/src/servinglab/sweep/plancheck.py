"""The experiment that checks a capacity plan by running it (pure): the winner's configuration on the plan's
replica count (`server.replicas`), an open-loop step that rises to the planned peak rate and holds it, and
the same SLO. Applied as it is, it answers "does the plan hold at its peak?"; with `replicas` one fewer,
"is the plan no larger than it must be?" (there, the SLO should break).

The peak step is held long enough for its p99 to have an upper bound at 95 % (:mod:`servinglab.measure.tails`
needs about 300 answered requests), with half as many again to spare. :func:`peak_phase` and :func:`verdict`
read the peak step's figures back from the check's results. Exported beside the plan by :mod:`servinglab.sweep.export`.
"""

from __future__ import annotations

import math
from typing import Any

from servinglab.api import ExperimentSpec
from servinglab.api.capacity import CapacityPlan
from servinglab.api.figures import PhaseFigures
from servinglab.api.load import ShapeSpec, StepShape
from servinglab.api.results import LevelResult
from servinglab.measure.tails import samples_needed

#: The first step offers this share of the peak: the server sees the rise before it must hold the peak.
RISE_SHARE = 0.5
#: The peak step carries at least this many times the samples a p99 bound needs.
SAMPLES_MARGIN = 1.5
CHECK_FILE = "plan-check.yaml"


def step_seconds(peak_rps: float, least: float = 10.0) -> float:
    """How long each step is held: long enough that the peak step answers SAMPLES_MARGIN x the samples a
    p99 upper bound needs, and at least `least` seconds."""
    return float(max(least, math.ceil(SAMPLES_MARGIN * samples_needed(0.99) / peak_rps)))


def check_spec(
    spec: ExperimentSpec, found: CapacityPlan, replicas: int | None = None, least_seconds: float = 10.0
) -> ExperimentSpec:
    """`spec` (the winner's) on `replicas` (the plan's count unless given) under the plan's peak as a rising
    step. Raises ValueError when the plan has no replica count or the spec no SLO to check."""
    if found.replicas is None or found.peak_rps is None:
        raise ValueError(f"the plan has no replica count to check: {found.reason}")
    if spec.slo.p99_latency_ms is None:
        raise ValueError("slo.p99LatencyMs is unset: a plan check needs the SLO the plan was made for")
    count = found.replicas if replicas is None else replicas
    if count < 1:
        raise ValueError(f"replicas: {count}; a plan check runs at least one replica")
    peak = found.peak_rps
    step = StepShape(rates=[_rate(peak * RISE_SHARE), _rate(peak)], step_seconds=step_seconds(peak, least_seconds))
    load = spec.load.model_copy(update={
        "mode": "open", "rates": [], "rate_search": None, "repeats": 1, "shape": ShapeSpec(step=step),
    })  # fmt: skip
    server = spec.server.model_copy(update={"replicas": count})
    document = spec.model_copy(update={"server": server, "load": load}).model_dump(by_alias=True, mode="json")
    return ExperimentSpec.model_validate(document)  # validated whole, as an applied manifest would be


def check_manifest(
    name: str,
    api_version: str,
    spec: ExperimentSpec,
    found: CapacityPlan,
    replicas: int | None = None,
    least_seconds: float = 10.0,
) -> dict[str, Any]:
    """The ServingExperiment that checks the plan, ready to write as YAML and apply."""
    checked = check_spec(spec, found, replicas, least_seconds)
    return {
        "apiVersion": api_version, "kind": "ServingExperiment", "metadata": {"name": name},
        "spec": checked.model_dump(by_alias=True, exclude_none=True, mode="json"),
    }  # fmt: skip


def _rate(value: float) -> float:
    return float(f"{value:.6g}")


def peak_phase(level: LevelResult) -> PhaseFigures | None:
    """The held peak: the step phase with the highest offered rate (the last of them on a tie)."""
    phases = [phase for phase in level.phases or [] if phase.rate_rps is not None]
    return max(reversed(phases), key=lambda phase: phase.rate_rps or 0.0) if phases else None


def verdict(level: LevelResult, slo_p99_ms: float) -> tuple[bool, float | None]:
    """Whether the check held at its peak, and the peak step's p99: none of its requests failed and its p99
    is within the SLO, and the whole run met the SLO as the results judge it (the p99's upper bound when
    the run had enough samples for one)."""
    phase = peak_phase(level)
    p99 = phase.latency_ms.p99 if phase is not None else None
    held = phase is not None and phase.errors == 0 and p99 is not None and p99 <= slo_p99_ms
    return held and bool(level.meets_slo), p99
