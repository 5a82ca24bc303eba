"""A namespace's pods and events as text, for the failure messages of the tests on the real node.

A pod that cannot start on the real node (an image not unpacked, a probe failing, a security context
refused) says why only in its status, its events and its containers' logs; the real-node tests
(tests/k8s/real_node) put all of that in their assertion messages through `describe`.
"""

from __future__ import annotations

import json
from typing import Any

from clusterenv.controlplane import Cluster
from clusterenv.node import REAL_NODE_NAME


def describe(cluster: Cluster, namespace: str) -> str:
    """Where each pod stands and the namespace's latest events (first: a CI summary shows the start of a
    failure), then the pods described, their containers' logs and every pod bound to the real node (any
    namespace's: one holding its GPU keeps the experiment queued): what a failure needs to be read."""
    pods = cluster.kubectl.get("pods", "-n", namespace)["items"]
    listed = cluster.kubectl.run("get", "events", "-n", namespace, "-o", "json", check=False)
    events = json.loads(listed.stdout)["items"] if listed.returncode == 0 else []
    latest = sorted(events, key=event_time)[-10:]
    summary = [f"pod {pod_state(pod)}" for pod in pods]
    summary += [f"event {e['involvedObject'].get('name')}: {e.get('reason')} x{event_count(e)}: "
                f"{(e.get('message') or '')[:160]}" for e in latest]  # fmt: skip
    operator = cluster.kubectl.run("logs", "-n", namespace, "-l", "app.kubernetes.io/component=operator",
                                   "--tail=6", check=False).stdout  # fmt: skip
    summary += [f"operator: {line[:200]}" for line in operator.splitlines()]
    described = cluster.kubectl.run("describe", "pods", "-n", namespace, check=False).stdout[-6000:]
    logs = [
        f"--- {pod['metadata']['name']}/{container['name']}\n"
        + cluster.kubectl.run(
            "logs", pod["metadata"]["name"], "-c", container["name"], "-n", namespace, "--tail=40", check=False
        ).stdout
        for pod in pods
        for container in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
    ]
    on_node = cluster.kubectl.run("get", "pods", "-A", "-o", "wide", "--field-selector",
                                  f"spec.nodeName={REAL_NODE_NAME}", check=False)  # fmt: skip
    return "\n".join([*summary, described, *logs, f"--- pods on {REAL_NODE_NAME}:", on_node.stdout or on_node.stderr])


def event_time(event: dict[str, Any]) -> str:
    """When an event last happened: a repeated one written through events.k8s.io (the scheduler's) keeps it
    in its series, with no lastTimestamp."""
    series = event.get("series") or {}
    return str(series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime") or "")


def event_count(event: dict[str, Any]) -> int:
    return int((event.get("series") or {}).get("count") or event.get("count") or 1)


def pod_state(pod: dict[str, Any]) -> str:
    """`name phase on node; container: state (reason: message)` for each container, init containers first."""
    status = pod.get("status", {})
    containers = [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]
    states = []
    for container in containers:
        state, detail = next(iter((container.get("state") or {}).items()), ("unknown", {}))
        why = ": ".join(str(detail[key])[:160] for key in ("reason", "message") if detail.get(key))
        states.append(f"{container['name']} {state}{' ready' if container.get('ready') else ''}"
                      f"{f' ({why})' if why else ''} restarts {container.get('restartCount', 0)}")  # fmt: skip
    unscheduled = [c.get("message", "") for c in status.get("conditions", []) if c.get("reason") == "Unschedulable"]
    return (f"{pod['metadata']['name']} {status.get('phase')} on {pod['spec'].get('nodeName') or '(none)'}; "
            + "; ".join(states + unscheduled))  # fmt: skip
