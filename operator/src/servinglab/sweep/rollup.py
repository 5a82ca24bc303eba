"""A sweep's results: per trial its capacity within the SLO, the best configuration, the Pareto
fronts over every measured point (throughput, and cost per million, against p99: :mod:`.fronts`), and why
the sweep stopped (pure).

A trial *record* is what one trial leaves behind, locally a file `trials/<name>.json` and on the
cluster a child experiment's status: a :class:`~servinglab.api.trials.TrialRecord`. The local sweep and
the sweep reconciler build the same records from the same typed results, so `servinglab sweep` and
`kubectl get servingsweep` report the same document.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servinglab.api import ServerKind, ServingSweep, SweepSpec, TrialConfig, axis_values, grid, kinds, space_size
from servinglab.api.conditions import now
from servinglab.api.cost import CostFigures, at_throughput
from servinglab.api.forms import FORM_DISAGREES, FORM_NOT_BUILT, FORM_NOT_SUPPORTED
from servinglab.api.results import ExperimentResults
from servinglab.api.states import Confidence, ConfirmationState
from servinglab.api.sweep import left_out
from servinglab.api.trialconfig import ObjectiveSpec
from servinglab.api.trials import (
    INFEASIBLE,
    SUCCEEDED,
    Confirmation,
    PrunedConfig,
    SweepBest,
    SweepCounts,
    SweepObjective,
    SweepResults,
    SweepSpace,
    TrialRecord,
)
from servinglab.api.verdicts import Verdict
from servinglab.measure.levels import level_meets_slo
from servinglab.sweep import confirm, objective
from servinglab.sweep.fronts import cost_front, pareto_front, points
from servinglab.sweep.search import OUT_OF_MEMORY, Outcome, pruned_by

#: Substrings of a failure that say which kind of infeasibility it was, checked in order (a form's failure
#: first: its message may quote a build that "exited with code").
_FAILURE_KINDS = (
    *((reason, (reason,)) for reason in (FORM_DISAGREES, FORM_NOT_BUILT, FORM_NOT_SUPPORTED)),
    (OUT_OF_MEMORY, ("out of memory", "outofmemory", "memoryerror", "cannot allocate memory", "oomkilled")),
    ("NeverReady", ("not ready within", "did not answer a test request", "serverNotReady")),
    ("Crashed", ("exited with code", "servercrashed", "crashloop")),
    ("SettingsNotApplied", ("did not apply the requested settings",)),
    ("Unschedulable", ("unschedulable", "no node matching")),
)


def classify_failure(message: str) -> str:
    """OutOfMemory, NeverReady, Crashed, SettingsNotApplied or Failed, from a failure's message."""
    lowered = message.lower()
    for reason, needles in _FAILURE_KINDS:
        if any(needle.lower() in lowered for needle in needles):
            return reason
    return "Failed"


@dataclass(frozen=True)
class Capacity:
    """A trial's figure of merit: its capacity within the objective, the p99 there, which level, and that
    level's verdict."""

    capacity_rps: float
    p99_latency_ms: float | None
    level: str
    verdict: Verdict | None = None
    cost: CostFigures | None = None
    latency_mean_ms: float | None = None


def capacity(document: ExperimentResults, slo_p99_ms: float | None, max_error_rate: float) -> Capacity | None:
    """The peak rate the open-loop search found within the SLO, else the highest-throughput level that
    meets the objective (the one SLO predicate, :func:`~servinglab.measure.levels.meets_slo`, with the
    sweep's allowed error share); None when nothing does."""
    peak = document.peak_rate
    if peak is not None and peak.rate_rps is not None:
        probe = next((level for level in document.results if level.rate_rps == peak.rate_rps), None)
        verdict = probe.verdict if probe is not None else None
        cost = at_throughput(probe.cost, peak.rate_rps) if probe is not None and probe.cost is not None else None
        mean = probe.latency_ms.mean if probe is not None else None
        return Capacity(peak.rate_rps, peak.p99_latency_ms, "peak rate", verdict.compact() if verdict else None, cost,
                        mean)  # fmt: skip
    levels = [level for level in document.results if level_meets_slo(level, slo_p99_ms, max_error_rate)]
    if not levels:
        return None
    top = max(levels, key=lambda level: level.throughput_rps)
    label = f"{top.concurrency} users" if top.concurrency is not None else f"{top.rate_rps} rps"
    verdict = top.verdict.compact() if top.verdict else None
    return Capacity(top.throughput_rps, top.latency_ms.p99, label, verdict, top.cost, top.latency_ms.mean)


def record(
    sweep: ServingSweep,
    name: str,
    order: int,
    config: TrialConfig,
    document: ExperimentResults | None,
    failure: str | None,
    finished_at: str | None = None,
) -> TrialRecord:
    """The record of one finished trial (measured, or infeasible with the failure's kind). A trial whose form
    disagreed with eager fp32 is a FormDisagrees failure even where it was measured: never ranked."""
    if document is not None and (disagrees := _form_disagrees(document)) is not None:
        document, failure = None, disagrees
    if document is None:
        return TrialRecord(
            name=name, order=order, config=config, state=INFEASIBLE,
            reason=classify_failure(failure or ""), message=failure, finished_at=finished_at or now(),
        )  # fmt: skip
    found = capacity(document, sweep.spec.template.slo.p99_latency_ms, sweep.spec.objective.max_error_rate)
    return TrialRecord(
        name=name, order=order, config=config, state=SUCCEEDED,
        reason=None if found is not None else "NoLevelWithinSlo", message=failure,
        finished_at=finished_at or now(),
        capacity_rps=found.capacity_rps if found else None, p99_latency_ms=found.p99_latency_ms if found else None,
        level=found.level if found else None, cost=found.cost if found else None,
        latency_mean_ms=found.latency_mean_ms if found else None,
        verdict=found.verdict if found else _last_verdict(document),
        ready_seconds=document.ready_seconds,
        reconfigured=document.reconfigured_seconds is not None, results=document,
    )  # fmt: skip


def _form_disagrees(document: ExperimentResults) -> str | None:
    """The FormDisagrees failure of results whose form failed its gate (None when it passed or had none)."""
    run = document.runtime.form if document.runtime is not None else None
    gate = run.gate if run is not None else None
    if run is None or gate is None or gate.passed:
        return None
    return (f"{FORM_DISAGREES}: spec.server.form: {run.form} disagrees with eager fp32 on the probe batch: largest "
            f"absolute error {gate.max_abs_error:.4g}, largest relative error {gate.max_rel_error:.4g} (tolerance "
            f"{gate.tolerance:g})")  # fmt: skip


def _last_verdict(document: ExperimentResults) -> Verdict | None:
    """A trial with no level within the objective: the verdict of its highest-throughput level."""
    judged = [level for level in document.results if level.verdict is not None]
    top = max(judged, key=lambda level: level.throughput_rps) if judged else None
    return top.verdict.compact() if top is not None and top.verdict is not None else None


def outcome(record: TrialRecord, goal: ObjectiveSpec) -> Outcome:
    """What the search needs of a record: its score for the objective, and the verdict at its capacity (the
    axis it points at, and whether it is at the raw ceiling)."""
    return Outcome(record.config, objective.of(goal, record), record.succeeded, record.reason, record.verdict)


def named_best(
    sweep: ServingSweep, ordered: Sequence[TrialRecord], confirmation: Confirmation | None
) -> SweepBest | None:
    """The configuration named best: the confirmation's pick once it has decided, else the highest single
    measurement (Unconfirmed; Confirming while the confirmation runs; NoneWithinSlo when every confirmation
    run missed the SLO)."""
    by_name = {record.name: record for record in ordered}
    if confirmation is not None and confirmation.winner in by_name:
        record = by_name[confirmation.winner]
        runs = next(c for c in confirmation.candidates if c.trial == record.name)
        return SweepBest(
            trial=record.name, config=record.config, capacity_rps=runs.mean_rps or 0.0,
            p99_latency_ms=record.p99_latency_ms, level=record.level, confidence=Confidence(confirmation.state),
            low_rps=runs.low_rps, high_rps=runs.high_rps, tied_with=confirmation.tied_with or None,
            verdict=record.verdict, latency_mean_ms=record.latency_mean_ms,
            cost=at_throughput(record.cost, runs.mean_rps) if record.cost and runs.mean_rps else record.cost,
        )  # fmt: skip
    top = best_record(ordered, sweep.spec.objective)
    if top is None:
        return None
    # NoneWithinSlo: every confirmation run missed the SLO; the best first measurement is named as such
    waiting = {
        ConfirmationState.RUNNING: Confidence.CONFIRMING,
        ConfirmationState.NONE_WITHIN_SLO: Confidence.NONE_WITHIN_SLO,
    }
    state = Confidence.UNCONFIRMED if confirmation is None else waiting.get(confirmation.state, Confidence.UNCONFIRMED)
    return _best_of(top).model_copy(update={"confidence": state})


def best_record(records: Sequence[TrialRecord], goal: ObjectiveSpec) -> TrialRecord | None:
    """The record with the best score for the objective (the earliest among equals)."""
    scored = [(found, record) for record in records if (found := objective.of(goal, record)) is not None]
    return max(scored, key=lambda pair: pair[0])[1] if scored else None


def _best_of(record: TrialRecord) -> SweepBest:
    return SweepBest(
        trial=record.name, config=record.config, capacity_rps=record.capacity_rps or 0.0,
        p99_latency_ms=record.p99_latency_ms, level=record.level, verdict=record.verdict, cost=record.cost,
        latency_mean_ms=record.latency_mean_ms,
    )  # fmt: skip


def _space(spec: SweepSpec, kind: ServerKind | None) -> SweepSpace:
    batches, delays, workers, precisions, paths, forms = axis_values(spec, kind)
    return SweepSpace(batch_size=batches, max_batch_delay_ms=delays, workers=workers,
                      precision=[str(p) for p in precisions],
                      data_path=[p.label() or "default" for p in paths] if len(paths) > 1 else None,
                      form=[str(f) for f in forms] if spec.space.form is not None else None)  # fmt: skip


def document(
    sweep: ServingSweep,
    records: Sequence[TrialRecord],
    stop_reason: str | None,
    started_at: str,
    confirmations: Sequence[TrialRecord] = (),
) -> SweepResults:
    """The sweep's results document (local `sweep.json`; on the cluster rebuilt from its trials). The
    trials are listed without their results (each trial's file, or its experiment, has them); the
    confirmation runs appear in `confirmation`, each candidate's runs in order."""
    spec = sweep.spec
    ordered = sorted(records, key=lambda record: record.order)
    history = [outcome(record, spec.objective) for record in ordered]
    done = {o.config.key() for o in history}
    pruned = [
        PrunedConfig(config=config, reason=why)
        for config in grid(spec)
        if config.key() not in done and (why := pruned_by(history, config))
    ] + [PrunedConfig(config=config, reason=why) for config, why in left_out(spec)]
    confirmation = confirm.decide(spec, ordered, confirmations)
    servers = kinds(spec)
    tops = [found for server in servers
            if (found := best_record([r for r in ordered if r.config.kind == server], spec.objective))]  # fmt: skip
    if spec.strategy == "list":
        space = SweepSpace(configurations=len(spec.configurations))
    else:
        space = _space(spec, None)
        if servers != [None]:
            own = {str(server): _space(spec, server) for server in servers}
            space = space.model_copy(update={"kind": list(own), "per_kind": own})
    every = points(ordered)
    cheapest, no_cost_front = cost_front(every)
    return SweepResults(
        api_version=sweep.api_version,
        sweep=sweep.metadata.name,
        model=spec.template.model.name,
        server_kind=spec.template.server.kind,
        strategy=spec.strategy,
        space=space,
        grid_size=space_size(spec),
        objective=SweepObjective(
            optimize=spec.objective.optimize,
            p99_latency_ms=spec.template.slo.p99_latency_ms,
            max_error_rate=spec.objective.max_error_rate,
        ),
        trials=[record.model_copy(update={"results": None}) for record in ordered],
        counts=SweepCounts(
            succeeded=sum(1 for record in ordered if record.state == SUCCEEDED),
            infeasible=sum(1 for record in ordered if record.state == INFEASIBLE),
            pruned=len(pruned),
            run=len(ordered),
        ),
        pruned=pruned,
        best=named_best(sweep, ordered, confirmation),
        best_per_kind=[_best_of(found) for found in sorted(tops, key=lambda r: -(objective.of(spec.objective, r) or 0))]
        if servers != [None]
        else None,
        confirmation=confirmation,
        points=every,
        front=pareto_front(every),
        cost_front=cheapest,
        cost_front_reason=no_cost_front,
        stop_reason=stop_reason,
        started_at=started_at,
        finished_at=now() if stop_reason else None,
    )
