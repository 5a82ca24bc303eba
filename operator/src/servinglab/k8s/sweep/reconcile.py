"""The ServingSweep reconciler: trials as child ServingExperiments, rolled up into the sweep's status.

One kopf daemon per sweep runs :func:`reconcile_sweep` every few seconds until it has finished. A
pass reads everything from the API — the sweep and its trials (child experiments labelled with the
sweep's name and owned by its uid) — so an operator restart resumes exactly: finished trials are
results, unfinished ones are running, and the search (a pure function of that history) proposes
only configurations that neither finished nor run. At most `parallelism` trials run at once, and
never more than the GPUs the template's node selector can ever be given; the experiment reconciler
queues what cannot get a GPU yet. Deleting a sweep deletes its trials and their children (owner
references). The experiment reconciler does not know about sweeps.
"""

from __future__ import annotations

import logging

from servinglab.api import (
    API_GROUP,
    API_VERSION,
    KIND,
    SWEEP_KIND,
    SWEEP_LABEL,
    ExperimentSpec,
    ServingSweep,
    SpecError,
    TrialConfig,
    parse_sweep,
    space_size,
    trial_name,
    trial_spec,
)
from servinglab.api import conditions as cond
from servinglab.api.results import ExperimentResults, Runtime, to_json
from servinglab.api.status import ExperimentStatus, SweepStatus
from servinglab.api.trials import SweepResults, SweepSummary, TrialRecord
from servinglab.k8s import metrics as opmetrics
from servinglab.k8s.builders import MANAGED_BY
from servinglab.k8s.client import Kube, Ref
from servinglab.k8s.experiment.gpuqueue import offers
from servinglab.measure.document import experiment_results
from servinglab.servers.base import Manifest
from servinglab.sweep import rollup
from servinglab.sweep.search import propose

ORDER_ANNOTATION = f"{API_GROUP}/trial-order"
LOG = logging.getLogger("servinglab.sweeps")


def trial_manifest(sweep: ServingSweep, uid: str, namespace: str, config: TrialConfig, order: int) -> Manifest:
    """The child experiment of one trial: deterministic name, its configuration in labels, owned by the sweep."""
    name = sweep.metadata.name
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {
            "name": trial_name(name, config),
            "namespace": namespace,
            "labels": {
                SWEEP_LABEL: name,
                f"{API_GROUP}/batch-size": str(config.batch_size),
                f"{API_GROUP}/max-batch-delay-ms": str(config.max_batch_delay_ms),
                f"{API_GROUP}/workers": str(config.workers),
                f"{API_GROUP}/precision": str(config.precision),
                **({f"{API_GROUP}/server-kind": config.kind} if config.kind else {}),
                "app.kubernetes.io/managed-by": MANAGED_BY,
            },
            "annotations": {ORDER_ANNOTATION: str(order)},
            "ownerReferences": [
                {
                    "apiVersion": f"{API_GROUP}/{API_VERSION}",
                    "kind": SWEEP_KIND,
                    "name": name,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],  # fmt: skip
        },
        "spec": trial_spec(sweep.spec, config).model_dump(by_alias=True, mode="json", exclude_none=True),
    }


def sweep_of(body: Manifest) -> ServingSweep:
    """The validated sweep of a stored object (its metadata beyond the name is the API server's)."""
    document = {k: body.get(k) for k in ("apiVersion", "kind", "spec")}
    return parse_sweep(document | {"metadata": {"name": body["metadata"]["name"]}})


def owned_by(child: Manifest, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in child["metadata"].get("ownerReferences", []))


def config_of(child: Manifest) -> TrialConfig:
    """The trial's configuration: its server settings, and its server when the sweep varies it (a label)."""
    server = child["spec"]["server"]
    config = {k: server[k] for k in ("batchSize", "maxBatchDelayMs", "workers", "precision")}
    kind = child["metadata"].get("labels", {}).get(f"{API_GROUP}/server-kind")
    return TrialConfig.model_validate({**config, **({"kind": kind} if kind else {})})


def trial_record(sweep: ServingSweep, child: Manifest) -> TrialRecord | None:
    """The record of a finished trial from its experiment's typed status (None while it runs): the same
    results document a local trial keeps (peak rate with its p99 included), so the same best is picked."""
    status = ExperimentStatus.model_validate(child.get("status") or {})
    if not cond.finished(status.conditions):
        return None
    name, config = child["metadata"]["name"], config_of(child)
    order = int(child["metadata"].get("annotations", {}).get(ORDER_ANNOTATION, 0))
    if cond.is_true(status.conditions, cond.SUCCEEDED):
        spec = ExperimentSpec.model_validate(child["spec"])
        document: ExperimentResults | None = experiment_results(
            name, spec, status.results or [], runtime=Runtime(mode="cluster", server_pod=status.server_pod),
            cold_start_seconds=status.cold_start_seconds, peak_rate=status.peak_rate, ceiling=status.ceiling,
            effective=status.effective,
        )  # fmt: skip
        failure = None
    else:
        failed = cond.get(status.conditions, cond.FAILED)
        document, failure = None, f"{failed.reason if failed else None}: {failed.message if failed else None}"
    # the trial's own time, the same on every pass
    return rollup.record(sweep, name, order, config, document, failure, finished_at=status.finished_at)


async def children(kube: Kube, namespace: str, name: str, uid: str) -> tuple[list[Manifest], set[str]]:
    """(this sweep's trials, names still held by trials of an earlier sweep of the same name)."""
    found = await kube.list(Ref(f"{API_GROUP}/{API_VERSION}", KIND, namespace), label_selector=f"{SWEEP_LABEL}={name}")
    # a re-applied sweep never reads, nor adopts, the trials of the one it replaced (garbage collection takes them)
    return [c for c in found if owned_by(c, uid)], {c["metadata"]["name"] for c in found if not owned_by(c, uid)}


async def gpu_capacity(kube: Kube, sweep: ServingSweep) -> int | None:
    """How many trials could hold a GPU at once (None: the template asks for no GPU)."""
    server = sweep.spec.template.server
    if server.gpus == 0:
        return None
    return sum(offer // server.gpus for offer in offers(await kube.list(Ref("v1", "Node", "")), server))


async def reconcile_sweep(kube: Kube, body: Manifest) -> bool:
    """Start what the search proposes, roll the trials up; True once the sweep has finished."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    ref = Ref(f"{API_GROUP}/{API_VERSION}", SWEEP_KIND, namespace, name)
    status = SweepStatus.model_validate(body.get("status") or {})
    conditions = status.conditions
    if cond.finished(conditions):
        return True
    try:
        sweep = sweep_of(body)
    except SpecError as exc:  # nothing is created for an invalid sweep
        message = "; ".join(exc.problems)
        failed = SweepStatus(conditions=cond.set_condition(conditions, cond.FAILED, True, "InvalidSpec", message),
                             summary=SweepSummary(state="Failed"), finished_at=cond.now())  # fmt: skip
        await kube.patch_status(ref, to_json(failed))
        return True
    started_at = status.started_at or cond.now()
    trials, stale = await children(kube, namespace, name, uid)
    outcomes = [(child, trial_record(sweep, child)) for child in trials]
    records = [record for _, record in outcomes if record is not None]
    running = [config_of(child) for child, record in outcomes if record is None]
    capacity = await gpu_capacity(kube, sweep)
    limit = sweep.spec.parallelism if capacity is None else min(sweep.spec.parallelism, max(capacity, 1))
    proposal = propose(sweep.spec, [rollup.outcome(r) for r in records], running, limit - len(running))
    order = len(trials)
    for config in proposal.configs:
        if trial_name(name, config) in stale:
            continue  # proposed again once the old trial is gone
        await kube.apply(trial_manifest(sweep, uid, namespace, config, order))
        order += 1
        running.append(config)
    finished = proposal.stop_reason is not None and not running
    rolled = rollup.document(sweep, records, proposal.stop_reason if finished else None, started_at)
    size = len(sweep.spec.configurations) if sweep.spec.strategy == "list" else space_size(sweep.spec)
    total = min(size, sweep.spec.max_trials or size)
    best = rolled.best
    summary = SweepSummary(
        state="Succeeded" if finished else "Running", trials_done=len(records), trials_running=len(running),
        trials_total=total, best_config=best.config.label() if best else None,
        best_throughput_rps=best.capacity_rps if best else None,
        best_p99_latency_ms=best.p99_latency_ms if best else None,
    )  # fmt: skip
    if finished:
        stop = str(proposal.stop_reason)
        conditions = cond.set_condition(conditions, cond.SUCCEEDED, True, "Finished", stop)
        conditions = cond.set_condition(conditions, cond.FAILED, False, "Finished", "")
        conditions = cond.set_condition(conditions, cond.RUNNING, False, "Finished", stop)
    else:
        message = f"{len(records)} trials finished, {len(running)} running (at most {limit} at once)"
        conditions = cond.set_condition(conditions, cond.RUNNING, True, "TrialsRunning", message)
    patch = SweepStatus(
        conditions=conditions, summary=summary, trials=rolled.trials, counts=rolled.counts, pruned=rolled.pruned,
        best=rolled.best, best_per_kind=rolled.best_per_kind, front=rolled.front, stop_reason=rolled.stop_reason,
        grid_size=rolled.grid_size,
        started_at=started_at, finished_at=cond.now() if finished else None,
    )  # fmt: skip
    await kube.patch_status(ref, to_json(patch))
    tally = rolled.counts
    counts = {"Succeeded": tally.succeeded, "Infeasible": tally.infeasible, "Pruned": tally.pruned,
              "Running": len(running)}  # fmt: skip
    opmetrics.sweep(namespace, name, sweep.spec.template.model.name, counts, rolled.best, rolled.front)
    return finished


async def sweep_document(kube: Kube, namespace: str, name: str) -> tuple[ServingSweep, SweepResults] | None:
    """A cluster sweep and its full results document, as a local sweep writes it (every trial's points
    included), rebuilt from its trials; None when there is no such sweep."""
    body = await kube.get(Ref(f"{API_GROUP}/{API_VERSION}", SWEEP_KIND, namespace, name))
    if body is None:
        return None
    parsed = sweep_of(body)
    trials, _ = await children(kube, namespace, name, body["metadata"]["uid"])
    records = [record for child in trials if (record := trial_record(parsed, child)) is not None]
    status = SweepStatus.model_validate(body.get("status") or {})
    rolled = rollup.document(parsed, records, status.stop_reason, status.started_at or "")
    return parsed, rolled.model_copy(update={"finished_at": status.finished_at, "summary": status.summary})
