"""`servinglab check-operator` (the chart's helm test) against real HTTP endpoints."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from servinglab.k8s.health import OperatorUnhealthy, check_operator
from servinglab.servers.process import free_ports

OPERATOR_METRICS = (
    "# HELP servinglab_experiments_running Experiments this operator is driving now\n"
    "# TYPE servinglab_experiments_running gauge\nservinglab_experiments_running 0.0\n"
    "# HELP servinglab_experiments_finished_total Experiments that finished, by state\n"
    "# TYPE servinglab_experiments_finished_total counter\n"
)


@pytest.fixture()
def endpoints() -> Iterator[dict[str, tuple[int, str]]]:
    """path -> (status, body), served on a free loopback port; yields the mutable routing table."""
    routes: dict[str, tuple[int, str]] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = routes.get(self.path, (404, "not found"))
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    (port,) = free_ports(1)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    routes["port"] = (port, "")
    yield routes
    server.shutdown()


def urls(endpoints: dict[str, tuple[int, str]]) -> tuple[str, str]:
    base = f"http://127.0.0.1:{endpoints['port'][0]}"
    return f"{base}/healthz", f"{base}/metrics"


def test_healthy_operator_passes(endpoints: dict[str, tuple[int, str]]) -> None:
    endpoints["/healthz"] = (200, "{}")
    endpoints["/metrics"] = (200, OPERATOR_METRICS)
    assert check_operator(*urls(endpoints), timeout=2) == 2


def test_failing_liveness_is_reported_with_its_status(endpoints: dict[str, tuple[int, str]]) -> None:
    endpoints["/healthz"] = (500, "probe failed")
    endpoints["/metrics"] = (200, OPERATOR_METRICS)
    with pytest.raises(OperatorUnhealthy, match=r"/healthz answered HTTP 500"):
        check_operator(*urls(endpoints), timeout=2)


def test_metrics_without_the_operators_families_fail(endpoints: dict[str, tuple[int, str]]) -> None:
    endpoints["/healthz"] = (200, "{}")
    endpoints["/metrics"] = (200, "# TYPE python_gc_objects_collected_total counter\n")
    with pytest.raises(OperatorUnhealthy, match="serves no servinglab_"):
        check_operator(*urls(endpoints), timeout=2)


def test_nothing_listening_fails_naming_the_url() -> None:
    (port,) = free_ports(1)
    with pytest.raises(OperatorUnhealthy, match=rf"127.0.0.1:{port}/healthz did not answer"):
        check_operator(f"http://127.0.0.1:{port}/healthz", f"http://127.0.0.1:{port}/metrics", timeout=2)
