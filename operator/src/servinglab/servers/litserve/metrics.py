"""servinglab's LitAPI counters (Prometheus text) -> the server-side breakdown of a measured window, and
the settings the workers run with (pure functions).

LitServe itself exports no metrics; servinglab's LitAPI (`handlers/servinglab_litserve_api.py`) counts,
as counters (so any window's means are exact differences of two scrapes):

* in the workers, per batch: batches, batched requests, milliseconds of preprocess, inference and
  postprocess, and each request's wait from its arrival in the API process to its batch's start;
* in the API processes, per request: requests answered (by status class) and their time in the server;

and, as gauges each worker sets once it has loaded the model: its max batch size, its batch timeout and
its readiness (summed over the live workers).

Reached through the seam (:meth:`servinglab.servers.litserve.LitServe.metrics`), locally and in the
load Job.
"""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from servinglab.api.figures import ServerBreakdown
from servinglab.api.results import EffectiveSettings
from servinglab.servers.counters import Snapshot, Window

PREFIX = "servinglab_litserve_"
_COUNTERS = (
    "batches", "batched_requests", "queue_ms", "preprocess_ms", "inference_ms", "postprocess_ms", "requests",
    "request_ms",
)  # fmt: skip
_GAUGES = ("max_batch_size", "batch_timeout_ms", "worker_ready")


def parse(text: str) -> Snapshot:
    """Each metric of interest summed over its series (a counter without its `_total`); a gauge no worker
    has set yet is absent."""
    totals: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(PREFIX) or sample.name.endswith("_created"):
                continue
            name = sample.name.removeprefix(PREFIX).removesuffix("_total")
            if name in _COUNTERS or name in _GAUGES:
                totals[name] += sample.value
    return {**{name: totals.get(name, 0.0) for name in _COUNTERS}, **{n: totals[n] for n in _GAUGES if n in totals}}


def breakdown(before: Snapshot, after: Snapshot) -> ServerBreakdown:
    """Means over the window between two snapshots; None where the window saw no such events."""
    window = Window(before, after)
    delta, per = window.delta, window.per
    batches, batched, requests = delta("batches"), delta("batched_requests"), delta("requests")

    return ServerBreakdown(
        queue_ms_mean=per(delta("queue_ms"), batched),
        server_latency_ms_mean=per(delta("request_ms"), requests),
        preprocess_ms_per_batch=per(delta("preprocess_ms"), batches),
        inference_ms_per_batch=per(delta("inference_ms"), batches),
        postprocess_ms_per_batch=per(delta("postprocess_ms"), batches),
        mean_batch_size=per(batched, batches),
        batches=batches,
        server_requests=requests,
    )


def effective(snapshot: Snapshot) -> EffectiveSettings:
    """What the workers that have loaded the model say they run with."""
    batch, timeout = snapshot.get("max_batch_size"), snapshot.get("batch_timeout_ms")
    return EffectiveSettings(
        batch_size=round(batch) if batch is not None else None,
        max_batch_delay_ms=round(timeout) if timeout is not None else None,
        ready_workers=round(snapshot.get("worker_ready", 0.0)),
    )
