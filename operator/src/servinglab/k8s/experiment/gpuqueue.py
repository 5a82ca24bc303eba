"""Who gets a GPU next (a pure function of the cluster's digests, :mod:`.placement`): experiments wait in
line instead of failing as Unschedulable, and are admitted only where the scheduler will place them.

One :func:`plan` decides for every queued experiment of every watched namespace at once:

* GPUs are counted per node: a node's allocatable GPUs minus what every pod bound to it holds — the
  operator's servers and anyone else's. One pod cannot span nodes, so a request of 2 needs one node
  with 2 free. A server of several replicas (spec.server.replicas) claims replicas x gpus: it is
  admitted when its nodes have room for every replica at once (each replica's GPUs on one node), and
  counts replicas x gpus against a quota.
* An experiment's *nodes* are those its node selector and tolerations allow (with its namespace's
  defaults) that have at least its GPUs. It is behind only the earlier experiments whose nodes overlap
  its own, so a queued A100 experiment never holds up a T4 one.
* An admitted experiment whose server is not yet bound to a node may land on any of its nodes: until
  the scheduler has placed it, nothing else is admitted onto those nodes — except one-GPU servers with
  exactly the same nodes while free GPUs remain for all of them, since any free GPU there suits each.
  So no admitted server is ever left Pending for want of a GPU the queue promised it.
* A request that none of the nodes could ever hold fails at once, naming the largest offer. A node that
  takes no pods for the moment (cordoned, not ready: the taints Kubernetes itself sets) is waited for.
* A namespace's ResourceQuotas on the GPU resource bound it too: an experiment waits while admitting it
  would exceed a quota's hard minus used (less what its admitted servers not yet counted there will
  take), in its namespace's order, without holding up other namespaces; one asking for more than a
  quota's hard fails at once. Else its server's pods would be refused and it would end Rejected.

The reconciler (:mod:`.admission`) keeps the digests current from watch-fed caches and asks for the
decision about its experiment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from servinglab.k8s.experiment.placement import Claim, GpuPod, NamespaceRules, Node, Quota, effective

GPU = "nvidia.com/gpu"
"""The GPU resource unless the operator is told another (:class:`servinglab.k8s.settings.Settings`)."""


@dataclass(frozen=True)
class Decision:
    """Admit now; or wait (the message a condition shows, the place in line); or never (the failure)."""

    admit: bool
    waiting: str | None = None
    never: str | None = None
    position: int = 0


@dataclass(frozen=True)
class Pool:
    """The nodes that could hold a claim's server (each with enough GPUs), those of them that take pods
    now (not cordoned, not ready, ...), and, if there are none at all, why it can never run."""

    nodes: frozenset[str]
    ready: frozenset[str]
    never: str | None = None


def pool(claim: Claim, nodes: Iterable[Node], rules: NamespaceRules, resource: str = GPU) -> Pool:
    placed = effective(claim, rules)
    if isinstance(placed, str):
        return Pool(frozenset(), frozenset(), placed)
    selector, tolerations = placed
    matching = [node for node in nodes if node.hosts(selector, tolerations, now=False)]
    fits = [node for node in matching if node.gpus >= claim.gpus]
    if fits and (room := sum(node.gpus // claim.gpus for node in fits)) < claim.replicas:
        return Pool(frozenset(), frozenset(),
                    f"the {len(fits)} nodes matching the server's nodeSelector and tolerations that offer "
                    f"{claim.gpus} {resource} hold {room} replicas at most, and spec.server.replicas is "
                    f"{claim.replicas}")  # fmt: skip
    if fits:
        ready = frozenset(node.name for node in fits if node.hosts(selector, tolerations))
        return Pool(frozenset(node.name for node in fits), ready)
    largest = max((node.gpus for node in matching), default=0)
    defaults = f", with namespace {claim.namespace}'s defaults" if rules.selector or rules.tolerations else ""
    return Pool(frozenset(), frozenset(),
                f"no node matching the server's nodeSelector and tolerations{defaults} offers {claim.gpus} "
                f"{resource} (the largest offers {largest}, {len(matching)} nodes match)")  # fmt: skip


def plan(
    nodes: Iterable[Node],
    pods: Iterable[GpuPod],
    claims: Iterable[Claim],
    rules: Mapping[str, NamespaceRules],
    resource: str = GPU,
    quotas: Iterable[Quota] = (),
) -> dict[str, Decision]:
    """The decision for each claim not yet admitted, by uid. Claims are taken in order; one admitted here
    counts as placed-pending for those after it, so following the whole plan never overcommits."""
    by_name = {node.name: node for node in nodes}
    used: dict[str, int] = {}
    placed: dict[str, int] = {}  # server pods bound to a node, by experiment
    for pod in pods:
        used[pod.node] = used.get(pod.node, 0) + pod.gpus
        placed[pod.experiment] = placed.get(pod.experiment, 0) + 1
    # an experiment is bound once all its replicas are; until then its unbound replicas are still being placed
    bound = {claim.uid for claim in claims if placed.get(claim.uid, 0) >= claim.replicas}
    free = {name: node.gpus - used.get(name, 0) for name, node in by_name.items()}
    pools: dict[tuple[object, ...], Pool] = {}

    def pool_of(claim: Claim) -> Pool:
        namespace = rules.get(claim.namespace, NamespaceRules())
        key = (claim.gpus, claim.replicas, claim.selector, claim.tolerations, namespace)
        if key not in pools:
            pools[key] = pool(claim, by_name.values(), namespace, resource)
        return pools[key]

    # servers admitted but not yet bound to a node, by their nodes and whether they want one GPU
    placing: dict[tuple[frozenset[str], bool], int] = {}
    for claim in claims:
        if claim.admitted and claim.uid not in bound:
            key = (pool_of(claim).nodes, claim.gpus == 1)
            placing[key] = placing.get(key, 0) + claim.replicas - placed.get(claim.uid, 0)
    waiting: dict[frozenset[str], int] = {}
    decisions: dict[str, Decision] = {}
    quota = _Quotas(quotas, claims, bound, resource)
    for claim in sorted((c for c in claims if not c.admitted), key=lambda c: c.order):
        found = pool_of(claim)
        if found.never is not None:
            decisions[claim.uid] = Decision(False, never=found.never)
            continue
        if (limited := quota.decision(claim)) is not None:
            decisions[claim.uid] = limited  # waiting for its namespace's quota holds up no one else's nodes
            continue
        fits, ready = found.nodes, found.ready
        unit = claim.gpus == 1
        ahead = sum(count for other, count in waiting.items() if other & fits)
        # Servers of one GPU on exactly these nodes take any free GPU here: while enough are free, this one
        # may go beside them. Any other server not yet placed could take the node this one needs.
        same = placing.get((fits, True), 0) if unit else 0
        unplaced = sum(count for (other, _), count in placing.items() if other & fits) - same
        most = max((free[name] for name in ready), default=0)
        # every replica at once: one-GPU replicas take any free GPUs; larger ones whole shares of a node each
        fit = (sum(max(free[name], 0) for name in ready) - same >= claim.replicas if unit
               else sum(max(free[name], 0) // claim.gpus for name in ready) >= claim.replicas)  # fmt: skip
        if not ahead and not unplaced and fit:
            decisions[claim.uid] = Decision(True, position=1)
            placing[(fits, unit)] = placing.get((fits, unit), 0) + claim.replicas
            quota.take(claim)
            continue
        waiting[fits] = waiting.get(fits, 0) + 1
        in_use = sum(by_name[name].gpus - max(free[name], 0) for name in fits)
        total = sum(by_name[name].gpus for name in fits)
        message = (
            f"waiting for {_asked(claim)} {resource} on one of the {len(fits)} nodes that can hold it (the most "
            f"free on one: {max(most, 0)}): {in_use} of {total} in use; position {ahead + 1} in the queue "
            f"({ahead} ahead)"
        )
        if unplaced or same:
            message += f"; {unplaced + same} admitted server(s) still being placed on these nodes"
        if len(ready) < len(fits):
            message += f"; {len(fits) - len(ready)} of the nodes take no pods now (cordoned, not ready or tainted)"
        decisions[claim.uid] = Decision(False, waiting=message, position=ahead + 1)
    return decisions


class _Quotas:
    """Per namespace with GPU quotas: the GPUs new servers may still request there (the tightest quota's hard
    minus used, less the admitted servers whose pods it may not count yet: those not bound to a node, some
    perhaps counted twice until they are), and the claims waiting for it, which keep their order."""

    def __init__(self, quotas: Iterable[Quota], claims: Iterable[Claim], bound: set[str], resource: str) -> None:
        self.resource = resource
        self.room: dict[str, int] = {}
        self.tightest: dict[str, Quota] = {}
        self.smallest: dict[str, Quota] = {}
        self.behind: dict[str, int] = {}
        for quota in quotas:
            namespace = quota.namespace
            if namespace not in self.room or quota.hard - quota.used < self.room[namespace]:
                self.room[namespace], self.tightest[namespace] = quota.hard - quota.used, quota
            if namespace not in self.smallest or quota.hard < self.smallest[namespace].hard:
                self.smallest[namespace] = quota
        for claim in claims:
            if claim.admitted and claim.uid not in bound and claim.namespace in self.room:
                self.room[claim.namespace] -= claim.total

    def decision(self, claim: Claim) -> Decision | None:
        """Never (more than a quota's hard), wait (over what is left, or others of its namespace wait), or
        None: the quotas let it in."""
        namespace, resource = claim.namespace, self.resource
        if (smallest := self.smallest.get(namespace)) is not None and claim.total > smallest.hard:
            return Decision(False, never=(
                f"the ResourceQuota {smallest.name} of namespace {namespace} allows {smallest.hard} {resource} in "
                f"all, and the server asks for {_asked(claim)}"
            ))  # fmt: skip
        if namespace not in self.room or (not self.behind.get(namespace) and self.room[namespace] >= claim.total):
            return None
        ahead = self.behind.get(namespace, 0)
        self.behind[namespace] = ahead + 1
        quota = self.tightest[namespace]
        return Decision(False, position=ahead + 1, waiting=(
            f"waiting for {_asked(claim)} {resource} within the ResourceQuota {quota.name} of namespace {namespace}: "
            f"{quota.used} of {quota.hard} in use, {max(self.room[namespace], 0)} left for new servers; position "
            f"{ahead + 1} in the namespace's queue ({ahead} ahead)"
        ))  # fmt: skip

    def take(self, claim: Claim) -> None:
        if claim.namespace in self.room:
            self.room[claim.namespace] -= claim.total


def _asked(claim: Claim) -> str:
    """`2`, or with several replicas `2 x 3 replicas = 6`."""
    return str(claim.gpus) if claim.replicas == 1 else f"{claim.gpus} x {claim.replicas} replicas = {claim.total}"


def capacity(claim: Claim, nodes: Iterable[Node], rules: NamespaceRules) -> int:
    """How many servers like the claim's (all their replicas) could hold GPUs at once on the nodes it may use
    (a sweep's bound)."""
    listed = list(nodes)
    fits = pool(claim, listed, rules).nodes
    return sum(node.gpus // claim.gpus for node in listed if node.name in fits) // claim.replicas
