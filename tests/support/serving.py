"""A local server a test starts itself, ready, on other ports when one picked for it was taken: the race the
local runner handles for users (a port picked free is bound by another process before the server binds it)
also meets the tests that start a server directly, and CI runs three test sessions side by side.

Used by the integration tests that start TorchServe, LitServe or Triton without `servinglab run`. The runner's
own loop is not reused: importing :mod:`servinglab.local.runner` inside pytest brings in Locust's gevent
patching; the bound, PORT_ATTEMPTS, is the same one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from servinglab.servers.base import PORT_ATTEMPTS, LocalServer, PortTaken

S = TypeVar("S", bound=LocalServer)


@contextmanager
def ready_server(make: Callable[[], S], timeout_seconds: float) -> Iterator[tuple[S, float]]:
    """`make()`'s server, started and ready, with its cold start; stopped when the block ends. A start that
    ends in :class:`PortTaken` is stopped and `make()` called again (a new server picks new ports), at most
    PORT_ATTEMPTS starts; any other failure is raised as it came, the server stopped."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        server = make()
        try:
            server.start()
            try:
                cold_start = server.wait_ready(timeout_seconds)
            except PortTaken:
                if attempt == PORT_ATTEMPTS:
                    raise
                continue
            yield server, cold_start
            return
        finally:
            server.stop()
