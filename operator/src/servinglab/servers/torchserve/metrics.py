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

from servinglab.api.figures import ServerBreakdown
from servinglab.servers.counters import Snapshot, Window, totals

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
    return totals(text, _COUNTERS, model_name, ("model_name", "ModelName"))


def breakdown(before: Snapshot, after: Snapshot) -> ServerBreakdown:
    """Means over the window between two snapshots; None where the window saw no such events."""
    window = Window(before, after)
    delta, per = window.delta, window.per
    requests = delta("ts_inference_requests")
    batches = delta("ServinglabBatches")

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
