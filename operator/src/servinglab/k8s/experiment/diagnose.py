"""Why a server or load pod is not serving, read from its status (pure functions): unschedulable, an init
container that could not put the model in place, a server that gave up on its model, a crash, a replaced
pod; pods that never start (an image that cannot be pulled, a missing Secret, pods the API refuses to
create, a missing payload), an eviction, an out-of-memory kill, a node that went away; and what a valid
spec cannot do on a cluster.

The server's own reasons (a container's termination message "<Reason>: <message>") are read through the
seam (:meth:`~servinglab.servers.base.Server.start_failure`); the model init containers' protocol is every
server's (:data:`~servinglab.servers.base.MODEL_INIT`). Used by the experiment reconciler.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from servinglab.api import ExperimentSpec
from servinglab.api.ceiling import ModelDescription
from servinglab.api.conditions import epoch
from servinglab.api.forms import FORM_DISAGREES, FORM_NOT_BUILT, FORM_NOT_SUPPORTED, FormRun
from servinglab.api.reasons import Reason
from servinglab.models.probe import checked
from servinglab.servers.base import FORM_INIT, MODEL_INIT, PROBE_INIT, Manifest, Server

#: A failure: the Failed condition's reason and its message.
Failure = tuple[Reason, str]
#: Waiting reasons of a container whose image cannot be pulled; the first two never change on a retry.
PULL_NEVER = ("InvalidImageName", "ErrImageNeverPull")
PULL_FAILED = (*PULL_NEVER, "ErrImagePull", "ImagePullBackOff")
#: The kubelet cannot build the container: a Secret or ConfigMap (or a key of one) it names is missing.
CONFIG_MISSING = "CreateContainerConfigError"


def pod_ready(pod: Manifest) -> bool:
    """The pod runs and its Ready condition is True (its containers pass their readiness probes)."""
    status = pod.get("status", {})
    conditions: list[Manifest] = status.get("conditions") or []
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def unschedulable_reason(pods: list[Manifest]) -> str | None:
    """The scheduler's message when the server pod cannot be placed (e.g. no node has the GPUs)."""
    for pod in pods:
        for condition in pod.get("status", {}).get("conditions", []):
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return str(condition.get("message", "unschedulable"))
    return None


def _last_termination(container: Manifest) -> Manifest | None:
    """A container status's termination: the current one, else the one before its restart."""
    terminated = container.get("state", {}).get("terminated") or container.get("lastState", {}).get("terminated")
    return dict(terminated) if terminated else None


def _container_problem(pod: Manifest) -> str | None:
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


#: Reasons `servinglab prepare-model` (and `build-model --into`) end with (the termination message starts
#: "<Reason>: ").
MODEL_REASONS = (
    Reason.MODEL_DOWNLOAD_FAILED,
    Reason.MODEL_CHECKSUM_MISMATCH,
    Reason.MODEL_NOT_RECOGNIZED,
    Reason.MODEL_TOO_LARGE,
    Reason.PRECISION_NOT_SUPPORTED,
    Reason.MODEL_NOT_SUPPORTED,
)
#: Reasons `servinglab prepare-form` ends with (in `model` for a built-in, in `form` for a user's model).
FORM_REASONS = (FORM_DISAGREES, FORM_NOT_BUILT, FORM_NOT_SUPPORTED)


def cluster_problems(spec: ExperimentSpec) -> list[str]:
    """What a valid spec cannot do on Kubernetes: paths and core counts of the operator's machine mean
    nothing to a pod."""
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


def _init_terminated(pod: Manifest, name: str) -> tuple[Manifest, bool] | None:
    """The model init container's last termination and whether it succeeded, if it ended."""
    for container in pod.get("status", {}).get("initContainerStatuses", []):
        if container.get("name") != name:
            continue
        if terminated := _last_termination(container):
            return terminated, terminated.get("exitCode") == 0 and "terminated" in container.get("state", {})
    return None


def model_init_failure(pods: list[Manifest]) -> Failure | None:
    """(reason, message) when the model could not be put in place: an init container (`model`, the `probe`
    that counts it, or the `form` that builds a user's model's form) failed. `model`'s own reason (a download,
    a checksum, a size, a form that disagrees, ...) or `form`'s when it says one, else ModelPreparationFailed."""
    for pod in pods:
        for name in (MODEL_INIT, PROBE_INIT, FORM_INIT):
            ended = _init_terminated(pod, name)
            if ended is None or ended[1]:
                continue
            terminated = ended[0]
            message = str(terminated.get("message") or terminated.get("reason") or "").strip()
            said, _, rest = message.partition(": ")
            reason = Reason.named(said)
            if reason is not None and (
                (name == MODEL_INIT and reason in (*MODEL_REASONS, *FORM_REASONS))
                or (name == FORM_INIT and reason in FORM_REASONS)
            ):
                return reason, rest
            return Reason.MODEL_PREPARATION_FAILED, (
                f"server pod {pod['metadata']['name']}: init container {name} exited with code "
                f"{terminated.get('exitCode', '?')}: {message}"
            ).strip()
    return None


def server_start_failure(pods: list[Manifest], server: Server) -> Failure | None:
    """(reason, message) when a server container gave up on its own (e.g. TorchServe's launcher ends it with
    ModelLoadFailed once the handler has failed to load the model): its termination message, read by its kind."""
    for pod in pods:
        for container in pod.get("status", {}).get("containerStatuses", []):
            terminated = _last_termination(container) or {}
            if (found := server.start_failure(str(terminated.get("message") or ""))) is not None:
                return found[0], f"server pod {pod['metadata']['name']}: {found[1]}"
    return None


def _init_json(pod: Manifest, name: str) -> Manifest | None:
    ended = _init_terminated(pod, name)
    if ended is None or not ended[1]:
        return None
    try:
        said = json.loads(ended[0].get("message") or "")
    except ValueError:
        return None
    return said if isinstance(said, dict) else None


def model_description(pod: Manifest) -> ModelDescription | None:
    """What `servinglab prepare-model` (or `build-model`) said of the model it put in place, with the
    parameters and FLOPs `servinglab count-model` counted: only those three figures are taken from the
    probe, which ran the user's code and so may say anything."""
    described = _init_json(pod, MODEL_INIT)
    if described is None:
        return None
    counts = checked(_init_json(pod, PROBE_INIT))
    described = {key: value for key, value in described.items() if key != "form"}
    try:
        return ModelDescription.model_validate({**described, **(counts or {})})
    except ValueError:
        return None


def form_run(pod: Manifest) -> FormRun | None:
    """The form that was built, gated and put beside the model (`server.form`): what `servinglab
    prepare-form` said, under `form` in `model`'s message (a built-in's) or as `form`'s (a user's model's)."""
    said = (_init_json(pod, MODEL_INIT) or {}).get("form") or _init_json(pod, FORM_INIT)
    try:
        return FormRun.model_validate(said) if isinstance(said, dict) and said else None
    except ValueError:
        return None


def crash_reason(pods: list[Manifest]) -> str | None:
    """Why the server died, if it did: its pod ended, or a container restarted or terminated."""
    for pod in pods:
        status, name = pod.get("status", {}), pod["metadata"]["name"]
        problem = _container_problem(pod)
        if status.get("phase") in ("Failed", "Succeeded"):
            return f"server pod {name} is {status['phase']}: {problem or status.get('message', '')}".strip()
        if problem is not None:
            return f"server pod {name}: {problem}"
    return None


def replaced_server(pods: list[Manifest], serving: str | list[str]) -> str | None:
    """Why the pods the load is measuring (every replica's) are no longer the server, if they are not: one
    deleted, or replaced by another pod (whose cold start and caches would be measured as if nothing had
    happened)."""
    live = {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}
    wanted = [serving] if isinstance(serving, str) else serving
    gone = [name for name in wanted if name not in live]
    if not gone:
        return None
    others = sorted(live - set(wanted))
    now = f"; now {', '.join(others)}" if others else ""
    return f"server pod {', '.join(gone)} was deleted during the load test{now}: its measurements are discarded"


def _statuses(pod: Manifest) -> Iterator[Manifest]:
    status = pod.get("status", {})
    yield from status.get("initContainerStatuses") or []
    yield from status.get("containerStatuses") or []


def _age(pod: Manifest, now: float) -> float:
    created = pod.get("metadata", {}).get("creationTimestamp")
    return now - epoch(created) if created else 0.0


def start_failure(pods: list[Manifest], what: str, grace_seconds: float, now: float) -> Failure | None:
    """A pod of `what` ("server", "load") whose containers cannot start: ImagePullFailed (at once for a
    name that can never be pulled, else once the pod is `grace_seconds` old: a registry can recover),
    ConfigMissing (a Secret or key it needs is missing, once `grace_seconds` old: it may still be created)."""
    for pod in pods:
        patient = _age(pod, now) <= grace_seconds
        for container in _statuses(pod):
            waiting = container.get("state", {}).get("waiting") or {}
            reason, message = waiting.get("reason"), str(waiting.get("message") or "").strip()
            where = f"{what} pod {pod['metadata']['name']}, container {container.get('name')}"
            if reason in PULL_FAILED and not (patient and reason not in PULL_NEVER):
                image = container.get("image", "")
                return (
                    Reason.IMAGE_PULL_FAILED,
                    f"{where}: image {image} cannot be pulled ({reason}): {message}".strip(),
                )
            if reason == CONFIG_MISSING and not patient:
                return Reason.CONFIG_MISSING, f"{where} cannot start: {message or reason}"
    return None


def evicted(pods: list[Manifest]) -> Failure | None:
    """A server pod its node evicted (memory or disk pressure, a drain): ServerEvicted."""
    for pod in pods:
        status = pod.get("status", {})
        if status.get("phase") == "Failed" and status.get("reason") == "Evicted":
            message = str(status.get("message") or "").strip()
            return Reason.SERVER_EVICTED, f"server pod {pod['metadata']['name']} was evicted by its node: {message}"
    return None


def out_of_memory(pods: list[Manifest]) -> Failure | None:
    """A server container killed for its memory (OOMKilled, now or before a restart): OutOfMemory."""
    for pod in pods:
        for container in _statuses(pod):
            if (_last_termination(container) or {}).get("reason") == "OOMKilled":
                return Reason.OUT_OF_MEMORY, (
                    f"server pod {pod['metadata']['name']}: container {container.get('name')} was killed for "
                    "exceeding its memory (OOMKilled); raise server.resources.limits.memory or lower the batch "
                    "size or workers"
                )
    return None


def nodes_of(pods: list[Manifest]) -> list[str]:
    """The nodes the live pods are bound to."""
    names = {pod.get("spec", {}).get("nodeName") for pod in pods if not pod["metadata"].get("deletionTimestamp")}
    return sorted(name for name in names if name)


def lost_node(
    pods: list[Manifest], nodes: dict[str, Manifest | None], grace_seconds: float, now: float
) -> Failure | None:
    """A live server pod whose node is gone (deleted), or not Ready (its kubelet silent or unhealthy) for
    longer than `grace_seconds` since its Ready condition last changed: ServerLost. A kubelet restart or a
    missed heartbeat makes a node NotReady for a moment while its pods keep serving. `nodes`: each name of
    :func:`nodes_of` and the Node read, None if there is none by that name."""
    for pod in pods:
        name = pod.get("spec", {}).get("nodeName")
        if not name or name not in nodes or pod["metadata"].get("deletionTimestamp"):
            continue
        node, pod_name = nodes[name], pod["metadata"]["name"]
        if node is None:
            return Reason.SERVER_LOST, f"node {name} of server pod {pod_name} was deleted"
        conditions: list[Manifest] = node.get("status", {}).get("conditions", [])
        ready: Manifest = next((c for c in conditions if c.get("type") == "Ready"), {})
        if ready.get("status") == "True":
            continue
        since = ready.get("lastTransitionTime")
        lasted = now - epoch(since) if since else None  # no time: cannot wait it out
        if lasted is not None and lasted <= grace_seconds:
            continue
        said = ": ".join(str(ready[k]) for k in ("reason", "message") if ready.get(k))
        how_long = f" for {lasted:.0f} s" if lasted is not None else ""
        return Reason.SERVER_LOST, (
            f"node {name} of server pod {pod_name} is not Ready ({ready.get('status', 'Unknown')}"
            f"{', ' + said if said else ''}){how_long}"
        )
    return None


def refused_pods(deployment: Manifest, grace_seconds: float, now: float) -> str | None:
    """Why the server's pods cannot be created (a quota, an admission policy), as the Deployment says, once
    the refusal has lasted `grace_seconds`: some pass on their own (a namespace's default ServiceAccount
    not made yet, a quota not counted yet, a webhook restarting) and the ReplicaSet retries them."""
    for condition in deployment.get("status", {}).get("conditions", []):
        if condition.get("type") == "ReplicaFailure" and condition.get("status") == "True":
            since = condition.get("lastTransitionTime")
            if since is None or now - epoch(since) <= grace_seconds:
                return None
            return f"the server's pods are refused: {condition.get('message') or condition.get('reason')}"
    return None


def payload_missing(pods: list[Manifest], spec: ExperimentSpec) -> str | None:
    """A load pod the scheduler cannot place because the payload's claim does not exist."""
    claim = spec.load.payload.pvc
    for pod in pods:
        for condition in pod.get("status", {}).get("conditions", []):
            message = str(condition.get("message") or "")
            if condition.get("reason") == "Unschedulable" and claim is not None and claim.claim_name in message:
                return f"load pod {pod['metadata']['name']} cannot be placed: {message}"
    return None


def stuck(pods: list[Manifest], grace_seconds: float, now: float) -> str | None:
    """A load pod still not running `grace_seconds` after its creation (its volumes not mounted, say)."""
    for pod in pods:
        if pod.get("status", {}).get("phase", "Pending") == "Pending" and _age(pod, now) > grace_seconds:
            return str(pod["metadata"]["name"])
    return None
