"""`servinglab run FILE --cluster` and `servinglab results NAME`: the client side of the operator.

Applies an experiment to the current kubeconfig's cluster, follows its conditions until it has
Succeeded or Failed, and turns its status into the same results document (and so the same table)
a local run produces.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from servinglab.k8s import conditions as cond
from servinglab.k8s.kube import Kube, Ref
from servinglab.spec import API_GROUP, API_VERSION, KIND, ServingExperiment
from servinglab.sweepspec import ServingSweep


def _ref(namespace: str, name: str) -> Ref:
    return Ref(f"{API_GROUP}/{API_VERSION}", KIND, namespace, name)


def status_document(body: dict[str, Any]) -> dict[str, Any]:
    """The local results layout, from an experiment's spec and status (for the same table)."""
    spec, status = body["spec"], body.get("status") or {}
    server = spec.get("server", {})
    summary = status.get("summary") or {}
    best = None
    if "bestThroughputRps" in summary:
        level = (
            {"concurrency": summary["bestConcurrency"]}
            if "bestConcurrency" in summary
            else {"rateRps": summary.get("bestRateRps")}
        )
        best = {**level, "throughputRps": summary["bestThroughputRps"], "p99LatencyMs": summary.get("bestP99LatencyMs")}
    slo = (spec.get("slo") or {}).get("p99LatencyMs")
    return {
        "experiment": body["metadata"]["name"],
        "model": spec["model"]["name"],
        "server": {k: server.get(k) for k in ("batchSize", "maxBatchDelayMs", "workers", "precision")},
        "slo": {"p99LatencyMs": slo} if slo is not None else None,
        "coldStartSeconds": status.get("coldStartSeconds", 0.0),
        "results": status.get("results", []),
        "best": best,
        "runtime": {"mode": "cluster", "serverPod": status.get("serverPod")},
        "conditions": status.get("conditions", []),
    }


async def _apply_and_follow(
    experiment: ServingExperiment, namespace: str, report: Callable[[str], None], timeout: float
) -> dict[str, Any]:
    kube = await Kube.connect()
    try:
        manifest = experiment.model_dump(by_alias=True, mode="json", exclude_none=True)
        manifest["metadata"] = {"name": experiment.metadata.name, "namespace": namespace}
        await kube.create(manifest)
        report(f"applied {KIND} {namespace}/{experiment.metadata.name}")
        return await _follow(kube, namespace, experiment.metadata.name, report, timeout)
    finally:
        await kube.close()


async def _follow(
    kube: Kube, namespace: str, name: str, report: Callable[[str], None], timeout: float
) -> dict[str, Any]:
    seen: set[tuple[str, str, str]] = set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        body = await kube.get(_ref(namespace, name))
        if body is None:
            raise LookupError(f"{KIND} {namespace}/{name} disappeared")
        conditions = (body.get("status") or {}).get("conditions", [])
        for condition in conditions:
            key = (condition["type"], condition["status"], condition.get("reason", ""))
            if key not in seen:
                seen.add(key)
                report(f"{condition['type']}={condition['status']} {condition.get('reason', '')}: "
                       f"{condition.get('message', '')}")  # fmt: skip
        if cond.finished(conditions):
            return body
        await asyncio.sleep(2)
    raise TimeoutError(f"{KIND} {namespace}/{name} did not finish within {timeout:.0f} s")


def run_on_cluster(
    experiment: ServingExperiment, namespace: str, report: Callable[[str], None], timeout: float
) -> dict[str, Any]:
    return asyncio.run(_apply_and_follow(experiment, namespace, report, timeout))


def fetch(namespace: str, name: str) -> dict[str, Any] | None:
    async def get() -> dict[str, Any] | None:
        kube = await Kube.connect()
        try:
            return await kube.get(_ref(namespace, name))
        finally:
            await kube.close()

    return asyncio.run(get())


def fetch_sweep(namespace: str, name: str) -> tuple[ServingSweep, dict[str, Any]] | None:
    """The sweep and its results document rebuilt from its trials (:func:`servinglab.k8s.sweeps.sweep_document`)."""
    from servinglab.k8s.sweeps import sweep_document

    async def get() -> tuple[ServingSweep, dict[str, Any]] | None:
        kube = await Kube.connect()
        try:
            return await sweep_document(kube, namespace, name)
        finally:
            await kube.close()

    return asyncio.run(get())
