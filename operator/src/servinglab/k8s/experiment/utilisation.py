"""Where the load Job reads the server's utilisation for `spec.load.utilisationTarget`: the operator's choice
of Prometheus, resource and share's denominator (:class:`~servinglab.k8s.podutilisation.UtilisationSource`),
or why it cannot give one. Used by the experiment reconciler: when it admits the spec (:func:`problem`) and
when it creates the load Job (:func:`source`).
"""

from __future__ import annotations

import urllib.parse
from typing import Literal

from servinglab.api import ExperimentSpec
from servinglab.api.kube import quantity
from servinglab.k8s.experiment import pods
from servinglab.k8s.experiment.status import Experiment
from servinglab.k8s.podutilisation import UtilisationSource
from servinglab.k8s.settings import Settings
from servinglab.servers.base import Manifest

FIELD = "spec.load.utilisationTarget"


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
    if spec.metrics.prometheus_url is None:
        if settings.prometheus_url is None:
            return (f"{FIELD}: on Kubernetes the load Job reads the server's utilisation from Prometheus (DCGM's for "
                    "a GPU, the kubelet's cAdvisor for the CPU); name one in spec.metrics.prometheusUrl or the "
                    "chart's prometheusUrl")  # fmt: skip
        if settings.prometheus_authorization is not None or _has_credentials(settings.prometheus_url):
            return (f"{FIELD}: the operator's Prometheus needs credentials, and they never leave the operator; "
                    "name a Prometheus the load pods may query without them in spec.metrics.prometheusUrl")  # fmt: skip
    if resource_of(spec) == "gpu":
        if spec.server.gpus == 0:
            return f"{FIELD}.resource: gpu, and the server has none (spec.server.gpus: 0); use cpu or auto"
        if "/mig-" in settings.gpu_resource:
            return (f"{FIELD}: the server's GPU is a MIG slice ({settings.gpu_resource}), and DCGM's utilisation "
                    "is the whole GPU's; use resource: cpu")  # fmt: skip
    return None


def _has_credentials(url: str) -> bool:
    """Whether a URL carries what a load pod's arguments must not: a user, a password, a query or a fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return True
    return bool(parts.username or parts.password or parts.query or parts.fragment)


async def source(experiment: Experiment, spec: ExperimentSpec, container: str) -> UtilisationSource | str:
    """What the load Job reads for the server's `container` in the pods that serve, or why the operator could
    not tell (a message naming what to set)."""
    url = spec.metrics.prometheus_url or experiment.settings.prometheus_url
    assert url is not None  # problem() refused the spec otherwise
    status = experiment.status
    serving = status.server_pods or ([status.server_pod] if status.server_pod else [])
    if not serving:
        return f"{FIELD}: no server pod was recorded as serving, so there is nothing to read"
    cores = 1.0  # a GPU's share is DCGM's percentage: it needs none
    if resource_of(spec) == "cpu":
        listed = {p["metadata"]["name"]: p for p in await pods.listed(experiment, "server")}
        found = await _cores(experiment, listed.get(serving[0]), container)
        if isinstance(found, str):
            return found
        cores = found
    return UtilisationSource(
        url=url, resource=resource_of(spec), namespace=experiment.namespace, pods=serving, container=container,
        cores=cores, replicas=len(serving),
    )  # fmt: skip


async def _cores(experiment: Experiment, pod: Manifest | None, container: str) -> float | str:
    """The cores one server container may use: its CPU limit as the pod has it (a LimitRange's default
    included), else its node's allocatable CPU."""
    if pod is None:
        return f"{FIELD}: the serving pod is gone, so its CPU limit cannot be read"
    spec = pod.get("spec") or {}
    own: Manifest = next((c for c in spec.get("containers", []) if c.get("name") == container), {})
    limit = ((own.get("resources") or {}).get("limits") or {}).get("cpu")
    node = spec.get("nodeName")
    if limit is None and node and (found := await pods.node(experiment, node)) is not None:
        limit = (found.get("status", {}).get("allocatable") or {}).get("cpu")
    try:
        cores = float(quantity(str(limit))) if limit is not None else 0.0
    except ValueError:
        cores = 0.0
    if cores <= 0:
        return (f"{FIELD}: the server's CPU share needs the cores it may use, and its container has no CPU limit "
                f"(spec.server.resources.limits.cpu) and its node {node or '(none yet)'} states no allocatable "
                "CPU")  # fmt: skip
    return cores
