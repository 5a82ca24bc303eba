"""Fixtures for tests that start a real server on loopback: TorchServe (Java frontend + Python workers) or
LitServe (the rendered script, its API processes and its spawned workers)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator

import psutil
import pytest

TORCHSERVE_MARKERS = ("org.pytorch.serve.ModelServer", "model_service_worker.py")
LITSERVE_MARKERS = ("litserve/server.py", "multiprocessing.spawn")
#: Every process this test session starts inherits this mark, so the leftover check and its clean-up see
#: this session's servers only (another session on the same machine may be serving meanwhile).
SESSION_MARK = "SERVINGLAB_TEST_SESSION"
os.environ.setdefault(SESSION_MARK, uuid.uuid4().hex)


def _ours(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.environ().get(SESSION_MARK) == os.environ[SESSION_MARK]
    return False


def torchserve_processes(since: float) -> list[psutil.Process]:
    """This session's server processes (TorchServe's, LitServe's) created after `since` (tests run one server
    at a time)."""
    found = []
    markers = TORCHSERVE_MARKERS + LITSERVE_MARKERS
    for proc in psutil.process_iter(["cmdline", "create_time"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["create_time"] >= since - 1 and any(m in cmdline for m in markers) and _ours(proc):
            found.append(proc)
    return found


@pytest.fixture()
def no_leftover_servers() -> Iterator[float]:
    """Fails the test if any server process it started is still alive afterwards."""
    started = time.time()
    yield started
    deadline = time.monotonic() + 10
    while (left := torchserve_processes(started)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for proc in left:  # do not let one failure poison the following tests
        proc.kill()
    assert not left, f"server processes left behind: {[p.pid for p in left]}"
