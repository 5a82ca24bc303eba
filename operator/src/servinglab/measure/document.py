"""One experiment's typed results document, assembled the same way whichever wing measured it.

The local runner builds it from what it measured; `servinglab results` rebuilds it from a cluster
experiment's status (:mod:`servinglab.k8s.follow`), so the table and the report read the same fields
from both.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence

from servinglab import __version__
from servinglab.api import ExperimentSpec
from servinglab.api.ceiling import Ceiling, ModelDescription
from servinglab.api.cost import CostSpec, Price, cost_figures
from servinglab.api.results import (
    EffectiveSettings,
    ExperimentResults,
    LevelResult,
    LoadSummary,
    PeakRate,
    Producer,
    Runtime,
    ServerSettings,
    Slo,
)
from servinglab.api.utilisation import UtilisationSearch
from servinglab.measure.levels import best_level
from servinglab.measure.verdict import judged

#: Where a level's GPU figures come from, by where the experiment ran.
GPU_SOURCES = {"local": "NVML", "cluster": "DCGM"}


def server_settings(spec: ExperimentSpec, effective: EffectiveSettings | None = None) -> ServerSettings:
    server = spec.server
    return ServerSettings(
        kind=server.kind, batch_size=server.batch_size, max_batch_delay_ms=server.max_batch_delay_ms,
        workers=server.workers, precision=str(server.precision),
        data_path=server.data_path.describe() if server.data_path.label() else None, effective=effective,
    )  # fmt: skip


def load_summary(spec: ExperimentSpec) -> LoadSummary:
    load = spec.load
    return LoadSummary(
        mode=f"{load.mode}-loop", arrival=load.arrival if load.mode == "open" else None,
        warmup_seconds=load.warmup_seconds, duration_seconds=load.duration_seconds, payload=str(load.payload.format),
    )  # fmt: skip


def experiment_results(
    name: str,
    spec: ExperimentSpec,
    levels: Sequence[LevelResult],
    *,
    runtime: Runtime,
    effective: EffectiveSettings | None = None,
    cold_start_seconds: float | None = None,
    peak_rate: PeakRate | None = None,
    utilisation: UtilisationSearch | None = None,
    ceiling: Ceiling | None = None,
    model: ModelDescription | None = None,
    started_at: str | None = None,
    finished_at: str | None = None,
    price: Price | None = None,
) -> ExperimentResults:
    """The document of a finished experiment; its best level and each level's verdict are computed here,
    once (:func:`with_ceiling` judges them again when the ceiling is measured afterwards). `price`: the
    one the operator resolved (its status's); None: the spec's own `cost`."""
    slo = spec.slo.p99_latency_ms
    settings = server_settings(spec, effective)
    levels = judged(levels, settings, ceiling, GPU_SOURCES.get(runtime.mode))
    held = 0 if runtime.device == "cpu" else spec.server.gpus  # a local run without a GPU held none
    levels = priced(levels, price or spec.cost, held, runtime.server_replicas or spec.server.replicas)
    return ExperimentResults(
        experiment=name,
        model=spec.model.name,
        server=settings,
        load=load_summary(spec),
        slo=Slo(p99_latency_ms=slo) if slo is not None else None,
        cold_start_seconds=round(cold_start_seconds, 3) if cold_start_seconds is not None else None,
        warmup_seconds=runtime.warmup.seconds if runtime.warmup is not None else None,
        results=list(levels),
        best=best_level(levels, slo),
        peak_rate=peak_rate,
        utilisation=utilisation,
        ceiling=ceiling,
        runtime=runtime,
        model_info=model,
        started_at=started_at,
        finished_at=finished_at,
        generator=Producer(servinglab=__version__, python=platform.python_version()),
    )


def priced(
    levels: Sequence[LevelResult], price: CostSpec | Price | None, gpus: int, replicas: int = 1
) -> list[LevelResult]:
    """Each level with its cost figures at its measured throughput, answered by `replicas` replicas each
    holding `gpus` GPUs (the whole deployment is priced: price per replica x replicas)."""
    return [
        level.model_copy(update={"cost": cost_figures(
            price, level.throughput_rps, gpus, level.gpu.energy_per_inference_joules if level.gpu else None,
            replicas=replicas)})
        for level in levels
    ]  # fmt: skip


def with_ceiling(document: ExperimentResults, ceiling: Ceiling) -> ExperimentResults:
    """The document with its ceiling, and each level judged again (near the raw ceiling is a verdict)."""
    source = GPU_SOURCES.get(document.runtime.mode) if document.runtime is not None else None
    levels = judged(document.results, document.server, ceiling, source)
    return document.model_copy(update={"ceiling": ceiling, "results": levels})


def with_verdicts(document: ExperimentResults) -> ExperimentResults:
    """A document whose levels all carry a verdict: those written before verdicts existed are judged now."""
    if all(level.verdict is not None for level in document.results):
        return document
    source = GPU_SOURCES.get(document.runtime.mode) if document.runtime is not None else None
    fresh = judged(document.results, document.server, document.ceiling, source)
    levels = [level if level.verdict is not None else new for level, new in zip(document.results, fresh, strict=True)]
    return document.model_copy(update={"results": levels})
