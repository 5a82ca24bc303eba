"""Where a server pod may go, read from the API's objects (pure functions and frozen facts).

The GPU queue (:mod:`.gpuqueue`) reasons about digests, not about whole objects: a GPU node (labels,
taints, allocatable GPUs), a pod bound to a node that holds GPUs (anyone's), an experiment that wants
or holds GPUs, a namespace's ResourceQuota on GPUs, and the defaults a namespace imposes on its pods.
Each digest is built here from the API's JSON by a function that returns None for what does not matter
to the queue (a node without the GPU resource, a pod that holds none, a finished experiment, a quota on
no GPUs), so the watch-fed caches keep only these.

Matching follows the scheduler: a node hosts a pod when every nodeSelector label is on it, it is not
cordoned, and every NoSchedule/NoExecute taint is tolerated. A namespace's
`scheduler.alpha.kubernetes.io/node-selector` (PodNodeSelector) and
`scheduler.alpha.kubernetes.io/defaultTolerations` (PodTolerationRestriction) are merged into the
pod's own as those admission plugins do; a selector that contradicts the namespace's is refused there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servinglab.api import EXPERIMENT_UID_LABEL
from servinglab.api import conditions as cond

NODE_SELECTOR_ANNOTATION = "scheduler.alpha.kubernetes.io/node-selector"
DEFAULT_TOLERATIONS_ANNOTATION = "scheduler.alpha.kubernetes.io/defaultTolerations"
#: An extended resource's name as the API server accepts it: a DNS subdomain prefix, a slash, a name.
_RESOURCE = re.compile(
    r"^(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_COUNT = re.compile(r"^[0-9]{1,6}$")

Labels = tuple[tuple[str, str], ...]


def resource_problem(name: str) -> str | None:
    """Why `name` cannot be the GPU resource (None if it can): a vendor's extended resource, such as
    nvidia.com/gpu, nvidia.com/mig-1g.5gb or amd.com/gpu."""
    if not _RESOURCE.match(name) or name.split("/", maxsplit=1)[0].endswith("kubernetes.io"):
        return f"'{name}' is not an extended resource name such as nvidia.com/gpu or nvidia.com/mig-1g.5gb"
    return None


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Toleration:
        return cls(str(raw.get("key") or ""), str(raw.get("operator") or "Equal"), str(raw.get("value") or ""),
                   str(raw.get("effect") or ""))  # fmt: skip

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


#: Taints Kubernetes itself puts on a node for a condition that passes (not ready, unreachable, pressure,
#: cordoned, not yet initialised): they keep pods away now, but say nothing of whether the node ever could.
_PASSING = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")


def tolerated(taint: Taint, tolerations: tuple[Toleration, ...]) -> bool:
    """PreferNoSchedule never keeps a pod away; the other effects must be tolerated."""
    return taint.effect == "PreferNoSchedule" or any(t.tolerates(taint) for t in tolerations)


def _count(value: Any) -> int:
    """A GPU count as the API writes extended resources (whole numbers); anything else counts as none."""
    text = str(value or "0")
    return int(text) if _COUNT.match(text) else 0


@dataclass(frozen=True)
class Node:
    """A node that has the GPU resource."""

    name: str
    labels: Labels
    taints: tuple[Taint, ...]
    gpus: int
    cordoned: bool

    def hosts(self, selector: Labels, tolerations: tuple[Toleration, ...], now: bool = True) -> bool:
        """Whether the scheduler would put such a pod here; with `now` False, once its passing conditions
        (not ready, cordoned, ...) are over."""
        labels = dict(self.labels)
        return (
            (not self.cordoned or not now)
            and all(labels.get(key) == value for key, value in selector)
            and all(tolerated(t, tolerations) or (not now and t.key.startswith(_PASSING)) for t in self.taints)
        )


def node_of(body: Mapping[str, Any], resource: str) -> Node | None:
    gpus = _count((body.get("status") or {}).get("allocatable", {}).get(resource))
    if gpus <= 0:
        return None
    spec = body.get("spec") or {}
    taints = tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in spec.get("taints") or []
    )
    labels = tuple(sorted((str(k), str(v)) for k, v in (body["metadata"].get("labels") or {}).items()))
    return Node(body["metadata"]["name"], labels, taints, gpus, bool(spec.get("unschedulable")))


@dataclass(frozen=True)
class GpuPod:
    """A pod bound to a node, holding GPUs there until it ends or is gone (terminating pods still hold
    theirs: the scheduler counts them until they are deleted). `experiment` is the uid of the experiment
    whose server it is, if any."""

    node: str
    gpus: int
    experiment: str


def _request(container: Mapping[str, Any], resource: str) -> int:
    resources = container.get("resources") or {}
    # an extended resource's request defaults to its limit, and may not differ from it
    return _count((resources.get("requests") or {}).get(resource) or (resources.get("limits") or {}).get(resource))


def gpu_pod_of(body: Mapping[str, Any], resource: str) -> GpuPod | None:
    """What a pod holds: its containers' GPUs (with sidecars), or its largest init container's if more."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    inits = spec.get("initContainers") or []
    sidecars = sum(_request(c, resource) for c in inits if c.get("restartPolicy") == "Always")
    running = sum(_request(c, resource) for c in spec.get("containers") or []) + sidecars
    gpus = max([running, *(_request(c, resource) for c in inits if c.get("restartPolicy") != "Always")])
    if gpus <= 0:
        return None
    experiment = str((body["metadata"].get("labels") or {}).get(EXPERIMENT_UID_LABEL) or "")
    return GpuPod(str(spec["nodeName"]), gpus, experiment)


@dataclass(frozen=True)
class Quota:
    """A ResourceQuota on the GPU resource (`requests.<resource>`): how many GPUs its namespace's pods may
    request in all, and how many they request now (as the quota controller last counted)."""

    namespace: str
    name: str
    hard: int
    used: int


def quota_of(body: Mapping[str, Any], resource: str) -> Quota | None:
    """The quota's GPU bound; None without one, or for a scoped quota (priority classes, terminating pods,
    ...: it may not apply to a server pod, and one that does not would hold the queue for nothing). The
    spec's bound is taken before the quota controller has counted it (the API refuses pods till then)."""
    spec, status, meta = body.get("spec") or {}, body.get("status") or {}, body.get("metadata") or {}
    if spec.get("scopes") or spec.get("scopeSelector"):
        return None
    key = f"requests.{resource}"
    hard = (spec.get("hard") or {}).get(key)
    if hard is None:
        return None
    return Quota(str(meta.get("namespace") or ""), str(meta.get("name") or ""), _count(hard),
                 _count((status.get("used") or {}).get(key)))  # fmt: skip


@dataclass(frozen=True)
class Claim:
    """An unfinished experiment that asks for GPUs: queued, or admitted (its server deployed or about to be)."""

    uid: str
    namespace: str
    name: str
    created: str
    gpus: int
    selector: Labels
    tolerations: tuple[Toleration, ...]
    admitted: bool

    @property
    def order(self) -> tuple[str, str, str]:
        """First come, first served, across every watched namespace."""
        return (self.created, self.namespace, self.name)


def claim_of(body: Mapping[str, Any]) -> Claim | None:
    """The claim of an experiment; None when it asks for no GPU, has finished, is being deleted (its server
    goes with it; while its pod is there, the pod is counted), or its spec is not one (its own pass fails
    it as InvalidSpec)."""
    meta, status = body["metadata"], body.get("status") or {}
    if meta.get("deletionTimestamp") or any(c.get("type") in (cond.SUCCEEDED, cond.FAILED) and c.get("status") == "True"
           for c in status.get("conditions") or []):  # fmt: skip
        return None
    try:
        server = (body.get("spec") or {}).get("server") or {}
        gpus = int(server.get("gpus", 1))
        selector = tuple(sorted((str(k), str(v)) for k, v in (server.get("nodeSelector") or {}).items()))
        tolerations = tuple(Toleration.of(t) for t in server.get("tolerations") or [])
    except (TypeError, ValueError, AttributeError):
        return None
    if gpus <= 0:
        return None
    return Claim(str(meta["uid"]), str(meta["namespace"]), str(meta["name"]), str(meta.get("creationTimestamp", "")),
                 gpus, selector, tolerations, bool(status.get("startedAt")))  # fmt: skip


@dataclass(frozen=True)
class NamespaceRules:
    """What a namespace adds to every pod (None: it sets nothing), or why its pods are refused."""

    selector: Labels = ()
    tolerations: tuple[Toleration, ...] = ()
    problem: str | None = None


def rules_of(body: Mapping[str, Any] | None) -> NamespaceRules:
    if body is None:
        return NamespaceRules()
    name, annotations = body["metadata"]["name"], body["metadata"].get("annotations") or {}
    pairs: list[tuple[str, str]] = []
    for term in str(annotations.get(NODE_SELECTOR_ANNOTATION) or "").split(","):
        if not term.strip():
            continue
        key, equals, value = term.partition("=")
        if not equals or "=" in value or not key.strip():
            written = annotations[NODE_SELECTOR_ANNOTATION]
            return NamespaceRules(problem=f"namespace {name}'s {NODE_SELECTOR_ANNOTATION} annotation "
                                  f"'{written}' is not key=value[,key=value]")  # fmt: skip
        pairs.append((key.strip(), value.strip()))
    try:
        raw = json.loads(annotations.get(DEFAULT_TOLERATIONS_ANNOTATION) or "[]")
        tolerations = tuple(Toleration.of(t) for t in raw)
    except (ValueError, TypeError, AttributeError):
        return NamespaceRules(problem=f"namespace {name}'s {DEFAULT_TOLERATIONS_ANNOTATION} annotation is not a "
                              "JSON list of tolerations")  # fmt: skip
    return NamespaceRules(tuple(sorted(pairs)), tolerations)


def effective(claim: Claim, rules: NamespaceRules) -> tuple[Labels, tuple[Toleration, ...]] | str:
    """The server pod's node selector and tolerations once its namespace's admission plugins have added
    theirs; or why the API server would refuse the pod."""
    if rules.problem:
        return rules.problem
    own = dict(claim.selector)
    for key, value in rules.selector:
        if own.get(key, value) != value:
            return (f"spec.server.nodeSelector {key}={own[key]} contradicts namespace {claim.namespace}'s "
                    f"{NODE_SELECTOR_ANNOTATION} ({key}={value}); the API server refuses such a pod")  # fmt: skip
        own[key] = value
    tolerations = claim.tolerations + tuple(t for t in rules.tolerations if t not in claim.tolerations)
    return tuple(sorted(own.items())), tolerations
