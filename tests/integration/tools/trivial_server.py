"""A trivial HTTP endpoint for load-generator tests: answers every POST after a fixed delay.

    python trivial_server.py PORT DELAY_MS [--serial]

--serial handles one request at a time (capacity 1000/DELAY_MS requests per second), so an offered
rate above that builds a queue, as an overloaded model server does.
"""

from __future__ import annotations

import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer


def main() -> None:
    port, delay = int(sys.argv[1]), float(sys.argv[2]) / 1000.0
    serial = "--serial" in sys.argv

    class Handler(BaseHTTPRequestHandler):
        # serial: one request per connection, so waiting connections are served in turn
        protocol_version = "HTTP/1.0" if serial else "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            time.sleep(delay)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server_class = HTTPServer if serial else ThreadingHTTPServer
    server_class.request_queue_size = 1024
    server_class.handle_error = lambda self, request, address: None  # clients that went away: not news
    server = server_class(("127.0.0.1", port), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
