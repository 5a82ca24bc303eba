"""Waiting for what another process does in its own time (Prometheus' next scrape or target refresh, the API
server's authorisation cache) without a fixed sleep. Used by test_chart.py and
test_pod_utilisation_prometheus.py."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(check: Callable[[], bool], seconds: float, interval: float = 1.0) -> bool:
    """Whether `check()` holds within `seconds`, asked every `interval` seconds."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True
