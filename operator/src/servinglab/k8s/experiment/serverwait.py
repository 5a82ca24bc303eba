"""The step between deploying and loading: wait until every server replica serves, recording the cold start,
or end the experiment with the reason it never will (a model that cannot load, a crash, unschedulable, not ready
in time). Called by the reconcile pass (:mod:`.reconcile`) while ServerReady is not true."""

from __future__ import annotations

import time

from servinglab import servers
from servinglab.api import ExperimentSpec
from servinglab.api import conditions as cond
from servinglab.api.reasons import Reason
from servinglab.api.states import ExperimentState
from servinglab.api.status import ExperimentSummary
from servinglab.k8s.experiment import diagnose, pods
from servinglab.k8s.experiment.status import Experiment

#: Why a compiled model's server takes longer to start, said when it did not start in time.
COMPILING = "; a compiled model's workers compile a graph per batch size before they serve"


def seconds_since(since: str | None) -> float:
    """Seconds since the status timestamp `since` (0 when unset)."""
    return time.time() - cond.epoch(since) if since else 0.0


async def await_server(experiment: Experiment, spec: ExperimentSpec) -> bool:
    """Record the server ready (cold start, pods, model, form) once every replica serves, or end the experiment
    with the reason it never will; True when the experiment ended."""
    kube = experiment.kube
    server = servers.get(spec.server.kind)
    kind = server.name
    deployment = await kube.get(experiment.child("apps/v1", "Deployment", experiment.names.server))
    server_pods = await pods.listed(experiment, "server")
    elapsed = seconds_since(experiment.status.started_at)
    wanted = spec.server.replicas
    if ((deployment or {}).get("status", {}).get("availableReplicas") or 0) >= wanted:
        # the load starts once every replica serves; the first by name stands for them where one pod is read
        # (a replacement not yet Ready is not one of them: at most `wanted` Ready pods are counted)
        running = [p for p in server_pods if diagnose.pod_ready(p) and not p["metadata"].get("deletionTimestamp")]
        ready = sorted(running, key=lambda p: str(p["metadata"]["name"]))[:wanted]
        names = [p["metadata"]["name"] for p in ready]
        pod_name = names[0] if names else ""
        model = diagnose.model_description(ready[0]) if ready else None
        form = diagnose.form_run(ready[0]) if ready else None
        where = f"pod {pod_name}" if wanted == 1 else f"{len(names)} pods ({', '.join(names)})"
        await experiment.set(
            cond.SERVER_READY, True, Reason.AVAILABLE, f"{kind} is ready in {where}",
            cold_start_seconds=round(elapsed, 3), server_ready_at=cond.now(), server_pod=pod_name,
            server_pods=names, server_replicas=len(names),
            summary=ExperimentSummary(state=ExperimentState.READY), **({"model": model} if model else {}),
            **({"form": form} if form else {}),
        )  # fmt: skip
        await experiment.event("Normal", "ServerReady", f"{kind} ready after {elapsed:.1f} s")
        return False
    failure = (
        diagnose.model_init_failure(server_pods)
        or diagnose.server_start_failure(server_pods, server)
        or await pods.server_failure(experiment, server_pods, deployment)
    )
    if failure is not None:
        await experiment.fail(*failure)
        return True
    if (crash := diagnose.crash_reason(server_pods)) is not None:
        await experiment.fail(Reason.SERVER_CRASHED, crash)
        return True
    unschedulable = diagnose.unschedulable_reason(server_pods)
    # Admitted means some node can hold it: a GPU still held by a finishing server is a wait, not a failure.
    waiting_for_gpu = unschedulable is not None and f"Insufficient {experiment.settings.gpu_resource}" in unschedulable
    if unschedulable is not None and not waiting_for_gpu and elapsed > experiment.settings.unschedulable_grace_seconds:
        await experiment.fail(Reason.UNSCHEDULABLE, f"the scheduler cannot place the server: {unschedulable}")
        return True
    if elapsed > spec.server.startup_timeout_seconds:
        await experiment.fail(
            Reason.SERVER_NOT_READY,
            f"{kind} was not ready within {spec.server.startup_timeout_seconds} s "
            f"(server.startupTimeoutSeconds{COMPILING if spec.server.compile_mode() != 'none' else ''})",
        )
        return True
    return False
