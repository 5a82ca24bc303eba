"""A finished load Job's results into the experiment's status: its typed document read from the results
ConfigMap (and its parts), the GPU figures of each measured window from Prometheus, and one status write,
so a finished result lands whole or not at all. Used by the experiment reconciler once the Job is Complete.
"""

from __future__ import annotations

import asyncio

from servinglab.api import ExperimentSpec
from servinglab.api import conditions as cond
from servinglab.api.cost import Price
from servinglab.api.figures import GpuFigures
from servinglab.api.reasons import Reason
from servinglab.api.results import LevelResult, LoadJobResults
from servinglab.api.states import ExperimentState
from servinglab.k8s import builders, pricing, promql
from servinglab.k8s import metrics as opmetrics
from servinglab.k8s.experiment import pods
from servinglab.k8s.experiment.status import Experiment, summary_of
from servinglab.k8s.promql import PrometheusError
from servinglab.k8s.sink import Reader, ResultsMissing, ResultsUnreadable
from servinglab.measure.document import GPU_SOURCES, priced, server_settings
from servinglab.measure.levels import with_device
from servinglab.measure.verdict import judged


async def job_message(experiment: Experiment) -> str | None:
    """The load pod's termination: its exit code and message (what the Job's program said at its end)."""
    pods = await experiment.kube.list(
        experiment.child("v1", "Pod", ""), label_selector=builders.pod_selector(experiment.owner, "load")
    )
    for pod in pods:
        for container in pod.get("status", {}).get("containerStatuses", []):
            terminated = container.get("state", {}).get("terminated") or {}
            if terminated:
                return (
                    f"exit code {terminated.get('exitCode')}: {terminated.get('message') or terminated.get('reason')}"
                )
    return None


# One results document is read at a time: each is bounded (see sink.Reader), and so is their sum.
_RESULTS_READ = asyncio.Lock()


async def read_results(experiment: Experiment) -> LoadJobResults:
    """The load Job's results document, whole and this experiment's own, without what the status never
    shows (windows, latency CDF, phases: those stay in the ConfigMap); ResultsMissing if it is not there,
    ResultsUnreadable if it is malformed or larger than the operator reads."""
    results_ref = experiment.child("v1", "ConfigMap", experiment.names.results)
    async with _RESULTS_READ:
        reader = Reader(await experiment.owned(results_ref))
        for index, name in enumerate(reader.part_names, start=1):  # never more than MAX_PARTS
            reader.add_part(index, await experiment.owned(experiment.child("v1", "ConfigMap", name)))
        results = reader.results()
    if results.experiment_uid not in (None, experiment.uid):
        raise ResultsMissing(f"{results_ref} holds the results of another experiment of this name")
    return results.model_copy(update={"results": [level.compact() for level in results.results]})


async def collect(experiment: Experiment, spec: ExperimentSpec) -> None:
    """Results to status, once. Unreadable results end the experiment as Failed, so that no later pass
    and no restarted operator reads them again."""
    try:
        document = await read_results(experiment)
    except ResultsMissing as exc:
        await experiment.fail(
            Reason.RESULTS_MISSING,
            f"the load Job finished without readable results ({exc}); Job {experiment.names.load} and its log are kept",
        )
        return
    except ResultsUnreadable as exc:
        await experiment.fail(
            Reason.RESULTS_UNREADABLE,
            f"the load Job's results were not read: {exc}; Job {experiment.names.load} and its log are kept",
        )
        return
    gpu, gpu_condition = await gpu_figures(experiment, spec, document.results)
    slo = spec.slo.p99_latency_ms
    measured = [with_device(level, None, gpu.get(index)) for index, level in enumerate(document.results)]
    # each level's verdict, with its GPU figures; the status keeps its compact form
    judged_levels = judged(measured, server_settings(spec), document.ceiling, GPU_SOURCES["cluster"])
    price = await price_of(experiment, spec)
    replicas = experiment.status.server_replicas or spec.server.replicas
    levels = [level.compact() for level in priced(judged_levels, price, spec.server.gpus, replicas)]
    generation = experiment.generation
    conditions = cond.set_condition(experiment.conditions, cond.GPU_METRICS, *gpu_condition, generation)
    conditions = cond.set_condition(conditions, cond.LOAD_TEST_COMPLETE, True, Reason.COMPLETE,
                                    f"{len(levels)} levels measured", generation)  # fmt: skip
    conditions = cond.set_condition(conditions, cond.SUCCEEDED, True, Reason.MEASURED,
                                    "results are in status.results", generation)  # fmt: skip
    conditions = cond.set_condition(conditions, cond.FAILED, False, Reason.MEASURED, "", generation)
    # Cold start ends when the server first answers a prediction (its health check can pass while
    # workers are still loading the model), as seen by the load Job.
    cold_start = experiment.status.cold_start_seconds
    if document.server_answered_at and experiment.status.started_at:
        cold_start = round(document.server_answered_at - cond.epoch(experiment.status.started_at), 3)
    # One write: the finished result lands whole, or not at all.
    await experiment.patch(
        cold_start_seconds=cold_start,
        conditions=conditions,
        results=levels,
        summary=summary_of(levels, slo, ExperimentState.SUCCEEDED, document.peak_rate),
        peak_rate=document.peak_rate,
        utilisation=document.utilisation,
        ceiling=document.ceiling,
        effective=document.effective,
        price=price,
        finished_at=cond.now(),
        observed_generation=generation,
    )
    await experiment.event("Normal", "Succeeded", f"{len(levels)} levels measured")
    opmetrics.finished(experiment.namespace, experiment.name, ExperimentState.SUCCEEDED, spec, levels)


async def price_of(experiment: Experiment, spec: ExperimentSpec) -> Price | None:
    """The price the levels are at: the spec's, else the chart's for the node the server pod ran on (its GPU
    product, or its name); None if neither has one."""
    chart = experiment.settings.pricing
    node: str | None = None
    labels: dict[str, str] = {}
    if spec.cost is None and chart.priced():
        serving = [
            p for p in await pods.listed(experiment, "server") if p["metadata"]["name"] == experiment.status.server_pod
        ]
        node = serving[0].get("spec", {}).get("nodeName") if serving else None
        if node and (found := await pods.node(experiment, node)) is not None:
            labels = found["metadata"].get("labels") or {}
    return pricing.resolve(spec.cost, chart, node, labels, spec.server.gpus, experiment.settings.gpu_resource)


async def gpu_figures(
    experiment: Experiment, spec: ExperimentSpec, levels: list[LevelResult]
) -> tuple[dict[int, GpuFigures], tuple[bool, Reason, str]]:
    """Each level's GPU figures over its measured window, and the GPUMetricsAvailable condition's value."""
    settings = experiment.settings
    reader = promql.reader(spec.metrics.prometheus_url, settings.prometheus_url, settings.prometheus_authorization)
    if reader is None:
        return {}, (False, Reason.NOT_CONFIGURED, "no Prometheus URL in spec.metrics or the operator settings")
    pod = experiment.status.server_pod or ""
    # DCGM's figures are one pod's: with several replicas its energy is not the energy of the requests all of
    # them answered, so no energy per inference (0 answered leaves it out), and the condition says so
    replicas = experiment.status.server_replicas or 1
    figures: dict[int, GpuFigures] = {}
    try:
        for index, level in enumerate(levels):
            if level.window_start is None or level.window_end is None:
                continue
            answered = level.requests - level.errors if replicas == 1 else 0
            figures[index] = GpuFigures.model_validate(
                await reader.window(experiment.namespace, pod, level.window_start, level.window_end, answered)
            )
    except PrometheusError as exc:
        # promql's reasons are spelled as text: any it may add later is a query that failed
        return {}, (False, Reason.named(exc.reason) or Reason.PROMETHEUS_QUERY_FAILED, str(exc))
    except ValueError as exc:  # figures GpuFigures refuses: the results stay, the GPU figures go
        figure = str(exc).splitlines()[0]
        return {}, (False, Reason.PROMETHEUS_QUERY_FAILED, f"{reader.shown}: unusable GPU figures ({figure})")
    if not any(value is not None for level in figures.values() for value in dict(level).values()):
        return figures, (False, Reason.NO_DATA, f"Prometheus at {reader.shown} has no DCGM metrics for pod {pod}")
    one_of = f" (one of {replicas} replicas; no energy per inference)" if replicas > 1 else ""
    return figures, (True, Reason.MEASURED, f"DCGM metrics of pod {pod}{one_of} from {reader.shown}")
