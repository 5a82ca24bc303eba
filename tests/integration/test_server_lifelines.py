"""A `servinglab run` killed with SIGKILL leaves no LitServe or Triton behind: it runs no `finally`, so only
the watchdog each local server is started under (servinglab.lifeline) can end the server's processes —
LitServe's API processes, workers and queue manager; tritonserver and its Python backend's stubs — which
otherwise go on holding their (GPU) memory. TorchServe's own test is in test_local_run.py."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

SMOKE = Path(__file__).resolve().parents[2] / "examples" / "experiment-smoke.yaml"
#: What shows the server is all there: one of its model's workers (LitServe's are spawned processes, Triton's
#: the Python backend's stubs).
WORKER_MARKERS = {"litserve": "multiprocessing.spawn", "triton": "triton_python_backend_stub"}


def command_of(proc: psutil.Process) -> str:
    """Its command line ("" for one that has ended, e.g. a finished step the runner has not reaped yet)."""
    with contextlib.suppress(psutil.Error):
        return " ".join(proc.cmdline())
    return ""


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (the same process, not a reused pid; a zombie has ended)."""
    left = []
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc)
    return left


@pytest.mark.parametrize("kind", ["litserve", pytest.param("triton", marks=pytest.mark.triton)])
def test_a_runner_killed_with_sigkill_leaves_no_server_behind(
    servinglab_cmd: list[str], tmp_path: Path, no_leftover_servers: float, kind: str, request: pytest.FixtureRequest
) -> None:
    if kind == "triton":
        request.getfixturevalue("triton_env")
    document = yaml.safe_load(SMOKE.read_text())
    document["spec"]["server"].update(kind=kind, workers=1)
    document["spec"]["load"].update(concurrency=[1], warmupSeconds=0.5, durationSeconds=300)
    document["spec"]["ceiling"] = {"enabled": False}
    experiment = tmp_path / "long.yaml"
    experiment.write_text(yaml.safe_dump(document))
    runner = subprocess.Popen(
        [*servinglab_cmd, "run", str(experiment)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert runner.stdout is not None
    server: list[psutil.Process] = []
    try:
        seen = ""
        while "measuring" not in seen:  # the server is up and answering the load
            line = runner.stdout.readline()
            assert line, seen
            seen += line
        # everything the runner started (the watchdog, the server, its workers), by pid, before the kill
        server = psutil.Process(runner.pid).children(recursive=True)
        commands = [command_of(proc) for proc in server]
        assert any(WORKER_MARKERS[kind] in command for command in commands), commands
        runner.kill()
        runner.wait(timeout=10)
        # the server stops on SIGTERM within seconds; the watchdog's SIGKILL follows its 15 s grace
        deadline = time.monotonic() + 30
        while (left := alive(server)) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        for proc in alive(server):  # a failure here must not leave a server to the following tests
            with contextlib.suppress(psutil.Error):
                proc.kill()
    assert not left, [command_of(proc) for proc in left]
