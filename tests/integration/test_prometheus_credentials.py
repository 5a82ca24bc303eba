"""The operator's Prometheus credentials (from its Secret, through its environment) go to the operator's own
Prometheus alone: an experiment that names another Prometheus (whoever runs it) never receives them. Real
HTTP servers on loopback record the Authorization header of every query."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from servinglab.k8s import promql
from servinglab.k8s.settings import Settings

TOKEN = "Bearer operator-prometheus-token"
EMPTY = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()


@contextmanager
def prometheus() -> Iterator[tuple[str, list[str | None]]]:
    """A Prometheus that answers every query with no samples; yields its URL and each query's header."""
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(EMPTY)))
            self.end_headers()
            self.wfile.write(EMPTY)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def query(reader: promql.GpuMetrics | None) -> None:
    assert reader is not None
    asyncio.run(reader.window("ns", "server-0", 100.0, 110.0, 5))


def test_the_operator_s_credentials_go_to_its_own_prometheus_only() -> None:
    with prometheus() as (operators, to_operator), prometheus() as (named, to_named):
        query(promql.reader(None, operators, TOKEN))
        query(promql.reader(named, operators, TOKEN))
        query(promql.reader(operators, operators, TOKEN))  # an experiment naming the operator's own
    assert to_operator and set(to_operator) == {TOKEN}
    assert to_named and set(to_named) == {None}
    assert promql.reader(None, None, TOKEN) is None


def test_the_header_comes_from_the_operator_s_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVINGLAB_PROMETHEUS_AUTHORIZATION", TOKEN)
    assert Settings.from_env().prometheus_authorization == TOKEN
    monkeypatch.delenv("SERVINGLAB_PROMETHEUS_AUTHORIZATION")
    assert Settings.from_env().prometheus_authorization is None
