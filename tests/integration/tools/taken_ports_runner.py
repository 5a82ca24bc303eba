"""Serve an experiment through the local runner's ServerSlot while another process (this one, standing in)
binds a port picked for the server before the server does; print what the runner did as JSON.

    python taken_ports_runner.py EXPERIMENT starts N     the first N starts find a port taken
    python taken_ports_runner.py EXPERIMENT starts all   every start finds one
    python taken_ports_runner.py EXPERIMENT restart      a sweep's restart of LitServe finds its port taken

The runner needs Locust's gevent patching before anything imports `socket` (as `servinglab.entry` does), so
it runs here, in a process of its own, rather than inside pytest (with tests/ on PYTHONPATH, for `support`).
Used by test_servers_on_taken_ports.py.
"""

from __future__ import annotations

import locust  # noqa: F401  (first: its gevent patching, as servinglab.entry does)

import json
import socket
import sys

from servinglab.api.experiment import load_experiment
from servinglab.local.runner import RunHooks, ServerSlot
from servinglab.servers import process
from servinglab.servers.base import PORT_ATTEMPTS, ServerError
from servinglab.servers.litserve import local as litserve_local
from support.ports import listen_on

held: list[socket.socket] = []


def take(port: int) -> None:
    """Listen on `port` until this process ends, as the other process would."""
    held.append(listen_on(port))


def main() -> None:
    experiment = load_experiment(sys.argv[1])
    mode = sys.argv[2]
    picked: list[list[int]] = []
    starts: list[str] = []
    taken_starts = 0 if mode != "starts" else PORT_ATTEMPTS if sys.argv[3] == "all" else int(sys.argv[3])

    def ports_then_taken(count: int) -> list[int]:
        ports = process.free_ports(count)
        picked.append(ports)
        if len(picked) <= taken_starts:
            take(ports[0])
        return ports

    start = litserve_local.LocalLitServe.start

    def taken_at_the_restart(server: litserve_local.LocalLitServe) -> None:
        starts.append(server.inference)
        if mode == "restart" and len(starts) == 2:  # the restart, on the ports it had
            take(int(server.inference.rsplit(":", 1)[1]))
        start(server)

    litserve_local.free_ports = ports_then_taken  # type: ignore[assignment]
    litserve_local.LocalLitServe.start = taken_at_the_restart  # type: ignore[method-assign]
    phases: list[str] = []
    slot = ServerSlot("ports", RunHooks(phase=phases.append), reuse=mode == "restart")
    report: dict[str, object] = {"phases": phases, "picked": picked, "starts": starts, "attempts": PORT_ATTEMPTS}
    try:
        if mode == "restart":
            slot.serve(experiment)
            server_spec = experiment.spec.server.model_copy(update={"batch_size": 4})
            experiment = experiment.model_copy(
                update={"spec": experiment.spec.model_copy(update={"server": server_spec})}
            )
        server, cold_start, reconfigured = slot.serve(experiment)
        code, _ = server.predict(b"\x00" * 16, "application/octet-stream", 30)
        report.update(inference=server.inference_url, cold_start=cold_start, reconfigured=reconfigured,
                      refused_code=code, batch_size=server.effective().batch_size)  # fmt: skip
    except ServerError as exc:
        report.update(error=str(exc), error_type=type(exc).__name__, server_left=slot.server is not None)
    finally:
        slot.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
