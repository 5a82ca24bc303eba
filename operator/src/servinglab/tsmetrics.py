"""TorchServe's Prometheus metrics -> the server-side breakdown of a measured window (pure functions).

TorchServe exports latency only as counters (no histograms), so the breakdown is computed from the
difference of two scrapes, one at the start and one at the end of a measured window:

* mean queue time  = delta(ts_queue_latency_microseconds) / delta(ts_inference_requests_total)
* mean server time = delta(ts_inference_latency_microseconds) / delta(ts_inference_requests_total)
* per-stage handler time per batch, and the mean batch size, from the handler's counters.

Used by the local runner; the operator will use the same arithmetic on PromQL increases.
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

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


def breakdown(before: Snapshot, after: Snapshot) -> dict[str, float | None]:
    """Means over the window between two snapshots; None where the window saw no such events."""

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    requests = delta("ts_inference_requests")
    batches = delta("ServinglabBatches")

    def per(total: float, count: float, scale: float = 1.0) -> float | None:
        return round(total / count * scale, 3) if count > 0 else None

    return {
        "queueMsMean": per(delta("ts_queue_latency_microseconds"), requests, 1e-3),
        "serverLatencyMsMean": per(delta("ts_inference_latency_microseconds"), requests, 1e-3),
        "preprocessMsPerBatch": per(delta("ServinglabPreprocessMs"), batches),
        "inferenceMsPerBatch": per(delta("ServinglabInferenceMs"), batches),
        "postprocessMsPerBatch": per(delta("ServinglabPostprocessMs"), batches),
        "meanBatchSize": per(delta("ServinglabBatchedRequests"), batches),
        "batches": batches,
        "serverRequests": requests,
    }


class WindowReader:
    """Scrapes a TorchServe metrics endpoint at the start and end of each measured window and
    keeps each level's breakdown; its two methods are the load generator's window hooks."""

    def __init__(self, fetch: Callable[[], str], model_name: str) -> None:
        self._fetch = fetch
        self._model_name = model_name
        self._before: dict[int, Snapshot] = {}
        self.breakdowns: dict[int, dict[str, float | None]] = {}

    def window_start(self, level: int) -> None:
        self._before[level] = parse(self._fetch(), self._model_name)

    def window_end(self, level: int) -> None:
        after = parse(self._fetch(), self._model_name)
        self.breakdowns[level] = breakdown(self._before[level], after)


def http_fetcher(url: str, timeout: float = 10.0) -> Callable[[], str]:
    """A fetch function for :class:`WindowReader` reading `url` (TorchServe's /metrics)."""

    def fetch() -> str:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text: str = response.read().decode()
            return text

    return fetch
