"""Fixtures for tests that start a real TorchServe (Java frontend + Python workers) on loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psutil
import pytest

TORCHSERVE_MARKERS = ("org.pytorch.serve.ModelServer", "model_service_worker.py")


def torchserve_processes(since: float) -> list[psutil.Process]:
    """TorchServe frontends and workers created after `since` (tests run one server at a time)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "create_time"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["create_time"] >= since - 1 and any(m in cmdline for m in TORCHSERVE_MARKERS):
            found.append(proc)
    return found


@pytest.fixture()
def no_leftover_servers() -> Iterator[float]:
    """Fails the test if any TorchServe process it started is still alive afterwards."""
    started = time.time()
    yield started
    deadline = time.monotonic() + 10
    while (left := torchserve_processes(started)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for proc in left:  # do not let one failure poison the following tests
        proc.kill()
    assert not left, f"TorchServe processes left behind: {[p.pid for p in left]}"
