"""A loopback HTTP endpoint that answers every GET with a text its owner renders at that moment: what the
test exporters (:mod:`clusterenv.monitoring`'s DCGM one, :mod:`clusterenv.cadvisor`) serve Prometheus."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from servinglab.servers.process import free_ports


class TextEndpoint:
    """Serves `render()` as Prometheus' text format on a free loopback port until stopped."""

    def __init__(self, render: Callable[[], str], name: str) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        (self.port,) = free_ports(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
