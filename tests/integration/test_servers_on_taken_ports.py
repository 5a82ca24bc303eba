"""A port picked free for a local server and bound by another process before the server binds it (CI saw
TorchServe's gRPC port taken beside the cluster tests): each real server's exit says so, and the local runner
starts the server again on other ports, a bounded number of times, instead of failing the experiment."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servinglab import servers
from servinglab.api.experiment import load_experiment
from servinglab.servers.base import LocalServer, PortTaken
from support.paths import EXAMPLES, ROOT
from support.ports import listen_on
from support.serving import ready_server

TOOL = Path(__file__).parent / "tools" / "taken_ports_runner.py"

#: Which of each server's ports the test takes: TorchServe's gRPC management port (CI's case), LitServe's
#: metrics port, Triton's HTTP port.
TAKEN_PORT = {
    "torchserve": lambda server: server.addresses.grpc_management_port,
    "litserve": lambda server: int(server.metrics_address.rsplit(":", 1)[1]),
    "triton": lambda server: server.http_port,
}


@pytest.fixture()
def listeners() -> Iterator[list[socket.socket]]:
    """Sockets this test listens on, each taking a port a server was to bind; closed afterwards."""
    held: list[socket.socket] = []
    yield held
    for sock in held:
        sock.close()


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("torchserve", marks=pytest.mark.torchserve),
        "litserve",
        pytest.param("triton", marks=pytest.mark.triton),
    ],
)
def test_a_server_whose_port_was_taken_ends_its_start_saying_so(
    kind: str, request: pytest.FixtureRequest, listeners: list[socket.socket], tmp_path: Path,
    no_leftover_servers: float,
) -> None:  # fmt: skip
    if kind == "triton":
        request.getfixturevalue("triton_env")
    spec = load_experiment(EXAMPLES / "experiment-smoke.yaml").spec
    spec = spec.model_copy(update={"server": spec.server.model_copy(update={"kind": kind})})
    kind_of = servers.get(kind)
    server: LocalServer = kind_of.local("tiny", kind_of.prepare_model(spec, tmp_path).directory, spec, tmp_path, False)
    listeners.append(listen_on(TAKEN_PORT[kind](server)))
    server.start()
    try:
        with pytest.raises(PortTaken) as raised:
            server.wait_ready(spec.server.startup_timeout_seconds)
    finally:
        server.stop()
    assert "in use" in raised.value.said and "bound by another process" in str(raised.value)


def test_a_test_that_starts_a_server_itself_gets_it_on_other_ports_when_one_was_taken(
    listeners: list[socket.socket], tmp_path: Path, no_leftover_servers: float
) -> None:
    """support.serving, which the integration tests that start a server directly use: CI's race there too."""
    spec = load_experiment(EXAMPLES / "experiment-litserve-smoke.yaml").spec
    litserve = servers.get("litserve")
    directory = litserve.prepare_model(spec, tmp_path).directory
    made: list[LocalServer] = []

    def make() -> LocalServer:
        made.append(litserve.local("tiny", directory, spec, tmp_path, False))
        if len(made) == 1:
            listeners.append(listen_on(TAKEN_PORT["litserve"](made[0])))
        return made[-1]

    with ready_server(make, spec.server.startup_timeout_seconds) as (server, cold_start):
        assert server is made[1] and cold_start > 0
        code, _ = server.predict(b"\x00" * 100, "application/octet-stream", 30)
        assert code == 400, "the second server answers on its own port"
    assert len(made) == 2, "one server for the taken port, one that started"


def serve_with_ports_taken(experiment: str, *mode: str) -> dict[str, Any]:
    """What the local runner did when ports picked for LitServe were taken (tools/taken_ports_runner.py)."""
    done = subprocess.run(
        [sys.executable, str(TOOL), str(EXAMPLES / experiment), *mode],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests")},  # its `support`, as pytest's pythonpath gives
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report


@pytest.mark.parametrize("taken", ["once", "every time"])
def test_the_runner_starts_the_server_again_on_other_ports_a_bounded_number_of_times(
    taken: str, no_leftover_servers: float
) -> None:
    report = serve_with_ports_taken("experiment-litserve-smoke.yaml", "starts", "1" if taken == "once" else "all")
    picked, phases, attempts = report["picked"], report["phases"], report["attempts"]
    taken_starts = 1 if taken == "once" else attempts
    assert attempts == 3
    assert len(picked) == min(taken_starts + 1, attempts), "one start for each taken port, then one more"
    again = [phase for phase in phases if "starting it again on other ports" in phase]
    assert len(again) == min(taken_starts, attempts - 1)
    assert all(phase.startswith("LitServe could not listen") and "in use" in phase for phase in again), "and why"
    if taken_starts < attempts:
        assert "error" not in report, report.get("error")
        assert report["cold_start"] > 0 and not report["reconfigured"]
        assert report["inference"].startswith(f"http://127.0.0.1:{picked[-1][0]}"), "on the last ports picked"
        assert report["refused_code"] == 400, "the server that started answers on its own port"
    else:
        assert report["error_type"] == "ServerError", "the run ends; nothing asks to start it again"
        assert f"a port was taken at each of {attempts} starts" in report["error"]
        assert not report["server_left"], "the last server was stopped"


def test_a_sweeps_restart_of_litserve_that_finds_its_port_taken_starts_it_on_other_ports(
    no_leftover_servers: float,
) -> None:
    """LitServe has no management API: a sweep's next configuration restarts it on the same ports, and one of
    them can be taken between its stop and its start."""
    report = serve_with_ports_taken("experiment-litserve-smoke.yaml", "restart")
    assert "error" not in report, report.get("error")
    starts = report["starts"]
    assert len(starts) == 3 and starts[0] == starts[1] != starts[2], "restarted on its ports, then on others"
    assert not report["reconfigured"] and report["batch_size"] == 4, "the new configuration is served"
    assert any(phase.startswith("LitServe could not listen") for phase in report["phases"])
