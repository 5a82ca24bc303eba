"""The status of a ServingExperiment and of a ServingSweep, typed; the CRDs' status schemas are
generated from these models (:mod:`servinglab.api.crd`), so the API server stores exactly them.

Written by the reconcilers (:mod:`servinglab.k8s.experiment.status`, :mod:`servinglab.k8s.sweep`),
read back by them after a restart, and turned into a results document by `servinglab results`.
"""

from __future__ import annotations

from pydantic import Field

from servinglab.api.ceiling import Ceiling, ModelDescription
from servinglab.api.conditions import Condition
from servinglab.api.cost import Price
from servinglab.api.forms import FormRun
from servinglab.api.meta import ResultModel
from servinglab.api.results import EffectiveSettings, LevelResult, PeakRate
from servinglab.api.states import ExperimentState
from servinglab.api.trials import (
    Confirmation,
    PrunedConfig,
    SweepBest,
    SweepCounts,
    SweepPoint,
    SweepSummary,
    TrialRecord,
)
from servinglab.api.utilisation import UtilisationSearch


class ExperimentSummary(ResultModel):
    """What `kubectl get servingexperiments` shows: the best level, and a display-only `state` digest of
    the conditions."""

    state: ExperimentState
    levels: int | None = None
    best_concurrency: int | None = None
    best_rate_rps: float | None = None
    best_throughput_rps: float | None = None
    best_p99_latency_ms: float | None = None
    peak_rate_rps: float | None = None
    #: The best level's bottleneck (its whole verdict is on that level in `results`).
    verdict: str | None = None


class ResultsRef(ResultModel):
    """Where the full results document is: the results ConfigMap and its key."""

    kind: str = "ConfigMap"
    name: str
    key: str


class ExperimentStatus(ResultModel):
    """`status` of a ServingExperiment."""

    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    started_at: str | None = None
    queued_at: str | None = None
    queued_seconds: float | None = None
    server_ready_at: str | None = None
    cold_start_seconds: float | None = None
    #: The server pod read where one is (logs, the model's description, telemetry): the first ready by name.
    server_pod: str | None = None
    #: Every replica's pod the load ran against, and how many served (spec.server.replicas once ready).
    server_pods: list[str] | None = None
    server_replicas: int | None = None
    model: ModelDescription | None = None
    #: The model's form as the server pod's init container built, gated and put beside it (`server.form`).
    form: FormRun | None = None
    results: list[LevelResult] | None = None
    summary: ExperimentSummary | None = None
    results_ref: ResultsRef | None = None
    peak_rate: PeakRate | None = None
    #: The search for the load that holds a utilisation (`spec.load.utilisationTarget`): where, or why not.
    utilisation: UtilisationSearch | None = None
    ceiling: Ceiling | None = None
    #: What the server said it applied, checked against the spec before the load (where its metrics say).
    effective: EffectiveSettings | None = None
    #: The price the levels' cost figures are at, and its source (spec.cost, or the chart's for the server's node).
    price: Price | None = None
    #: The Secret of the load pods' generator key (several generators only): its name, never its value.
    generator_key_secret: str | None = None
    #: The Secret of a model URL's query string (a pre-signed URL's signature), kept out of the
    #: experiment's ConfigMap: its name, never its value.
    model_url_secret: str | None = None
    finished_at: str | None = None
    cleaned_up_at: str | None = None


class SweepStatus(ResultModel):
    """`status` of a ServingSweep: the roll-up of its trials (their measured points stay with them)."""

    conditions: list[Condition] = Field(default_factory=list)
    summary: SweepSummary | None = None
    trials: list[TrialRecord] | None = None
    counts: SweepCounts | None = None
    pruned: list[PrunedConfig] | None = None
    best: SweepBest | None = None
    confirmation: Confirmation | None = None
    best_per_kind: list[SweepBest] | None = None
    front: list[SweepPoint] | None = None
    #: The cost front (cost per million against p99's upper bound), or why there is none.
    cost_front: list[SweepPoint] | None = None
    cost_front_reason: str | None = None
    stop_reason: str | None = None
    grid_size: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
