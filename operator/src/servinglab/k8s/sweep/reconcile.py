"""The ServingSweep reconciler: trials as child ServingExperiments, rolled up into the sweep's status.

One kopf daemon per sweep runs :func:`reconcile_sweep` every few seconds until it has finished. A
pass reads everything from the API — the sweep and its trials (child experiments labelled with the
sweep's name and owned by its uid) — so an operator restart resumes exactly: finished trials are
results, unfinished ones are running, and the search (a pure function of that history) proposes
only configurations that neither finished nor run. At most `parallelism` trials run at once, and
never more than the GPUs the template's node selector can ever be given; the experiment reconciler
queues what cannot get a GPU yet. When the search has stopped, the best few trials are measured again in
alternating rounds (:mod:`servinglab.sweep.confirm`): each run is a child experiment `<trial>-r<round>`
annotated with the trial it confirms, and a round starts when the one before it has finished. Deleting a
sweep deletes its trials and their children (owner references). The experiment reconciler does not know
about sweeps. A sweep fails (:func:`end_sweep`) on an invalid spec, on a trial the API server refuses for
good, or once its passes have kept failing for `failingSeconds` (the daemon's bound, k8s/main.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from servinglab.api import (
    API_GROUP,
    GROUP_VERSION,
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
from servinglab.api.reasons import Reason
from servinglab.api.results import ExperimentResults, Runtime, to_json
from servinglab.api.states import SweepState
from servinglab.api.status import ExperimentStatus, SweepStatus
from servinglab.api.trials import SweepBest, SweepCounts, SweepPoint, SweepResults, SweepSummary, TrialRecord
from servinglab.k8s import metrics as opmetrics
from servinglab.k8s.builders import MANAGED_BY
from servinglab.k8s.client import Kube, KubeError, Ref
from servinglab.k8s.experiment.admission import GpuQueue
from servinglab.measure.document import experiment_results
from servinglab.servers.base import Manifest
from servinglab.sweep import confirm, rollup
from servinglab.sweep.search import propose

ORDER_ANNOTATION = f"{API_GROUP}/trial-order"
CONFIRMS_ANNOTATION = f"{API_GROUP}/confirms"
ROUND_ANNOTATION = f"{API_GROUP}/confirm-round"
LOG = logging.getLogger("servinglab.sweeps")


def trial_manifest(
    sweep: ServingSweep, uid: str, namespace: str, config: TrialConfig, order: int, run: confirm.Run | None = None
) -> Manifest:
    """The child experiment of one trial (or of one confirmation `run`): deterministic name, its configuration
    in labels, owned by the sweep."""
    name = sweep.metadata.name
    annotations = {ORDER_ANNOTATION: str(order)}
    if run is not None:
        annotations |= {CONFIRMS_ANNOTATION: run.trial.name, ROUND_ANNOTATION: str(run.round)}
    return {
        "apiVersion": GROUP_VERSION,
        "kind": KIND,
        "metadata": {
            "name": trial_name(name, config, run.round if run is not None else 0),
            "namespace": namespace,
            "labels": {
                SWEEP_LABEL: name,
                f"{API_GROUP}/batch-size": str(config.batch_size),
                f"{API_GROUP}/max-batch-delay-ms": str(config.max_batch_delay_ms),
                f"{API_GROUP}/workers": str(config.workers),
                f"{API_GROUP}/precision": str(config.precision),
                f"{API_GROUP}/data-path": config.path.label() or "default",
                **({f"{API_GROUP}/server-kind": config.kind} if config.kind else {}),
                **({f"{API_GROUP}/form": str(config.form)} if config.form else {}),
                "app.kubernetes.io/managed-by": MANAGED_BY,
            },
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": GROUP_VERSION,
                    "kind": SWEEP_KIND,
                    "name": name,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": trial_spec(sweep.spec, config).model_dump(by_alias=True, mode="json", exclude_none=True),
    }


def sweep_of(body: Manifest, prices_elsewhere: bool = True) -> ServingSweep:
    """The validated sweep of a stored object (its metadata beyond the name is the API server's).
    `prices_elsewhere`: the operator's chart prices the nodes its trials run on (a stored sweep read back
    was accepted by an operator: it is)."""
    document = {k: body.get(k) for k in ("apiVersion", "kind", "spec")}
    return parse_sweep(document | {"metadata": {"name": body["metadata"]["name"]}}, prices_elsewhere=prices_elsewhere)


def owned_by(child: Manifest, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in child["metadata"].get("ownerReferences", []))


def config_of(child: Manifest) -> TrialConfig:
    """The trial's configuration: its server settings, and its server when the sweep varies it (a label)."""
    server = child["spec"]["server"]
    keys = ("batchSize", "maxBatchDelayMs", "workers", "precision", "dataPath", "form")
    config = {k: server[k] for k in keys if k in server}
    kind = child["metadata"].get("labels", {}).get(f"{API_GROUP}/server-kind")
    return TrialConfig.model_validate({**config, **({"kind": kind} if kind else {})})


def trial_record(sweep: ServingSweep, child: Manifest) -> TrialRecord | None:
    """The record of a finished trial from its experiment's typed status (None while it runs): the same
    results document a local trial keeps (peak rate with its p99 included), so the same best is picked."""
    status = ExperimentStatus.model_validate(child.get("status") or {})
    if not cond.finished(status.conditions):
        return None
    name, config = child["metadata"]["name"], config_of(child)
    annotations = child["metadata"].get("annotations", {})
    order = int(annotations.get(ORDER_ANNOTATION, 0))
    if cond.is_true(status.conditions, cond.SUCCEEDED):
        spec = ExperimentSpec.model_validate(child["spec"])
        document: ExperimentResults | None = experiment_results(
            name, spec, status.results or [],
            runtime=Runtime(mode="cluster", server_pod=status.server_pod, server_replicas=status.server_replicas,
                        form=status.form),
            cold_start_seconds=status.cold_start_seconds, peak_rate=status.peak_rate, ceiling=status.ceiling,
            utilisation=status.utilisation,
            effective=status.effective, price=status.price,
        )  # fmt: skip
        failure = None
    else:
        failed = cond.get(status.conditions, cond.FAILED)
        document, failure = None, f"{failed.reason if failed else None}: {failed.message if failed else None}"
    # the trial's own time, the same on every pass
    record = rollup.record(sweep, name, order, config, document, failure, finished_at=status.finished_at)
    if CONFIRMS_ANNOTATION in annotations:
        record = record.model_copy(
            update={"confirms": annotations[CONFIRMS_ANNOTATION], "round": int(annotations.get(ROUND_ANNOTATION, 0))}
        )
    return record


def is_confirmation(child: Manifest) -> bool:
    return CONFIRMS_ANNOTATION in child["metadata"].get("annotations", {})


async def children(kube: Kube, namespace: str, name: str, uid: str) -> tuple[list[Manifest], set[str]]:
    """(this sweep's trials, names still held by trials of an earlier sweep of the same name)."""
    found = await kube.list(Ref(GROUP_VERSION, KIND, namespace), label_selector=f"{SWEEP_LABEL}={name}")
    # a re-applied sweep never reads, nor adopts, the trials of the one it replaced (garbage collection takes them)
    return [c for c in found if owned_by(c, uid)], {c["metadata"]["name"] for c in found if not owned_by(c, uid)}


async def gpu_capacity(queue: GpuQueue, namespace: str, sweep: ServingSweep) -> int | None:
    """How many trials could hold a GPU at once (None: the template asks for no GPU), from the GPU queue's
    cache of the nodes (with the namespace's pod defaults)."""
    server = sweep.spec.template.server
    if server.gpus == 0:
        return None
    await queue.refresh({namespace})
    return queue.capacity(namespace, server)


@dataclass
class Pass:
    """One pass's view of the trials: finished (search trials and confirmation runs) and under way."""

    records: list[TrialRecord]
    confirmations: list[TrialRecord]
    running: list[TrialConfig]
    confirming: list[str]

    @classmethod
    def read(cls, sweep: ServingSweep, trials: list[Manifest]) -> Pass:
        outcomes = [(child, trial_record(sweep, child)) for child in trials]
        finished = [record for _, record in outcomes if record is not None]
        unfinished = [child for child, record in outcomes if record is None]
        return cls(
            records=[record for record in finished if record.confirms is None],
            confirmations=[record for record in finished if record.confirms is not None],
            running=[config_of(child) for child in unfinished if not is_confirmation(child)],
            confirming=[child["metadata"]["name"] for child in unfinished if is_confirmation(child)],
        )


async def start_next(kube: Kube, sweep: ServingSweep, uid: str, namespace: str, stale: set[str], now: Pass,
                     limit: int, order: int) -> str | None:  # fmt: skip
    """Start what the search proposes, or once it has stopped, the confirmation runs due (within `limit`
    trials at once); `now` is updated with what was started. Returns the search's stop reason."""
    name = sweep.metadata.name
    room = limit - len(now.running) - len(now.confirming)
    proposal = propose(sweep.spec, [rollup.outcome(r, sweep.spec.objective) for r in now.records], now.running, room)
    for config in proposal.configs:
        if trial_name(name, config) in stale:
            continue  # proposed again once the old trial is gone
        await kube.apply(trial_manifest(sweep, uid, namespace, config, order))
        order += 1
        now.running.append(config)
    if proposal.stop_reason is None or now.running:
        return proposal.stop_reason
    for run in confirm.pending(sweep.spec, now.records, now.confirmations, now.confirming, limit - len(now.confirming)):
        if trial_name(name, run.trial.config, run.round) in stale:
            continue
        await kube.apply(trial_manifest(sweep, uid, namespace, run.trial.config, order, run))
        order += 1
        now.confirming.append(trial_name(name, run.trial.config, run.round))
    return proposal.stop_reason


async def reconcile_sweep(kube: Kube, body: Manifest, queue: GpuQueue, chart_prices: bool = False) -> bool:
    """Start what the search proposes, roll the trials up; True once the sweep has finished. `chart_prices`:
    the chart prices nodes (a cost objective then needs no template price)."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    ref = Ref(GROUP_VERSION, SWEEP_KIND, namespace, name)
    status = SweepStatus.model_validate(body.get("status") or {})
    conditions = status.conditions
    if cond.finished(conditions):
        # its series again, from what it ended with: this process may have started since (a restart, a
        # new leader), or another replica wrote the last pass
        model = (((body.get("spec") or {}).get("template") or {}).get("model") or {}).get("name", "")
        publish(
            namespace,
            name,
            str(model),
            status.counts or SweepCounts(),
            0,
            status.best,
            status.front or [],
            status.cost_front or [],
        )
        return True
    try:
        sweep = sweep_of(body, prices_elsewhere=chart_prices)
    except SpecError as exc:  # nothing is created for an invalid sweep
        await end_sweep(kube, body, Reason.INVALID_SPEC, "; ".join(exc.problems))
        return True
    started_at = status.started_at or cond.now()
    trials, stale = await children(kube, namespace, name, uid)
    now = Pass.read(sweep, trials)
    capacity = await gpu_capacity(queue, namespace, sweep)
    limit = sweep.spec.parallelism if capacity is None else min(sweep.spec.parallelism, max(capacity, 1))
    try:
        stop_reason = await start_next(kube, sweep, uid, namespace, stale, now, limit, len(trials))
    except KubeError as exc:
        if not exc.refusal:
            raise  # the next pass tries again; passes that keep failing end the sweep (main._drive)
        await end_sweep(kube, body, Reason.REJECTED, f"the API server refused a trial: {exc}")
        return True
    searched = stop_reason is not None and not now.running
    finished = searched and not now.confirming
    records, confirmations, running, confirming = now.records, now.confirmations, now.running, now.confirming
    rolled = rollup.document(sweep, records, stop_reason if finished else None, started_at, confirmations)
    size = space_size(sweep.spec)
    total = min(size, sweep.spec.max_trials or size)
    best = rolled.best
    summary = SweepSummary(
        state=SweepState.SUCCEEDED if finished else SweepState.RUNNING, trials_done=len(records),
        trials_running=len(running), trials_total=total, best_config=best.config.label() if best else None,
        best_throughput_rps=best.capacity_rps if best else None,
        best_p99_latency_ms=best.p99_latency_ms if best else None,
        winner=best.confidence if best else None,
    )  # fmt: skip
    if finished:
        stop = str(stop_reason)
        conditions = cond.set_condition(conditions, cond.SUCCEEDED, True, Reason.FINISHED, stop)
        conditions = cond.set_condition(conditions, cond.FAILED, False, Reason.FINISHED, "")
        conditions = cond.set_condition(conditions, cond.RUNNING, False, Reason.FINISHED, stop)
    else:
        message = f"{len(records)} trials finished, {len(running)} running (at most {limit} at once)"
        if searched:
            message = (f"the search stopped; confirming the best: {len(confirmations)} runs finished, "
                       f"{len(confirming)} running")  # fmt: skip
        conditions = cond.set_condition(conditions, cond.RUNNING, True, Reason.TRIALS_RUNNING, message)
    patch = SweepStatus(
        conditions=conditions, summary=summary, trials=rolled.trials, counts=rolled.counts, pruned=rolled.pruned,
        best=rolled.best, best_per_kind=rolled.best_per_kind, confirmation=rolled.confirmation, front=rolled.front,
        cost_front=rolled.cost_front, cost_front_reason=rolled.cost_front_reason,
        stop_reason=rolled.stop_reason,
        grid_size=rolled.grid_size,
        started_at=started_at, finished_at=cond.now() if finished else None,
    )  # fmt: skip
    written = to_json(patch)
    # a merge patch keeps a field it leaves out: whichever of the cost front and its reason is absent now
    # (the reason an early pass wrote, before a priced point) is deleted, by a null
    written |= {key: None for key in ("costFront", "costFrontReason") if key not in written}
    await kube.patch_status(ref, written)
    model = sweep.spec.template.model.name
    publish(
        namespace,
        name,
        model,
        rolled.counts,
        len(running) + len(confirming),
        rolled.best,
        rolled.front,
        rolled.cost_front or [],
    )
    return finished


async def end_sweep(kube: Kube, body: Manifest, reason: Reason, message: str) -> None:
    """End an unfinished sweep as Failed with `reason`: an invalid spec (nothing was created), a trial the API
    server refuses (Rejected: it would refuse it again), passes that kept failing (ReconcileFailed). Trials
    already running go on to their own end, each bounded as any experiment is."""
    status = SweepStatus.model_validate(body.get("status") or {})
    if cond.finished(status.conditions):
        return
    meta = body["metadata"]
    conditions = cond.set_condition(status.conditions, cond.FAILED, True, reason, message)
    conditions = cond.set_condition(conditions, cond.RUNNING, False, reason, message)
    failed = SweepStatus(conditions=conditions, summary=SweepSummary(state=SweepState.FAILED), finished_at=cond.now())
    await kube.patch_status(Ref(GROUP_VERSION, SWEEP_KIND, meta["namespace"], meta["name"]),
                            to_json(failed))  # fmt: skip


def publish(namespace: str, name: str, model: str, tally: SweepCounts, running: int, best: SweepBest | None,
            front: list[SweepPoint], cost_front: list[SweepPoint]) -> None:  # fmt: skip
    """The sweep's metric series (trials by state, its best, its two fronts) as of this pass."""
    counts = {"Succeeded": tally.succeeded, "Infeasible": tally.infeasible, "Pruned": tally.pruned,
              "Running": running}  # fmt: skip
    opmetrics.sweep(namespace, name, model, counts, best, front, cost_front)


async def sweep_document(kube: Kube, namespace: str, name: str) -> tuple[ServingSweep, SweepResults] | None:
    """A cluster sweep and its full results document, as a local sweep writes it (every trial's points
    included), rebuilt from its trials; None when there is no such sweep."""
    body = await kube.get(Ref(GROUP_VERSION, SWEEP_KIND, namespace, name))
    if body is None:
        return None
    parsed = sweep_of(body)
    trials, _ = await children(kube, namespace, name, body["metadata"]["uid"])
    finished = [record for child in trials if (record := trial_record(parsed, child)) is not None]
    records = [record for record in finished if record.confirms is None]
    confirmations = [record for record in finished if record.confirms is not None]
    status = SweepStatus.model_validate(body.get("status") or {})
    rolled = rollup.document(parsed, records, status.stop_reason, status.started_at or "", confirmations)
    return parsed, rolled.model_copy(update={"finished_at": status.finished_at, "summary": status.summary})
