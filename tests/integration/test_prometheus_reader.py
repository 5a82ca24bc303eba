"""What the operator fetches from `spec.metrics.prometheusUrl`, and what it repeats into status: over real
HTTP, from servers that answer like Prometheus, like something else, redirect elsewhere, answer without
end, or not at all (a closed port, TLS to a plain server); every one on loopback."""

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

from servinglab.k8s.promql import FIGURES, MAX_RESPONSE_BYTES, GpuMetrics, PrometheusError

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


def refused(url: str, timeout: float = 5.0) -> PrometheusError:
    with pytest.raises(PrometheusError) as raised:
        read_window(url, timeout)
    return raised.value


def test_a_redirect_is_reported_as_one_and_not_followed() -> None:
    """The Location points at another server on loopback (as it could at an internal service): it is
    never asked, and neither its address nor the Location's query reaches the message."""
    with http_server(lambda path: (200, "application/json", b"{}")) as (elsewhere, asked_elsewhere):
        location = f"{elsewhere}/internal?token=hunter2"

        class Redirect(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}"
            error = refused(url)
        finally:
            server.shutdown()
    assert str(error) == f"{url}: HTTP 302, a redirect (not followed)" and error.reason == "PrometheusRedirected"
    assert asked_elsewhere == []


def test_a_closed_port_is_reported_as_refused_without_the_sockets_own_words() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()
    error = refused(url)
    assert str(error) == f"{url}: connection refused" and error.reason == "PrometheusUnreachable"


def test_tls_to_a_server_that_speaks_none_is_reported_as_tls_failed() -> None:
    with http_server(lambda path: (200, "application/json", b"{}")) as (url, _):
        tls_url = url.replace("http://", "https://")
        error = refused(tls_url)
    assert str(error) == f"{tls_url}: TLS failed" and "SSL" not in str(error)


def test_credentials_and_query_of_the_url_are_not_repeated() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    error = refused(f"http://admin:hunter2@127.0.0.1:{port}/prom?token=hunter2")
    assert str(error) == f"http://127.0.0.1:{port}/prom: connection refused"


def test_an_answer_past_the_size_limit_is_refused_whatever_its_length_header_says() -> None:
    with http_server(lambda path: (200, "application/json", b"[" * (MAX_RESPONSE_BYTES + 1))) as (url, _):
        assert "an answer larger than 1024 KiB" in str(refused(url))
    # no Content-Length, bytes until the connection closes: reading stops at the limit
    listener = socket.create_server(("127.0.0.1", 0))
    sent = [0]

    def endless() -> None:
        connection, _ = listener.accept()
        connection.recv(65536)
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
        try:
            while sent[0] < 64 * MAX_RESPONSE_BYTES:
                connection.sendall(b"[" * 65536)
                sent[0] += 65536
        except OSError:
            pass  # the reader hung up
        connection.close()

    thread = threading.Thread(target=endless, daemon=True)
    thread.start()
    try:
        error = refused(f"http://127.0.0.1:{listener.getsockname()[1]}")
    finally:
        listener.close()
    thread.join(timeout=10)
    assert "an answer larger than 1024 KiB" in str(error) and error.reason == "PrometheusQueryFailed"
    assert sent[0] < 16 * MAX_RESPONSE_BYTES  # it stopped reading, it did not drain the stream


def test_a_sample_that_is_not_a_number_is_described_not_raised() -> None:
    vector = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": "x"}]}}
    with http_server(lambda path: (200, "application/json", json.dumps(vector).encode())) as (url, _):
        error = refused(url)
    assert str(error) == f"{url}: HTTP 200, not a Prometheus sample"


@pytest.mark.parametrize(
    ("series", "expected"),
    [
        ([{"metric": {}, "value": [110, "+Inf"]}], "a sample that is not finite"),
        ([{"metric": {}, "value": [110, "-Inf"]}], "a sample that is not finite"),
        ([{"metric": {}, "value": [110, "NaN"]}], "a sample that is not finite"),
        ([{"metric": {}}], "not a Prometheus sample"),  # an empty series: no value at all
        ([{"metric": {}, "value": []}], "not a Prometheus sample"),
        ([{}], "not a Prometheus sample"),
    ],
)
def test_a_success_that_holds_no_finite_sample_is_an_error_of_the_query(
    series: list[dict[str, object]], expected: str
) -> None:
    """A status cannot hold +Inf or NaN (JSON has neither; the API server refuses the patch), nor does a GPU
    figure take either: the experiment's GPUMetricsAvailable says why instead."""
    vector = {"status": "success", "data": {"resultType": "vector", "result": series}}
    with http_server(lambda path: (200, "application/json", json.dumps(vector).encode())) as (url, _):
        error = refused(url)
    assert str(error) == f"{url}: HTTP 200, {expected}" and error.reason == "PrometheusQueryFailed"
