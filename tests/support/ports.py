"""A port held the way another process would hold it: the race of a port picked free for a server and
bound by someone else before the server binds it, made certain. Used by test_servers_on_taken_ports.py and
its tool (tests/integration/tools/taken_ports_runner.py)."""

from __future__ import annotations

import socket


def listen_on(port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:`port` until it is closed."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past a stopped server's TIME_WAIT connections
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock
