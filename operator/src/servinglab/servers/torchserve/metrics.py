"""TorchServe's Prometheus metrics -> the server-side breakdown of a measured window (pure functions).

TorchServe exports latency only as counters (no histograms), so the breakdown is computed from the
difference of two scrapes, one at the start and one at the end of a measured window:

* mean queue time  = delta(ts_queue_latency_microseconds) / delta(ts_inference_requests_total)
* mean server time = delta(ts_inference_latency_microseconds) / delta(ts_inference_requests_total)
* per-stage handler time per batch, and the mean batch size, from the handler's counters.

Reached through the seam (:meth:`servinglab.servers.torchserve.TorchServe.metrics`): the measurement
driver reads a snapshot at each edge of each measured window, locally and in the load Job.
"""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from servinglab.api.results import ServerBreakdown

Snapshot = dict[str, float]

# Names without the "_total" suffix: the parser adds it to every counter sample, TorchServe only to
# some counter names, so both sides are compared without it.
_COUNTERS = (
    "ts_inference_requests",
    "ts_inference_latency_microseconds",
    "ts_queue_latency_microseconds",
    "ServinglabBatches",
    "ServinglabBatchedRequests",
    "ServinglabPreprocessMs",
    "ServinglabInferenceMs",
    "ServinglabPostprocessMs",
    "Requests2XX",
    "Requests4XX",
    "Requests5XX",
)


def parse(text: str, model_name: str | None = None) -> Snapshot:
    """Sum each counter of interest over its series (optionally only those of one model)."""
    totals: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name not in _COUNTERS:
                continue
            labels = sample.labels
            series_model = labels.get("model_name", labels.get("ModelName"))
            if model_name is not None and series_model not in (None, model_name):
                continue
            totals[name] += sample.value
    return {name: totals.get(name, 0.0) for name in _COUNTERS}


def breakdown(before: Snapshot, after: Snapshot) -> ServerBreakdown:
    """Means over the window between two snapshots; None where the window saw no such events."""

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    requests = delta("ts_inference_requests")
    batches = delta("ServinglabBatches")

    def per(total: float, count: float, scale: float = 1.0) -> float | None:
        return round(total / count * scale, 3) if count > 0 else None

    return ServerBreakdown(
        queue_ms_mean=per(delta("ts_queue_latency_microseconds"), requests, 1e-3),
        server_latency_ms_mean=per(delta("ts_inference_latency_microseconds"), requests, 1e-3),
        preprocess_ms_per_batch=per(delta("ServinglabPreprocessMs"), batches),
        inference_ms_per_batch=per(delta("ServinglabInferenceMs"), batches),
        postprocess_ms_per_batch=per(delta("ServinglabPostprocessMs"), batches),
        mean_batch_size=per(delta("ServinglabBatchedRequests"), batches),
        batches=batches,
        server_requests=requests,
    )
