"""A capacity plan: how many replicas of the winning configuration serve a peak rate, and the per-replica
targets autoscalers scale on (`spec.capacity` of a sweep; the plan itself, a result).

The plan is computed by :mod:`servinglab.sweep.plan` from one replica's capacity within the SLO and the mean
latency there; it is written beside the sweep's exported winner.
"""

from __future__ import annotations

from pydantic import Field

from servinglab.api.meta import ResultModel, SpecModel

#: The most headroom a plan may keep: at 0.9 a replica runs at a tenth of its capacity; beyond, a typo.
MAX_HEADROOM = 0.9
#: A peak rate above this is refused (a bound against a typo of a few orders of magnitude).
MAX_PEAK_RPS = 10_000_000.0

NO_PEAK = "no peak rate: set spec.capacity.peakRps"
NO_CAPACITY = "no capacity: no configuration met the SLO, so one replica's capacity is unknown"


class CapacitySpec(SpecModel):
    """The traffic the winner must serve: its peak rate, and the share of each replica's capacity kept free."""

    peak_rps: float | None = Field(
        default=None, gt=0, le=MAX_PEAK_RPS,
        description="The peak request rate the deployment must serve (requests per second); unset: no replica "
        "count, the per-replica targets only.",
    )  # fmt: skip
    headroom: float = Field(
        default=0.2, ge=0, le=MAX_HEADROOM,
        description="The share of one replica's capacity within the SLO kept free (0.2: each replica is planned "
        "at 80 % of it), for bursts and a replica's noise.",
    )  # fmt: skip
    min_replicas: int = Field(default=1, ge=1, le=1000, description="The autoscalers' lowest replica count.")


class CapacityPlan(ResultModel):
    """One replica's capacity within the SLO (with its confirmation interval when there is one), the requests in
    flight there by Little's law, the per-replica targets at the headroom, and with a peak rate the replicas it
    needs and what they cost per hour. `reason` says why a figure is absent."""

    configuration: str | None = None
    capacity_rps: float | None = None
    low_rps: float | None = None
    high_rps: float | None = None
    latency_mean_ms: float | None = None
    #: Requests in flight on one replica at its capacity: capacity x mean latency (Little's law).
    in_flight: float | None = None
    headroom: float = 0.2
    #: What each replica is planned to carry: capacity x (1 - headroom), and the requests in flight then.
    target_rps_per_replica: float | None = None
    target_in_flight_per_replica: float | None = None
    peak_rps: float | None = None
    replicas: int | None = None
    #: The replicas needed if the capacity is at its interval's low end (absent without an interval).
    replicas_at_low: int | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    price_per_hour: float | None = None
    currency: str | None = None
    cost_per_hour: float | None = None
    reason: str | None = None
