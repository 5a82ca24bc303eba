"""ServingExperiments for the cluster tests, and waiting for their outcome."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from clusterenv.controlplane import Cluster
from clusterenv.kubectl import ClusterError
from servinglab.api import GROUP_VERSION, PLURAL
from support import manifests


def experiment(name: str, prometheus_url: str | None = None, **server: Any) -> dict[str, Any]:
    """The tiny model on one simulated T4, two short levels; `server` overrides spec.server fields."""
    return manifests.experiment(
        name,
        server={
            "batchSize": 4,
            "maxBatchDelayMs": 5,
            "workers": 1,
            "precision": "fp32",
            "gpus": 1,
            "nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            **server,
        },
        load={"concurrency": [1, 4], "warmupSeconds": 1, "durationSeconds": 3},
        slo={"p99LatencyMs": 5000},
        metrics={"prometheusUrl": prometheus_url} if prometheus_url else {},
    )


def sweep(name: str, template: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A ServingSweep of `template` (an experiment's spec); `spec` is the rest of the sweep's spec."""
    return manifests.sweep(name, template=template, **spec)


def wait_finished(
    cluster: Cluster, namespace: str, name: str, operator_log: Callable[[], str], timeout: float = 240
) -> dict[str, Any]:
    """Wait until the experiment is Succeeded or Failed; return it. On timeout fail with its conditions and
    the operator's log."""
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    path = f"/apis/{GROUP_VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
    while time.monotonic() < deadline:
        try:
            found = cluster.kubectl.read(path)
        except ClusterError:  # the API server stopped for a moment (some tests stop it): ask again
            found = None
        if found is None:  # not applied yet
            time.sleep(1)
            continue
        body = found
        conditions = {c["type"]: c for c in body.get("status", {}).get("conditions", [])}
        if any(conditions.get(kind, {}).get("status") == "True" for kind in ("Succeeded", "Failed")):
            return body
        time.sleep(1)
    said = " | ".join(f"{c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
                      for c in body.get("status", {}).get("conditions", []))  # fmt: skip
    # the first line is what a test summary shows: where the experiment waits and why
    pytest.fail(f"{name} did not finish in {timeout} s; its conditions: {said or '(none)'}\n"
                f"operator log:\n{operator_log()}")  # fmt: skip


def condition(body: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in body["status"]["conditions"] if c["type"] == kind)
