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
from http.client import HTTPResponse
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from servinglab.api.figures import GpuFigures
from servinglab.api.utilisation import NeverReached, UtilisationSearch
from servinglab.api.verdicts import CpuFigures
from servinglab.k8s.promql import MAX_RESPONSE_BYTES, PrometheusError, sample_of, shown

CPU_METRIC = "container_cpu_usage_seconds_total"
#: The most server pods a reading names (spec.server.replicas is bounded lower).
MAX_PODS = 64
#: The longest one query may take, from connecting to its answer's last byte.
QUERY_SECONDS = 10.0
#: How long the Job waits after a window for Prometheus to scrape past its end.
WAIT_SECONDS = 60.0
#: The longest one probe's reading takes: the wait, then the figure's and the pods' queries. The load Job's
#: deadline counts it per probe (:mod:`servinglab.k8s.deadline`).
READING_SECONDS = WAIT_SECONDS + 4 * QUERY_SECONDS
GPU_METRIC = "DCGM_FI_DEV_GPU_UTIL"


class UtilisationSource(BaseModel):
    """Where and what the load Job reads: the operator's choice for one experiment."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    url: str = Field(max_length=2048)
    resource: Literal["gpu", "cpu"]
    namespace: str = Field(max_length=253)
    #: The server's pods by name (the experiment ends if one is replaced, so the names hold for its load).
    pods: list[str] = Field(min_length=1, max_length=MAX_PODS)
    container: str = Field(max_length=253)
    #: The cores each server container may use: the share's denominator, per replica (CPU only).
    cores: float = Field(gt=0, le=1_000_000)
    replicas: int = Field(ge=1, le=10_000)
    wait_seconds: float = Field(default=WAIT_SECONDS, gt=0, le=WAIT_SECONDS)

    def arg(self) -> str:
        return self.model_dump_json(by_alias=True)


def _pod_pattern(pods: list[str]) -> str:
    """The pods' names as one PromQL regular expression (a DNS name's only special character is the dot;
    PromQL's strings take no backslash escape of it)."""
    return "|".join(pod.replace(".", "[.]") for pod in pods)


def _selectors(source: UtilisationSource) -> list[tuple[str, str]]:
    """Each way the series may be labelled: its selector, and the label that names the pod."""
    pods = _pod_pattern(source.pods)
    if source.resource == "cpu":
        return [(f'namespace="{source.namespace}",pod=~"{pods}",container="{source.container}"', "pod")]
    # dcgm-exporter's own labels, or Prometheus' `exported_` ones where it does not honour them
    return [(f'namespace="{source.namespace}",pod=~"{pods}"', "pod"),
            (f'exported_namespace="{source.namespace}",exported_pod=~"{pods}"', "exported_pod")]  # fmt: skip


def _over_window(source: UtilisationSource, window: str) -> list[tuple[str, str]]:
    """Per pod, its figure over the window (CPU cores busy; GPU utilisation in percent), by each labelling.
    The same container scraped twice (the kubelet's cAdvisor and its resource metrics, or a cAdvisor
    DaemonSet beside it) is one series per pod here, not two."""
    if source.resource == "cpu":
        return [(f"max by (pod) (rate({CPU_METRIC}{{{selector}}}[{window}]))", label)
                for selector, label in _selectors(source)]  # fmt: skip
    return [(f"avg by ({label}) (avg_over_time({GPU_METRIC}{{{selector}}}[{window}]))", label)
            for selector, label in _selectors(source)]  # fmt: skip


def _window(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds))}s"


def window_query(source: UtilisationSource, window_seconds: float) -> str:
    """The server's use over the window: CPU cores busy, summed over its pods; or the GPU's utilisation in
    percent, averaged over its pods."""
    combine = "sum" if source.resource == "cpu" else "avg"
    return " or ".join(f"{combine}({per_pod})" for per_pod, _ in _over_window(source, _window(window_seconds)))


def pods_query(source: UtilisationSource, window_seconds: float) -> str:
    """How many of the server's pods have a figure over the window (a pod with too few samples has none)."""
    return " or ".join(f"count({per_pod})" for per_pod, _ in _over_window(source, _window(window_seconds)))


def begun_query(source: UtilisationSource) -> str:
    """How many of the server's pods have a sample (evaluated at the window's start: one from before it). A
    counter whose first sample falls inside the window would read as a fraction of the window's use."""
    metric = CPU_METRIC if source.resource == "cpu" else GPU_METRIC
    return " or ".join(f"count(max by ({label}) ({metric}{{{selector}}}))" for selector, label in _selectors(source))


def freshness_query(source: UtilisationSource) -> str:
    """When Prometheus last scraped the pod scraped longest ago (Unix seconds): replicas on other nodes are
    other targets, scraped at other times."""
    metric = CPU_METRIC if source.resource == "cpu" else GPU_METRIC
    return " or ".join(f"min(max by ({label}) (timestamp({metric}{{{selector}}})))"
                       for selector, label in _selectors(source))  # fmt: skip


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

    def __init__(self, source: UtilisationSource, query_seconds: float = QUERY_SECONDS) -> None:
        self.source = source
        self.note: str | None = None  # why the last reading failed, for the Job's log and its results
        self.cpu: dict[int, CpuFigures] = {}  # the figures a local server has per level; none here
        self.gpu: dict[int, GpuFigures] = {}
        self._base = source.url.rstrip("/")
        self._where = shown(self._base)
        self._query_seconds = query_seconds
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
        """The level's share of the resource, once Prometheus has scraped every server pod past the window's
        end; None when it has no figure for the window, or none for one of the pods (the reason is in
        `note`): a share of fewer pods than it is divided by would be a wrong answer, not a missing one."""
        window = self._windows.get(level)
        if window is None:
            return None
        start, end = window
        what = f"{resource.upper()} figure of the server pods"
        try:
            if not self._scraped_past(end):
                self.note = (f"{self._where}: no {resource.upper()} sample of every server pod scraped within "
                             f"{self.source.wait_seconds:g} s of the window's end")  # fmt: skip
                return None
            value = self._instant(window_query(self.source, end - start), end)
            pods = self._instant(pods_query(self.source, end - start), end) if value is not None else None
            begun = self._instant(begun_query(self.source), start) if pods is not None else None
        except PrometheusError as exc:
            self.note = str(exc)
            return None
        if value is None:
            self.note = f"{self._where}: no {what} over the window (a probe should last several scrape intervals)"
            return None
        if pods is None or pods < len(self.source.pods):
            self.note = (f"{self._where}: a {what} over the window for {pods or 0:g} of the "
                         f"{len(self.source.pods)} pods (a probe should last several scrape intervals)")  # fmt: skip
            return None
        if begun is None or begun < len(self.source.pods):
            self.note = (f"{self._where}: a sample from before the window for {begun or 0:g} of the "
                         f"{len(self.source.pods)} pods (Prometheus began scraping them during the probe)")  # fmt: skip
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
        """One instant query's sample, within QUERY_SECONDS from connecting to the last byte (a server that
        answers a byte at a time is cut off, not waited for)."""
        params = {"query": query, **({"time": f"{at:.3f}"} if at is not None else {})}
        url = f"{self._base}/api/v1/query?{urllib.parse.urlencode(params)}"
        deadline = time.monotonic() + self._query_seconds
        try:
            try:
                response = self._opener.open(url, timeout=self._query_seconds)
            except urllib.error.HTTPError as exc:
                if 300 <= exc.code < 400:
                    raise PrometheusError(f"{self._where}: HTTP {exc.code}, a redirect (not followed)") from None
                response = exc
            with response:
                status, content_type = response.status, response.headers.get_content_type()
                raw = self._bounded_body(response, deadline, status)
        except TimeoutError:
            raise PrometheusError(
                f"{self._where}: no whole answer within {self._query_seconds:g} s (timed out)"
            ) from None
        except (urllib.error.URLError, OSError, ValueError):
            raise PrometheusError(f"{self._where}: no answer (connection failed)") from None
        return sample_of(raw, status, content_type, self._where)

    def _bounded_body(self, response: HTTPResponse | urllib.error.HTTPError, deadline: float, status: int) -> bytes:
        body = bytearray()
        while chunk := response.read1(64 * 1024):
            body += chunk
            if len(body) > MAX_RESPONSE_BYTES:
                raise PrometheusError(
                    f"{self._where}: HTTP {status}, an answer larger than {MAX_RESPONSE_BYTES >> 10} KiB"
                )
            if time.monotonic() > deadline:
                raise TimeoutError
        return bytes(body)
