"""The ServingExperiment operator: kopf handlers that orchestrate one experiment to its result.

One kopf daemon per experiment runs :func:`reconcile` every few seconds until the experiment has
Succeeded or Failed and its cleanup is done. Each pass reads the current state from the API and
moves it one step:

  deploy children (server-side apply, idempotent; once per daemon run) -> server Available (cold start recorded) ->
  load Job created -> Job Complete: results read from the results ConfigMap, GPU figures from
  Prometheus, status written once -> finished -> cleanup (no running Job; per spec.cleanup no
  server) retried on every pass until done -> `cleanedUpAt` (never touched again).

Failures end the experiment with a Failed condition naming the cause: invalid spec (no children
are created), unschedulable server (the scheduler's own message), server not ready in time,
server crashed or replaced during the load, load Job failed (its termination message), results
missing. A restarted operator resumes from what the API holds: the same children, at most one Job,
nothing lost. Children are recognised by their owner's uid, never by name alone, so a deleted and
re-applied experiment never reads its predecessor's pods, Job or results.

Only a finished, cleaned-up experiment is outside the daemon's filter, so only it carries no kopf
finalizer: it can be deleted (or its namespace, or the CRD) with no operator running. Exactly one
operator process acts at a time (:mod:`servinglab.k8s.leader`).

Run with `servinglab operator` (kopf's runner), in the cluster or against a kubeconfig.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf

from servinglab.k8s import conditions as cond
from servinglab.k8s import gpuqueue, leader, opmetrics, resources, summary, sweeps
from servinglab.k8s.kube import Kube, KubeError, Ref
from servinglab.k8s.promql import GpuMetrics, PrometheusError
from servinglab.loadgen.results_sink import RESULTS_KEY, Reader, ResultsMissing, ResultsUnreadable
from servinglab.spec import API_GROUP, API_VERSION, KIND, ExperimentSpec, SpecError, parse_experiment
from servinglab.sweepspec import SWEEP_KIND

PLURAL = "servingexperiments"
LOG = logging.getLogger("servinglab.operator")


@dataclass(frozen=True)
class Settings:
    """Operator settings; :meth:`from_env` reads them from the environment (the Helm chart sets it)."""

    servinglab_image: str = "servinglab/servinglab:0.1.0"
    """Image of the model-builder init container and the load Job (SERVINGLAB_IMAGE)."""
    prometheus_url: str | None = None
    """Default Prometheus for GPU metrics when an experiment names none (SERVINGLAB_PROMETHEUS_URL)."""
    poll_seconds: float = 2.0
    """How often a running experiment is reconciled (SERVINGLAB_POLL_SECONDS)."""
    unschedulable_grace_seconds: float = 30.0
    """How long the server pod may stay unschedulable before the experiment fails
    (SERVINGLAB_UNSCHEDULABLE_GRACE_SECONDS)."""
    lease_namespace: str = "default"
    """Where the leader-election Lease lives (SERVINGLAB_LEASE_NAMESPACE; the CLI sets it)."""
    lease_seconds: float = 15.0
    """How long a silent leader keeps the Lease before a standby takes over (SERVINGLAB_LEASE_SECONDS)."""
    model_cache_claim: str | None = None
    """A ReadWriteMany claim, in each watched namespace, where server pods keep models by digest
    (SERVINGLAB_MODEL_CACHE_CLAIM; the chart's modelCache.claimName)."""

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        return cls(
            servinglab_image=env.get("SERVINGLAB_IMAGE", cls.servinglab_image),
            prometheus_url=env.get("SERVINGLAB_PROMETHEUS_URL") or None,
            poll_seconds=float(env.get("SERVINGLAB_POLL_SECONDS", cls.poll_seconds)),
            unschedulable_grace_seconds=float(
                env.get("SERVINGLAB_UNSCHEDULABLE_GRACE_SECONDS", cls.unschedulable_grace_seconds)
            ),
            lease_namespace=env.get("SERVINGLAB_LEASE_NAMESPACE") or cls.lease_namespace,
            lease_seconds=float(env.get("SERVINGLAB_LEASE_SECONDS", cls.lease_seconds)),
            model_cache_claim=env.get("SERVINGLAB_MODEL_CACHE_CLAIM") or None,
        )


def _epoch(timestamp: str) -> float:
    return datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _now() -> float:
    return datetime.now(UTC).timestamp()


class Experiment:
    """One experiment's view of the cluster for a single reconcile pass."""

    def __init__(self, kube: Kube, body: dict[str, Any], settings: Settings) -> None:
        self.kube = kube
        self.body = body
        self.settings = settings
        meta = body["metadata"]
        self.name, self.namespace, self.uid = meta["name"], meta["namespace"], meta["uid"]
        self.generation = meta.get("generation")
        self.ref = Ref(f"{API_GROUP}/{API_VERSION}", KIND, self.namespace, self.name)
        self.owner = resources.Owner(self.name, self.namespace, self.uid)
        self.names = resources.Names(self.name)
        self.status: dict[str, Any] = dict(body.get("status") or {})
        # read raw: the cleanup of an experiment whose spec was invalid still runs (and finds nothing)
        cleanup = ((body.get("spec") or {}).get("cleanup") or {}).get("deleteServer", True)
        self.delete_server_when_done = cleanup is not False

    @property
    def conditions(self) -> list[cond.Condition]:
        return list(self.status.get("conditions") or [])

    def child(self, api_version: str, kind: str, name: str) -> Ref:
        return Ref(api_version, kind, self.namespace, name)

    async def patch(self, **fields: Any) -> None:
        self.status.update(fields)
        await self.kube.patch_status(self.ref, fields)

    async def set(self, kind: str, status: bool | None, reason: str, message: str, **fields: Any) -> None:
        conditions = cond.set_condition(self.conditions, kind, status, reason, message, self.generation)
        await self.patch(conditions=conditions, observedGeneration=self.generation, **fields)

    async def event(self, kind: str, reason: str, message: str) -> None:
        """A Kubernetes event on the experiment; failing to record one never fails the experiment."""
        now = cond.now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self.name}.", "namespace": self.namespace},
            "involvedObject": {
                "apiVersion": f"{API_GROUP}/{API_VERSION}",
                "kind": KIND,
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
            },
            "type": kind,
            "reason": reason,
            "message": message[:1000],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": "servinglab-operator"},
        }
        try:
            await self.kube.create(event)
        except KubeError as exc:
            LOG.warning("could not record event %s for %s: %s", reason, self.ref, exc)

    async def fail(self, reason: str, message: str) -> None:
        """End the experiment as Failed; :func:`_clean_up` then stops its load and frees its GPU."""
        conditions = cond.set_condition(self.conditions, cond.FAILED, True, reason, message, self.generation)
        conditions = cond.set_condition(conditions, cond.SUCCEEDED, False, reason, message, self.generation)
        state = {"state": "Failed", **{k: v for k, v in (self.status.get("summary") or {}).items() if k != "state"}}
        await self.patch(conditions=conditions, summary=state, finishedAt=cond.now())
        await self.event("Warning", reason, message)
        opmetrics.finished(self.namespace, self.name, "Failed")

    async def owned(self, ref: Ref) -> dict[str, Any] | None:
        """The child if this incarnation of the experiment owns it, else None (absent, or a predecessor's)."""
        child = await self.kube.get(ref)
        return child if child is not None and resources.owned_by(child, self.uid) else None

    async def delete_owned(self, ref: Ref) -> None:
        if await self.owned(ref) is not None:
            await self.kube.delete(ref)


def _true_conditions(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The Job's conditions that hold (Complete, Failed, ...), by type."""
    return {c["type"]: c for c in job.get("status", {}).get("conditions", []) if c.get("status") == "True"}


def _job_finished(job: dict[str, Any]) -> bool:
    return bool(_true_conditions(job).keys() & {"Complete", "Failed"})


async def _clean_up(experiment: Experiment) -> None:
    """The desired state of a finished experiment: no load Job running and, per spec.cleanup, no server
    holding a GPU. Runs on every pass until it has succeeded (also after an operator restart or a
    refused delete: a KubeError propagates and the daemon retries), then records `cleanedUpAt`.
    A Job that finished is kept: its log is the last copy of results that were not collected."""
    if experiment.status.get("cleanedUpAt"):
        return
    job_ref = experiment.child("batch/v1", "Job", experiment.names.load)
    job = await experiment.owned(job_ref)
    if job is not None and not _job_finished(job):
        await experiment.kube.delete(job_ref)
    if experiment.delete_server_when_done:
        await experiment.delete_owned(experiment.child("apps/v1", "Deployment", experiment.names.server))
        await experiment.delete_owned(experiment.child("v1", "Service", experiment.names.server))
    await experiment.patch(cleanedUpAt=cond.now())


async def reconcile(kube: Kube, body: dict[str, Any], settings: Settings, deploy: bool = True) -> bool | None:
    """Move the experiment one step; True once it has finished (Succeeded or Failed), None while it
    waits in the GPU queue (nothing deployed yet), else False.

    `deploy` applies the children (idempotent); the daemon asks for it on its first pass only — at
    creation, and again after an operator restart — not on every poll of a running experiment.
    """
    experiment = Experiment(kube, body, settings)
    if not cond.finished(experiment.conditions):
        outcome = await _advance(experiment, body, deploy)
        if outcome is not True:
            return outcome
    await _clean_up(experiment)
    return True


async def _advance(experiment: Experiment, body: dict[str, Any], deploy: bool) -> bool | None:
    try:
        document = {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "metadata": {"name": experiment.name, "namespace": experiment.namespace},
            "spec": body.get("spec"),
        }
        spec = parse_experiment(document).spec
    except SpecError as exc:
        await experiment.fail("InvalidSpec", "; ".join(exc.problems))
        return True
    if problems := cluster_problems(spec):
        await experiment.fail("InvalidSpec", "; ".join(problems))
        return True

    if "startedAt" not in experiment.status and spec.server.gpus > 0 and not await _admitted(experiment, spec):
        return True if cond.finished(experiment.conditions) else None
    if "startedAt" not in experiment.status:
        await experiment.set(
            cond.SERVER_READY, None, "Deploying", "TorchServe is being deployed",
            startedAt=cond.now(), summary={"state": "Deploying"},
            resultsRef={"kind": "ConfigMap", "name": experiment.names.results, "key": RESULTS_KEY},
        )  # fmt: skip
        await experiment.event("Normal", "Deploying", f"Deploying TorchServe for {spec.model.name}")

    if deploy and not cond.is_true(experiment.conditions, cond.LOAD_TEST_COMPLETE):
        deployed = await _deploy(experiment, spec)
        if deployed is not True:
            return deployed
    if not cond.is_true(experiment.conditions, cond.SERVER_READY):
        return await _await_server(experiment, spec)
    return await _run_load(experiment, spec)


# One operator process admits one experiment at a time, so two daemons never take the same free GPU.
_ADMISSION = asyncio.Lock()


async def _admitted(experiment: Experiment, spec: ExperimentSpec) -> bool:
    """Whether the experiment may deploy its server now (see :mod:`servinglab.k8s.gpuqueue`); while it
    may not, a Queued condition says why and where it stands. Fails it if no node could ever host it."""
    async with _ADMISSION:
        kube = experiment.kube
        server = spec.server
        offers = gpuqueue.offers(await kube.list(Ref("v1", "Node", "")), server)
        siblings = await kube.list(experiment.child(f"{API_GROUP}/{API_VERSION}", KIND, ""))
        pods = await kube.list(experiment.child("v1", "Pod", ""), label_selector="app.kubernetes.io/component=server")
        serving = {
            p["metadata"].get("labels", {}).get(f"{API_GROUP}/experiment")
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        }
        in_use, queue = 0, []
        for other in siblings:
            status, name = other.get("status") or {}, other["metadata"]["name"]
            gpus = int(((other.get("spec") or {}).get("server") or {}).get("gpus", 1))
            finished = cond.finished(list(status.get("conditions") or []))
            if "startedAt" in status and (not finished or name in serving):
                in_use += gpus
            elif "startedAt" not in status and not finished and gpus > 0:
                queue.append((other["metadata"].get("creationTimestamp", ""), name))
        queue.sort()
        names = [name for _, name in queue]
        position = names.index(experiment.name) + 1 if experiment.name in names else len(names) + 1
        decision = gpuqueue.decide(server.gpus, offers, in_use, position)
        if decision.never is not None:
            await experiment.fail("Unschedulable", decision.never)
            return False
        if decision.admit:
            queued_at = experiment.status.get("queuedAt")
            if queued_at is not None:
                await experiment.set(cond.QUEUED, False, "Admitted", "a GPU is free",
                                     queuedSeconds=round(_now() - _epoch(queued_at), 3))  # fmt: skip
            return True
        assert decision.waiting is not None
        first = "queuedAt" not in experiment.status
        current = cond.get(experiment.conditions, cond.QUEUED) or {}
        if first or current.get("message") != decision.waiting:
            since = {"queuedAt": cond.now()} if first else {}
            await experiment.set(
                cond.QUEUED, True, "WaitingForGPU", decision.waiting, summary={"state": "Queued"}, **since
            )
        if first:
            await experiment.event("Normal", "Queued", decision.waiting)
        return False


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
    if existing is None or resources.owned_by(existing, experiment.uid):
        return None
    owners = existing["metadata"].get("ownerReferences") or []
    if any(owner.get("kind") == KIND and owner.get("name") == experiment.name for owner in owners):
        return Obstacle(f"{ref} of a previous experiment named {experiment.name} is still being deleted", False)
    return Obstacle(f"{ref} exists and does not belong to this experiment; delete or rename it", True)


async def _deploy(experiment: Experiment, spec: ExperimentSpec) -> bool | None:
    """Apply the children; None (nothing applied) while a predecessor's children are still there."""
    owner, image = experiment.owner, experiment.settings.servinglab_image
    document = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": experiment.name},
        "spec": spec.model_dump(by_alias=True, mode="json"),
    }
    manifests = (
        resources.config_map(owner, spec, document),
        resources.results_config_map(owner),
        resources.load_service_account(owner),
        resources.load_role(owner),
        resources.load_role_binding(owner),
        resources.deployment(owner, spec, image, experiment.settings.model_cache_claim),
        resources.service(owner),
        *([resources.load_service(owner)] if resources.generator_count(spec) > 1 else []),
    )
    job = experiment.child("batch/v1", "Job", experiment.names.load)
    for ref in (*(Ref.of(manifest) for manifest in manifests), job):
        if (obstacle := await _predecessor(experiment, ref)) is None:
            continue
        if obstacle.conflict:
            await experiment.fail("NameConflict", obstacle.message)
            return True
        await experiment.set(cond.SERVER_READY, None, "WaitingForPredecessor", obstacle.message)
        return None
    for manifest in manifests:
        await experiment.kube.apply(manifest)
    return True


async def _server_pods(experiment: Experiment) -> list[dict[str, Any]]:
    selector = resources.pod_selector(experiment.owner, "server")
    return await experiment.kube.list(experiment.child("v1", "Pod", ""), label_selector=selector)


def unschedulable_reason(pods: list[dict[str, Any]]) -> str | None:
    """The scheduler's message when the server pod cannot be placed (e.g. no node has the GPUs)."""
    for pod in pods:
        for condition in pod.get("status", {}).get("conditions", []):
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return str(condition.get("message", "unschedulable"))
    return None


def _last_termination(container: dict[str, Any]) -> dict[str, Any] | None:
    """A container status's termination: the current one, else the one before its restart."""
    terminated = container.get("state", {}).get("terminated") or container.get("lastState", {}).get("terminated")
    return dict(terminated) if terminated else None


def _container_problem(pod: dict[str, Any]) -> str | None:
    for container in pod.get("status", {}).get("containerStatuses", []):
        state = container.get("state", {})
        terminated = _last_termination(container)
        restarts = container.get("restartCount", 0)
        if restarts > 0 or state.get("terminated"):
            detail = terminated or state.get("waiting") or {}
            return (
                f"container {container['name']} {'terminated' if not restarts else f'restarted {restarts} times'}: "
                f"{detail.get('reason', 'unknown')} (exit code {detail.get('exitCode', '?')}) "
                f"{detail.get('message', '')}"
            ).strip()
    return None


#: Reasons `servinglab prepare-model` ends with (its termination message starts "<Reason>: ").
MODEL_REASONS = ("ModelDownloadFailed", "ModelChecksumMismatch", "ModelNotRecognized", "PrecisionNotSupported")


def cluster_problems(spec: ExperimentSpec) -> list[str]:
    """What a valid spec cannot do on Kubernetes: paths of the operator's machine mean nothing to a pod."""
    problems = []
    source, payload = spec.model.source, spec.load.payload
    if source is not None and source.path is not None:
        problems.append(f"spec.model.source.path: {source.path!r} is a local path; on Kubernetes use url or pvc")
    if payload.own_bodies and payload.config_map is None and payload.pvc is None:
        problems.append("spec.load.payload: files/records on Kubernetes come from a configMap or a pvc; name one")
    if spec.load.shape is not None and spec.load.shape.trace is not None and not (payload.config_map or payload.pvc):
        problems.append("spec.load.shape.trace: on Kubernetes the trace file comes from payload's configMap or pvc")
    if spec.load.generators == "auto":
        problems.append(
            "spec.load.generators: auto counts this machine's cores; on Kubernetes give the number of load pods"
        )
    return problems


def _init_terminated(pod: dict[str, Any], name: str) -> tuple[dict[str, Any], bool] | None:
    """The model init container's last termination and whether it succeeded, if it ended."""
    for container in pod.get("status", {}).get("initContainerStatuses", []):
        if container.get("name") != name:
            continue
        if terminated := _last_termination(container):
            return terminated, terminated.get("exitCode") == 0 and "terminated" in container.get("state", {})
    return None


def model_init_failure(pods: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) when the model could not be put in place: the init container failed. Its
    own reason (a download, a checksum, ...) when it says one, else ModelPreparationFailed."""
    for pod in pods:
        ended = _init_terminated(pod, "model")
        if ended is None or ended[1]:
            continue
        terminated = ended[0]
        message = str(terminated.get("message") or terminated.get("reason") or "").strip()
        reason, _, rest = message.partition(": ")
        if reason in MODEL_REASONS:
            return reason, rest
        return "ModelPreparationFailed", (
            f"server pod {pod['metadata']['name']}: init container model exited with code "
            f"{terminated.get('exitCode', '?')}: {message}"
        ).strip()
    return None


def model_load_failure(pods: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(ModelLoadFailed, message) when the server container gave up on its model: its launcher ends it
    with that termination message once the handler has failed to load (tsconfig.server_launcher)."""
    for pod in pods:
        for container in pod.get("status", {}).get("containerStatuses", []):
            terminated = _last_termination(container) or {}
            reason, _, message = str(terminated.get("message") or "").strip().partition(": ")
            if reason == "ModelLoadFailed":
                return reason, f"server pod {pod['metadata']['name']}: {message}"
    return None


def model_description(pod: dict[str, Any]) -> dict[str, Any] | None:
    """What `servinglab prepare-model` said of the model it put in place (its termination message)."""
    ended = _init_terminated(pod, "model")
    if ended is None or not ended[1]:
        return None
    try:
        described = json.loads(ended[0].get("message") or "")
    except ValueError:
        return None
    return described if isinstance(described, dict) else None


def crash_reason(pods: list[dict[str, Any]]) -> str | None:
    """Why the server died, if it did: its pod ended, or a container restarted or terminated."""
    for pod in pods:
        status, name = pod.get("status", {}), pod["metadata"]["name"]
        problem = _container_problem(pod)
        if status.get("phase") in ("Failed", "Succeeded"):
            return f"server pod {name} is {status['phase']}: {problem or status.get('message', '')}".strip()
        if problem is not None:
            return f"server pod {name}: {problem}"
    return None


async def _await_server(experiment: Experiment, spec: ExperimentSpec) -> bool:
    kube = experiment.kube
    deployment = await kube.get(experiment.child("apps/v1", "Deployment", experiment.names.server)) or {}
    pods = await _server_pods(experiment)
    elapsed = _now() - _epoch(experiment.status["startedAt"])
    if (deployment.get("status", {}).get("availableReplicas") or 0) >= 1:
        ready = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
        pod_name = ready[0]["metadata"]["name"] if ready else ""
        model = model_description(ready[0]) if ready else None
        await experiment.set(
            cond.SERVER_READY, True, "Available", f"TorchServe is ready in pod {pod_name}",
            coldStartSeconds=round(elapsed, 3), serverReadyAt=cond.now(), serverPod=pod_name,
            summary={"state": "Ready"}, **({"model": model} if model else {}),
        )  # fmt: skip
        await experiment.event("Normal", "ServerReady", f"TorchServe ready after {elapsed:.1f} s")
        return False
    if (model_failure := model_init_failure(pods) or model_load_failure(pods)) is not None:
        await experiment.fail(*model_failure)
        return True
    if (crash := crash_reason(pods)) is not None:
        await experiment.fail("ServerCrashed", crash)
        return True
    unschedulable = unschedulable_reason(pods)
    # Admitted means some node can hold it: a GPU still held by a finishing server is a wait, not a failure.
    waiting_for_gpu = unschedulable is not None and f"Insufficient {gpuqueue.GPU}" in unschedulable
    if unschedulable is not None and not waiting_for_gpu and elapsed > experiment.settings.unschedulable_grace_seconds:
        await experiment.fail("Unschedulable", f"the scheduler cannot place the server: {unschedulable}")
        return True
    if elapsed > spec.server.startup_timeout_seconds:
        await experiment.fail(
            "ServerNotReady", f"TorchServe was not ready within {spec.server.startup_timeout_seconds} s"
        )
        return True
    return False


def replaced_server(pods: list[dict[str, Any]], serving: str) -> str | None:
    """Why the pod the load is measuring is no longer the server, if it is not: deleted, or replaced
    by another pod (whose cold start and caches would be measured as if nothing had happened)."""
    live = {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}
    if serving in live:
        return None
    others = sorted(live)
    now = f"; now {', '.join(others)}" if others else ""
    return f"server pod {serving} was deleted during the load test{now}: its measurements are discarded"


async def _run_load(experiment: Experiment, spec: ExperimentSpec) -> bool:
    kube = experiment.kube
    job_ref = experiment.child("batch/v1", "Job", experiment.names.load)
    pods = await _server_pods(experiment)
    serving = experiment.status.get("serverPod")
    if serving and (replaced := replaced_server(pods, serving)) is not None:
        await experiment.fail("ServerRestarted", replaced)
        return True
    job = await kube.get(job_ref)
    if job is not None and not resources.owned_by(job, experiment.uid):
        return False  # a predecessor's Job, still being garbage-collected: never read it as ours
    if job is None:
        flops = (experiment.status.get("model") or {}).get("flopsPerInference")
        await kube.apply(resources.load_job(experiment.owner, spec, experiment.settings.servinglab_image, flops))
        await experiment.set(
            cond.LOAD_TEST_COMPLETE, False, "Running",
            f"load ({spec.load.describe()}) running in Job {experiment.names.load}",
            summary={"state": "Running"},
        )  # fmt: skip
        await experiment.event("Normal", "LoadTestStarted", f"Job {experiment.names.load} started")
        return False
    job_conditions = _true_conditions(job)
    if "Failed" in job_conditions:
        message = await _job_message(experiment) or job_conditions["Failed"].get("message", "")
        await experiment.fail("LoadJobFailed", f"Job {experiment.names.load} failed: {message}")
        return True
    if "Complete" in job_conditions:
        await _collect(experiment, spec)
        return True
    if (crash := crash_reason(pods)) is not None:
        await experiment.fail("ServerCrashed", f"during the load test: {crash}")
        return True
    return False


async def _job_message(experiment: Experiment) -> str | None:
    pods = await experiment.kube.list(
        experiment.child("v1", "Pod", ""), label_selector=resources.pod_selector(experiment.owner, "load")
    )
    for pod in pods:
        for container in pod.get("status", {}).get("containerStatuses", []):
            terminated = container.get("state", {}).get("terminated") or {}
            if terminated:
                return (
                    f"exit code {terminated.get('exitCode')}: {terminated.get('message') or terminated.get('reason')}"
                )
    return None


# One results document is read at a time: each is bounded (see results_sink.Reader), and so is their sum.
_RESULTS_READ = asyncio.Lock()


async def _read_results(experiment: Experiment) -> dict[str, Any]:
    """The load Job's results document, whole and this experiment's own, without what the status never
    shows (windows, latency CDF, phases: those stay in the ConfigMap); ResultsMissing if it is not
    there, ResultsUnreadable if it is malformed or larger than the operator reads."""
    results_ref = experiment.child("v1", "ConfigMap", experiment.names.results)
    async with _RESULTS_READ:
        reader = Reader(await experiment.owned(results_ref))
        for index, name in enumerate(reader.part_names, start=1):  # never more than MAX_PARTS
            reader.add_part(index, await experiment.owned(experiment.child("v1", "ConfigMap", name)))
        document = reader.document()
    if document.get("experimentUid", experiment.uid) != experiment.uid:
        raise ResultsMissing(f"{results_ref} holds the results of another experiment of this name")
    for level in document["results"]:
        level.pop("latencyCdfMs", None)
        level.pop("phases", None)
        if isinstance(level.get("stability"), dict):
            level["stability"].pop("windows", None)
    return document


async def _collect(experiment: Experiment, spec: ExperimentSpec) -> None:
    """Results to status, once. Unreadable results end the experiment as Failed, so that no later pass
    and no restarted operator reads them again."""
    try:
        document = await _read_results(experiment)
    except ResultsMissing as exc:
        await experiment.fail(
            "ResultsMissing",
            f"the load Job finished without readable results ({exc}); Job {experiment.names.load} and its log "
            "are kept",
        )
        return
    except ResultsUnreadable as exc:
        await experiment.fail(
            "ResultsUnreadable",
            f"the load Job's results were not read: {exc}; Job {experiment.names.load} and its log are kept",
        )
        return
    levels: list[dict[str, Any]] = document["results"]
    gpu, gpu_condition = await _gpu_figures(experiment, spec, levels)
    slo = spec.slo.p99_latency_ms
    compact = [summary.level_status(level, gpu.get(index), slo) for index, level in enumerate(levels)]
    conditions = cond.set_condition(experiment.conditions, cond.GPU_METRICS, *gpu_condition, experiment.generation)
    conditions = cond.set_condition(
        conditions,
        cond.LOAD_TEST_COMPLETE,
        True,
        "Complete",
        f"{len(levels)} levels measured",
        experiment.generation,
    )
    conditions = cond.set_condition(
        conditions, cond.SUCCEEDED, True, "Measured", "results are in status.results", experiment.generation
    )
    conditions = cond.set_condition(conditions, cond.FAILED, False, "Measured", "", experiment.generation)
    # Cold start ends when the server first answers a prediction (its health check can pass while
    # workers are still loading the model), as seen by the load Job.
    cold_start = experiment.status.get("coldStartSeconds")
    if document.get("serverAnsweredAt"):
        cold_start = round(float(document["serverAnsweredAt"]) - _epoch(experiment.status["startedAt"]), 3)
    # One write: the finished result lands whole, or not at all.
    await experiment.patch(
        coldStartSeconds=cold_start,
        conditions=conditions,
        results=compact,
        summary=summary.summarise(compact, slo, "Succeeded", document.get("peakRate")),
        **({"ceiling": document["ceiling"]} if document.get("ceiling") else {}),
        finishedAt=cond.now(),
        observedGeneration=experiment.generation,
    )
    await experiment.event("Normal", "Succeeded", f"{len(levels)} levels measured")
    opmetrics.finished(experiment.namespace, experiment.name, "Succeeded", spec, compact)


async def _gpu_figures(
    experiment: Experiment, spec: ExperimentSpec, levels: list[dict[str, Any]]
) -> tuple[dict[int, dict[str, float | None]], tuple[bool, str, str]]:
    url = spec.metrics.prometheus_url or experiment.settings.prometheus_url
    if url is None:
        return {}, (False, "NotConfigured", "no Prometheus URL in spec.metrics or the operator settings")
    reader, pod = GpuMetrics(url), experiment.status.get("serverPod", "")
    figures: dict[int, dict[str, float | None]] = {}
    try:
        for index, level in enumerate(levels):
            successful = int(level["requests"]) - int(level["errors"])
            figures[index] = await reader.window(
                experiment.namespace, pod, float(level["windowStart"]), float(level["windowEnd"]), successful
            )
    except PrometheusError as exc:
        return {}, (False, exc.reason, str(exc))
    if not any(value is not None for level in figures.values() for value in level.values()):
        return figures, (False, "NoData", f"Prometheus at {reader.shown} has no DCGM metrics for pod {pod}")
    return figures, (True, "Measured", f"DCGM metrics of pod {pod} from {reader.shown}")


# -- kopf wiring -----------------------------------------------------------------------------------


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf keeps its own bookkeeping in annotations under our group, never in our status.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=API_GROUP)
    settings.persistence.finalizer = f"{API_GROUP}/finalizer"
    settings.posting.level = logging.WARNING  # our own events say what happened; kopf's are noise
    # a watch or request on a half-open connection must end, so that kopf reconnects
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    memo.kube = await Kube.connect()
    memo.settings = Settings.from_env()
    opmetrics.start_server()
    # Exactly one operator acts: wait here, before any handler runs, until this process leads.
    identity = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    memo.election = leader.Election(memo.kube, memo.settings.lease_namespace, identity, memo.settings.lease_seconds)
    async with leader.standby_health(os.environ.get("SERVINGLAB_LIVENESS_URL")):
        await memo.election.acquire()
    memo.renewal = asyncio.create_task(memo.election.keep(_lost_leadership))


def _lost_leadership(why: str) -> None:
    """Another operator may act from now on: stop at once, mid-step if need be (every step is idempotent)."""
    LOG.critical("%s; exiting so that only one operator acts", why)
    logging.shutdown()
    os._exit(70)


@kopf.on.cleanup()
async def _cleanup(memo: kopf.Memo, **_: Any) -> None:
    memo.renewal.cancel()
    await memo.election.release()
    await memo.kube.close()


def _running(status: kopf.Status, **_: Any) -> bool:
    """The daemon's filter: not yet finished and cleaned up. Outside it, kopf keeps no finalizer on the
    object (and removes one left from before), so deleting it needs no operator."""
    return not status.get("cleanedUpAt")


def _sweep_running(status: kopf.Status, **_: Any) -> bool:
    return not cond.finished(list(status.get("conditions") or []))


async def _drive(
    ref: Ref,
    step: Callable[[dict[str, Any]], Awaitable[bool]],
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    logger: kopf.Logger,
) -> None:
    """Reconcile one object every poll until `step` says it has finished or it is gone."""
    while not stopped:
        try:
            body = await memo.kube.get(ref)
            if body is None:
                return
            if await step(body):
                return
        except KubeError as exc:
            opmetrics.RECONCILE_ERRORS.labels(reason=type(exc).__name__).inc()
            logger.warning("Reconcile of %s failed, retrying: %s", ref, exc)
        await stopped.wait(memo.settings.poll_seconds)


@kopf.daemon(API_GROUP, API_VERSION, PLURAL, cancellation_timeout=5.0, when=_running)
async def drive(
    name: str, namespace: str | None, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any
) -> None:
    """One per experiment, restarted with the operator: reconcile until finished."""
    ref = Ref(f"{API_GROUP}/{API_VERSION}", KIND, namespace or "", name)
    deployed = False

    async def step(body: dict[str, Any]) -> bool:
        nonlocal deployed
        outcome = await reconcile(memo.kube, body, memo.settings, deploy=not deployed)
        deployed = deployed or outcome is not None  # once per daemon run, by the first pass past the queue
        return outcome is True

    with opmetrics.RUNNING.track_inprogress():
        await _drive(ref, step, memo, stopped, logger)


@kopf.daemon(API_GROUP, API_VERSION, sweeps.SWEEP_PLURAL, cancellation_timeout=5.0, when=_sweep_running)
async def drive_sweep(
    name: str, namespace: str | None, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any
) -> None:
    """One per sweep, restarted with the operator: start trials and roll them up until finished."""
    ref = Ref(f"{API_GROUP}/{API_VERSION}", SWEEP_KIND, namespace or "", name)
    await _drive(ref, lambda body: sweeps.reconcile_sweep(memo.kube, body), memo, stopped, logger)
