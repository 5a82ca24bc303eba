"""A local server a test starts itself, ready, on other ports when one picked for it was taken: the race the
local runner handles for users (a port picked free is bound by another process before the server binds it)
also meets the tests that start a server directly, and CI runs three test sessions side by side.

Used by the integration tests that start TorchServe, LitServe or Triton without `servinglab run`; the start
and its bound are the runner's own (:func:`servinglab.servers.process.start_ready`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from servinglab.servers.base import LocalServer
from servinglab.servers.process import start_ready

S = TypeVar("S", bound=LocalServer)


@contextmanager
def ready_server(make: Callable[[], S], timeout_seconds: float) -> Iterator[tuple[S, float]]:
    """`make()`'s server, started and ready, with its cold start; stopped when the block ends. A start that
    found a port taken is stopped and `make()` called again (new ports), as the runner does, at most
    PORT_ATTEMPTS starts (then ServerError); any other failure is raised as it came, the server stopped."""
    server, cold_start = start_ready(make, timeout_seconds)
    try:
        yield server, cold_start
    finally:
        server.stop()
