"""The operator's own Prometheus metrics (port from SERVINGLAB_METRICS_PORT, default 9090).

* `servinglab_experiments_finished_total{state}` — experiments that reached Succeeded / Failed;
* `servinglab_experiments_running` — experiments this operator is driving now;
* `servinglab_reconcile_errors_total{reason}` — API errors a reconcile pass retried;
* `servinglab_experiment_throughput_rps`, `servinglab_experiment_latency_p99_ms` — each finished
  experiment's result per level, labelled with its configuration so dashboards can compare
  configurations; `servinglab_experiment_best_throughput_rps` — its best level.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import Counter, Gauge, start_http_server

from servinglab.spec import ExperimentSpec

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
# a level is a concurrency (closed loop) or an offered rate (open loop); the other label is empty
_LEVEL_LABELS = ("concurrency", "rate_rps")
THROUGHPUT = Gauge(
    "servinglab_experiment_throughput_rps", "Measured throughput per level", [*_CONFIG_LABELS, *_LEVEL_LABELS]
)
P99 = Gauge("servinglab_experiment_latency_p99_ms", "Measured p99 latency per level", [*_CONFIG_LABELS, *_LEVEL_LABELS])
BEST = Gauge("servinglab_experiment_best_throughput_rps", "Best throughput of an experiment", list(_CONFIG_LABELS))

_started = False


def start_server() -> None:
    global _started  # noqa: PLW0603 - one HTTP server per process
    if not _started:
        start_http_server(int(os.environ.get("SERVINGLAB_METRICS_PORT", "9090")))
        _started = True


def finished(
    namespace: str,
    experiment: str,
    state: str,
    spec: ExperimentSpec | None = None,
    levels: list[dict[str, Any]] | None = None,
) -> None:
    FINISHED.labels(state=state).inc()
    if spec is None or not levels:
        return
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
        which = {"concurrency": str(level.get("concurrency", "")), "rate_rps": f"{level.get('rateRps', '')}"}
        THROUGHPUT.labels(**config, **which).set(level["throughputRps"])
        if (p99 := level["latencyMs"].get("p99")) is not None:
            P99.labels(**config, **which).set(p99)
    BEST.labels(**config).set(max(level["throughputRps"] for level in levels))
