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

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from servinglab.api.results import ServerBreakdown

Snapshot = dict[str, float]

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
    totals: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name not in _COUNTERS:
                continue
            if model_name is not None and sample.labels.get("model") not in (None, model_name):
                continue
            totals[name] += sample.value
    return {name: totals.get(name, 0.0) for name in _COUNTERS}


def breakdown(before: Snapshot, after: Snapshot) -> ServerBreakdown:
    """Means over the window between two snapshots; None where the window saw no such events."""

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    requests = delta("nv_inference_request_success")
    inferences = delta("nv_inference_count")
    executions = delta("nv_inference_exec_count")

    def per(total: float, count: float, scale: float = 1.0) -> float | None:
        return round(total / count * scale, 3) if count > 0 else None

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
