"""GPU figures of one measured window, from the DCGM exporter's metrics in Prometheus.

For the server pod's GPU over [windowStart, windowEnd]: utilisation average and maximum, memory
used maximum, average power, energy (the increase of the total-energy counter) and energy per
successful inference. dcgm-exporter labels the workload as `pod`/`namespace`, or as
`exported_pod`/`exported_namespace` when Prometheus does not honour its labels; both are matched.

`query_text` builds the PromQL (pure); `GpuMetrics` runs it over HTTP (GET /api/v1/query, one instant
query per figure and level, each within its timeout) and returns None for a figure Prometheus has no
data for. The operator reports why when every figure is missing. A sample that is not a number, or not a
finite one (+Inf, NaN), is an error: no GPU figure is either, and a status holding one would be refused.

The URL is the user's and the operator fetches it from inside the cluster, so what comes back is
handled as hostile: redirects are not followed (a 3xx is reported as one, its Location never
repeated), at most MAX_RESPONSE_BYTES of an answer are read, and errors name the URL (without
credentials), the HTTP status, Prometheus' error type or a short category of connection failure
("connection refused", "name not resolved", "TLS failed", ...), never the response body, the
addresses tried or the socket's own message.
"""

from __future__ import annotations

import errno
import json
import math
import urllib.parse
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


#: A query's answer is one aggregated sample: a few hundred bytes. More than this is not Prometheus.
MAX_RESPONSE_BYTES = 1 << 20


class PrometheusError(RuntimeError):
    """Prometheus could not be reached, redirected elsewhere or rejected a query; `reason` is the
    GPUMetricsAvailable condition's reason."""

    def __init__(self, message: str, reason: str = "PrometheusUnreachable") -> None:
        super().__init__(message)
        self.reason = reason


def shown(url: str) -> str:
    """The URL as status may repeat it: scheme, host, port and path, no credentials or query."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port is not None else host
    except ValueError:
        return "the Prometheus URL"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def failure(exc: BaseException) -> str:
    """A short category of why a request got no answer: aiohttp's own message carries the addresses
    it tried, the socket's error text and TLS internals, none of which belong in status."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "name not resolved"
    if isinstance(exc, aiohttp.ClientSSLError | aiohttp.ServerFingerprintMismatch):
        return "TLS failed"
    if isinstance(exc, aiohttp.ClientConnectorError):
        code = exc.os_error.errno
        if code == errno.ECONNREFUSED:
            return "connection refused"
        if code in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return "address unreachable"
        return "connection failed"
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError):
        return "connection closed"
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return "invalid URL"
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ClientResponseError):
        return "invalid HTTP response"
    return "request failed"


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


def reader(experiment_url: str | None, operator_url: str | None, authorization: str | None) -> GpuMetrics | None:
    """The reader of an experiment's GPU figures: its own Prometheus, else the operator's; None for neither.
    The operator's credentials (from its Secret, never from a ConfigMap or a spec) go to the operator's own
    Prometheus alone: a URL an experiment names could be anyone's."""
    url = experiment_url or operator_url
    if url is None:
        return None
    return GpuMetrics(url, authorization=authorization if url == operator_url else None)


class GpuMetrics:
    """Reads the GPU figures of measured windows from one Prometheus."""

    def __init__(self, url: str, timeout_seconds: float = 10.0, authorization: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.shown = shown(self.url)
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self.headers = {"Authorization": authorization} if authorization else {}

    async def _instant(self, session: aiohttp.ClientSession, query: str, at: float) -> float | None:
        params = {"query": query, "time": f"{at:.3f}"}
        where = self.shown
        try:
            async with session.get(
                f"{self.url}/api/v1/query", params=params, headers=self.headers, allow_redirects=False
            ) as response:
                status, content_type = response.status, response.content_type
                if 300 <= status < 400:
                    raise PrometheusError(f"{where}: HTTP {status}, a redirect (not followed)", "PrometheusRedirected")
                raw = await _bounded_body(response, where)
        except TimeoutError:
            raise PrometheusError(f"{where}: no answer within {self.timeout.total:g} s (timed out)") from None
        except aiohttp.ClientError as exc:
            raise PrometheusError(f"{where}: {failure(exc)}") from None
        return sample_of(raw, status, content_type, where)

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


def sample_of(raw: bytes, status: int, content_type: str, where: str) -> float | None:
    """The one sample of an instant query's answer (None: no data), or PrometheusError naming what came back
    instead. Never echoes the body: the URL is the user's, and what answers there is not ours to publish."""
    try:
        body: Any = json.loads(raw)
        result = body["data"]["result"] if body.get("status") == "success" else None
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        body, result = None, None
    if not isinstance(result, list):
        kind = body.get("errorType") if isinstance(body, dict) and body.get("status") == "error" else None
        what = (
            f"Prometheus refused the query ({kind})"
            if isinstance(kind, str) and kind.isidentifier() and len(kind) <= 40
            else (f"not a Prometheus query API response ({content_type[:60]}, {len(raw)} bytes)")
        )
        raise PrometheusError(f"{where}: HTTP {status}, {what}", "PrometheusQueryFailed")
    if not result:
        return None
    try:
        value = float(result[0]["value"][1])
    except (ValueError, TypeError, KeyError, IndexError, OverflowError):
        raise PrometheusError(f"{where}: HTTP {status}, not a Prometheus sample", "PrometheusQueryFailed") from None
    if not math.isfinite(value):  # a figure is never +Inf or NaN, and status (JSON) cannot hold one
        raise PrometheusError(f"{where}: HTTP {status}, a sample that is not finite", "PrometheusQueryFailed")
    return value


async def _bounded_body(response: aiohttp.ClientResponse, where: str) -> bytes:
    """The answer's body, refused past MAX_RESPONSE_BYTES (whatever its Content-Length claims)."""
    too_large = PrometheusError(
        f"{where}: HTTP {response.status}, an answer larger than {MAX_RESPONSE_BYTES >> 10} KiB "
        "(not a Prometheus query API response)",
        "PrometheusQueryFailed",
    )
    if (response.content_length or 0) > MAX_RESPONSE_BYTES:
        raise too_large
    body = bytearray()
    async for chunk in response.content.iter_chunked(64 * 1024):
        body += chunk
        if len(body) > MAX_RESPONSE_BYTES:
            raise too_large
    return bytes(body)
