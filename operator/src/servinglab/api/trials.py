"""A sweep's results, typed: each trial's record, the best configuration, the Pareto fronts (throughput
and cost per million, each against p99).

A trial *record* is what one trial leaves behind (locally the file `trials/<name>.json`, on the
cluster a child experiment's status read back): its configuration, its state — Succeeded (measured;
`capacity_rps` may still be None when no level met the objective) or Infeasible (out of memory, never
ready, crashed: a result, not a failure of the sweep) — and, locally, the trial's whole results.
:class:`SweepResults` is the sweep's document (`sweep.json`; `servinglab results --sweep`), built by
:mod:`servinglab.sweep.rollup` from the records, the same locally and on a cluster.
"""

from __future__ import annotations

from pydantic import Field

from servinglab.api.cost import CostFigures
from servinglab.api.meta import GROUP_VERSION, ResultModel
from servinglab.api.results import ExperimentResults
from servinglab.api.states import Confidence, ConfirmationState, SweepState, TrialState
from servinglab.api.trialconfig import TrialConfig
from servinglab.api.verdicts import Verdict

SWEEP_RESULTS_KIND = "ServingSweepResults"
SUCCEEDED, INFEASIBLE = TrialState.SUCCEEDED, TrialState.INFEASIBLE


class TrialRecord(ResultModel):
    """One finished trial."""

    name: str
    order: int
    config: TrialConfig
    state: TrialState
    reason: str | None = None
    message: str | None = None
    finished_at: str | None = None
    capacity_rps: float | None = None
    p99_latency_ms: float | None = None
    level: str | None = None
    #: The capacity level's mean latency (the requests in flight there, by Little's law, for a capacity plan).
    latency_mean_ms: float | None = None
    #: What the capacity level's throughput costs (the figure a cost objective ranks by).
    cost: CostFigures | None = None
    #: The verdict at the trial's capacity level (compact: the level in `results` has its parts).
    verdict: Verdict | None = None
    #: A confirmation run: the trial it measures again, and which round of the alternation it belongs to.
    confirms: str | None = None
    round: int | None = None
    ready_seconds: float | None = None
    reconfigured: bool | None = None
    wall_seconds: float | None = None
    results: ExperimentResults | None = None

    @property
    def succeeded(self) -> bool:
        return self.state == SUCCEEDED


class PrunedConfig(ResultModel):
    """A configuration not run because an earlier outcome implies it would fail."""

    config: TrialConfig
    reason: str


class SweepBest(ResultModel):
    """The configuration named best: with a confirmation, the one its alternated re-measurements pick
    (`capacityRps` their mean, within [lowRps, highRps] at 95 %; `confidence` Confirmed, or Tie when others
    could not be told from it: `tiedWith`); without one, the highest single measurement (Unconfirmed)."""

    trial: str
    config: TrialConfig
    capacity_rps: float
    p99_latency_ms: float | None = None
    level: str | None = None
    confidence: Confidence | None = None
    low_rps: float | None = None
    high_rps: float | None = None
    tied_with: list[str] | None = None
    verdict: Verdict | None = None
    #: The mean latency of the trial's capacity level (its first measurement).
    latency_mean_ms: float | None = None
    #: The cost at `capacityRps` (with a confirmation: at its mean).
    cost: CostFigures | None = None


class MissedRun(ResultModel):
    """A confirmation run with no level within the objective: a miss of the tail, not a capacity of 0. Its
    best level's p99 (the lowest) and that p99's upper bound at 95 % (absent when the level was too short)."""

    round: int
    p99_latency_ms: float | None = None
    p99_upper_ms: float | None = None


class CandidateRuns(ResultModel):
    """One candidate of the confirmation: its first measurement (which made it a candidate), the capacities
    of its alternated re-measurements that met the objective (in round order) and those that missed it,
    the geometric mean and 95 % interval of the capacities, and whether it ties with the best."""

    trial: str
    config: TrialConfig
    first_rps: float | None = None
    runs_rps: list[float] = Field(default_factory=list)
    missed: list[MissedRun] | None = None
    mean_rps: float | None = None
    low_rps: float | None = None
    high_rps: float | None = None
    tied: bool | None = None


class Confirmation(ResultModel):
    """The top candidates measured again, alternating: how the winner was named."""

    state: ConfirmationState = Field(
        description="Running, Confirmed (one candidate is better than the others), Tie, or NoneWithinSlo "
        "(no candidate met the objective in any of its runs)."
    )
    rounds: int
    candidates: list[CandidateRuns] = Field(default_factory=list)
    winner: str | None = None
    tied_with: list[str] = Field(default_factory=list)
    note: str | None = None


class SweepPoint(ResultModel):
    """One measured level of one trial: a point of the throughput-p99 plane (and, priced, of the cost-p99
    plane). The p99's bounds at 95 % are absent where the level was too short for them."""

    trial: str
    config: TrialConfig
    level: float | None = None
    throughput_rps: float
    p99_latency_ms: float
    cost_per_million: float | None = None
    p99_lower_ms: float | None = None
    p99_upper_ms: float | None = None

    @property
    def p99_bound_ms(self) -> float:
        """The p99 the cost front ranks by: its upper bound where the level has one, else the p99 itself."""
        return self.p99_upper_ms if self.p99_upper_ms is not None else self.p99_latency_ms


class SweepCounts(ResultModel):
    succeeded: int = Field(default=0, alias="Succeeded")
    infeasible: int = Field(default=0, alias="Infeasible")
    pruned: int = 0
    run: int = 0


class SweepObjective(ResultModel):
    optimize: str | None = None
    p99_latency_ms: float | None = None
    max_error_rate: float = 0.0


class SweepSpace(ResultModel):
    """The values each axis took (grid and search), or how many configurations were listed; with a kind
    axis, the servers and each one's own axes."""

    batch_size: list[int] | None = None
    max_batch_delay_ms: list[int] | None = None
    workers: list[int] | None = None
    precision: list[str] | None = None
    #: The data paths tried, by label ("default": the handler's), when the sweep varied them.
    data_path: list[str] | None = None
    #: The model's forms tried, when the sweep varied them.
    form: list[str] | None = None
    configurations: int | None = None
    kind: list[str] | None = None
    per_kind: dict[str, SweepSpace] | None = None


class SweepSummary(ResultModel):
    """What `kubectl get servingsweeps` shows."""

    state: SweepState
    trials_done: int | None = None
    trials_running: int | None = None
    trials_total: int | None = None
    best_config: str | None = None
    best_throughput_rps: float | None = None
    best_p99_latency_ms: float | None = None
    #: Confirmed, Tie, Unconfirmed (no confirmation), Confirming while it runs, or NoneWithinSlo (every
    #: confirmation run of every candidate missed the SLO: the best first measurement, no capacity plan).
    winner: Confidence | None = None


class SweepResults(ResultModel):
    """A sweep's document."""

    api_version: str = GROUP_VERSION
    kind: str = SWEEP_RESULTS_KIND
    sweep: str
    model: str
    #: The template's server (a trial that names none ran on it).
    server_kind: str | None = None
    strategy: str
    space: SweepSpace = Field(default_factory=SweepSpace)
    grid_size: int
    objective: SweepObjective = Field(default_factory=SweepObjective)
    trials: list[TrialRecord] = Field(default_factory=list)
    counts: SweepCounts = Field(default_factory=SweepCounts)
    pruned: list[PrunedConfig] = Field(default_factory=list)
    best: SweepBest | None = None
    confirmation: Confirmation | None = None
    #: With a kind axis: each server's own best (the servers side by side), best first.
    best_per_kind: list[SweepBest] | None = None
    points: list[SweepPoint] = Field(default_factory=list)
    front: list[SweepPoint] = Field(default_factory=list)
    #: The points no other beats on both cost per million and p99's upper bound (both lower), by p99; absent,
    #: with `cost_front_reason`, when no point is priced.
    cost_front: list[SweepPoint] | None = None
    cost_front_reason: str | None = None
    stop_reason: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    summary: SweepSummary | None = None
