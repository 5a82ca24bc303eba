"""The CPU part of a kubelet's cAdvisor, for the stand-in kubelet's containers: what a real kubelet serves at
`/metrics/cadvisor` and Prometheus scrapes, `container_cpu_usage_seconds_total{namespace, pod, container}`.

A real kubelet reads each container's cgroup; the stand-in's containers are process trees, so a container's
counter is the CPU seconds of its live processes plus those of their children that ended and were waited
for (what the cgroup would have counted for them). A counter never goes down (a worker that ends without
being waited for takes its seconds with it; the counter keeps its last value), as a cgroup's does not.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import psutil

from clusterenv.textendpoint import TextEndpoint

#: (pod, container) -> the pid of the container's main process.
Containers = Callable[[], dict[tuple[str, str], int]]


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of the process, its descendants and their waited-for children (None: it is gone)."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for process in tree:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


class CAdvisor:
    """Serves the namespace's containers' CPU counters on a loopback port until stopped."""

    def __init__(self, namespace: str, containers: Containers) -> None:
        self.namespace = namespace
        self._containers = containers
        self._counters: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._endpoint = TextEndpoint(self.render, "cadvisor")
        self.port = self._endpoint.port

    def start(self) -> CAdvisor:
        self._endpoint.start()
        return self

    def stop(self) -> None:
        self._endpoint.stop()

    def render(self) -> str:
        with self._lock:
            for key, pid in self._containers().items():
                if (seconds := tree_cpu_seconds(pid)) is not None:
                    self._counters[key] = max(seconds, self._counters.get(key, 0.0))
            counters = dict(self._counters)
        lines = ["# HELP container_cpu_usage_seconds_total Cumulative cpu time consumed in seconds.",
                 "# TYPE container_cpu_usage_seconds_total counter"]  # fmt: skip
        for (pod, container), seconds in sorted(counters.items()):
            labels = f'container="{container}",cpu="total",namespace="{self.namespace}",pod="{pod}"'
            lines.append(f"container_cpu_usage_seconds_total{{{labels}}} {seconds:.6f}")
        return "\n".join(lines) + "\n"
