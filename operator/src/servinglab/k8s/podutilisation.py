"""The server pods' utilisation over each probe of a load that holds one (`spec.load.utilisationTarget`),
read by the load Job from Prometheus while the load runs.

A load pod sees neither the server's processes nor its GPU. It reads what the cluster's monitoring keeps:
DCGM's GPU utilisation of the server pods (`DCGM_FI_DEV_GPU_UTIL`, averaged over the window and the pods),
or, without a GPU, the server container's CPU seconds as the kubelet's cAdvisor counts them
(`container_cpu_usage_seconds_total`) per second of the window, over the cores the container may use: its
CPU limit, else its node's allocatable CPU (summed over replicas, so a share of all they may use). The
operator resolves which and from where (:class:`UtilisationSource`, one JSON argument of the Job);
:class:`PodUtilisation` waits after each window until Prometheus holds a sample scraped after the window's
end (bounded by `waitSeconds`), then asks for the window's figure. Each scrape is a point, so a probe
should last several scrape intervals; a window Prometheus has fewer than two samples in reads as unread.

Answers are handled as :mod:`servinglab.k8s.promql` handles them (no redirect followed, at most
MAX_RESPONSE_BYTES read, nothing of a body repeated) and the operator's Prometheus credentials never reach
a load pod: the operator hands over only a Prometheus that needs none. Used by :mod:`servinglab.k8s.loadjob`
(the reading) and the experiment reconciler (the source).
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from servinglab.api.figures import GpuFigures
from servinglab.api.utilisation import NeverReached, UtilisationSearch
from servinglab.api.verdicts import CpuFigures
from servinglab.k8s.promql import MAX_RESPONSE_BYTES, PrometheusError, sample_of, shown

CPU_METRIC = "container_cpu_usage_seconds_total"
GPU_METRIC = "DCGM_FI_DEV_GPU_UTIL"


class UtilisationSource(BaseModel):
    """Where and what the load Job reads: the operator's choice for one experiment."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    url: str = Field(max_length=2048)
    resource: Literal["gpu", "cpu"]
    namespace: str = Field(max_length=253)
    #: The server Deployment's pods, as a regular expression of their names (a replaced pod matches too).
    pods: str = Field(max_length=512)
    container: str = Field(max_length=253)
    #: The cores each server container may use: the share's denominator, per replica (CPU only).
    cores: float = Field(gt=0, le=1_000_000)
    replicas: int = Field(ge=1, le=10_000)
    wait_seconds: float = Field(default=60.0, gt=0, le=3600)

    def arg(self) -> str:
        return self.model_dump_json(by_alias=True)


def deployment_pods(deployment: str) -> str:
    """A Deployment's pods' names, `<deployment>-<replica set hash>-<suffix>`, as a PromQL regular expression
    (a DNS name's only special character is the dot; PromQL's strings take no backslash escape of it)."""
    return f"{deployment.replace('.', '[.]')}-[a-z0-9]+-[a-z0-9]+"


def _selectors(source: UtilisationSource) -> list[str]:
    if source.resource == "cpu":
        return [f'namespace="{source.namespace}",pod=~"{source.pods}",container="{source.container}"']
    # dcgm-exporter's own labels, or Prometheus' `exported_` ones where it does not honour them
    return [f'namespace="{source.namespace}",pod=~"{source.pods}"',
            f'exported_namespace="{source.namespace}",exported_pod=~"{source.pods}"']  # fmt: skip


def window_query(source: UtilisationSource, window_seconds: float) -> str:
    """The server's use over the window: CPU cores busy, summed over its pods; or the GPU's mean utilisation
    in percent, over its pods' GPUs."""
    window = f"{max(1, math.ceil(window_seconds))}s"
    if source.resource == "cpu":
        return " or ".join(f"sum(rate({CPU_METRIC}{{{s}}}[{window}]))" for s in _selectors(source))
    return " or ".join(f"avg(avg_over_time({GPU_METRIC}{{{s}}}[{window}]))" for s in _selectors(source))


def freshness_query(source: UtilisationSource) -> str:
    """When Prometheus last scraped the figure (Unix seconds)."""
    metric = CPU_METRIC if source.resource == "cpu" else GPU_METRIC
    return " or ".join(f"max(timestamp({metric}{{{s}}}))" for s in _selectors(source))


def share(source: UtilisationSource, value: float) -> float:
    """The query's answer as a share of the resource (0..1 for a server within its means)."""
    if source.resource == "cpu":
        return value / (source.cores * source.replicas)
    return value / 100.0


def with_reading_note(search: UtilisationSearch | None, note: str | None) -> UtilisationSearch | None:
    """The search's summary; where a probe went unread, why (`note`: Prometheus' side of it)."""
    if search is None or note is None or search.reason != NeverReached.NO_READING:
        return search
    return search.model_copy(update={"note": "; ".join(part for part in (search.note, note) if part)})


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # a 3xx comes back as an HTTPError: reported, its Location never followed


class PodUtilisation:
    """Each level's utilisation of the server pods, by the level's index in the run (what the driver's
    utilisation search reads); the level's window edges come from the driver's hooks."""

    def __init__(self, source: UtilisationSource, timeout_seconds: float = 10.0) -> None:
        self.source = source
        self.note: str | None = None  # why the last reading failed, for the Job's log and its results
        self.cpu: dict[int, CpuFigures] = {}  # the figures a local server has per level; none here
        self.gpu: dict[int, GpuFigures] = {}
        self._base = source.url.rstrip("/")
        self._where = shown(self._base)
        self._timeout = timeout_seconds
        self._opener = urllib.request.build_opener(_NoRedirect)
        self._started: dict[int, float] = {}
        self._windows: dict[int, tuple[float, float]] = {}

    def resource(self, asked: str) -> Literal["gpu", "cpu"]:
        return self.source.resource  # the operator resolved `auto` from the server's GPUs

    def window_start(self, level: int) -> None:
        self._started[level] = time.time()

    def window_end(self, level: int) -> None:
        if (started := self._started.pop(level, None)) is not None:
            self._windows[level] = (started, time.time())

    def tick(self) -> None:
        pass

    def utilisation(self, level: int, resource: Literal["gpu", "cpu"]) -> float | None:
        """The level's share of the resource, once Prometheus has scraped past the window's end; None when
        it has no figure for the window (the reason is in `note`)."""
        window = self._windows.get(level)
        if window is None:
            return None
        start, end = window
        try:
            if not self._scraped_past(end):
                self.note = (f"{self._where}: no {resource.upper()} sample of the server pods scraped within "
                             f"{self.source.wait_seconds:g} s of the window's end")  # fmt: skip
                return None
            value = self._instant(window_query(self.source, end - start), end)
        except PrometheusError as exc:
            self.note = str(exc)
            return None
        if value is None:
            self.note = f"{self._where}: no {resource.upper()} figure of the server pods over the window"
            return None
        return round(share(self.source, value), 4)

    def _scraped_past(self, end: float) -> bool:
        deadline = time.monotonic() + self.source.wait_seconds
        while True:
            latest = self._instant(freshness_query(self.source), None)
            if latest is not None and latest >= end:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)

    def _instant(self, query: str, at: float | None) -> float | None:
        params = {"query": query, **({"time": f"{at:.3f}"} if at is not None else {})}
        url = f"{self._base}/api/v1/query?{urllib.parse.urlencode(params)}"
        try:
            with self._opener.open(url, timeout=self._timeout) as response:
                raw = response.read(MAX_RESPONSE_BYTES + 1)
                status, content_type = response.status, response.headers.get_content_type()
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                raise PrometheusError(f"{self._where}: HTTP {exc.code}, a redirect (not followed)") from None
            raw = exc.read(MAX_RESPONSE_BYTES + 1)
            status, content_type = exc.code, exc.headers.get_content_type()
        except TimeoutError:
            raise PrometheusError(f"{self._where}: no answer within {self._timeout:g} s (timed out)") from None
        except (urllib.error.URLError, OSError, ValueError):
            raise PrometheusError(f"{self._where}: no answer (connection failed)") from None
        if len(raw) > MAX_RESPONSE_BYTES:
            raise PrometheusError(f"{self._where}: HTTP {status}, an answer larger than {MAX_RESPONSE_BYTES >> 10} KiB")
        return sample_of(raw, status, content_type, self._where)
