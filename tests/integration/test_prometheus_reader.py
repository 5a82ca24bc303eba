"""What the operator fetches from `spec.metrics.prometheusUrl`, and what it repeats into status: over real
HTTP, from servers that answer like Prometheus, like something else, or not at all."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from servinglab.k8s.promql import FIGURES, GpuMetrics, PrometheusError

SECRET = "internal-build-7f3a token=hunter2"


@contextmanager
def http_server(answer: Callable[[str], tuple[int, str, bytes]]) -> Iterator[tuple[str, list[str]]]:
    """Serves `answer(path)`; yields the URL and the list of paths requested."""
    requested: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requested.append(self.path)
            status, content_type, body = answer(self.path)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requested
    finally:
        server.shutdown()


def read_window(url: str, timeout: float = 5.0) -> dict[str, float | None]:
    return asyncio.run(GpuMetrics(url, timeout_seconds=timeout).window("ns", "server-0", 100.0, 110.0, 50))


def test_only_instant_queries_for_the_pods_window_are_fetched() -> None:
    vector = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [110, "42"]}]}}
    with http_server(lambda path: (200, "application/json", json.dumps(vector).encode())) as (url, requested):
        figures = read_window(url)
    assert figures["powerAvgWatts"] == 42.0 and figures["energyPerInferenceJoules"] == round(42e-3 / 50, 6)
    assert len(requested) == len(FIGURES)  # one GET per figure, nothing else
    for path in requested:
        parsed = urllib.parse.urlparse(path)
        query = urllib.parse.parse_qs(parsed.query)
        assert parsed.path == "/api/v1/query" and set(query) == {"query", "time"}
        assert query["time"] == ["110.000"] and 'pod="server-0"' in query["query"][0]


@pytest.mark.parametrize(
    ("status", "content_type", "body", "expected"),
    [
        (200, "text/html", f"<html>{SECRET}</html>".encode(),
         "HTTP 200, not a Prometheus query API response (text/html"),
        (503, "text/plain", SECRET.encode(), "HTTP 503, not a Prometheus query API response (text/plain"),
        (400, "application/json", json.dumps({"status": "error", "errorType": "bad_data", "error": SECRET}).encode(),
         "HTTP 400, Prometheus refused the query (bad_data)"),
        (200, "application/json", json.dumps({"status": "success", "data": SECRET}).encode(),
         "not a Prometheus query API response (application/json"),
    ],
)  # fmt: skip
def test_what_answers_is_never_echoed_only_described(
    status: int, content_type: str, body: bytes, expected: str
) -> None:
    with http_server(lambda path: (status, content_type, body)) as (url, _), pytest.raises(PrometheusError) as raised:
        read_window(url)
    message = str(raised.value)
    assert expected in message and message.startswith(url)
    assert "hunter2" not in message and "internal-build" not in message


def test_a_prometheus_that_never_answers_times_out() -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog), never answers
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(PrometheusError, match=f"{url}: no answer within 1 s"):
            read_window(url, timeout=1.0)
        assert time.monotonic() - started < 5
    finally:
        listener.close()
