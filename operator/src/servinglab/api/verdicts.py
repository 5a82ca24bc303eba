"""Why a level measured what it did: the figures a verdict is read from, and the verdict itself.

A :class:`Verdict` rides on every :class:`~servinglab.api.results.LevelResult` (and, for a sweep, on every
trial's record): ONE bottleneck from a fixed vocabulary (:class:`Bottleneck`), the sentence of figures that
supports it, the next change to try, and the sweep axis that change moves (the search tries it first).
Its parts are typed too: where one request's time went (:class:`TimeSplit`), how busy the workers were
(:class:`WorkerLoad`), the device (:class:`DeviceLoad`: GPU from DCGM or NVML, or the server's CPU time
locally) and how batches formed (:class:`BatchFormation`). :class:`CpuFigures` is the server processes'
CPU over a measured window, which a local run records next to the GPU's figures.

The verdict is computed by :mod:`servinglab.measure.verdict` (pure); nothing here imports the rest of
servinglab.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class _Figures(BaseModel):
    """camelCase on the wire like every result (:class:`servinglab.api.results.ResultModel`, which
    imports this module); unknown fields of a newer document are ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class Bottleneck(StrEnum):
    """The fixed vocabulary of verdicts (see docs/verdicts.md for how each is read)."""

    GENERATOR = "generator-bound"  # the load generator, not the server, set the pace
    FRONTEND = "frontend-bound"  # the time is between the client and the server's own counters
    QUEUE = "queue-bound"  # requests wait for busy workers whose device has room: too few workers
    BATCH_DELAY = "batch-delay-bound"  # requests wait on the batch timer while workers idle
    PREPROCESS = "preprocess-bound"  # the workers' time goes to decoding / preparing the inputs
    POSTPROCESS = "postprocess-bound"  # ... to turning outputs into responses
    COMPUTE = "compute-bound"  # the model's forward pass on a busy device is the limit
    RAW_CEILING = "near-raw-ceiling"  # served as fast as the model alone runs at that batch
    UNDERLOADED = "underloaded"  # the server had room: the load did not ask for more
    UNKNOWN = "unknown"  # too few figures to judge (no server breakdown)


class CpuFigures(_Figures):
    """The server's workers (the processes that run the model) on this machine's CPU over a measured window:
    the cores they used, and the cores they wanted (used, plus waiting to run: on a shared machine a worker
    that computes waits for a core, one that sleeps or waits on a device does not)."""

    cores_busy: float = Field(description="CPU seconds the workers used per second of the window.")
    cores_wanted: float | None = Field(
        default=None, description="CPU seconds the workers used or waited in the run queue per second (Linux)."
    )
    cores: int = Field(description="CPU cores the server may run on.")


class TimeSplit(_Figures):
    """Where one request's time went (ms, means over the measured window). `networkFrontend` is the
    client's latency minus the server's; `batching` is the server's time outside the queue and the
    handler (batch assembly, worker round trips)."""

    client_ms: float | None = None
    generator_ms: float | None = None
    network_frontend_ms: float | None = None
    queue_ms: float | None = None
    preprocess_ms: float | None = None
    inference_ms: float | None = None
    postprocess_ms: float | None = None
    batching_ms: float | None = None


class WorkerLoad(_Figures):
    """How busy the workers were: handler time x batches / (workers x window)."""

    workers: int
    busy_fraction: float | None = None
    handler_ms_per_batch: float | None = None


class DeviceLoad(_Figures):
    """The device the model ran on, over the window: busy share, memory, power and energy per inference
    (GPU), or the server's CPU (`cpu`: cores busy of cores); `source` says where the figures came from."""

    kind: str = Field(description="gpu or cpu")
    source: str | None = None
    busy_fraction: float | None = None
    memory_used_max_mib: float | None = Field(default=None, alias="memoryUsedMaxMiB")
    power_avg_watts: float | None = None
    energy_per_inference_joules: float | None = None
    compute_per_busy_second: float | None = Field(
        default=None, description="CPU only: cores the workers used or waited for per second they were busy."
    )
    note: str | None = None


class BatchFormation(_Figures):
    """The batches the server formed against the most it may form, and what forms them."""

    formed: float | None = None
    maximum: int
    fill: float | None = None
    arrivals_per_delay: float | None = Field(
        default=None, description="Requests arriving within one max batch delay (throughput x delay)."
    )
    formed_by: str | None = Field(
        default=None,
        description="What sets the batch: maximum (batches are full), load (each holds every request in flight), "
        "queue (requests waiting for a busy worker), delay (what arrives within the delay), or unclear.",
    )
    note: str | None = None


class VerdictHint(_Figures):
    """The sweep axis the next change moves, and which way (+1: a larger value, -1: a smaller one).
    Axes: batchSize, maxBatchDelayMs, workers, precision, the data-path axes a server may add (decode), and
    form (with `value`: the form to try); a sweep whose space lacks the axis ignores the hint."""

    axis: str
    step: int = Field(ge=-1, le=1)
    value: str | None = None


class Verdict(_Figures):
    """One level's bottleneck, the figures behind it and the next change to try."""

    bottleneck: Bottleneck
    because: str
    next: str
    #: The axes the next change moves, most direct first (a sweep tries the first its space has).
    hints: list[VerdictHint] = Field(default_factory=list)
    time_ms: TimeSplit | None = None
    workers: WorkerLoad | None = None
    device: DeviceLoad | None = None
    batch: BatchFormation | None = None
    served_over_raw: float | None = None

    def compact(self) -> Verdict:
        """What a status keeps: the verdict, its reasons and hint (the parts are rebuilt from the level)."""
        return self.model_copy(update={"time_ms": None, "workers": None, "device": None, "batch": None})
