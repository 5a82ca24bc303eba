"""The experiment reconciler: one idempotent pass that moves a ServingExperiment one step towards its result.

A pass reads the current state from the API and moves it on:

  admitted (GPU queue) -> children deployed (server-side apply; once per daemon run) -> server ready (cold
  start recorded) -> load Job created -> Job Complete: results collected, status written once -> finished
  -> cleanup (no running Job; per spec.cleanup no server) retried on every pass until done ->
  `cleanedUpAt` (never touched again).

Failures end the experiment with a Failed condition naming the cause: invalid spec (no children are
created), credentials not allowed, a child the API refuses (Rejected, with the API's message: retrying
cannot help), unschedulable server (the scheduler's own message), a model that cannot be put in place or
loaded, pods that never start (:mod:`.pods`), server not ready in time, server lost, evicted, out of
memory, crashed or replaced during the load, load Job failed (its termination message), results missing;
and passes that keep failing for another reason (:func:`give_up`). A restarted operator resumes from what the API holds:
the same children, at most one Job, nothing lost. Children are recognised by their owner's uid, never by
name alone, so a deleted and re-applied experiment never reads its predecessor's pods, Job or results.

The server's kind (:func:`servinglab.servers.get`) gives the pod; nothing here knows a server.

Upgrades mid-run: a started experiment runs on the spec it was validated with (:mod:`.snapshot`), and its
server is never re-applied once ready, so a new CRD or a new operator changes nothing under it.
"""

from __future__ import annotations

from dataclasses import dataclass

from servinglab import servers
from servinglab.api import KIND, ExperimentSpec, SpecError, parse_experiment
from servinglab.api import conditions as cond
from servinglab.api.reasons import Reason
from servinglab.api.states import ExperimentState
from servinglab.api.status import ExperimentSummary, ResultsRef
from servinglab.k8s import builders, credentials, loadbuilders, modelsecrets
from servinglab.k8s.client import Conflict, Forbidden, Kube, Ref
from servinglab.k8s.experiment import diagnose, pods, snapshot, utilisation
from servinglab.k8s.experiment.admission import GpuQueue, admitted
from servinglab.k8s.experiment.children import Refused, apply_child
from servinglab.k8s.experiment.loadrun import job_finished, run_load
from servinglab.k8s.experiment.serverwait import await_server, seconds_since
from servinglab.k8s.experiment.status import Experiment
from servinglab.k8s.settings import Settings
from servinglab.k8s.sink import RESULTS_KEY
from servinglab.loadgen import wire
from servinglab.servers.base import Manifest, PodInputs, PodPlan


async def reconcile(
    kube: Kube,
    body: Manifest,
    settings: Settings,
    queue: GpuQueue,
    deploy: bool = True,
    pinned: snapshot.Pinned | None = None,
) -> bool | None:
    """Move the experiment one step; True once it has finished (Succeeded or Failed), None while it
    waits in the GPU queue (nothing deployed yet), else False.

    `deploy` applies the children (idempotent) until the server is ready; the daemon asks for it on its
    first pass only — at creation, and again after an operator restart — not on every poll of a running
    experiment. `pinned` keeps a started experiment's snapshot between the passes of one daemon run.
    """
    experiment = Experiment(kube, body, settings)
    if not cond.finished(experiment.conditions):
        try:
            outcome = await _advance(experiment, body, queue, deploy, pinned or snapshot.Pinned())
        except Refused as exc:
            await experiment.fail(Reason.REJECTED, f"the API server refused it: {exc}")
            outcome = True
        if outcome is not True:
            return outcome
    await _clean_up(experiment)
    return True


async def give_up(kube: Kube, body: Manifest, settings: Settings, why: str) -> None:
    """After its passes kept failing for `settings.failing_seconds`: end the experiment as Failed with the
    error (unless it has finished already) and remove its server (per spec.cleanup), as for any failure.
    Raises if the API refuses that too: the daemon tries again on its next pass."""
    experiment = Experiment(kube, body, settings)
    if not cond.finished(experiment.conditions):
        await experiment.fail(Reason.RECONCILE_FAILED, why)
    await _clean_up(experiment)


def _plan(experiment: Experiment, spec: ExperimentSpec) -> PodPlan:
    inputs = PodInputs(
        config_map=experiment.names.config,
        servinglab_image=experiment.settings.servinglab_image,
        model_cache_claim=experiment.settings.model_cache_claim,
        experiment_file=builders.EXPERIMENT_FILE,
        gpu_resource=experiment.settings.gpu_resource,
        model_url_secret=experiment.status.model_url_secret,
        model_cache_key_secret=modelsecrets.MODEL_CACHE_KEY_SECRET if experiment.settings.model_cache_claim else None,
    )
    return servers.get(spec.server.kind).pod(spec, inputs)


async def _spec(experiment: Experiment, body: Manifest, pinned: snapshot.Pinned) -> ExperimentSpec | None:
    """The spec this pass runs on; None once the experiment has failed for it. A started experiment runs on
    its snapshot (:mod:`.snapshot`), never re-validated from the live spec, so that an upgrade mid-run
    cannot fail it; before the start, the live spec is validated and checked against what Kubernetes and
    the operator's settings allow."""
    if experiment.status.started_at is not None:
        try:
            if (started := await snapshot.read(experiment, pinned)) is not None:
                return started
        except SpecError as exc:
            await experiment.fail(Reason.INVALID_SPEC, "the spec it started with: " + "; ".join(exc.problems))
            return None
    try:
        document = {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "metadata": {"name": experiment.name, "namespace": experiment.namespace},
            "spec": body.get("spec"),
        }
        spec = parse_experiment(document).spec
    except SpecError as exc:
        await experiment.fail(Reason.INVALID_SPEC, "; ".join(exc.problems))
        return None
    if problems := diagnose.cluster_problems(spec):
        await experiment.fail(Reason.INVALID_SPEC, "; ".join(problems))
        return None
    if (problem := utilisation.problem(spec, experiment.settings)) is not None:
        await experiment.fail(Reason.INVALID_SPEC, problem)
        return None
    if problems := credentials.problems(spec, experiment.namespace, experiment.settings.model_credentials):
        await experiment.fail(Reason.CREDENTIALS_NOT_ALLOWED, "; ".join(problems))
        return None
    return spec


async def _advance(
    experiment: Experiment, body: Manifest, queue: GpuQueue, deploy: bool, pinned: snapshot.Pinned
) -> bool | None:
    if (spec := await _spec(experiment, body, pinned)) is None:
        return True
    status = experiment.status
    if status.started_at is None and spec.server.gpus > 0 and not await admitted(experiment, queue):
        return True if cond.finished(experiment.conditions) else None
    if experiment.status.started_at is None and (missing := await pods.payload_problem(experiment, spec)):
        # before anything is deployed: a payload applied with the experiment gets a moment to arrive
        created = (body.get("metadata") or {}).get("creationTimestamp")
        if created is None or seconds_since(created) > experiment.settings.start_grace_seconds:
            await experiment.fail(Reason.PAYLOAD_MISSING, missing)
            return True
        return None
    if experiment.status.started_at is None:
        await experiment.set(
            cond.SERVER_READY, None, Reason.DEPLOYING, f"{servers.get(spec.server.kind).name} is being deployed",
            started_at=cond.now(), summary=ExperimentSummary(state=ExperimentState.DEPLOYING),
            results_ref=ResultsRef(name=experiment.names.results, key=RESULTS_KEY),
        )  # fmt: skip
        await experiment.event(
            "Normal", "Deploying", f"Deploying {servers.get(spec.server.kind).name} for {spec.model.name}"
        )

    plan = _plan(experiment, spec)
    # Never once the server is ready: an operator upgraded mid-run (another servinglab image, another
    # cache claim) would change the pod template and so replace the server under test.
    if deploy and not cond.is_true(experiment.conditions, cond.SERVER_READY):
        deployed = await _deploy(experiment, spec, plan)
        if deployed is not True:
            return deployed
    if not cond.is_true(experiment.conditions, cond.SERVER_READY):
        return await await_server(experiment, spec)
    return await run_load(experiment, spec, plan)


@dataclass(frozen=True)
class Obstacle:
    """An object that stands where a child is to be applied and is not this experiment's."""

    message: str
    conflict: bool  # True: foreign, never ours to remove; False: a predecessor's, being garbage-collected


async def _predecessor(experiment: Experiment, ref: Ref) -> Obstacle | None:
    """What stands in the way of a child: an object of its name that this incarnation of the experiment
    does not own. One owned by an experiment that is gone (deleted, then re-applied under the same name)
    is the garbage collector's to remove: wait for it. Anything else is a conflict: the operator never
    deletes what it did not create."""
    existing = await experiment.kube.get(ref)
    if existing is None or builders.owned_by(existing, experiment.uid):
        return None
    owners = existing["metadata"].get("ownerReferences") or []
    if any(owner.get("kind") == KIND and owner.get("name") == experiment.name for owner in owners):
        return Obstacle(f"{ref} of a previous experiment named {experiment.name} is still being deleted", False)
    return Obstacle(f"{ref} exists and does not belong to this experiment; delete or rename it", True)


def _children(experiment: Experiment, spec: ExperimentSpec, plan: PodPlan) -> tuple[Manifest, ...]:
    """The experiment's children but the Job and its Secrets, in the order they are applied (pure)."""
    owner = experiment.owner
    return (
        builders.config_map(owner, plan, snapshot.document(experiment.name, spec)),
        builders.results_config_map(owner),
        loadbuilders.load_service_account(owner),
        loadbuilders.load_role(owner),
        loadbuilders.load_role_binding(owner),
        builders.service(owner, plan),
        *(
            [loadbuilders.load_service(owner), loadbuilders.load_network_policy(owner)]
            if loadbuilders.generator_count(spec) > 1
            else []
        ),
        # last: once its pod runs it holds a GPU, so everything it needs must have been accepted first
        builders.deployment(owner, spec, plan),
    )


async def _deploy(experiment: Experiment, spec: ExperimentSpec, plan: PodPlan) -> bool | None:
    """Apply the children; None (nothing applied) while a predecessor's children are still there."""
    owner = experiment.owner
    manifests = _children(experiment, spec, plan)
    job = experiment.child("batch/v1", "Job", experiment.names.load)
    for ref in (*(Ref.of(manifest) for manifest in manifests), job):
        if (obstacle := await _predecessor(experiment, ref)) is None:
            continue
        if obstacle.conflict:
            await experiment.fail(Reason.NAME_CONFLICT, obstacle.message)
            return True
        await experiment.set(cond.SERVER_READY, None, Reason.WAITING_FOR_PREDECESSOR, obstacle.message)
        return None
    if loadbuilders.generator_count(spec) > 1 and not experiment.status.generator_key_secret:
        # Created once, before the Job (which names it) can exist; its name in status is what makes that
        # once: a restarted operator finds it there and never makes a second key under running pods. A
        # restart between the create and the patch leaves an unused Secret, owned, so collected with the
        # experiment. The operator cannot read Secrets (no get/list: that would be every Secret in the
        # namespace), hence generateName and the name kept here, not a fixed name it would have to check.
        try:
            secret = await experiment.kube.create(loadbuilders.generator_key_secret(owner, wire.new_key()))
        except Forbidden as exc:  # RBAC from before several load pods: retrying cannot help; nothing is applied yet
            if not exc.refusal:
                raise  # one that passes on its own: the next pass tries again
            await experiment.fail(Reason.FORBIDDEN, f"the load pods' key: {exc}; the operator needs create on secrets")
            return True
        await experiment.patch(generator_key_secret=secret["metadata"]["name"])
    if modelsecrets.needs_model_url_secret(spec) and not experiment.status.model_url_secret:
        # As the generator key's, and for the same reasons; `spec` here is the live one (the snapshot, which
        # has the URL redacted, is written below, so a restart after it finds the name in status).
        assert spec.model.source is not None and spec.model.source.url is not None
        try:
            secret = await experiment.kube.create(modelsecrets.model_url_secret(owner, spec.model.source.url))
        except Forbidden as exc:
            if not exc.refusal:
                raise
            await experiment.fail(
                Reason.FORBIDDEN, f"the model URL's Secret: {exc}; the operator needs create on secrets"
            )
            return True
        await experiment.patch(model_url_secret=secret["metadata"]["name"])
        manifests = _children(experiment, spec, _plan(experiment, spec))  # the server's pod names the Secret
    if experiment.settings.model_cache_claim and not await _model_cache_key(experiment):
        return True
    for manifest in manifests:
        await apply_child(experiment, manifest)
    return True


async def _model_cache_key(experiment: Experiment) -> bool:
    """The namespace's model cache key Secret exists (created now, or found: 409); False once the experiment
    has failed for it. The operator never reads it (no get on Secrets): it was made by the operator, or by
    whoever may create Secrets in the namespace, who may also read them."""
    try:
        await experiment.kube.create(modelsecrets.model_cache_key_secret(experiment.namespace))
    except Conflict:
        pass  # made for an earlier experiment: the cache's manifests are signed with it
    except Forbidden as exc:
        if not exc.refusal:
            raise
        await experiment.fail(Reason.FORBIDDEN, f"the model cache's key: {exc}; the operator needs create on secrets")
        return False
    return True


async def _clean_up(experiment: Experiment) -> None:
    """The desired state of a finished experiment: no load Job running and, per spec.cleanup, no server
    holding a GPU. Runs on every pass until it has succeeded (also after an operator restart or a
    refused delete: a KubeError propagates and the daemon retries), then records `cleanedUpAt`.
    A Job that finished is kept: its log is the last copy of results that were not collected."""
    if experiment.status.cleaned_up_at:
        return
    job_ref = experiment.child("batch/v1", "Job", experiment.names.load)
    job = await experiment.owned(job_ref)
    if job is not None and not job_finished(job):
        await experiment.kube.delete(job_ref)
    if experiment.delete_server_when_done:
        await experiment.delete_owned(experiment.child("apps/v1", "Deployment", experiment.names.server))
        await experiment.delete_owned(experiment.child("v1", "Service", experiment.names.server))
    await experiment.patch(cleaned_up_at=cond.now())
