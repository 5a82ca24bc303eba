"""The load Job's reading of the server pods' utilisation against a real Prometheus (Debian's), scraping a
test exporter of cAdvisor's CPU counter whose slopes are known: each pod's counter grows by a chosen number
of cores per second of wall time, so the reading must be those cores over the cores the pods may use, at any
host speed (the counter is read at each scrape's time).

The same series scraped twice (by two jobs, as a kubelet's cAdvisor and a cAdvisor DaemonSet can) is counted
once; a pod Prometheus has no figure for makes the reading unread, not a smaller share."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterenv.monitoring import Prometheus
from clusterenv.textendpoint import TextEndpoint
from servinglab.k8s.podutilisation import PodUtilisation, UtilisationSource
from servinglab.servers.process import free_ports
from support.waiting import eventually

#: Cores busy per pod: what the exporter's counters grow by per second.
BUSY = {"srv-5d8f7c9b4-aaaaa": 1.5, "srv-5d8f7c9b4-bbbbb": 0.5}
CORES = 2.0  # each pod's CPU limit


class CpuCounters:
    def __init__(self) -> None:
        self.began = time.time()

    def render(self) -> str:
        elapsed = time.time() - self.began
        lines = ["# TYPE container_cpu_usage_seconds_total counter"]
        for pod, cores in BUSY.items():
            labels = f'container="server",cpu="total",namespace="team",pod="{pod}"'
            lines.append(f"container_cpu_usage_seconds_total{{{labels}}} {cores * elapsed:.6f}")
        return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exporter = TextEndpoint(CpuCounters().render, "cpu-counters")
    exporter.start()
    # scraped twice: as the "dcgm" job and as a kubelet's cAdvisor, both honouring the exporter's labels
    server = Prometheus(tmp_path_factory.mktemp("prometheus"), exporter.port)
    server.scrape_kubelet(f"127.0.0.1:{exporter.port}")
    server.start()
    deadline = time.monotonic() + 120
    while not server.query("container_cpu_usage_seconds_total") and time.monotonic() < deadline:
        time.sleep(0.5)  # scraped once at least, so that every window below has samples before it
    yield server.url
    server.stop()
    exporter.stop()


def read(url: str, pods: list[str], seconds: float = 4.0) -> tuple[float | None, str | None]:
    source = UtilisationSource(url=url, resource="cpu", namespace="team", pods=pods, container="server",
                               cores=CORES, replicas=len(pods))  # fmt: skip
    reading = PodUtilisation(source)
    time.sleep(2)  # a few scrapes before the window, so that its start has samples on both sides
    reading.window_start(0)
    time.sleep(seconds)
    reading.window_end(0)
    return reading.utilisation(0, "cpu"), reading.note


def test_the_share_is_the_pods_cores_busy_over_all_they_may_use_each_series_once(prometheus: str) -> None:
    value, note = read(prometheus, list(BUSY))
    assert note is None and value is not None
    expected = sum(BUSY.values()) / (CORES * len(BUSY))  # 2 cores of 4: 0.5; counted twice it would be 1.0
    assert abs(value - expected) < 0.05, value


def test_one_pod_and_not_the_other_is_that_pods_share(prometheus: str) -> None:
    value, _ = read(prometheus, ["srv-5d8f7c9b4-aaaaa"])
    assert value is not None and abs(value - 1.5 / CORES) < 0.05, value


def test_a_counter_first_scraped_during_the_window_is_not_read_as_its_share(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A Prometheus that begins scraping while the probe runs has only the window's tail of the counter:
    read, it would be a fraction of the pods' use. The probe is unread instead."""
    exporter = TextEndpoint(CpuCounters().render, "late-counters")
    exporter.start()
    late = Prometheus(tmp_path_factory.mktemp("late"), exporter.port)  # its address is known before it starts
    source = UtilisationSource(url=late.url, resource="cpu", namespace="team", pods=list(BUSY), container="server",
                               cores=CORES, replicas=len(BUSY))  # fmt: skip
    reading = PodUtilisation(source)
    try:
        reading.window_start(0)
        late.start()  # so its first scrape comes after the window began
        deadline = time.monotonic() + 120
        while len(late.query("count_over_time(container_cpu_usage_seconds_total[1m]) >= 4")) < len(BUSY) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.5)  # until the window holds enough samples of each pod for a figure
        time.sleep(3)
        reading.window_end(0)
        value, note = reading.utilisation(0, "cpu"), reading.note
    finally:
        late.stop()
        exporter.stop()
    assert value is None and note is not None and "a sample from before the window for 0 of the 2 pods" in note


def test_a_target_forgotten_is_scraped_no_more(tmp_path: Path) -> None:
    """The cluster tests' Prometheus outlives each test's servers and kubelets: their ports, which another
    process may listen on next, are forgotten when the test ends."""
    exporter = TextEndpoint(CpuCounters().render, "kept-counters")
    server = Prometheus(tmp_path, exporter.port)
    kept, gone = f"127.0.0.1:{exporter.port}", [f"127.0.0.1:{port}" for port in free_ports(2)]
    server.scrape(gone[0], {"namespace": "team", "pod": "srv-0"})
    server.scrape_kubelet(gone[1])
    try:
        exporter.start()
        server.start()
        assert eventually(lambda: server.scraped() == {kept, *gone}, 120), server.scraped()  # files read each second
        server.forget(gone)
        assert eventually(lambda: server.scraped() == {kept}, 120), server.scraped()
    finally:
        server.stop()
        exporter.stop()


def test_a_pod_prometheus_has_no_figure_for_makes_the_probe_unread(prometheus: str) -> None:
    value, note = read(prometheus, [*BUSY, "srv-5d8f7c9b4-ccccc"])  # a third replica no scrape has seen
    assert value is None and note is not None
    # (a pod with no series is none of those whose freshness is waited for: the count tells it is missing)
    assert "a CPU figure of the server pods over the window for 2 of the 3 pods" in note
