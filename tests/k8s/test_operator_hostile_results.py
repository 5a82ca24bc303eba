"""Results no honest load Job writes, and a Prometheus that redirects: the operator reads them within its
memory, fails only the experiment they belong to (`ResultsUnreadable`, saying what was too large), never
reads them again — not on the next pass, not after a restart — and the next experiment in the namespace
runs to its result.

The load Job is played by `clusterenv/results_writer.py` (the stand-in kubelet's `job_command`), which
writes the results ConfigMaps as the Job's own ServiceAccount could: a head claiming a million parts,
and parts whose gzip inflates to 200 MiB.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest

import clusterenv
from clusterenv.controlplane import Cluster
from clusterenv.experiments import condition, experiment, wait_finished
from clusterenv.kubelet import LocalKubelet
from clusterenv.operatorproc import Operator

pytestmark = [pytest.mark.k8s, pytest.mark.torchserve]

RESULTS_WRITER = Path(clusterenv.__file__).with_name("results_writer.py")
#: The chart's memory limit for the operator is 512 MiB; reading hostile results must stay far below it.
PEAK_RSS_BOUND_MIB = 256


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set so far (psutil reports the current one; the kernel keeps the peak)."""
    process = psutil.Process(pid)
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for process {pid}")


def get(cluster: Cluster, namespace: str, kind: str, name: str) -> dict[str, Any]:
    return dict(cluster.kubectl.get(kind, name, "-n", namespace))


def events(cluster: Cluster, namespace: str, name: str) -> list[str]:
    found = cluster.kubectl.get("events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")
    return [event["reason"] for event in found["items"]]


@contextmanager
def redirecting_prometheus() -> Iterator[tuple[str, list[str]]]:
    """A 'Prometheus' that redirects every query to another server on loopback; yields its URL and the
    paths that other server was asked for (it must be asked for none)."""
    asked: list[str] = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    elsewhere = ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
    location = f"http://127.0.0.1:{elsewhere.server_address[1]}/api/v1/query?token=hunter2"

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(307)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    redirect = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    for server in (elsewhere, redirect):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{redirect.server_address[1]}", asked
    finally:
        for server in (elsewhere, redirect):
            server.shutdown()


def test_hostile_results_fail_only_their_experiment_within_the_operators_memory(
    cluster: Cluster, namespace: str, operator: Operator, kubelet_factory: Callable[..., LocalKubelet]
) -> None:
    kubelet = kubelet_factory()
    assert operator.process is not None
    baseline = psutil.Process(operator.process.pid).memory_info().rss / 2**20
    hostile = {"parts": "many-parts", "bomb": "bomb"}
    finished: dict[str, dict[str, Any]] = {}
    for name, mode in hostile.items():
        kubelet.job_command = [sys.executable, str(RESULTS_WRITER), mode]
        cluster.kubectl.apply(experiment(name), namespace=namespace)
        finished[name] = wait_finished(cluster, namespace, name, operator.log)
    peak = peak_rss_mib(operator.process.pid)
    assert peak < PEAK_RSS_BOUND_MIB, f"operator peak RSS {peak:.0f} MiB (at start {baseline:.0f} MiB)"
    for name, problem in (("parts", "parts-results claims '1000000' parts; a document has 1 to 32"),
                          ("bomb", "bomb-results: the results inflate to more than 8 MiB of JSON")):  # fmt: skip
        failed = condition(finished[name], "Failed")
        assert (failed["status"], failed["reason"]) == ("True", "ResultsUnreadable"), (failed, operator.log())
        assert problem in failed["message"], failed["message"]
        assert "results" not in finished[name]["status"]

    # finished: a restarted operator reads none of it again, and the namespace's next experiment runs
    operator.stop()
    operator.start()
    kubelet.job_command = None
    with redirecting_prometheus() as (prometheus_url, asked_elsewhere):
        cluster.kubectl.apply(experiment("after", prometheus_url), namespace=namespace)
        after = wait_finished(cluster, namespace, "after", operator.log)
    if condition(after, "Succeeded")["status"] != "True":
        failed = condition(after, "Failed")
        logs = {name: pod.log.read_text(errors="replace")[-3000:] for name, pod in kubelet.pods.items() if pod.log}
        pytest.fail(f"{failed['reason']}: {failed['message']}\n{logs}\n{kubelet.errors}\n{operator.log()[-2000:]}")
    assert len(after["status"]["results"]) == 2
    gpu = condition(after, "GPUMetricsAvailable")
    assert (gpu["status"], gpu["reason"]) == ("False", "PrometheusRedirected"), gpu
    assert gpu["message"] == f"{prometheus_url}: HTTP 307, a redirect (not followed)"
    assert asked_elsewhere == []
    for name in hostile:
        again = get(cluster, namespace, "sx", name)
        assert again["status"]["finishedAt"] == finished[name]["status"]["finishedAt"]
        assert json.dumps(again["status"]["conditions"]) == json.dumps(finished[name]["status"]["conditions"])
        assert events(cluster, namespace, name).count("ResultsUnreadable") == 1
