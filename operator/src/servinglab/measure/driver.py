"""The one measurement driver: every level of an experiment's load against a running server, with the
server's own breakdown over each measured window, as typed levels.

`servinglab run`, `servinglab sweep` (both through the local runner) and the load Job
(:mod:`servinglab.k8s.loadjob`) all measure through :func:`measure_load`, so a level means the same
everywhere: warm-up excluded, exact percentiles from raw samples, throughput over the measured window,
the generator's saturation judged, the peak-rate search judged against the SLO defined in
:mod:`servinglab.measure.levels`. The caller must have imported Locust first (see
:mod:`servinglab.entry`), and must say where the load goes (:class:`~servinglab.loadgen.levels.Target`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal, Protocol

from servinglab.api import LoadSpec
from servinglab.api.figures import GpuFigures
from servinglab.api.results import LevelResult, PeakRate
from servinglab.api.utilisation import UtilisationSearch
from servinglab.api.verdicts import CpuFigures
from servinglab.loadgen import levels, wire
from servinglab.loadgen.hooks import LevelHooks, ProgressFn
from servinglab.loadgen.utilisation import Reading
from servinglab.measure.levels import latency_of, level_results, meets_slo, probe_passes, with_device
from servinglab.measure.windows import WindowReader
from servinglab.servers.base import ServerMetrics


class Telemetry(Protocol):
    """The server's devices over each measured window, by the level's index in the run: a local server's
    processes and GPUs (:class:`servinglab.measure.telemetry.LocalTelemetry`), or, in the load Job, its pods'
    utilisation from Prometheus (:class:`servinglab.k8s.podutilisation.PodUtilisation`)."""

    cpu: dict[int, CpuFigures]
    gpu: dict[int, GpuFigures]

    def resource(self, asked: str) -> Literal["gpu", "cpu"]: ...
    def utilisation(self, level: int, resource: Literal["gpu", "cpu"]) -> float | None: ...
    def window_start(self, level: int) -> None: ...
    def window_end(self, level: int) -> None: ...
    def tick(self) -> None: ...


@dataclass(frozen=True)
class ServerWindows:
    """How to read the server under test at a window's edges: its metrics text, and what it means; for a
    local server also its processes' CPU and its GPUs (`telemetry`)."""

    fetch: Callable[[], str]
    metrics: ServerMetrics
    telemetry: Telemetry | None = None


@dataclass(frozen=True)
class Measured:
    """Every measured level in run order (peak-search probes last) and the peak rate found, if searched; or
    the utilisation search's levels and its summary."""

    levels: list[LevelResult]
    peak_rate: PeakRate | None = None
    utilisation: UtilisationSearch | None = None

    @property
    def requests(self) -> int:
        return sum(level.requests for level in self.levels)

    @property
    def errors(self) -> int:
        return sum(level.errors for level in self.levels)


def measure_load(
    load: LoadSpec,
    slo_p99_ms: float | None,
    target: levels.Target,
    server: ServerWindows | None = None,
    progress: ProgressFn | None = None,
    remote: Sequence[wire.Channel] = (),
) -> Measured:
    """Run the load section (`remote`: the other load pods' generators, when several share it) and
    return its typed levels; without `server` the levels carry no server breakdown."""
    windows = WindowReader(server.fetch, server.metrics) if server is not None else None
    telemetry = server.telemetry if server is not None else None

    def started(index: int) -> None:
        if windows is not None:
            windows.window_start(index)
        if telemetry is not None:
            telemetry.window_start(index)

    def ended(index: int) -> None:
        if telemetry is not None:
            telemetry.window_end(index)
        if windows is not None:
            windows.window_end(index)

    def ticked(label: str, phase: str, done: float, planned: float, measured: int) -> None:
        if telemetry is not None:
            telemetry.tick()
        if progress is not None:
            progress(label, phase, done, planned, measured)

    hooks = LevelHooks(ticked, started, ended)
    passes = partial(probe_passes, slo_p99_ms=slo_p99_ms) if slo_p99_ms is not None else None
    reading = None
    if load.utilisation_target is not None and telemetry is not None:
        reading = Reading(
            resource := telemetry.resource(load.utilisation_target.resource),
            partial(telemetry.utilisation, resource=resource),
            lambda stats: meets_slo(latency_of(stats), stats.errors, stats.requests, slo_p99_ms),
        )
    outcome = levels.run_load(load, passes, target, hooks, remote, reading)
    breakdowns = windows.breakdowns if windows is not None else {}
    results = level_results(outcome.levels, outcome.sweep_levels, breakdowns, slo_p99_ms)
    if telemetry is not None:
        results = [
            with_device(level, telemetry.cpu.get(index), telemetry.gpu.get(index))
            for index, level in enumerate(results)
        ]  # fmt: skip
    return Measured(results, outcome.peak, outcome.utilisation)
