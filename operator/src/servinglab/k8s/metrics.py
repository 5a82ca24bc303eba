"""The operator's own Prometheus metrics (port from SERVINGLAB_METRICS_PORT, default 9090).

* `servinglab_experiments_finished_total{state}` — experiments that reached Succeeded / Failed;
* `servinglab_experiments_running` — experiments this operator is driving now;
* `servinglab_reconcile_errors_total{reason}` — API errors a reconcile pass retried;
* `servinglab_watch_restarts_total{kind}` — watches of the operator's caches (the GPU queue's nodes, GPU
  pods, experiments) that ended on an error they do not expect and were started again (:mod:`.cache`);
* `servinglab_experiment_throughput_rps`, `servinglab_experiment_latency_p99_ms` — each finished
  experiment's result per level, labelled with its configuration so dashboards can compare
  configurations; `servinglab_experiment_best_throughput_rps` — its best level;
* `servinglab_experiment_cost_per_million{..., currency}` — each level's cost per million inferences, only
  where the experiment was priced (an unpriced level has no sample, never a 0);
  `servinglab_experiment_latency_p99_lower_ms` and `..._upper_ms` — the p99's bounds at 95 % (each only
  where the level was long enough for it);
* `servinglab_experiment_verdict{..., verdict}` — 1 for each level's bottleneck verdict (generator-bound,
  queue-bound, compute-bound, ...: :class:`~servinglab.api.verdicts.Bottleneck`), labelled like the two above;
* `servinglab_sweep_trials{namespace, sweep, model, state}` — a sweep's trials by state (Succeeded,
  Infeasible, Running, Pruned); `servinglab_sweep_best_capacity_rps` — its best configuration's
  capacity within the SLO, labelled with the configuration; `servinglab_sweep_front_throughput_rps`
  and `servinglab_sweep_front_p99_ms` — its Pareto front, one series per point (`point` is its rank
  by p99), labelled with the trial and level; `servinglab_sweep_cost_front_cost_per_million` and
  `servinglab_sweep_cost_front_p99_bound_ms` — its cost front (cost per million against the p99's upper
  bound, or the p99 where a level had no bound), labelled likewise, absent when nothing was priced.

A deleted experiment's or sweep's series are removed (:func:`forget`, :func:`forget_sweep`: the wiring
calls them on the watch's DELETED event), so a long-lived operator's metrics do not grow with every
experiment ever run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from prometheus_client import Counter, Gauge, start_http_server

from servinglab.api import ExperimentSpec
from servinglab.api.results import LevelResult
from servinglab.api.states import ExperimentState
from servinglab.api.trials import SweepBest, SweepPoint

_CONFIG_LABELS = (
    "namespace",
    "experiment",
    "model",
    "batch_size",
    "max_batch_delay_ms",
    "workers",
    "precision",
)

FINISHED = Counter("servinglab_experiments_finished", "Experiments that finished, by state", ["state"])
RUNNING = Gauge("servinglab_experiments_running", "Experiments this operator is driving now")
RECONCILE_ERRORS = Counter("servinglab_reconcile_errors", "Reconcile passes that hit an API error", ["reason"])
WATCH_RESTARTS = Counter(
    "servinglab_watch_restarts", "Cache watches restarted after an error they do not expect", ["kind"]
)
# a level is a concurrency (closed loop) or an offered rate (open loop); the other label is empty
_LEVEL_LABELS = ("concurrency", "rate_rps")
THROUGHPUT = Gauge(
    "servinglab_experiment_throughput_rps", "Measured throughput per level", [*_CONFIG_LABELS, *_LEVEL_LABELS]
)
P99 = Gauge("servinglab_experiment_latency_p99_ms", "Measured p99 latency per level", [*_CONFIG_LABELS, *_LEVEL_LABELS])
P99_LOWER = Gauge(
    "servinglab_experiment_latency_p99_lower_ms",
    "Lower bound at 95 % of a level's p99",
    [*_CONFIG_LABELS, *_LEVEL_LABELS],
)
P99_UPPER = Gauge(
    "servinglab_experiment_latency_p99_upper_ms",
    "Upper bound at 95 % of a level's p99",
    [*_CONFIG_LABELS, *_LEVEL_LABELS],
)
COST = Gauge(
    "servinglab_experiment_cost_per_million",
    "Cost per million inferences at a level's throughput (priced experiments only)",
    [*_CONFIG_LABELS, *_LEVEL_LABELS, "currency"],
)
BEST = Gauge("servinglab_experiment_best_throughput_rps", "Best throughput of an experiment", list(_CONFIG_LABELS))
VERDICT = Gauge(
    "servinglab_experiment_verdict",
    "1 for each level's bottleneck verdict (label verdict)",
    [*_CONFIG_LABELS, *_LEVEL_LABELS, "verdict"],
)

_SWEEP_LABELS = ("namespace", "sweep", "model")
SWEEP_TRIALS = Gauge("servinglab_sweep_trials", "A sweep's trials by state", [*_SWEEP_LABELS, "state"])
SWEEP_BEST = Gauge(
    "servinglab_sweep_best_capacity_rps",
    "A sweep's best capacity within the SLO, by configuration",
    [*_SWEEP_LABELS, *_CONFIG_LABELS[3:]],
)
_FRONT_LABELS = (*_SWEEP_LABELS, "point", "trial", "level")
FRONT_RPS = Gauge("servinglab_sweep_front_throughput_rps", "Throughput of a Pareto-front point", list(_FRONT_LABELS))
FRONT_P99 = Gauge("servinglab_sweep_front_p99_ms", "p99 latency of a Pareto-front point", list(_FRONT_LABELS))
COST_FRONT = Gauge(
    "servinglab_sweep_cost_front_cost_per_million", "Cost per million of a cost-front point", list(_FRONT_LABELS)
)
COST_FRONT_P99 = Gauge(
    "servinglab_sweep_cost_front_p99_bound_ms",
    "p99 upper bound (the p99 where the level had none) of a cost-front point",
    list(_FRONT_LABELS),
)
_Series = list[tuple[Gauge, tuple[str, ...]]]
_sweep_series: dict[tuple[str, str], _Series] = {}
_experiment_series: dict[tuple[str, str], _Series] = {}

_started = False


def start_server() -> None:
    global _started  # noqa: PLW0603 - one HTTP server per process
    if not _started:
        start_http_server(int(os.environ.get("SERVINGLAB_METRICS_PORT", "9090")))
        _started = True


def finished(
    namespace: str,
    experiment: str,
    state: ExperimentState,
    spec: ExperimentSpec | None = None,
    levels: list[LevelResult] | None = None,
) -> None:
    FINISHED.labels(state=state).inc()
    if spec is None or not levels:
        return
    forget(namespace, experiment)  # a re-applied experiment of the same name replaces its series
    series = _experiment_series.setdefault((namespace, experiment), [])
    config = {
        "namespace": namespace,
        "experiment": experiment,
        "model": spec.model.name,
        "batch_size": str(spec.server.batch_size),
        "max_batch_delay_ms": str(spec.server.max_batch_delay_ms),
        "workers": str(spec.server.workers),
        "precision": str(spec.server.precision),
    }
    for level in levels:
        which = {
            "concurrency": str(level.concurrency) if level.concurrency is not None else "",
            "rate_rps": f"{level.rate_rps}" if level.rate_rps is not None else "",
        }
        values = (*config.values(), *which.values())
        THROUGHPUT.labels(*values).set(level.throughput_rps)
        series.append((THROUGHPUT, values))
        bounds = level.latency_ms.p99_interval
        for gauge, figure in ((P99, level.latency_ms.p99), (P99_LOWER, bounds.lower if bounds else None),
                              (P99_UPPER, bounds.upper if bounds else None)):  # fmt: skip
            if figure is not None:
                gauge.labels(*values).set(figure)
                series.append((gauge, values))
        if level.cost is not None and level.cost.cost_per_million is not None:
            priced = (*values, level.cost.currency or "")
            COST.labels(*priced).set(level.cost.cost_per_million)
            series.append((COST, priced))
        if level.verdict is not None:
            judged = (*values, str(level.verdict.bottleneck))
            VERDICT.labels(*judged).set(1)
            series.append((VERDICT, judged))
    BEST.labels(*config.values()).set(max(level.throughput_rps for level in levels))
    series.append((BEST, tuple(config.values())))


def _remove(series: _Series) -> None:
    for gauge, values in series:
        with contextlib.suppress(KeyError):  # never set, or removed already
            gauge.remove(*values)


def forget(namespace: str, experiment: str) -> None:
    """Remove a deleted experiment's series."""
    _remove(_experiment_series.pop((namespace, experiment), []))


def forget_sweep(namespace: str, name: str) -> None:
    """Remove a deleted sweep's series."""
    _remove(_sweep_series.pop((namespace, name), []))


def sweep(namespace: str, name: str, model: str, counts: dict[str, int], best: SweepBest | None,
          front: list[SweepPoint], cost_front: Sequence[SweepPoint] = ()) -> None:  # fmt: skip
    """A sweep's current roll-up; replaces the series this sweep had before (its best and fronts move)."""
    forget_sweep(namespace, name)
    series: _Series = []

    def put(gauge: Gauge, labels: tuple[str, ...], value: float) -> None:
        gauge.labels(*labels).set(value)
        series.append((gauge, labels))

    for state, count in counts.items():
        put(SWEEP_TRIALS, (namespace, name, model, state), count)
    if best is not None:
        config = best.config
        settings = (str(config.batch_size), str(config.max_batch_delay_ms), str(config.workers), str(config.precision))
        put(SWEEP_BEST, (namespace, name, model, *settings), best.capacity_rps)
    for rank, point in enumerate(front):
        level = "" if point.level is None else f"{point.level:g}"
        labels = (namespace, name, model, str(rank), point.trial, level)
        put(FRONT_RPS, labels, point.throughput_rps)
        put(FRONT_P99, labels, point.p99_latency_ms)
    for rank, point in enumerate(cost_front):
        level = "" if point.level is None else f"{point.level:g}"
        labels = (namespace, name, model, str(rank), point.trial, level)
        if point.cost_per_million is not None:  # a cost front holds priced points only
            put(COST_FRONT, labels, point.cost_per_million)
            put(COST_FRONT_P99, labels, point.p99_bound_ms)
    _sweep_series[(namespace, name)] = series
