"""Who gets a GPU next: experiments wait in a first-come queue instead of failing as Unschedulable
(pure functions; the reconciler gathers the nodes, experiments and server pods they read).

An experiment that asks for GPUs is *admitted* (its server deployed, `status.startedAt` set) only
when the nodes its selector and tolerations allow offer that many GPUs beyond those held by admitted,
unfinished experiments and by servers still running, and when it is first in line. A request that no
node could ever satisfy fails at once, naming the largest offer. Queue time is not cold-start time.

GPUs used by pods the operator does not manage are not counted here; the scheduler still keeps
those, and a server it cannot place yet waits within its startup timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servinglab.api import ServerSpec

GPU = "nvidia.com/gpu"


def tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    """Whether a NoSchedule/NoExecute taint is tolerated (PreferNoSchedule never keeps a pod away)."""
    if taint.get("effect") == "PreferNoSchedule":
        return True
    for toleration in tolerations:
        if toleration.get("effect") not in (None, taint.get("effect")):
            continue
        if toleration.get("operator") == "Exists" and toleration.get("key") in (None, taint.get("key")):
            return True
        if toleration.get("key") == taint.get("key") and toleration.get("value") == taint.get("value"):
            return True
    return False


def node_offer(node: dict[str, Any], selector: dict[str, str], tolerations: list[dict[str, Any]]) -> int:
    """GPUs this node can give the server: its allocatable GPUs if the selector and taints allow it."""
    labels = node.get("metadata", {}).get("labels", {})
    if any(labels.get(key) != value for key, value in selector.items()):
        return 0
    if node.get("spec", {}).get("unschedulable"):
        return 0
    if not all(tolerated(taint, tolerations) for taint in node.get("spec", {}).get("taints", [])):
        return 0
    return int(str(node.get("status", {}).get("allocatable", {}).get(GPU, "0")) or 0)


def offers(nodes: list[dict[str, Any]], server: ServerSpec) -> list[int]:
    """What each node that can host this server offers it (nodes offering nothing left out)."""
    tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in server.tolerations]
    return [offer for node in nodes if (offer := node_offer(node, server.node_selector, tolerations)) > 0]


@dataclass(frozen=True)
class Decision:
    """Admit now; or wait (with the message a condition shows); or never (the failure message)."""

    admit: bool
    waiting: str | None = None
    never: str | None = None


def decide(gpus: int, offers: list[int], in_use: int, position: int) -> Decision:
    """`offers`: per matching node; `in_use`: GPUs held on them now; `position`: 1-based place in the
    queue of experiments not yet admitted (creation order)."""
    if max(offers, default=0) < gpus:
        largest = max(offers, default=0)
        return Decision(False, never=f"no node matching the server's nodeSelector and tolerations offers {gpus} "
                        f"{GPU} (the largest offers {largest}, {len(offers)} nodes match)")  # fmt: skip
    free = sum(offers) - in_use
    if position == 1 and free >= gpus:
        return Decision(True)
    return Decision(
        False,
        waiting=f"waiting for {gpus} {GPU}: {max(in_use, 0)} of {sum(offers)} in use; "
        f"position {position} in the queue ({position - 1} ahead)",
    )
