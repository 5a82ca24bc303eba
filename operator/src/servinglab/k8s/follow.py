"""`servinglab run FILE --cluster` and `servinglab results NAME`: the client side of the operator.

Applies an experiment to the current kubeconfig's cluster, follows its conditions until it has
Succeeded or Failed, and turns its typed status into the same results document a local run produces
(:func:`servinglab.measure.document.experiment_results`), so the table is the same: trust warnings,
peak rate and ceiling included. A sweep's document is rebuilt from its trials as the reconciler does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from servinglab.api import GROUP_VERSION, KIND, ExperimentSpec, ServingExperiment, ServingSweep
from servinglab.api import conditions as cond
from servinglab.api.results import ExperimentResults, PeakRate, Runtime
from servinglab.api.states import ExperimentState
from servinglab.api.status import ExperimentStatus
from servinglab.api.trials import SweepResults
from servinglab.k8s.client import Kube, KubeError, Ref
from servinglab.measure.document import experiment_results
from servinglab.servers.base import Manifest


@dataclass(frozen=True)
class ClusterExperiment:
    """A cluster experiment as a results document, its state (None: the operator has written none yet), and
    why it failed (if it did)."""

    results: ExperimentResults
    state: ExperimentState | None
    failure: str | None


@dataclass(frozen=True)
class ClusterSweep:
    sweep: ServingSweep
    results: SweepResults


def _ref(namespace: str, name: str) -> Ref:
    return Ref(GROUP_VERSION, KIND, namespace, name)


def experiment_of(body: Manifest) -> ClusterExperiment:
    """The results document of a stored experiment, from its spec and its status."""
    name = body["metadata"]["name"]
    try:
        spec = ExperimentSpec.model_validate(body["spec"])
        status = ExperimentStatus.model_validate(body.get("status") or {})
    except ValidationError as exc:
        raise KubeError(f"{KIND} {name} cannot be read: {exc.errors()[0]['msg']}") from None
    summary = status.summary
    peak = status.peak_rate
    if peak is None and summary is not None and summary.peak_rate_rps is not None:
        peak = PeakRate(rate_rps=summary.peak_rate_rps)  # a status written before the peak rate was typed
    document = experiment_results(
        name, spec, status.results or [],
        runtime=Runtime(mode="cluster", server_pod=status.server_pod, server_replicas=status.server_replicas,
                        form=status.form),
        cold_start_seconds=status.cold_start_seconds,
        peak_rate=peak, utilisation=status.utilisation, ceiling=status.ceiling, model=status.model,
        started_at=status.started_at,
        finished_at=status.finished_at, effective=status.effective, price=status.price,
    ).model_copy(update={"conditions": status.conditions, "generator": None})  # fmt: skip
    failed = cond.get(status.conditions, cond.FAILED)
    failure = f"{failed.reason}: {failed.message}" if failed is not None and failed.status == "True" else None
    return ClusterExperiment(document, summary.state if summary is not None else None, failure)


async def _apply_and_follow(
    experiment: ServingExperiment, namespace: str, report: Callable[[str], None], timeout: float
) -> Manifest:
    kube = await Kube.connect()
    try:
        manifest = experiment.model_dump(by_alias=True, mode="json", exclude_none=True)
        manifest["metadata"] = {"name": experiment.metadata.name, "namespace": namespace}
        await kube.create(manifest)
        report(f"applied {KIND} {namespace}/{experiment.metadata.name}")
        return await _follow(kube, namespace, experiment.metadata.name, report, timeout)
    finally:
        await kube.close()


async def _follow(kube: Kube, namespace: str, name: str, report: Callable[[str], None], timeout: float) -> Manifest:
    seen: set[tuple[str, str, str]] = set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        body = await kube.get(_ref(namespace, name))
        if body is None:
            raise LookupError(f"{KIND} {namespace}/{name} disappeared")
        conditions = ExperimentStatus.model_validate(body.get("status") or {}).conditions
        for condition in conditions:
            key = (condition.type, condition.status, condition.reason)
            if key not in seen:
                seen.add(key)
                report(f"{condition.type}={condition.status} {condition.reason}: {condition.message}")
        if cond.finished(conditions):
            return body
        await asyncio.sleep(2)
    raise TimeoutError(f"{KIND} {namespace}/{name} did not finish within {timeout:.0f} s")


def run_on_cluster(
    experiment: ServingExperiment, namespace: str, report: Callable[[str], None], timeout: float
) -> ClusterExperiment:
    return experiment_of(asyncio.run(_apply_and_follow(experiment, namespace, report, timeout)))


def fetch(namespace: str, name: str) -> ClusterExperiment | None:
    async def get() -> Manifest | None:
        kube = await Kube.connect()
        try:
            return await kube.get(_ref(namespace, name))
        finally:
            await kube.close()

    body = asyncio.run(get())
    return experiment_of(body) if body is not None else None


def fetch_sweep(namespace: str, name: str) -> ClusterSweep | None:
    """The sweep and its results document, rebuilt from its trials as the reconciler does
    (:func:`servinglab.k8s.sweep.reconcile.sweep_document`)."""
    from servinglab.k8s.sweep.reconcile import sweep_document

    async def get() -> ClusterSweep | None:
        kube = await Kube.connect()
        try:
            found = await sweep_document(kube, namespace, name)
        finally:
            await kube.close()
        return ClusterSweep(*found) if found is not None else None

    return asyncio.run(get())
