"""A candidate's score for its sweep's objective: the one figure the roll-up, the search and the
confirmation rank configurations by, higher better (pure).

Throughput: the capacity within the SLO. Cost: inferences per unit of money at that capacity (capacity
over the replica's price per hour), the lowest cost per million inferences first. A candidate without a
capacity, or without a price under the cost objective, has no score: it is not ranked; nor has a trial whose
model's form disagreed with eager fp32 (FormDisagrees), whatever it measured.
"""

from __future__ import annotations

from servinglab.api.cost import CostFigures
from servinglab.api.forms import FORM_DISAGREES
from servinglab.api.trialconfig import ObjectiveSpec
from servinglab.api.trials import TrialRecord


def score(objective: ObjectiveSpec, capacity_rps: float | None, cost: CostFigures | None) -> float | None:
    """The candidate's score: its capacity, or with the cost objective its capacity per price per hour."""
    if capacity_rps is None:
        return None
    if objective.optimize == "throughput":
        return capacity_rps
    if cost is None or not cost.price_per_hour:
        return None
    return capacity_rps / cost.price_per_hour


def of(objective: ObjectiveSpec, record: TrialRecord) -> float | None:
    """A trial record's score (its capacity within the SLO, and that level's cost); None for a FormDisagrees."""
    if record.reason == FORM_DISAGREES:
        return None
    return score(objective, record.capacity_rps, record.cost)
