"""The server-side breakdown computed from two scrapes of TorchServe's Prometheus text."""

from __future__ import annotations

import pytest

from servinglab.servers.torchserve import metrics as tsmetrics

# Format as TorchServe 0.12 prints it (Java simpleclient: trailing commas inside the braces).
SCRAPE = """\
# HELP ts_inference_requests_total Torchserve prometheus counter metric with unit: Count
# TYPE ts_inference_requests_total counter
ts_inference_requests_total{{model_name="m",model_version="default",hostname="h",}} {requests}
ts_inference_requests_total{{model_name="other",model_version="default",hostname="h",}} 999.0
# HELP ts_inference_latency_microseconds Torchserve prometheus counter metric with unit: Microseconds
# TYPE ts_inference_latency_microseconds counter
ts_inference_latency_microseconds{{model_name="m",model_version="default",hostname="h",}} {latency}
# HELP ts_queue_latency_microseconds Torchserve prometheus counter metric with unit: Microseconds
# TYPE ts_queue_latency_microseconds counter
ts_queue_latency_microseconds{{model_name="m",model_version="default",hostname="h",}} {queue}
# HELP ServinglabBatches Torchserve prometheus counter metric with unit: count
# TYPE ServinglabBatches counter
ServinglabBatches{{ModelName="m",Level="Model",Hostname="h",}} {batches}
# HELP ServinglabBatchedRequests Torchserve prometheus counter metric with unit: count
# TYPE ServinglabBatchedRequests counter
ServinglabBatchedRequests{{ModelName="m",Level="Model",Hostname="h",}} {batched}
# HELP ServinglabInferenceMs Torchserve prometheus counter metric with unit: ms
# TYPE ServinglabInferenceMs counter
ServinglabInferenceMs{{ModelName="m",Level="Model",Hostname="h",}} {infer}
# HELP QueueTime Torchserve prometheus gauge metric with unit: Milliseconds
# TYPE QueueTime gauge
QueueTime{{Level="Host",Hostname="h",}} 5.0
"""


def scrape(**values: float) -> tsmetrics.Snapshot:
    return tsmetrics.parse(SCRAPE.format(**values), model_name="m")


def test_parse_reads_counters_of_the_model_only() -> None:
    snap = scrape(requests=10, latency=5000, queue=1000, batches=4, batched=10, infer=40)
    assert snap["ts_inference_requests"] == 10
    assert snap["ServinglabBatches"] == 4


def test_breakdown_is_the_mean_over_the_window() -> None:
    before = scrape(requests=10, latency=5_000, queue=1_000, batches=4, batched=10, infer=40)
    after = scrape(requests=110, latency=2_005_000, queue=501_000, batches=29, batched=110, infer=540)
    result = tsmetrics.breakdown(before, after)
    assert result.server_latency_ms_mean == pytest.approx(20.0)  # 2 s over 100 requests
    assert result.queue_ms_mean == pytest.approx(5.0)
    assert result.mean_batch_size == pytest.approx(4.0)  # 100 requests in 25 batches
    assert result.inference_ms_per_batch == pytest.approx(20.0)


def test_breakdown_of_an_idle_window_is_empty_not_zero() -> None:
    snap = scrape(requests=10, latency=5000, queue=1000, batches=4, batched=10, infer=40)
    result = tsmetrics.breakdown(snap, snap)
    assert result.queue_ms_mean is None
    assert result.mean_batch_size is None
