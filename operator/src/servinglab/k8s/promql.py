"""GPU figures of one measured window, from the DCGM exporter's metrics in Prometheus.

For the server pod's GPU over [windowStart, windowEnd]: utilisation average and maximum, memory
used maximum, average power, energy (the increase of the total-energy counter) and energy per
successful inference. dcgm-exporter labels the workload as `pod`/`namespace`, or as
`exported_pod`/`exported_namespace` when Prometheus does not honour its labels; both are matched.

`query_text` builds the PromQL (pure); `GpuMetrics` runs it over HTTP (GET /api/v1/query, one instant
query per figure and level, each within its timeout) and returns None for a figure Prometheus has no
data for. The operator reports why when every figure is missing; errors name the URL, the HTTP status
and Prometheus' error type, never the response body.
"""

from __future__ import annotations

import json
import math
from typing import Any

import aiohttp

# figure name -> (PromQL function, DCGM metric, scale)
FIGURES: dict[str, tuple[str, str, float]] = {
    "utilizationAvgPercent": ("avg_over_time", "DCGM_FI_DEV_GPU_UTIL", 1.0),
    "utilizationMaxPercent": ("max_over_time", "DCGM_FI_DEV_GPU_UTIL", 1.0),
    "memoryUsedMaxMiB": ("max_over_time", "DCGM_FI_DEV_FB_USED", 1.0),
    "powerAvgWatts": ("avg_over_time", "DCGM_FI_DEV_POWER_USAGE", 1.0),
    # the energy counter is in millijoules
    "energyJoules": ("increase", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),
}


class PrometheusError(RuntimeError):
    """Prometheus could not be reached or rejected a query."""


def query_text(function: str, metric: str, namespace: str, pod: str, window_seconds: float) -> str:
    """`function` over the window for the pod's GPUs, summed over GPUs (util and power averaged)."""
    window = f"{max(1, math.ceil(window_seconds))}s"
    aggregate = "sum" if metric in ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_FB_USED") else "avg"
    selectors = (
        f'namespace="{namespace}",pod="{pod}"',
        f'exported_namespace="{namespace}",exported_pod="{pod}"',
    )
    parts = [f"{aggregate}({function}({metric}{{{selector}}}[{window}]))" for selector in selectors]
    return " or ".join(parts)


class GpuMetrics:
    """Reads the GPU figures of measured windows from one Prometheus."""

    def __init__(self, url: str, timeout_seconds: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)

    async def _instant(self, session: aiohttp.ClientSession, query: str, at: float) -> float | None:
        params = {"query": query, "time": f"{at:.3f}"}
        try:
            async with session.get(f"{self.url}/api/v1/query", params=params) as response:
                raw = await response.read()
                status, content_type = response.status, response.content_type
        except TimeoutError:
            raise PrometheusError(f"{self.url}: no answer within {self.timeout.total:g} s") from None
        except aiohttp.ClientError as exc:
            raise PrometheusError(f"{self.url}: {type(exc).__name__}: {exc}") from None
        # Never echo the body: the URL is the user's, and what answers there is not ours to publish in status.
        try:
            body: Any = json.loads(raw)
            result = body["data"]["result"] if body.get("status") == "success" else None
        except (ValueError, TypeError, KeyError, AttributeError):
            body, result = None, None
        if not isinstance(result, list):
            kind = body.get("errorType") if isinstance(body, dict) and body.get("status") == "error" else None
            what = (
                f"Prometheus refused the query ({kind})"
                if isinstance(kind, str) and kind.isidentifier()
                else (f"not a Prometheus query API response ({content_type}, {len(raw)} bytes)")
            )
            raise PrometheusError(f"{self.url}: HTTP {status}, {what}")
        series = result
        if not series:
            return None
        value = float(series[0]["value"][1])
        return None if math.isnan(value) else value

    async def window(
        self, namespace: str, pod: str, start: float, end: float, successful_requests: int
    ) -> dict[str, float | None]:
        figures: dict[str, float | None] = {}
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            for name, (function, metric, scale) in FIGURES.items():
                value = await self._instant(session, query_text(function, metric, namespace, pod, end - start), end)
                figures[name] = None if value is None else round(value * scale, 3)
        energy = figures.get("energyJoules")
        figures["energyPerInferenceJoules"] = (
            round(energy / successful_requests, 6) if energy is not None and successful_requests > 0 else None
        )
        return figures
