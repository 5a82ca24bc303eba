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
from typing import Any

from servinglab.k8s import conditions as cond
from servinglab.k8s import gpuqueue, opmetrics
from servinglab.k8s.client import Kube, Ref
from servinglab.k8s.resources import MANAGED_BY
from servinglab.api import API_GROUP, API_VERSION, KIND, SpecError
from servinglab.sweep import rollup
from servinglab.sweep.search import propose
from servinglab.api import SWEEP_KIND, ServingSweep, TrialConfig, parse_sweep, space_size, trial_name, trial_spec

SWEEP_PLURAL = "servingsweeps"
SWEEP_LABEL = f"{API_GROUP}/sweep"
ORDER_ANNOTATION = f"{API_GROUP}/trial-order"
LOG = logging.getLogger("servinglab.sweeps")

#: Status fields of the rolled-up document (the points of every trial stay with the trials).
_STATUS_FIELDS = ("trials", "counts", "pruned", "best", "front", "stopReason", "gridSize")


def trial_manifest(sweep: ServingSweep, uid: str, namespace: str, config: TrialConfig, order: int) -> dict[str, Any]:
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


def sweep_of(body: dict[str, Any]) -> ServingSweep:
    """The validated sweep of a stored object (its metadata beyond the name is the API server's)."""
    document = {k: body.get(k) for k in ("apiVersion", "kind", "spec")}
    return parse_sweep(document | {"metadata": {"name": body["metadata"]["name"]}})


def owned_by(child: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in child["metadata"].get("ownerReferences", []))


def config_of(child: dict[str, Any]) -> TrialConfig:
    server = child["spec"]["server"]
    return TrialConfig.model_validate({k: server[k] for k in ("batchSize", "maxBatchDelayMs", "workers", "precision")})


def trial_record(sweep: ServingSweep, child: dict[str, Any]) -> dict[str, Any] | None:
    """The record of a finished trial from its experiment's status (None while it runs)."""
    status = child.get("status") or {}
    conditions = list(status.get("conditions") or [])
    if not cond.finished(conditions):
        return None
    name, config = child["metadata"]["name"], config_of(child)
    order = int(child["metadata"].get("annotations", {}).get(ORDER_ANNOTATION, 0))
    if cond.is_true(conditions, cond.SUCCEEDED):
        summary = status.get("summary") or {}
        document: dict[str, Any] = {
            "results": status.get("results") or [],
            "coldStartSeconds": status.get("coldStartSeconds"),
        }
        if summary.get("peakRateRps") is not None:
            document["peakRate"] = {"rateRps": summary["peakRateRps"], "p99LatencyMs": None}
        entry = rollup.record(sweep, name, order, config, document, None)
    else:
        failed = cond.get(conditions, cond.FAILED) or {}
        entry = rollup.record(sweep, name, order, config, None, f"{failed.get('reason')}: {failed.get('message')}")
    entry["finishedAt"] = status.get("finishedAt")  # the trial's own time, the same on every pass
    return entry


async def children(kube: Kube, namespace: str, name: str, uid: str) -> tuple[list[dict[str, Any]], set[str]]:
    """(this sweep's trials, names still held by trials of an earlier sweep of the same name)."""
    found = await kube.list(Ref(f"{API_GROUP}/{API_VERSION}", KIND, namespace), label_selector=f"{SWEEP_LABEL}={name}")
    # a re-applied sweep never reads, nor adopts, the trials of the one it replaced (garbage collection takes them)
    return [c for c in found if owned_by(c, uid)], {c["metadata"]["name"] for c in found if not owned_by(c, uid)}


async def gpu_capacity(kube: Kube, sweep: ServingSweep) -> int | None:
    """How many trials could hold a GPU at once (None: the template asks for no GPU)."""
    server = sweep.spec.template.server
    if server.gpus == 0:
        return None
    return sum(offer // server.gpus for offer in gpuqueue.offers(await kube.list(Ref("v1", "Node", "")), server))


async def reconcile_sweep(kube: Kube, body: dict[str, Any]) -> bool:
    """Start what the search proposes, roll the trials up; True once the sweep has finished."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    ref = Ref(f"{API_GROUP}/{API_VERSION}", SWEEP_KIND, namespace, name)
    status = dict(body.get("status") or {})
    conditions = list(status.get("conditions") or [])
    if cond.finished(conditions):
        return True
    try:
        sweep = sweep_of(body)
    except SpecError as exc:  # nothing is created for an invalid sweep
        message = "; ".join(exc.problems)
        failed = cond.set_condition(conditions, cond.FAILED, True, "InvalidSpec", message)
        await kube.patch_status(ref, {"conditions": failed, "summary": {"state": "Failed"}, "finishedAt": cond.now()})
        return True
    started_at = status.get("startedAt") or cond.now()
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
    best = rolled["best"]
    summary = {
        "state": "Succeeded" if finished else "Running",
        "trialsDone": len(records),
        "trialsRunning": len(running),
        "trialsTotal": total,
        **(
            {
                "bestConfig": TrialConfig.model_validate(best["config"]).label(),
                "bestThroughputRps": best["capacityRps"],
                "bestP99LatencyMs": best["p99LatencyMs"],
            }
            if best
            else {}
        ),  # fmt: skip
    }
    if finished:
        conditions = cond.set_condition(conditions, cond.SUCCEEDED, True, "Finished", str(proposal.stop_reason))
        conditions = cond.set_condition(conditions, cond.FAILED, False, "Finished", "")
    else:
        message = f"{len(records)} trials finished, {len(running)} running (at most {limit} at once)"
        conditions = cond.set_condition(conditions, "Running", True, "TrialsRunning", message)
    patch = {k: rolled[k] for k in _STATUS_FIELDS} | {
        "summary": summary,
        "conditions": conditions,
        "startedAt": started_at,
    }
    if finished:
        patch["finishedAt"] = cond.now()
        patch["conditions"] = cond.set_condition(conditions, "Running", False, "Finished", str(proposal.stop_reason))
    await kube.patch_status(ref, patch)
    tally = rolled["counts"]
    counts = {"Succeeded": tally["Succeeded"], "Infeasible": tally["Infeasible"], "Pruned": tally["pruned"],
              "Running": len(running)}  # fmt: skip
    opmetrics.sweep(namespace, name, sweep.spec.template.model.name, counts, best, rolled["front"])
    return finished


async def sweep_document(kube: Kube, namespace: str, name: str) -> tuple[ServingSweep, dict[str, Any]] | None:
    """A cluster sweep and its full results document, as a local sweep writes it (every trial's points
    included), rebuilt from its trials; None when there is no such sweep."""
    body = await kube.get(Ref(f"{API_GROUP}/{API_VERSION}", SWEEP_KIND, namespace, name))
    if body is None:
        return None
    parsed = sweep_of(body)
    trials, _ = await children(kube, namespace, name, body["metadata"]["uid"])
    records = [record for child in trials if (record := trial_record(parsed, child)) is not None]
    status = body.get("status") or {}
    rolled = rollup.document(parsed, records, status.get("stopReason"), status.get("startedAt") or "")
    rolled["finishedAt"] = status.get("finishedAt")
    rolled["summary"] = status.get("summary")
    return parsed, rolled
