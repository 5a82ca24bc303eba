"""The figures one measured level is made of: latency percentiles with their confidence intervals, the
stability windows, the load generator's own verdict, an open loop's sends, the repeats' spread, a shaped
run's phases, the server's breakdown and the GPU's figures over the window. A level
(:class:`servinglab.api.results.LevelResult`) holds them; the load generator, the measurement driver and the
presenters read them. Nothing here imports the rest of servinglab.
"""

from __future__ import annotations

from pydantic import Field

from servinglab.api.meta import ResultModel


class PercentileInterval(ResultModel):
    """How sure a percentile is: distribution-free bounds (ms) from order statistics, each one-sided at
    `confidence`, over `samples` successful requests. A bound that so few samples cannot give is absent;
    without an upper bound, `samplesNeeded` says how many it would take."""

    lower: float | None = None
    upper: float | None = None
    confidence: float
    samples: int
    samples_needed: int | None = None

    @property
    def too_short(self) -> bool:
        return self.upper is None


class LatencyIntervals(ResultModel):
    """The percentiles' confidence bounds (absent in documents written before they were computed)."""

    p50: PercentileInterval | None = None
    p90: PercentileInterval | None = None
    p95: PercentileInterval | None = None
    p99: PercentileInterval | None = None


class Latency(ResultModel):
    """Exact nearest-rank percentiles of the successful requests (ms); None when none succeeded."""

    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None
    min: float | None = None
    mean: float | None = None
    intervals: LatencyIntervals | None = None

    @property
    def p99_interval(self) -> PercentileInterval | None:
        return self.intervals.p99 if self.intervals is not None else None


class Window(ResultModel):
    """One stability window: requests sent in it, answered throughput and exact p99."""

    start: float
    throughput_rps: float
    p99_ms: float | None = None


class Stability(ResultModel):
    """Whether a level's last windows agreed; `stable` None means too few windows to judge."""

    windows: list[Window] = Field(default_factory=list)
    tolerance: float | None = None
    stable: bool | None = None
    reason: str | None = None
    throughput_spread: float | None = None
    throughput_tolerance: float | None = None
    p99_spread: float | None = None
    p99_compared: bool | None = None
    measured_seconds: float | None = None


class SendGap(ResultModel):
    """How late the generator sent (ms): a closed loop's gap between answer and next send, an open
    loop's lag behind the schedule."""

    p50: float | None = None
    p99: float = 0.0
    max: float | None = None


class OneGenerator(ResultModel):
    """Whether one load generator, not the server, limited the level: its CPU, or its send gaps."""

    cpu_percent: float | None = None
    send_gap_ms: SendGap | None = None
    saturated: bool = False
    reason: str | None = None


class GeneratorVerdict(OneGenerator):
    """The level's verdict; with several generators the worst one's figures, any saturated one named,
    and each one's own verdict."""

    generators: int | None = None
    per_generator: list[OneGenerator] | None = None


class OpenLoopFigures(ResultModel):
    """What an open-loop generator offered and could not do."""

    offered_rps: float | None = None
    arrival: str | None = None
    sent_rps: float
    late_sends: int
    dropped_sends: int


class MeanCi(ResultModel):
    """A mean and the half-width of its 95 % confidence interval."""

    mean: float
    ci95: float


class Repeats(ResultModel):
    """A level run several times: each run's throughput and p99, and their means with a 95 % CI."""

    runs: int
    throughput_rps: list[float]
    p99_ms: list[float]
    throughput_rps_mean: MeanCi
    p99_ms_mean: MeanCi | None = None


class PhaseFigures(ResultModel):
    """One phase of a shaped run (a step, a burst, a trace; or all bursts or all base periods together)."""

    name: str
    start: float | None = None
    users: int | None = None
    rate_rps: float | None = None
    seconds: float
    requests: int
    errors: int
    throughput_rps: float
    latency_ms: Latency = Field(default_factory=Latency)


class ServerBreakdown(ResultModel):
    """Where the server's time went over the measured window, from its own counters: means per request
    and per batch, the mean batch it formed, and how many batches and requests it counted."""

    queue_ms_mean: float | None = None
    server_latency_ms_mean: float | None = None
    preprocess_ms_per_batch: float | None = None
    inference_ms_per_batch: float | None = None
    postprocess_ms_per_batch: float | None = None
    mean_batch_size: float | None = None
    batches: float | None = None
    server_requests: float | None = None


class GpuFigures(ResultModel):
    """The server's GPU over the measured window (DCGM through Prometheus on a cluster; NVML locally)."""

    utilization_avg_percent: float | None = None
    utilization_max_percent: float | None = None
    memory_used_max_mib: float | None = Field(default=None, alias="memoryUsedMaxMiB")
    power_avg_watts: float | None = None
    energy_joules: float | None = None
    energy_per_inference_joules: float | None = None
