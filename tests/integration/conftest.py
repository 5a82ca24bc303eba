"""Fixtures for tests that start a real server on loopback: TorchServe (Java frontend + Python workers),
LitServe (the rendered script, its API processes and its spawned workers) or tritonserver (with its Python
backend's stubs)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial

import psutil
import pytest

TORCHSERVE_MARKERS = ("org.pytorch.serve.ModelServer", "model_service_worker.py")
LITSERVE_MARKERS = ("litserve/server.py", "multiprocessing.spawn")
TRITON_MARKERS = ("tritonserver", "triton_python_backend_stub")
SERVER_MARKERS = (*TORCHSERVE_MARKERS, *LITSERVE_MARKERS, *TRITON_MARKERS)
#: Set by `no_leftover_servers` for the test's duration; every process the test starts inherits it (the
#: launcher, the JVM and its workers too). Other tests, other sessions, may run TorchServe on the same
#: machine at the same time: only processes carrying this test's mark are its own.
TEST_MARK = "SERVINGLAB_TEST_MARK"


def torchserve_processes(since: float, mark: str | None = None) -> list[psutil.Process]:
    """Running server processes (TorchServe's, LitServe's, Triton's) created after
    `since`; with `mark`, only those whose environment carries that TEST_MARK."""
    found = []
    for proc in psutil.process_iter(["cmdline", "create_time"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["create_time"] < since - 1 or not any(m in cmdline for m in SERVER_MARKERS):
            continue
        if mark is not None:
            try:
                if proc.environ().get(TEST_MARK) != mark:
                    continue
            except psutil.Error:  # gone, or a zombie: nothing left to run
                continue
        found.append(proc)
    return found


@pytest.fixture()
def no_leftover_servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[float]:
    """Fails the test if any server process it started is still alive afterwards."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv(TEST_MARK, mark)
    started = time.time()
    yield started
    deadline = time.monotonic() + 10
    while (left := torchserve_processes(started, mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for proc in left:  # do not let one failure poison the following tests
        proc.kill()
    assert not left, f"server processes left behind: {[p.pid for p in left]}"


@pytest.fixture()
def torchserve_of_this_test(no_leftover_servers: float) -> Callable[[], list[psutil.Process]]:
    """Lists the TorchServe processes this test started that are still running."""
    return partial(torchserve_processes, no_leftover_servers, os.environ[TEST_MARK])
