"""The GPU queue on the cluster: whether an experiment may deploy its server now, and if not, where it
stands (the decision itself is pure: :mod:`.gpuqueue`; this gathers the nodes, the experiments and the
server pods it reads). One operator process admits one experiment at a time, so two passes never take
the same free GPU. Used by the experiment reconciler before anything is deployed.
"""

from __future__ import annotations

import asyncio
import time

from servinglab.api import API_GROUP, API_VERSION, EXPERIMENT_LABEL, KIND, ExperimentSpec
from servinglab.api import conditions as cond
from servinglab.api.status import ExperimentStatus, ExperimentSummary
from servinglab.k8s.client import Ref
from servinglab.k8s.experiment import gpuqueue
from servinglab.k8s.experiment.status import Experiment

_ADMISSION = asyncio.Lock()


async def admitted(experiment: Experiment, spec: ExperimentSpec) -> bool:
    """Whether the experiment may deploy its server now (see :mod:`.gpuqueue`); while it may not, a Queued
    condition says why and where it stands. Fails it if no node could ever host it."""
    async with _ADMISSION:
        kube = experiment.kube
        server = spec.server
        offers = gpuqueue.offers(await kube.list(Ref("v1", "Node", "")), server)
        siblings = await kube.list(experiment.child(f"{API_GROUP}/{API_VERSION}", KIND, ""))
        pods = await kube.list(experiment.child("v1", "Pod", ""), label_selector="app.kubernetes.io/component=server")
        serving = {
            p["metadata"].get("labels", {}).get(EXPERIMENT_LABEL)
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        }
        in_use, queue = 0, []
        for other in siblings:
            status, name = ExperimentStatus.model_validate(other.get("status") or {}), other["metadata"]["name"]
            gpus = int(((other.get("spec") or {}).get("server") or {}).get("gpus", 1))
            finished = cond.finished(status.conditions)
            if status.started_at is not None and (not finished or name in serving):
                in_use += gpus
            elif status.started_at is None and not finished and gpus > 0:
                queue.append((other["metadata"].get("creationTimestamp", ""), name))
        queue.sort()
        names = [name for _, name in queue]
        position = names.index(experiment.name) + 1 if experiment.name in names else len(names) + 1
        decision = gpuqueue.decide(server.gpus, offers, in_use, position)
        if decision.never is not None:
            await experiment.fail("Unschedulable", decision.never)
            return False
        if decision.admit:
            queued_at = experiment.status.queued_at
            if queued_at is not None:
                waited = round(time.time() - cond.epoch(queued_at), 3)
                await experiment.set(cond.QUEUED, False, "Admitted", "a GPU is free", queued_seconds=waited)
            return True
        assert decision.waiting is not None
        first = experiment.status.queued_at is None
        current = cond.get(experiment.conditions, cond.QUEUED)
        if first or current is None or current.message != decision.waiting:
            since = {"queued_at": cond.now()} if first else {}
            await experiment.set(
                cond.QUEUED, True, "WaitingForGPU", decision.waiting, summary=ExperimentSummary(state="Queued"),
                **since,
            )  # fmt: skip
        if first:
            await experiment.event("Normal", "Queued", decision.waiting)
        return False
