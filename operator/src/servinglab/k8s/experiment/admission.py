"""The GPU queue on the cluster: whether an experiment may deploy its server now, and if not, where it
stands. The decision is pure (:mod:`.gpuqueue`); this keeps what it reads current, without listing
anything per pass: watch-fed caches (:mod:`servinglab.k8s.cache`) of the GPU nodes, of the pods that
hold GPUs in any namespace (bound, not finished), of the unfinished experiments and the ResourceQuotas
of every watched namespace — one queue for all of them — plus each namespace's pod defaults, read at
most every :data:`RULES_SECONDS`. A decision to admit is remembered until the cache shows the experiment started,
so two passes never take the same GPU; a change that may let someone in wakes the queued experiments
(:meth:`GpuQueue.changed`). Started by :mod:`servinglab.k8s.main`; asked by the experiment reconciler
before anything is deployed, and by the sweep reconciler for how many trials could run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from servinglab.api import GROUP_VERSION, KIND, ServerSpec
from servinglab.api import conditions as cond
from servinglab.api.reasons import Reason
from servinglab.api.states import ExperimentState
from servinglab.api.status import ExperimentSummary
from servinglab.k8s.cache import Informer
from servinglab.k8s.client import Kube, KubeError, NotFound, Ref
from servinglab.k8s.experiment import gpuqueue
from servinglab.k8s.experiment.placement import (
    Claim,
    NamespaceRules,
    Toleration,
    claim_of,
    gpu_pod_of,
    node_of,
    quota_of,
    rules_of,
)
from servinglab.k8s.experiment.status import Experiment
from servinglab.servers.base import Manifest

LOG = logging.getLogger("servinglab.queue")
#: A namespace's node selector and default tolerations are read again after this long.
RULES_SECONDS = 30.0
#: A queued experiment's message is rewritten at once when its place in line moves, else at most this often.
REPORT_SECONDS = 10.0
#: An admission the cache has not shown as started after this long (its status write failed) is dropped.
PENDING_SECONDS = 120.0
#: Bound pods that have not finished: those hold their GPUs (the API server filters, so the rest never arrives).
BOUND_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


@dataclass(frozen=True)
class Tracked:
    """An unfinished experiment that wants GPUs: its claim, and its last body (not compared: a status
    message changing is no change to the queue)."""

    claim: Claim
    body: Manifest = field(compare=False, hash=False)


def _tracked(body: Manifest) -> Tracked | None:
    claim = claim_of(body)
    return Tracked(claim, body) if claim is not None else None


class GpuQueue:
    """One queue for every watched namespace (`namespaces` None: all of them)."""

    def __init__(self, kube: Kube, namespaces: list[str] | None, resource: str = gpuqueue.GPU) -> None:
        self.kube, self.resource = kube, resource
        self.nodes = Informer(kube, Ref("v1", "Node", ""), lambda b: node_of(b, resource), on_change=self._changed)
        self.pods = Informer(
            kube, Ref("v1", "Pod", ""), lambda b: gpu_pod_of(b, resource), field_selector=BOUND_PODS,
            on_change=self._changed,
        )  # fmt: skip
        self.experiments = {
            namespace: Informer(kube, Ref(GROUP_VERSION, KIND, namespace), _tracked, on_change=self._changed)
            for namespace in (namespaces or [""])
        }
        # a namespace's GPU quota bounds it as nodes do: admitted past it, its server's pods would be refused
        self.quotas = {
            namespace: Informer(
                kube, Ref("v1", "ResourceQuota", namespace), lambda b: quota_of(b, resource), on_change=self._changed
            )
            for namespace in (namespaces or [""])
        }
        self._rules: dict[str, tuple[NamespaceRules, float]] = {}
        self._refreshing = asyncio.Lock()
        self._pending: dict[str, tuple[Claim, float]] = {}
        self._reported: dict[str, tuple[int, float]] = {}
        self._generation = 0
        self._plan: tuple[int, dict[str, gpuqueue.Decision]] = (-1, {})
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        kube.observe(self._written)

    def start(self) -> GpuQueue:
        informers: list[Informer[Any]] = [self.nodes, self.pods, *self.experiments.values(), *self.quotas.values()]
        self._tasks = [asyncio.create_task(informer.run()) for informer in informers]
        return self

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _changed(self) -> None:
        self._generation += 1
        self._wake.set()
        self._wake = asyncio.Event()

    async def changed(self, timeout: float) -> None:
        """Return when something changed that may let a queued experiment in, or after `timeout` s."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    def _informer(self, namespace: str) -> Informer[Tracked] | None:
        return self.experiments.get(namespace) or self.experiments.get("")

    def _written(self, obj: Manifest) -> None:
        if obj.get("kind") == KIND and obj.get("apiVersion") == GROUP_VERSION:
            informer = self._informer(str(obj["metadata"].get("namespace") or ""))
            if informer is not None:
                informer.offer(obj)

    def body(self, namespace: str, name: str) -> Manifest | None:
        """The cached body of an unfinished experiment that wants GPUs (what a queued pass reads)."""
        informer = self._informer(namespace)
        tracked = informer.get(namespace, name) if informer is not None else None
        return tracked.body if tracked is not None else None

    def unsynced(self) -> str | None:
        """What the queue is still waiting to read (with the last error), or None once it has it all."""
        informers: list[Informer[Any]] = [self.nodes, self.pods, *self.experiments.values(), *self.quotas.values()]
        missing = [i for i in informers if not i.synced.is_set()]
        if not missing:
            return None
        errors = "; ".join(i.error for i in missing if i.error)
        what = ", ".join(f"{i.ref.kind}s" for i in missing)
        return f"the GPU queue is still reading the cluster ({what})" + (f": {errors}" if errors else "")

    async def refresh(self, namespaces: set[str]) -> None:
        """Read the pod defaults of these namespaces again if they are older than :data:`RULES_SECONDS` (one
        pass reads; the queued passes a change has woken all at once wait for it rather than read too)."""
        async with self._refreshing:
            await self._refresh(namespaces)

    async def _refresh(self, namespaces: set[str]) -> None:
        now = time.monotonic()
        for namespace in sorted(namespaces):
            known = self._rules.get(namespace)
            if known is not None and now - known[1] < RULES_SECONDS:
                continue
            try:
                rules = rules_of(await self.kube.get(Ref("v1", "Namespace", "", namespace)))
            except NotFound:
                rules = NamespaceRules()
            except KubeError as exc:  # e.g. RBAC without namespaces/get: go on without the defaults
                LOG.warning("cannot read namespace %s's pod defaults: %s", namespace, exc)
                rules = known[0] if known is not None else NamespaceRules()
            if known is None or known[0] != rules:
                self._changed()
            self._rules[namespace] = (rules, now)

    def _claims(self) -> list[Claim]:
        claims = {t.claim.uid: t.claim for informer in self.experiments.values() for t in informer.values()}
        now = time.monotonic()
        for uid, (claim, since) in list(self._pending.items()):
            cached = claims.get(uid)
            if cached is None or cached.admitted or now - since > PENDING_SECONDS:
                del self._pending[uid]  # started (the cache shows it), finished or gone, or never written
            else:
                claims[uid] = claim
        return list(claims.values())

    def plan(self) -> dict[str, gpuqueue.Decision]:
        if self._plan[0] != self._generation or self._pending:
            rules = {namespace: known[0] for namespace, known in self._rules.items()}
            nodes, pods = self.nodes.values(), self.pods.values()
            quotas = [quota for informer in self.quotas.values() for quota in informer.values()]
            decisions = gpuqueue.plan(nodes, pods, self._claims(), rules, self.resource, quotas)
            self._plan = (self._generation, decisions)
            self._reported = {uid: seen for uid, seen in self._reported.items() if uid in decisions}
        return self._plan[1]

    def decide(self, body: Manifest) -> gpuqueue.Decision:
        """This experiment's decision; one to admit is remembered until the cache shows it started."""
        if (waiting := self.unsynced()) is not None:
            return gpuqueue.Decision(False, waiting=waiting)
        self._written(body)  # a new experiment's first pass may come before the watch brings it
        claim = claim_of(body)
        if claim is not None and claim.uid in self._pending:
            return gpuqueue.Decision(True, position=1)  # admitted, but its start was not written: again
        decision = self.plan().get(claim.uid) if claim is not None else None
        if decision is None:
            return gpuqueue.Decision(False, waiting="waiting for the GPU queue to see this experiment")
        if decision.admit and claim is not None:
            self._pending[claim.uid] = (replace(claim, admitted=True), time.monotonic())
            self._reported.pop(claim.uid, None)
            self._changed()
        return decision

    def report(self, uid: str, decision: gpuqueue.Decision, first: bool) -> bool:
        """Whether a waiting message is worth a status write: the first, a move in line, or a while since."""
        last = self._reported.get(uid)
        now = time.monotonic()
        if first or last is None or last[0] != decision.position or now - last[1] >= REPORT_SECONDS:
            self._reported[uid] = (decision.position, now)
            return True
        return False

    def capacity(self, namespace: str, server: ServerSpec) -> int:
        """How many servers like this one could hold GPUs at once in this namespace (a sweep's bound)."""
        tolerations = tuple(Toleration.of(t.model_dump(by_alias=True, exclude_none=True)) for t in server.tolerations)
        claim = Claim("", namespace, "", "", server.gpus, tuple(sorted(server.node_selector.items())), tolerations,
                      False, server.replicas)  # fmt: skip
        rules = self._rules.get(namespace, (NamespaceRules(), 0.0))[0]
        return gpuqueue.capacity(claim, self.nodes.values(), rules)


async def admitted(experiment: Experiment, queue: GpuQueue) -> bool:
    """Whether the experiment may deploy its server now (see :mod:`.gpuqueue`); while it may not, a Queued
    condition says why and where it stands. Fails it if no node could ever host it. The queue reads the
    spec from the experiment's body, as it reads every other experiment's."""
    namespaces = {t.claim.namespace for i in queue.experiments.values() for t in i.values()} | {experiment.namespace}
    await queue.refresh(namespaces)
    decision = queue.decide(experiment.body)
    if decision.never is not None:
        await experiment.fail(Reason.UNSCHEDULABLE, decision.never)
        return False
    if decision.admit:
        queued_at = experiment.status.queued_at
        if queued_at is not None:
            waited = round(time.time() - cond.epoch(queued_at), 3)
            await experiment.set(cond.QUEUED, False, Reason.ADMITTED, "a GPU is free", queued_seconds=waited)
        return True
    assert decision.waiting is not None
    first = experiment.status.queued_at is None
    current = cond.get(experiment.conditions, cond.QUEUED)
    changed = first or current is None or current.message != decision.waiting
    if changed and queue.report(experiment.uid, decision, first):
        since = {"queued_at": cond.now()} if first else {}
        await experiment.set(
            cond.QUEUED, True, Reason.WAITING_FOR_GPU, decision.waiting,
            summary=ExperimentSummary(state=ExperimentState.QUEUED), **since,
        )  # fmt: skip
    if first:
        await experiment.event("Normal", "Queued", decision.waiting)
    return False
