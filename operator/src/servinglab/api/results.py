"""What an experiment measured, as typed models: one level, and one experiment's whole document.

The one family every part of servinglab produces and reads: the local runner and the load Job write
:class:`ExperimentResults` / :class:`LoadJobResults`, the operator keeps each level's
:meth:`LevelResult.compact` form in the experiment's status, `servinglab results` rebuilds an
:class:`ExperimentResults` from that status, and the table, the report and the sweep roll-up read it.
Field names on the wire are camelCase (the status and the JSON files), snake_case in Python; fields
that are None are left out of what is written (:func:`to_json`), so a document reads the same after a
round trip. Documents written by earlier versions parse: fields they lack are optional, and the flat
`stable` / `generatorSaturated` flags of the first status layout are kept as such.

Nothing here imports the rest of servinglab: the API layer is the bottom of the package.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from servinglab.api.ceiling import Ceiling, ModelDescription
from servinglab.api.conditions import Condition
from servinglab.api.cost import CostFigures
from servinglab.api.figures import (
    GeneratorVerdict,
    GpuFigures,
    Latency,
    LatencyIntervals,
    OpenLoopFigures,
    PhaseFigures,
    Repeats,
    ServerBreakdown,
    Stability,
)
from servinglab.api.forms import FormRun
from servinglab.api.meta import GROUP_VERSION, ResultModel
from servinglab.api.utilisation import UtilisationSearch
from servinglab.api.verdicts import CpuFigures, Verdict

RESULTS_KIND = "ServingExperimentResults"

#: A JSON object at the edge (files, the API): what the models are read from and written to.
JsonObject = dict[str, Any]


def to_json(model: BaseModel) -> JsonObject:
    """The model as JSON-ready data: camelCase, None left out (a missing field reads back as None)."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


# -- one level ----------------------------------------------------------------------------------------


class LevelResult(ResultModel):
    """One measured level: a closed loop's `concurrency` or an open loop's offered `rate_rps`."""

    concurrency: int | None = None
    rate_rps: float | None = None
    throughput_rps: float
    latency_ms: Latency = Field(default_factory=Latency)
    requests: int
    errors: int
    errors_by_kind: dict[str, int] | None = None
    window_seconds: float | None = None
    window_start: float | None = None
    window_end: float | None = None
    latency_cdf_ms: list[list[float]] | None = None
    stability: Stability | None = None
    generator: GeneratorVerdict | None = None
    open_loop: OpenLoopFigures | None = None
    repeats: Repeats | None = None
    phases: list[PhaseFigures] | None = None
    server: ServerBreakdown | None = None
    gpu: GpuFigures | None = None
    cpu: CpuFigures | None = None
    #: What the level's throughput costs (absent in documents written before costs were computed).
    cost: CostFigures | None = None
    verdict: Verdict | None = None
    meets_slo: bool | None = None
    #: True when `meets_slo` was judged on the p99 itself, the level being too short for its upper bound.
    slo_uncertain: bool | None = None
    peak_search_probe: bool | None = None
    # the first status layout's flat trust flags (read from old statuses; never written now)
    stable: bool | None = None
    generator_saturated: bool | None = None

    @property
    def label(self) -> str:
        """The level for people: "4" users or "50 rps"."""
        return str(self.concurrency) if self.concurrency is not None else f"{self.rate_rps or 0:g} rps"

    @property
    def is_stable(self) -> bool | None:
        return self.stability.stable if self.stability is not None else self.stable

    @property
    def generator_limited(self) -> bool:
        if self.generator is not None:
            return self.generator.saturated
        return bool(self.generator_saturated)

    def compact(self) -> LevelResult:
        """What an experiment's status keeps: everything the table shows, without the latency CDF, the
        stability windows, a shaped run's phases, the bounds of the percentiles but p99's, and every
        generator's own verdict (those stay in the full document the status references: they would make
        the status grow with the run's length)."""
        stability = self.stability.model_copy(update={"windows": []}) if self.stability is not None else None
        generator = self.generator.model_copy(update={"per_generator": None}) if self.generator is not None else None
        verdict = self.verdict.compact() if self.verdict is not None else None
        intervals = self.latency_ms.intervals  # the status keeps the bound the SLO is judged on
        latency = self.latency_ms.model_copy(
            update={"intervals": LatencyIntervals(p99=intervals.p99) if intervals is not None else None}
        )
        return self.model_copy(
            update={"latency_cdf_ms": None, "stability": stability, "generator": generator, "phases": None,
                    "verdict": verdict, "latency_ms": latency}
        )  # fmt: skip


# -- one experiment -----------------------------------------------------------------------------------


class EffectiveSettings(ResultModel):
    """What the server reported it applied (checked against the request before any load is sent)."""

    batch_size: int | None = None
    max_batch_delay_ms: int | None = None
    min_workers: int | None = None
    max_workers: int | None = None
    ready_workers: int | None = None
    #: The server's backend that served the model, where it has several (Triton: `python`, servinglab's model,
    #: or a native one: `onnxruntime`, `pytorch`, `tensorrt`), as the server says.
    backend: str | None = None
    #: Why the model's form is not on the server's native backend for it (Triton: none here, or the requests'
    #: encoding), where a form was asked for.
    backend_note: str | None = None


class ServerSettings(ResultModel):
    """The configuration under test, as requested, and as the server applied it."""

    kind: str | None = None
    batch_size: int | None = None
    max_batch_delay_ms: int | None = None
    workers: int | None = None
    precision: str | None = None
    #: The data path the spec asked for, for people (absent: the handler's defaults); `runtime.dataPath` ran.
    data_path: str | None = None
    effective: EffectiveSettings | None = None


class LoadSummary(ResultModel):
    mode: str
    arrival: str | None = None
    warmup_seconds: float | None = None
    duration_seconds: float | None = None
    payload: str | None = None


class Slo(ResultModel):
    p99_latency_ms: float | None = None


class BestLevel(ResultModel):
    """The level with the highest throughput (among those within the SLO, if one is set)."""

    concurrency: int | None = None
    rate_rps: float | None = None
    throughput_rps: float
    p99_latency_ms: float | None = None
    #: That p99's upper bound at 95 % (absent: a level too short for one, or a document from before bounds).
    p99_upper_ms: float | None = None
    cost: CostFigures | None = None

    @property
    def label(self) -> str:
        return str(self.concurrency) if self.concurrency is not None else f"{self.rate_rps or 0:g} rps"


class PeakRate(ResultModel):
    """The highest open-loop rate whose p99 met the SLO, and how the search got there."""

    rate_rps: float | None = None
    p99_latency_ms: float | None = None
    throughput_rps: float | None = None
    first_failing_rps: float | None = None
    probes: int | None = None
    precision: float | None = None
    note: str | None = None


class Warmup(ResultModel):
    """The handler's warm-up as its slowest worker reported it."""

    seconds: float
    batch_sizes: list[int] = Field(default_factory=list)
    skipped: list[int] = Field(default_factory=list)
    budget_seconds: float | None = None
    #: The sizes run whatever the budget: a compiled model's padded sizes, each compiling its graph.
    required: list[int] | None = None


class DataPathRun(ResultModel):
    """The handler's data path as a worker ran it (its own account), beside what the spec asked for."""

    decode: str | None = None
    decode_threads: int | None = None
    transfer: str | None = None
    pinned_copies: bool | None = None
    compile: str | None = None
    channels_last: bool | None = None
    padded_batch_sizes: list[int] | None = None
    device: str | None = None
    note: str | None = None


class Runtime(ResultModel):
    """Where the experiment ran."""

    mode: Literal["local", "cluster"]
    device: str | None = None
    precision_note: str | None = None
    data_path: DataPathRun | None = None
    #: The model's form as built, checked and served (absent: the model as it comes).
    form: FormRun | None = None
    warmup: Warmup | None = None
    cpu_count: int | None = None
    machine: str | None = None
    #: Where the levels' GPU figures came from, or why there are none (no GPU, NVML not readable).
    gpu_telemetry: str | None = None
    #: The pod read for logs and telemetry (with several replicas: the first by name).
    server_pod: str | None = None
    #: How many server replicas the load ran against (absent: one); throughput and cost are the whole deployment's.
    server_replicas: int | None = None


class Producer(ResultModel):
    """Which servinglab wrote the document."""

    servinglab: str
    python: str | None = None


class ExperimentResults(ResultModel):
    """One experiment's results document: the local `--output` file, `servinglab results -o`, and
    what the table and the report read."""

    api_version: str = GROUP_VERSION
    kind: str = RESULTS_KIND
    experiment: str
    model: str
    server: ServerSettings = Field(default_factory=ServerSettings)
    load: LoadSummary | None = None
    slo: Slo | None = None
    cold_start_seconds: float | None = None
    reconfigured_seconds: float | None = None
    warmup_seconds: float | None = None
    results: list[LevelResult] = Field(default_factory=list)
    best: BestLevel | None = None
    peak_rate: PeakRate | None = None
    utilisation: UtilisationSearch | None = None
    ceiling: Ceiling | None = None
    runtime: Runtime | None = None
    model_info: ModelDescription | None = None
    conditions: list[Condition] | None = None
    started_at: str | None = None
    finished_at: str | None = None
    generator: Producer | None = None

    @property
    def slo_p99_ms(self) -> float | None:
        return self.slo.p99_latency_ms if self.slo is not None else None

    @property
    def ready_seconds(self) -> float | None:
        """Until the server was ready: its cold start, or its reconfiguration in a sweep."""
        return self.reconfigured_seconds if self.reconfigured_seconds is not None else self.cold_start_seconds


class LoadJobResults(ResultModel):
    """What the load Job writes into the experiment's results ConfigMap for the operator."""

    results: list[LevelResult]
    server_answered_at: float | None = None
    peak_rate: PeakRate | None = None
    #: The search for the load that holds a utilisation (`load.utilisationTarget`), read from Prometheus.
    utilisation: UtilisationSearch | None = None
    ceiling: Ceiling | None = None
    #: What the server said it applied, checked before the load (None: its metrics do not say).
    effective: EffectiveSettings | None = None
    experiment_uid: str | None = None
