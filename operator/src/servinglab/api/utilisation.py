"""A load that holds a utilisation: what users ask (`spec.load.utilisationTarget`) and what they read back
(the results document's `utilisation`).

The load generator raises the closed loop's users or the open loop's rate until the server's utilisation
holds at `target` within `tolerance` (:mod:`servinglab.loadgen.utilisation`), then reports the throughput
and latency there and every probe that led there, or that it was never reached and why
(:class:`NeverReached`). The utilisation is the GPU's (NVML, locally) or, without one, the server's CPU:
the CPU seconds its workers used per second of a probe's window, over the cores the server may run on.
Nothing here imports the rest of servinglab.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from servinglab.api.meta import ResultModel, SpecModel

#: Most users a closed loop may have (as `load.concurrency`), and most requests per second an open loop may send.
MAX_USERS = 4096
MAX_RPS = 1_000_000.0


class UtilisationTargetSpec(SpecModel):
    """Raise the load until the server's utilisation is within `target` ± `tolerance`, then measure there."""

    target: float = Field(gt=0, le=1, description="The utilisation to hold, a share of the resource (0.6: 60 %).")
    tolerance: float = Field(default=0.05, gt=0, le=0.5, description="How far from target a probe may be.")
    resource: Literal["auto", "gpu", "cpu"] = Field(
        default="auto",
        description="Whose utilisation: the server's GPU (NVML), its CPU (its workers' CPU time over the cores it "
        "may use); auto: the GPU where the server has one, else the CPU.",
    )
    start: float | None = Field(
        default=None,
        gt=0,
        le=MAX_RPS,
        description="The first probe's users (closed; default 1) or rate (open; needed).",
    )
    max_load: float | None = Field(
        default=None, gt=0, le=MAX_RPS, description=f"The most users (default {MAX_USERS}) or rps a probe may offer."
    )
    max_probes: int = Field(default=8, ge=2, le=32, description="At most this many probes.")
    probe_seconds: float | None = Field(
        default=None,
        gt=0,
        le=3600,
        description="Measure each probe this long, then the load found for durationSeconds; unset: each probe is "
        "measured for durationSeconds and the one that holds the target is the measurement.",
    )
    max_seconds: float | None = Field(
        default=None, gt=0, le=86_400, description="Start no probe after this long since the search began."
    )

    @model_validator(mode="after")
    def _band_above_zero(self) -> UtilisationTargetSpec:
        if self.target - self.tolerance <= 0:
            raise ValueError(
                f"utilisationTarget.tolerance: {self.tolerance:g} around target {self.target:g} reaches 0; "
                "give a smaller tolerance"
            )
        if self.start is not None and self.max_load is not None and self.max_load < self.start:
            raise ValueError(f"utilisationTarget.maxLoad {self.max_load:g} is below start {self.start:g}")
        return self

    def bounds(self, closed: bool) -> tuple[float, float]:
        """The first and the largest load a probe offers: users (closed) or requests per second (open)."""
        first = self.start if self.start is not None else 1.0
        return first, self.max_load if self.max_load is not None else (MAX_USERS if closed else MAX_RPS)


class NeverReached(StrEnum):
    """Why the utilisation target was not reached (docs/load.md says how each is told)."""

    GENERATOR = "generator-saturated"  # the load generator limited a probe: it cannot push the server further
    SLO = "slo-broken"  # a probe at or below the target missed the SLO (its p99 or failed requests)
    SERVER_LIMIT = "server-limit"  # the load doubled and the utilisation stayed flat below the target
    MAX_LOAD = "max-load"  # utilisationTarget.maxLoad was offered and the utilisation stayed below the target
    START_ABOVE = "start-above-target"  # the first probe already used more than target + tolerance
    BETWEEN_LOADS = "between-loads"  # one load is below the band, the next one possible above it
    BUDGET = "budget-spent"  # maxProbes or maxSeconds spent before a probe landed in the band
    NO_READING = "no-reading"  # the resource's utilisation could not be read


class UtilisationStep(ResultModel):
    """One probe of the search: the load it offered and what the server did with it."""

    concurrency: int | None = None
    rate_rps: float | None = None
    utilisation: float | None = None
    throughput_rps: float
    p99_latency_ms: float | None = None
    meets_slo: bool | None = None
    generator_saturated: bool | None = None
    level_index: int = Field(description="Where this probe is in the document's results.")


class UtilisationSearch(ResultModel):
    """The search for the load that holds a utilisation: the level measured there, or why none was."""

    resource: Literal["gpu", "cpu"]
    target: float
    tolerance: float
    reached: bool
    reason: NeverReached | None = None
    note: str | None = None
    concurrency: int | None = None
    rate_rps: float | None = None
    utilisation: float | None = None
    throughput_rps: float | None = None
    latency_ms: dict[str, float] | None = None
    level_index: int | None = Field(default=None, description="The measured level in the document's results.")
    probes: int = 0
    steps: list[UtilisationStep] = Field(default_factory=list)

    @property
    def load_label(self) -> str:
        return f"c={self.concurrency}" if self.concurrency is not None else f"{self.rate_rps or 0:g} rps"
