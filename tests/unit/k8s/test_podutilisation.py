"""Where the load Job reads the server's utilisation on Kubernetes: the operator's refusals naming the field,
the PromQL it asks (the server container's cAdvisor CPU over its limit, or DCGM's GPU utilisation of the
Deployment's pods, with either label convention), and how a hostile or silent Prometheus ends as an unread
probe with its reason (no redirect followed, no answer read past its bound, no wait without end)."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from servinglab.api import parse_experiment
from servinglab.api.utilisation import NeverReached, UtilisationSearch
from servinglab.k8s.experiment.utilisation import problem, resource_of
from servinglab.k8s.podutilisation import (
    MAX_RESPONSE_BYTES,
    PodUtilisation,
    UtilisationSource,
    freshness_query,
    pods_query,
    share,
    window_query,
    with_reading_note,
)
from servinglab.k8s.settings import Settings
from support.manifests import experiment


def spec(load: dict[str, Any], **server: Any) -> Any:
    return parse_experiment(experiment("aim", server=server, load=load)).spec


AIM = {"mode": "closed", "utilisationTarget": {"target": 0.6}}


def test_without_a_target_nothing_is_asked_of_prometheus() -> None:
    assert problem(spec({"concurrency": [1]}), Settings()) is None


@pytest.mark.parametrize(
    ("load", "server", "settings", "said"),
    [
        (AIM, {}, Settings(), "reads the server's utilisation from Prometheus"),
        (AIM, {}, Settings(prometheus_url="http://p:9090", prometheus_authorization="Bearer x"),
         "needs credentials, and they never leave the operator"),
        (AIM, {}, Settings(prometheus_url="http://user:pw@p:9090"),
         "needs credentials, and they never leave the operator"),
        ({**AIM, "utilisationTarget": {"target": 0.6, "resource": "gpu"}}, {"gpus": 0},
         Settings(prometheus_url="http://p:9090"), ".resource: gpu, and the server has none"),
        (AIM, {"gpus": 1}, Settings(prometheus_url="http://p:9090", gpu_resource="nvidia.com/mig-1g.5gb"),
         "is a MIG slice (nvidia.com/mig-1g.5gb), and DCGM's utilisation is the whole GPU's"),
    ],
)  # fmt: skip
def test_a_target_the_load_job_could_not_read_is_refused_naming_the_field(
    load: dict[str, Any], server: dict[str, Any], settings: Settings, said: str
) -> None:
    found = problem(spec(load, **server), settings)
    assert found is not None and found.startswith("spec.load.utilisationTarget") and said in found


def test_a_prometheus_the_load_pods_may_query_is_enough() -> None:
    assert problem(spec(AIM, gpus=0), Settings(prometheus_url="http://p:9090")) is None
    named = parse_experiment(
        experiment("aim", server={"gpus": 0}, load=AIM, metrics={"prometheusUrl": "http://mine:9090"})
    ).spec
    # the operator's credentials stay with the operator: the experiment's own Prometheus is read instead
    assert problem(named, Settings(prometheus_url="http://p:9090", prometheus_authorization="Bearer x")) is None


def test_auto_reads_the_gpu_where_the_server_has_one_else_its_cpu() -> None:
    assert resource_of(spec(AIM, gpus=1)) == "gpu"
    assert resource_of(spec(AIM, gpus=0)) == "cpu"
    assert resource_of(spec({**AIM, "utilisationTarget": {"target": 0.6, "resource": "cpu"}}, gpus=1)) == "cpu"


def source(**changes: Any) -> UtilisationSource:
    base = {"url": "http://127.0.0.1:9", "resource": "cpu", "namespace": "team",
            "pods": ["a.b-server-5d8f7c9b4-x2x9q", "a.b-server-5d8f7c9b4-k7l2m"], "container": "litserve", "cores": 4,
            "replicas": 2}  # fmt: skip
    return UtilisationSource.model_validate({**base, **changes})


def test_the_serving_pods_and_no_others_are_selected() -> None:
    query = window_query(source(), 4)
    pattern = re.search(r'pod=~"([^"]+)"', query)
    assert pattern is not None
    pods = re.compile(pattern.group(1))  # Prometheus anchors its regular expressions
    assert pods.fullmatch("a.b-server-5d8f7c9b4-x2x9q") and pods.fullmatch("a.b-server-5d8f7c9b4-k7l2m")
    for other in ("axb-server-5d8f7c9b4-x2x9q", "a.b-server-5d8f7c9b4-x2x9q-0", "a.b-server-5d8f7c9b4-zzzzz"):
        assert not pods.fullmatch(other), other


def test_the_cpu_is_the_server_containers_cores_busy_over_all_it_may_use() -> None:
    cpu = source()
    query = window_query(cpu, 4.2)
    assert query.startswith('sum(max by (pod) (rate(container_cpu_usage_seconds_total{namespace="team",pod=~')
    assert query.endswith('container="litserve"}[5s])))')
    assert pods_query(cpu, 4.2).startswith("count(max by (pod) (rate(container_cpu_usage_seconds_total{")
    assert freshness_query(cpu).startswith("min(max by (pod) (timestamp(container_cpu_usage_seconds_total{")
    assert share(cpu, 2.0) == 0.25  # 2 cores busy of 2 replicas x 4 cores


def test_the_gpu_is_dcgms_utilisation_by_either_label_convention() -> None:
    gpu = source(resource="gpu")
    query = window_query(gpu, 3)
    assert query.startswith('avg(avg by (pod) (avg_over_time(DCGM_FI_DEV_GPU_UTIL{namespace="team",pod=~')
    assert ' or avg(avg by (exported_pod) (avg_over_time(DCGM_FI_DEV_GPU_UTIL{exported_namespace="team",' in query
    assert "min(max by (exported_pod) (timestamp(DCGM_FI_DEV_GPU_UTIL{exported_namespace" in freshness_query(gpu)
    assert share(gpu, 65.0) == 0.65


def test_the_source_is_bounded_and_travels_as_one_argument() -> None:
    cpu = source()
    assert UtilisationSource.model_validate_json(cpu.arg()) == cpu
    with pytest.raises(ValueError, match=r"wait_?[sS]econds"):
        source(waitSeconds=86_400)  # what the load Job's deadline counts per probe, at most
    with pytest.raises(ValueError, match="pods"):
        source(pods=[])
    with pytest.raises(ValueError, match="cores"):
        source(cores=0)


class Hostile:
    """A Prometheus stand-in that answers every query the same chosen way, and counts who asked."""

    def __init__(self, status: int, body: bytes, headers: dict[str, str] | None = None, trickle: float = 0) -> None:
        """`trickle`: seconds between the body's bytes, each sent alone."""
        self.asked: list[str] = []
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hostile.asked.append(self.path)
                self.send_response(status)
                for name, value in (headers or {"Content-Type": "application/json"}).items():
                    self.send_header(name, value)
                self.end_headers()
                if not trickle:
                    self.wfile.write(body)
                    return
                with contextlib.suppress(OSError):  # the reader hangs up first
                    for byte in body:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(trickle)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture()
def hostile_factory() -> Iterator[list[Hostile]]:
    made: list[Hostile] = []
    yield made
    for each in made:
        each.server.shutdown()


def read_one(url: str, wait: float = 60, query_seconds: float = 5) -> tuple[float | None, str | None]:
    pods = PodUtilisation(source(url=url, waitSeconds=wait), query_seconds=query_seconds)
    pods.window_start(0)
    pods.window_end(0)
    return pods.utilisation(0, "cpu"), pods.note


def test_a_redirect_is_not_followed_and_the_probe_reads_as_unread(hostile_factory: list[Hostile]) -> None:
    elsewhere = Hostile(200, b'{"status":"success","data":{"result":[{"value":[1,"1e12"]}]}}')
    redirect = Hostile(302, b"", {"Location": f"{elsewhere.url}/api/v1/query"})
    hostile_factory += [elsewhere, redirect]
    value, note = read_one(redirect.url)
    assert value is None and note is not None and "HTTP 302, a redirect (not followed)" in note
    assert elsewhere.asked == [] and len(redirect.asked) == 1


def test_an_answer_past_its_bound_is_not_read(hostile_factory: list[Hostile]) -> None:
    huge = Hostile(200, b"[" * (MAX_RESPONSE_BYTES + 10))
    hostile_factory.append(huge)
    value, note = read_one(huge.url)
    assert value is None and note is not None and "an answer larger than 1024 KiB" in note


def test_an_answer_sent_a_byte_at_a_time_is_cut_off_at_the_querys_bound(hostile_factory: list[Hostile]) -> None:
    slow = Hostile(200, b'{"status":"success","data":{"result":[{"value":[1,"1e12"]}]}}', trickle=0.5)
    hostile_factory.append(slow)
    value, note = read_one(slow.url, query_seconds=1)
    assert value is None and note is not None and "no whole answer within 1 s (timed out)" in note
    assert len(slow.asked) == 1


def test_a_prometheus_that_never_scrapes_past_the_window_is_waited_for_a_bounded_time(
    hostile_factory: list[Hostile],
) -> None:
    stale = Hostile(200, b'{"status":"success","data":{"result":[{"value":[1,"1000.0"]}]}}')  # scraped in 1970
    hostile_factory.append(stale)
    value, note = read_one(stale.url, wait=1)
    assert value is None and note is not None and "no CPU sample of every server pod scraped within 1 s" in note
    assert 1 <= len(stale.asked) <= 10  # asked (again while it waited), then gave up


def test_an_unread_probe_ends_the_search_with_prometheus_reason_in_its_note() -> None:
    search = UtilisationSearch(resource="cpu", target=0.5, tolerance=0.05, reached=False,
                               reason=NeverReached.NO_READING, note="probe 1 unread")  # fmt: skip
    note = "http://p:9090: HTTP 302, a redirect (not followed)"
    told = with_reading_note(search, note)
    assert told is not None and told.note == "probe 1 unread; http://p:9090: HTTP 302, a redirect (not followed)"
    reached = search.model_copy(update={"reached": True, "reason": None})
    assert with_reading_note(reached, note) == reached
