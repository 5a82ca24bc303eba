"""Pods that never start and servers that go away, read from the cluster on each pass while an experiment
waits for its server or runs its load: the reads (server and load pods, their nodes, the payload), and the
failure they show, if any (the reading itself is :mod:`.diagnose`'s, pure). Each failure ends the
experiment in about a minute instead of at a timeout, and the cleanup then frees its GPU.

Used by the experiment reconciler.
"""

from __future__ import annotations

import time

from servinglab.api import ExperimentSpec
from servinglab.api.conditions import epoch
from servinglab.api.reasons import Reason
from servinglab.k8s import builders
from servinglab.k8s.client import Ref
from servinglab.k8s.experiment import diagnose
from servinglab.k8s.experiment.diagnose import Failure
from servinglab.k8s.experiment.status import Experiment
from servinglab.servers.base import Manifest


async def listed(experiment: Experiment, component: str) -> list[Manifest]:
    """This incarnation's pods of `component` ("server", "load")."""
    selector = builders.pod_selector(experiment.owner, component)
    return await experiment.kube.list(experiment.child("v1", "Pod", ""), label_selector=selector)


async def node(experiment: Experiment, name: str) -> Manifest | None:
    """The node called `name`, or None if it does not exist (from the watch cache: one node by name, not every
    node of a large cluster). Also read for a node's allocatable CPU (:mod:`.utilisation`) and its price
    (:mod:`.collect`)."""
    items = await experiment.kube.list(Ref("v1", "Node", ""), field_selector=f"metadata.name={name}", cached=True)
    return items[0] if items else None


async def _nodes(experiment: Experiment, pods: list[Manifest]) -> dict[str, Manifest | None]:
    """The nodes the pods are bound to, by name; None for one that does not exist."""
    return {name: await node(experiment, name) for name in diagnose.nodes_of(pods)}


async def server_failure(experiment: Experiment, pods: list[Manifest], deployment: Manifest | None) -> Failure | None:
    """Why the server will not serve, that no wait can change: its pods refused, evicted, killed for memory,
    unable to start, or their node gone. None while it may still come up (or while it serves)."""
    grace, now = experiment.settings.start_grace_seconds, time.time()
    if deployment is not None and (refused := diagnose.refused_pods(deployment, grace, now)) is not None:
        return Reason.REJECTED, refused
    found = diagnose.evicted(pods) or diagnose.out_of_memory(pods) or diagnose.start_failure(pods, "server", grace, now)
    if found is not None:
        return found
    return diagnose.lost_node(pods, await _nodes(experiment, pods), experiment.settings.node_grace_seconds, now)


async def payload_problem(experiment: Experiment, spec: ExperimentSpec) -> str | None:
    """What the load pods' payload ConfigMap lacks: the ConfigMap, or a file the spec names in it. (A
    payload claim is the scheduler's to find missing: see :func:`load_failure`.)"""
    payload = spec.load.payload
    if payload.config_map is None:
        return None
    stored = await experiment.kube.get(experiment.child("v1", "ConfigMap", payload.config_map))
    if stored is None:
        return f"the payload ConfigMap {payload.config_map} does not exist in namespace {experiment.namespace}"
    keys = {*(stored.get("data") or {}), *(stored.get("binaryData") or {})}
    wanted = [*payload.files, *([payload.records] if payload.records else [])]
    if spec.load.shape is not None and spec.load.shape.trace is not None:
        wanted.append(spec.load.shape.trace.file)
    if missing := [name for name in wanted if name not in keys]:
        return f"the payload ConfigMap {payload.config_map} has no key {', '.join(missing)}"
    return None


async def load_failure(experiment: Experiment, spec: ExperimentSpec, job: Manifest) -> Failure | None:
    """Why the load Job's pods will not run: never created (refused by a quota or an admission policy),
    their image or a Secret missing, their payload missing, or no node for them. Read only while some pod
    of the Job is not ready (a running Job costs no reads)."""
    wanted = int(job.get("spec", {}).get("parallelism") or 1)
    if int(job.get("status", {}).get("ready") or 0) >= wanted:
        return None
    pods = await listed(experiment, "load")
    now, grace = time.time(), experiment.settings.start_grace_seconds
    name = job["metadata"]["name"]
    if not pods:
        created = job["metadata"].get("creationTimestamp")
        if created and now - epoch(created) > grace:
            return Reason.REJECTED, (
                f"Job {name} has created no pod in {grace:g} s: the API refuses its pods (a ResourceQuota, an "
                f"admission policy); `kubectl describe job {name}` shows the refusal"
            )
        return None
    if (missing := diagnose.payload_missing(pods, spec)) is not None:
        return Reason.PAYLOAD_MISSING, missing
    if (found := diagnose.start_failure(pods, "load", grace, now)) is not None:
        return found
    if (pod := diagnose.stuck(pods, grace, now)) is not None and (problem := await payload_problem(experiment, spec)):
        return Reason.PAYLOAD_MISSING, f"load pod {pod} cannot start: {problem}"
    if (unschedulable := diagnose.unschedulable_reason(pods)) is not None and diagnose.stuck(pods, grace, now):
        return Reason.UNSCHEDULABLE, f"the scheduler cannot place the load pods: {unschedulable}"
    return None
