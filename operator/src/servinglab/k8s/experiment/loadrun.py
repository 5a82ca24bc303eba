"""The load step: the load Job created once for a ready server, then watched with the server until it completes
(its results collected: :mod:`.collect`) or something ends the experiment (the Job failed, the server crashed,
was replaced or lost, the load pods never started). Called by the reconcile pass (:mod:`.reconcile`) once
ServerReady is true."""

from __future__ import annotations

from servinglab.api import ExperimentSpec
from servinglab.api import conditions as cond
from servinglab.api.reasons import Reason
from servinglab.api.states import ExperimentState
from servinglab.api.status import ExperimentSummary
from servinglab.k8s import builders, loadbuilders
from servinglab.k8s.experiment import diagnose, pods, utilisation
from servinglab.k8s.experiment.children import apply_child
from servinglab.k8s.experiment.collect import collect, job_message
from servinglab.k8s.experiment.status import Experiment
from servinglab.servers.base import Manifest, PodPlan


def job_conditions(job: Manifest) -> dict[str, Manifest]:
    """The Job's conditions that hold (Complete, Failed, ...), by type."""
    return {c["type"]: c for c in job.get("status", {}).get("conditions", []) if c.get("status") == "True"}


def job_finished(job: Manifest) -> bool:
    """Complete or Failed: nothing runs in it any more."""
    return bool(job_conditions(job).keys() & {"Complete", "Failed"})


async def run_load(experiment: Experiment, spec: ExperimentSpec, plan: PodPlan) -> bool:
    """Create the load Job once (with the utilisation reading it needs), then watch it and the server: collect
    the results when it completes, or end the experiment with the reason; True when the experiment ended."""
    kube = experiment.kube
    job_ref = experiment.child("batch/v1", "Job", experiment.names.load)
    server_pods = await pods.listed(experiment, "server")
    if (failure := await pods.server_failure(experiment, server_pods, None)) is not None:
        await experiment.fail(failure[0], f"during the load test: {failure[1]}")
        return True
    serving = experiment.status.server_pods or ([experiment.status.server_pod] if experiment.status.server_pod else [])
    if serving and (replaced := diagnose.replaced_server(server_pods, serving)) is not None:
        await experiment.fail(Reason.SERVER_RESTARTED, replaced)
        return True
    job = await kube.get(job_ref)
    if job is not None and not builders.owned_by(job, experiment.uid):
        return False  # a predecessor's Job, still being garbage-collected: never read it as ours
    if job is None:
        model = experiment.status.model
        flops = model.flops_per_inference if model is not None else None
        image, key_secret = experiment.settings.servinglab_image, experiment.status.generator_key_secret
        resources = experiment.settings.load_resources
        reading = await utilisation.source(experiment, spec, plan.containers[0]["name"]) if (
            spec.load.utilisation_target) else None  # fmt: skip
        if isinstance(reading, str):
            await experiment.fail(Reason.INVALID_SPEC, reading)
            return True
        job = loadbuilders.load_job(experiment.owner, spec, plan, image, flops, key_secret, resources,
                                    reading.arg() if reading is not None else None)  # fmt: skip
        await apply_child(experiment, job)
        await experiment.set(
            cond.LOAD_TEST_COMPLETE, False, Reason.RUNNING,
            f"load ({spec.load.describe()}) running in Job {experiment.names.load}",
            summary=ExperimentSummary(state=ExperimentState.RUNNING),
        )  # fmt: skip
        await experiment.event("Normal", "LoadTestStarted", f"Job {experiment.names.load} started")
        return False
    holding = job_conditions(job)
    if "Failed" in holding:
        message = await job_message(experiment) or holding["Failed"].get("message", "")
        await experiment.fail(Reason.LOAD_JOB_FAILED, f"Job {experiment.names.load} failed: {message}")
        return True
    if "Complete" in holding:
        await collect(experiment, spec)
        return True
    if (crash := diagnose.crash_reason(server_pods)) is not None:
        await experiment.fail(Reason.SERVER_CRASHED, f"during the load test: {crash}")
        return True
    if (failure := await pods.load_failure(experiment, spec, job)) is not None:
        await experiment.fail(*failure)
        return True
    return False
