"""Triton's Prometheus metrics -> the server-side breakdown of a measured window (pure functions).

Triton counts, per model, requests and cumulative durations in microseconds; the breakdown is the
difference of two scrapes, one at each edge of a measured window:

* mean queue time and mean request time (Triton's whole handling of a request) per request;
* compute input / infer / output: Triton adds a batch's execution time to each request of the batch, so
  these counters per request are the batch durations weighted by batch size (the mean per batch when the
  batches have one size): reported as preprocess (inputs handed to the model), inference (servinglab's
  model decodes, batches and runs the images here) and postprocess (outputs taken back);
* mean batch size = inferences / executions; batches = executions.

Reached through the seam (:meth:`servinglab.servers.triton.Triton.metrics`), locally and in the load Job.
"""

from __future__ import annotations

from servinglab.api.figures import ServerBreakdown
from servinglab.servers.counters import Snapshot, Window, totals

_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


def parse(text: str, model_name: str | None = None) -> Snapshot:
    """Sum each counter of interest over its series (its versions), only those of `model_name` if given."""
    return totals(text, _COUNTERS, model_name, ("model",))


def breakdown(before: Snapshot, after: Snapshot) -> ServerBreakdown:
    """Means over the window between two snapshots; None where the window saw no such events."""
    window = Window(before, after)
    delta, per = window.delta, window.per
    requests = delta("nv_inference_request_success")
    inferences = delta("nv_inference_count")
    executions = delta("nv_inference_exec_count")

    return ServerBreakdown(
        queue_ms_mean=per(delta("nv_inference_queue_duration_us"), requests, 1e-3),
        server_latency_ms_mean=per(delta("nv_inference_request_duration_us"), requests, 1e-3),
        preprocess_ms_per_batch=per(delta("nv_inference_compute_input_duration_us"), requests, 1e-3),
        inference_ms_per_batch=per(delta("nv_inference_compute_infer_duration_us"), requests, 1e-3),
        postprocess_ms_per_batch=per(delta("nv_inference_compute_output_duration_us"), requests, 1e-3),
        mean_batch_size=per(inferences, executions),
        batches=executions,
        server_requests=requests,
    )
