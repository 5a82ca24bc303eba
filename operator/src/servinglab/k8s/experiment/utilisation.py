"""Where the load Job reads the server's utilisation for `spec.load.utilisationTarget`: the operator's choice
of Prometheus, resource and share's denominator (:class:`~servinglab.k8s.podutilisation.UtilisationSource`),
or why it cannot give one. Used by the experiment reconciler: when it admits the spec (:func:`problem`) and
when it creates the load Job (:func:`source`).
"""

from __future__ import annotations

from typing import Literal

from servinglab.api import ExperimentSpec
from servinglab.api.kube import quantity
from servinglab.k8s.client import Ref
from servinglab.k8s.experiment import pods
from servinglab.k8s.experiment.status import Experiment
from servinglab.k8s.podutilisation import UtilisationSource, deployment_pods
from servinglab.k8s.settings import Settings


def resource_of(spec: ExperimentSpec) -> Literal["gpu", "cpu"]:
    """The resource a utilisation target reads: the one asked for; for `auto` the GPU where the server has one."""
    aim = spec.load.utilisation_target
    asked = aim.resource if aim is not None else "auto"
    if asked == "auto":
        return "gpu" if spec.server.gpus > 0 else "cpu"
    return asked


def problem(spec: ExperimentSpec, settings: Settings) -> str | None:
    """Why the load Job could not read this spec's utilisation target (None: it can, or there is none)."""
    if spec.load.utilisation_target is None:
        return None
    field = "spec.load.utilisationTarget"
    if spec.metrics.prometheus_url is None and settings.prometheus_url is None:
        return (f"{field}: on Kubernetes the load Job reads the server's utilisation from Prometheus (DCGM's for a "
                "GPU, the kubelet's cAdvisor for the CPU); name one in spec.metrics.prometheusUrl or the chart's "
                "prometheusUrl")  # fmt: skip
    if spec.metrics.prometheus_url is None and settings.prometheus_authorization is not None:
        return (f"{field}: the operator's Prometheus needs credentials, and they never leave the operator; name a "
                "Prometheus the load pods may query without them in spec.metrics.prometheusUrl")  # fmt: skip
    if resource_of(spec) == "gpu" and spec.server.gpus == 0:
        return f"{field}.resource: gpu, and the server has none (spec.server.gpus: 0); use cpu or auto"
    return None


async def source(experiment: Experiment, spec: ExperimentSpec, container: str) -> UtilisationSource | str:
    """What the load Job reads for the server's `container`, or why the operator could not tell (a message)."""
    url = spec.metrics.prometheus_url or experiment.settings.prometheus_url
    assert url is not None  # problem() refused the spec otherwise
    cores = await _cores(experiment, spec) if resource_of(spec) == "cpu" else 1.0  # a GPU's share needs none
    if isinstance(cores, str):
        return cores
    return UtilisationSource(
        url=url, resource=resource_of(spec), namespace=experiment.namespace,
        pods=deployment_pods(experiment.names.server), container=container, cores=cores,
        replicas=experiment.status.server_replicas or spec.server.replicas,
    )  # fmt: skip


async def _cores(experiment: Experiment, spec: ExperimentSpec) -> float | str:
    """The cores one server container may use: its CPU limit, else its node's allocatable CPU."""
    if (limit := spec.server.resources.limits.get("cpu")) is not None:
        return float(quantity(limit))
    serving = [
        p for p in await pods.listed(experiment, "server") if p["metadata"]["name"] == experiment.status.server_pod
    ]
    node = serving[0].get("spec", {}).get("nodeName") if serving else None
    found = await experiment.kube.list(Ref("v1", "Node", ""), field_selector=f"metadata.name={node}", cached=True) if (
        node) else []  # fmt: skip
    allocatable = (found[0].get("status", {}).get("allocatable") or {}).get("cpu") if found else None
    try:
        cores = float(quantity(str(allocatable))) if allocatable is not None else 0.0
    except ValueError:
        cores = 0.0
    if cores <= 0:
        return (
            f"spec.load.utilisationTarget: the server's CPU share needs its cores, and it has no CPU limit "
            f"(spec.server.resources.limits.cpu) and its node {node or '(none yet)'} states no allocatable CPU"
        )
    return cores
